"""The solver protocol: ``init`` evaluates the start, ``step`` makes one iteration."""

from __future__ import annotations

import math
from typing import Any

from .._compat import materialize
from ._linalg import norm, to_floats, value_rtol, working_eps
from ._result import SolverState, Status

__all__ = ["Solver", "make_state"]


def make_state(x: Any, f: Any, g: Any, xp: Any, **kw: Any) -> SolverState:
    x, f, g = materialize(x, f, g)
    ff, gn = to_floats(f, norm(g, xp), xp=xp)
    state = SolverState(x=x, fun=f, jac=g, fun_float=ff, grad_norm=gn, **kw)
    if not (math.isfinite(ff) and math.isfinite(gn)):
        state.failed = Status.NONFINITE
    return state


class Solver:
    """Base class. Subclasses set ``name``, ``default_max_iter`` and implement ``step``."""

    name = "solver"
    default_max_iter = 1000
    #: False for stochastic methods, whose gradient norm is not known each step
    checks_gradient = True

    def __init__(self, **options: Any):
        if options:
            raise TypeError(
                f"unknown option(s) for method {self.name!r}: {', '.join(sorted(options))}"
            )

    #: machine epsilon of the working dtype and the rounding level of objective values
    eps = float(2.0**-52)
    feps = 1e-12

    def init(self, objective: Any, x0: Any) -> SolverState:
        self.eps = working_eps(x0)
        self.feps = value_rtol(self.eps)
        f, g = objective.value_and_gradient(x0)
        return make_state(x0, f, g, objective.xp)

    def step(self, objective: Any, state: SolverState) -> SolverState:  # pragma: no cover
        raise NotImplementedError

"""The solver protocol: an immutable configuration with ``init``, ``step``, ``terminate``.

A solver is a frozen dataclass of its options. A run is a sequence of
:class:`SolverState` values: ``init`` evaluates the start, ``step`` makes one iteration
and returns the next state (with ``failed`` set when it cannot), ``terminate`` says
whether the run is over, and ``finish`` turns the last state and status into what the
result reports. Whatever a solver learns during a run (correction pairs, step sizes,
running estimates) lives in ``state.memo``, never on the solver, so one configuration
serves any number of runs and a state can warm-start a neighbouring problem.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .._compat import materialize
from ._linalg import norm, to_floats, value_rtol, working_eps
from ._result import SolverState, Status
from ._stop import Progress, StopRule, stall_status

__all__ = ["Solver", "make_state", "failed_state"]


def make_state(x: Any, f: Any, g: Any, xp: Any, **kw: Any) -> SolverState:
    """A state at ``x`` with value ``f`` and gradient ``g`` (host floats computed once)."""
    x, f, g = materialize(x, f, g)
    ff, gn = to_floats(f, norm(g, xp), xp=xp)
    state = SolverState(x=x, fun=f, jac=g, fun_float=ff, grad_norm=gn, **kw)
    if not (math.isfinite(ff) and math.isfinite(gn)):
        state.failed = Status.NONFINITE
    return state


def failed_state(state: SolverState, status: Status, detail: str = "") -> SolverState:
    """``state`` one iteration on, marked as failed (the iterate does not move)."""
    return dataclasses.replace(state, nit=state.nit + 1, failed=status, detail=detail)


@dataclass(frozen=True)
class Solver:
    """Base configuration. Subclasses add their options as fields and implement ``step``."""

    #: The method's name in :func:`~tiltlab.minimize` (``method=``).
    name: ClassVar[str] = "solver"
    #: The iteration limit when ``minimize`` is given none.
    default_max_iter: ClassVar[int] = 1000
    #: False for stochastic methods, whose gradient norm is not known at each step
    checks_gradient: ClassVar[bool] = True

    @classmethod
    def configure(cls, *, seed: Any = None, **options: Any) -> Solver:
        """The configuration from ``minimize``'s options (``seed`` only where it is used)."""
        params = inspect.signature(cls.__init__).parameters
        names = {k for k in params if k != "self"}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(
                f"unknown option(s) for method {cls.name!r}: {', '.join(unknown)}"
                + (f" (it takes {', '.join(sorted(names))})" if names else "")
            )
        if "seed" in names:
            options["seed"] = seed
        return cls(**options)

    def init(self, objective: Any, x0: Any, *, max_iter: int, warm: Any = None) -> SolverState:
        """Evaluate the start; ``warm`` is the final state of a neighbouring run, if any."""
        f, g = objective.value_and_gradient(x0)
        state = make_state(x0, f, g, objective.xp)
        if state.failed is None:
            state.memo = self.start(objective, state, max_iter=max_iter, warm=warm)
        return state

    def start(self, objective: Any, state: SolverState, *, max_iter: int, warm: Any) -> Any:
        """The solver's initial memo (default: the rounding level of the values)."""
        return value_rtol(working_eps(state.x))

    def step(self, objective: Any, state: SolverState) -> SolverState:  # pragma: no cover
        """One iteration from ``state``: the next state (its ``failed`` set on failure)."""
        raise NotImplementedError

    def terminate(
        self, state: SolverState, rule: StopRule, progress: Progress
    ) -> tuple[Status | None, str]:
        """The status that ends the run at ``state``, or ``(None, "")`` to go on."""
        if rule.converged(state):
            return Status.CONVERGED, ""
        if self.checks_gradient:
            return stall_status(progress, state, rule)
        return None, ""

    def failure(
        self, previous: SolverState, new: SolverState, rule: StopRule
    ) -> tuple[SolverState, Status, str]:
        """A step that failed: the run ends at ``previous`` with ``new``'s status.

        A line search that fails where the gradient is already at the attainable level
        has converged to working precision.
        """
        status, detail = new.failed, new.detail
        assert status is not None
        if status is Status.LINE_SEARCH_FAILED and previous.grad_norm <= rule.attainable:
            status, detail = Status.PRECISION, ""
        nit = new.nit if status in (Status.NONFINITE, Status.DIVERGED) else previous.nit
        return dataclasses.replace(previous, nit=nit), status, detail

    def finish(
        self, objective: Any, state: SolverState, status: Status, detail: str
    ) -> tuple[SolverState, Status, str]:
        """The state and status the result reports (default: as they are)."""
        return state, status, detail

    def refresh(self, objective: Any, state: SolverState) -> SolverState:
        """``state`` with ``fun`` and ``jac`` evaluated at its own ``x`` if stale."""
        if not state.stale:
            return state
        f, g = objective.value_and_gradient(state.x)
        return make_state(state.x, f, g, objective.xp, nit=state.nit, step=state.step)

    def record(self, state: SolverState) -> dict[str, float]:
        """Extra per-iteration history entries (e.g. a validation value)."""
        return {}

    def export_pairs(self, state: SolverState) -> Any:
        """L-BFGS correction pairs of ``state`` (None for other solvers)."""
        return None

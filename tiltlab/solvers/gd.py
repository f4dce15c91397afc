"""Gradient descent: the paper's batch algorithms, sample-level and hierarchical.

The tilted gradient ``sum_i w_i grad f_i`` (or its hierarchical form) is exactly the
gradient of the objective, so the paper's Batch TERM updates are gradient descent on
``TiltedObjective``; hierarchy is handled inside the objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ._base import Solver, failed_state, make_state
from ._checks import check_positive, check_real
from ._linalg import armijo, power_iteration, value_rtol, working_eps
from ._result import SolverState, Status

__all__ = ["GradientDescent"]


class _Memo(NamedTuple):
    feps: float  # rounding level of the values
    alpha: float  # the step (Armijo: the last accepted one, doubled for the next trial)


@dataclass(frozen=True, init=False)
class GradientDescent(Solver):
    """Gradient descent with a fixed step, the ``1/(C1 + C2 t)`` rule, or Armijo.

    Options
    -------
    step : {"armijo", "fixed", "rule"}, default "armijo"
    lr : float, optional
        Step size for ``step="fixed"``; default ``1/beta`` with ``beta`` the largest
        Hessian eigenvalue at the start (power iteration on Hessian-vector products).
    C1, C2 : float, optional
        Constants of the convergence theorem's rule ``alpha = 1/(C1 + C2 t)`` (see
        :func:`tiltlab.diagnostics.fit_step_size_rule`); without them ``rule`` uses
        ``1/beta(t)`` measured at the start.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> X = np.c_[np.ones(5), np.arange(5.0)]
    >>> obj = tl.TiltedObjective("squared", X, np.arange(5.0))
    >>> res = tl.minimize(obj, method="gd", step="fixed")
    >>> res.success, (np.round(res.x, 4) + 0.0).tolist()
    (True, [0.0, 1.0])
    """

    name = "gd"
    # ill-conditioned problems (HIV-1 one-hot, condition ~4e3) need ~2e4 steps to 1e-8
    default_max_iter = 50_000

    mode: str
    lr: float | None
    C1: float | None
    C2: float | None

    def __init__(
        self,
        step: str = "armijo",
        lr: float | None = None,
        C1: float | None = None,
        C2: float | None = None,
    ):
        if step not in ("armijo", "fixed", "rule"):
            raise ValueError(f"`step` must be 'armijo', 'fixed' or 'rule', got {step!r}")
        lr = None if lr is None else check_positive(lr, "lr")
        C1 = None if C1 is None else check_positive(C1, "C1")
        C2 = None if C2 is None else check_real(C2, "C2")
        for k, v in (("mode", step), ("lr", lr), ("C1", C1), ("C2", C2)):
            object.__setattr__(self, k, v)

    def start(self, objective: Any, state: SolverState, *, max_iter: int, warm: Any) -> _Memo:
        x0 = state.x
        if self.mode == "rule" and self.C1 is not None and self.C2 is not None:
            alpha = 1.0 / (self.C1 + self.C2 * max(float(objective.t), 0.0))
        elif self.mode == "fixed" and self.lr is not None:
            alpha = float(self.lr)
        elif self.mode in ("fixed", "rule"):
            beta = power_iteration(lambda v: objective.hvp(x0, v), x0, objective.xp)
            alpha = 1.0 / max(beta, 1e-300)
        else:
            alpha = 1.0 / max(state.grad_norm, 1.0)
        return _Memo(value_rtol(working_eps(x0)), alpha)

    def step(self, objective: Any, state: SolverState) -> SolverState:
        xp = objective.xp
        memo = state.memo
        if self.mode == "armijo":
            step, x, f, g, _ = armijo(
                objective, state.x, state.fun_float, state.jac, -state.jac, 2.0 * memo.alpha,
                xp, feps=memo.feps,
            )  # fmt: skip
            if step == 0.0:
                return failed_state(state, Status.LINE_SEARCH_FAILED)
            memo = memo._replace(alpha=step)
        else:
            x = state.x - memo.alpha * state.jac
            f, g = objective.value_and_gradient(x)
        return make_state(x, f, g, xp, nit=state.nit + 1, step=memo.alpha, memo=memo)


"""Accelerated gradient descent (Nesterov/FISTA) with backtracking and adaptive restart."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._compat import materialize
from ._base import Solver, failed_state, make_state
from ._checks import check_positive
from ._linalg import norm, to_float, value_rtol, vdot, working_eps
from ._result import SolverState, Status

__all__ = ["AcceleratedGradient"]


class _Memo(NamedTuple):
    feps: float
    L: float  # Lipschitz estimate
    x_prev: Any
    k: int  # iterations since the last restart


@dataclass(frozen=True)
class AcceleratedGradient(Solver):
    """Nesterov's accelerated gradient with a backtracking Lipschitz estimate.

    Each iteration extrapolates ``y = x + (k-1)/(k+2) (x - x_prev)``, takes a gradient
    step from ``y`` with step ``1/L`` (``L`` doubled until sufficient decrease, and
    allowed to shrink by ``L_decrease`` each iteration), and restarts the momentum when
    the objective goes up (O'Donoghue and Candes' function restart).

    Options
    -------
    L0 : float, optional
        Initial Lipschitz estimate (default: ``||g0||``-scaled guess).
    L_decrease : float, default 0.9
        Factor by which the Lipschitz estimate may shrink each iteration.
    restart : bool, default True
        Restart the momentum when the objective goes up.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> X = np.c_[np.ones(5), np.arange(5.0)]
    >>> obj = tl.TiltedObjective("squared", X, np.arange(5.0))
    >>> res = tl.minimize(obj, method="agd")
    >>> res.success, (np.round(res.x, 4) + 0.0).tolist()
    (True, [0.0, 1.0])
    """

    name = "agd"
    default_max_iter = 10_000

    L0: float | None = None
    L_decrease: float = 0.9
    restart: bool = True

    def __post_init__(self) -> None:
        if self.L0 is not None:
            check_positive(self.L0, "L0")
        if not 0 < self.L_decrease <= 1:
            raise ValueError("`L_decrease` must lie in (0, 1]")

    def start(self, objective: Any, state: SolverState, *, max_iter: int, warm: Any) -> _Memo:
        L = self.L0 if self.L0 is not None else max(state.grad_norm, 1e-8)
        if self.L0 is None and isinstance(warm, SolverState) and isinstance(warm.memo, _Memo):
            L = warm.memo.L  # the curvature scale of the neighbouring problem
        return _Memo(value_rtol(working_eps(state.x)), L, state.x, 0)

    def step(self, objective: Any, state: SolverState) -> SolverState:
        xp = objective.xp
        feps, L_old, x_prev, k = state.memo
        k += 1
        beta = (k - 1) / (k + 2)
        y = state.x + beta * (state.x - x_prev) if k > 1 else state.x
        (y,) = materialize(y)
        if k > 1 and beta > 0:
            _, gy = objective.value_and_gradient(y)
        else:
            gy = state.jac
        L = L_old * self.L_decrease
        # accept L once it bounds the local Lipschitz constant of the gradient: a test on
        # gradients stays meaningful when f's decrease drops below its rounding error
        for _ in range(80):
            x_new = y - gy / L
            f_new, g_new = objective.value_and_gradient(x_new)
            fn = to_float(f_new)
            if math.isfinite(fn):
                dg = to_float(norm(g_new - gy, xp))
                dx = to_float(norm(x_new - y, xp))
                if dg <= L * dx * (1 + feps) or dx == 0:
                    break
            L *= 2.0
        else:
            return failed_state(state, Status.LINE_SEARCH_FAILED)
        # gradient restart (O'Donoghue and Candes): momentum points uphill
        if self.restart and k > 1 and to_float(vdot(gy, x_new - state.x, xp)) > 0:
            k = 0
        memo = _Memo(feps, L, state.x, k)
        return make_state(x_new, f_new, g_new, xp, nit=state.nit + 1, step=1.0 / L, memo=memo)

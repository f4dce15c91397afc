"""Accelerated gradient descent (Nesterov/FISTA) with backtracking and adaptive restart."""

from __future__ import annotations

import math
from typing import Any

from .._compat import materialize
from ._base import Solver, make_state
from ._linalg import norm, to_float, vdot
from ._result import Status

__all__ = ["AcceleratedGradient"]


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
    restart : bool, default True
    """

    name = "agd"
    default_max_iter = 10_000

    def __init__(
        self, L0: float | None = None, L_decrease: float = 0.9, restart: bool = True, **options: Any
    ):
        super().__init__(**options)
        if not 0 < L_decrease <= 1:
            raise ValueError("`L_decrease` must lie in (0, 1]")
        self.L0, self.L_decrease, self.restart = L0, L_decrease, restart

    def init(self, objective: Any, x0: Any):
        state = super().init(objective, x0)
        self.L = self.L0 if self.L0 is not None else max(state.grad_norm, 1e-8)
        self.x_prev = x0
        self.k = 0
        return state

    def step(self, objective: Any, state):
        xp = objective.xp
        self.k += 1
        beta = (self.k - 1) / (self.k + 2)
        y = state.x + beta * (state.x - self.x_prev) if self.k > 1 else state.x
        (y,) = materialize(y)
        if self.k > 1 and beta > 0:
            _, gy = objective.value_and_gradient(y)
        else:
            gy = state.jac
        L = self.L * self.L_decrease
        # accept L once it bounds the local Lipschitz constant of the gradient: a test on
        # gradients stays meaningful when f's decrease drops below its rounding error
        for _ in range(80):
            x_new = y - gy / L
            f_new, g_new = objective.value_and_gradient(x_new)
            fn = to_float(f_new)
            if math.isfinite(fn):
                dg = to_float(norm(g_new - gy, xp))
                dx = to_float(norm(x_new - y, xp))
                if dg <= L * dx * (1 + self.feps) or dx == 0:
                    break
            L *= 2.0
        else:
            out = make_state(state.x, state.fun, state.jac, xp, nit=state.nit + 1)
            out.failed = Status.LINE_SEARCH_FAILED
            return out
        self.L = L
        # gradient restart (O'Donoghue and Candes): momentum points uphill
        if self.restart and self.k > 1 and to_float(vdot(gy, x_new - state.x, xp)) > 0:
            self.k = 0
        self.x_prev = state.x
        return make_state(x_new, f_new, g_new, xp, nit=state.nit + 1, step=1.0 / L)

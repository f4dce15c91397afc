"""Gradient descent: the paper's batch algorithms, sample-level and hierarchical.

The tilted gradient ``sum_i w_i grad f_i`` (or its hierarchical form) is exactly the
gradient of the objective, so the paper's Batch TERM updates are gradient descent on
``TiltedObjective``; hierarchy is handled inside the objective.
"""

from __future__ import annotations

from typing import Any

from ._base import Solver, make_state
from ._linalg import armijo, power_iteration
from ._result import Status

__all__ = ["GradientDescent"]


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
    """

    name = "gd"
    # ill-conditioned problems (HIV-1 one-hot, condition ~4e3) need ~2e4 steps to 1e-8
    default_max_iter = 50_000

    def __init__(
        self,
        step: str = "armijo",
        lr: float | None = None,
        C1: float | None = None,
        C2: float | None = None,
        **options: Any,
    ):
        super().__init__(**options)
        if step not in ("armijo", "fixed", "rule"):
            raise ValueError(f"`step` must be 'armijo', 'fixed' or 'rule', got {step!r}")
        if lr is not None and not lr > 0:
            raise ValueError(f"`lr` must be positive, got {lr!r}")
        self.mode, self.lr, self.C1, self.C2 = step, lr, C1, C2

    def init(self, objective: Any, x0: Any):
        state = super().init(objective, x0)
        if self.mode == "rule" and self.C1 is not None and self.C2 is not None:
            t = max(float(objective.t), 0.0)
            self.alpha = 1.0 / (self.C1 + self.C2 * t)
        elif self.mode in ("fixed", "rule") and (self.lr is None or self.mode == "rule"):
            beta = power_iteration(lambda v: objective.hvp(x0, v), x0, objective.xp)
            self.alpha = 1.0 / max(beta, 1e-300)
        elif self.mode == "fixed" and self.lr is not None:
            self.alpha = float(self.lr)
        else:
            self.alpha = 1.0 / max(state.grad_norm, 1.0)
        return state

    def step(self, objective: Any, state):
        xp = objective.xp
        if self.mode == "armijo":
            step, x, f, g, _ = armijo(
                objective,
                state.x,
                state.fun_float,
                state.jac,
                -state.jac,
                2.0 * self.alpha,
                xp,
                feps=self.feps,
            )
            if step == 0.0:
                out = make_state(state.x, state.fun, state.jac, xp, nit=state.nit + 1)
                out.failed = Status.LINE_SEARCH_FAILED
                return out
            self.alpha = step
        else:
            x = state.x - self.alpha * state.jac
            f, g = objective.value_and_gradient(x)
        return make_state(x, f, g, xp, nit=state.nit + 1, step=self.alpha)

"""Limited-memory BFGS with a weak-Wolfe line search, written on the array API."""

from __future__ import annotations

import math
from typing import Any

from .._compat import materialize
from ._base import Solver, make_state
from ._linalg import approx_wolfe, to_float, vdot
from ._result import Status

__all__ = ["LBFGS", "wolfe_search"]


def wolfe_search(
    objective: Any,
    x: Any,
    f: float,
    g: Any,
    d: Any,
    step: float,
    xp: Any,
    *,
    c1: float = 1e-4,
    c2: float = 0.9,
    max_evals: int = 40,
):
    """Bracketing/bisection search for a step meeting the weak Wolfe conditions.

    Returns ``(step, x_new, f_new, g_new)``; ``step`` is 0 if none was found.
    """
    slope = to_float(vdot(g, d, xp))
    if not slope < 0:
        return 0.0, x, None, None
    lo, hi = 0.0, math.inf
    best = None
    for _ in range(max_evals):
        x_new = x + step * d
        f_new, g_new = objective.value_and_gradient(x_new)
        fn = to_float(f_new)
        dnew = to_float(vdot(g_new, d, xp))
        if (
            math.isfinite(fn)
            and fn > f + c1 * step * slope
            and approx_wolfe(fn, f, dnew, slope, c1=c1)
        ):
            return step, x_new, f_new, g_new  # decrease below rounding: accept
        if not math.isfinite(fn) or fn > f + c1 * step * slope:
            hi = step
        else:
            best = (step, x_new, f_new, g_new)
            if dnew < c2 * slope:
                lo = step
            else:
                return best
        step = 0.5 * (lo + hi) if math.isfinite(hi) else 2.0 * lo
        if hi - lo < 1e-16 * max(1.0, hi):
            break
    if best is not None:  # sufficient decrease without curvature: still progress
        return best
    return 0.0, x, None, None


class LBFGS(Solver):
    """L-BFGS (Nocedal's two-loop recursion) with a weak-Wolfe line search.

    Options
    -------
    memory : int, default 10
        Number of correction pairs kept.
    """

    name = "lbfgs"
    default_max_iter = 2000

    def __init__(self, memory: int = 10, **options: Any):
        super().__init__(**options)
        if int(memory) < 1:
            raise ValueError("`memory` must be a positive integer")
        self.memory = int(memory)

    def init(self, objective: Any, x0: Any):
        self.s: list = []
        self.y: list = []
        self.rho: list = []
        return super().init(objective, x0)

    def _direction(self, g: Any, xp: Any) -> Any:
        q = -g
        alphas = []
        for s, y, rho in zip(reversed(self.s), reversed(self.y), reversed(self.rho), strict=True):
            a = rho * vdot(s, q, xp)
            alphas.append(a)
            q = q - a * y
        if self.s:
            gamma = vdot(self.s[-1], self.y[-1], xp) / vdot(self.y[-1], self.y[-1], xp)
            q = gamma * q
        for (s, y, rho), a in zip(
            zip(self.s, self.y, self.rho, strict=True), reversed(alphas), strict=True
        ):
            b = rho * vdot(y, q, xp)
            q = q + (a - b) * s
        return q

    def step(self, objective: Any, state):
        xp = objective.xp
        (d,) = materialize(self._direction(state.jac, xp))
        if not to_float(vdot(d, state.jac, xp)) < 0:  # lost descent: reset memory
            self.s, self.y, self.rho = [], [], []
            d = -state.jac
        step0 = 1.0 if self.s else min(1.0, 1.0 / max(state.grad_norm, 1e-300))
        step, x, f, g = wolfe_search(objective, state.x, state.fun_float, state.jac, d, step0, xp)
        if step == 0.0:
            if self.s:  # retry once along the steepest descent direction
                self.s, self.y, self.rho = [], [], []
                return self.step(objective, state)
            out = make_state(state.x, state.fun, state.jac, xp, nit=state.nit + 1)
            out.failed = Status.LINE_SEARCH_FAILED
            return out
        # keep the stored pairs concrete: lazy (Dask) pairs would chain every past direction
        s, yv = materialize(x - state.x, g - state.jac)
        sy = to_float(vdot(s, yv, xp))
        if sy > 1e-12 * to_float(vdot(yv, yv, xp)) and sy > 0:
            self.s.append(s)
            self.y.append(yv)
            self.rho.append(1.0 / sy)
            if len(self.s) > self.memory:
                self.s.pop(0)
                self.y.pop(0)
                self.rho.pop(0)
        return make_state(x, f, g, xp, nit=state.nit + 1, step=step)

"""Newton's method with the exact tilted Hessian (dense or Newton-CG on hvp).

Safe where the Hessian is indefinite (tilts t < 0): the dense variant flips negative
eigenvalues (modified Newton), Newton-CG stops at the first direction of negative
curvature; both end with a backtracking line search, so every step descends.
"""

from __future__ import annotations

from typing import Any

from ._base import Solver, make_state
from ._linalg import armijo, host_solve, to_float, vdot
from ._result import Status

__all__ = ["Newton"]


class Newton(Solver):
    """Damped Newton.

    Options
    -------
    hessian : {"auto", "dense", "cg"}, default "auto"
        Dense Hessian solved on the host (small ``d``; ``auto`` picks it for
        ``d <= 500``) or truncated conjugate gradients on Hessian-vector products.
    cg_max_iter : int, default 100
    """

    name = "newton"
    default_max_iter = 200

    def __init__(self, hessian: str = "auto", cg_max_iter: int = 100, **options: Any):
        super().__init__(**options)
        if hessian not in ("auto", "dense", "cg"):
            raise ValueError(f"`hessian` must be 'auto', 'dense' or 'cg', got {hessian!r}")
        self.hessian, self.cg_max_iter = hessian, int(cg_max_iter)

    def init(self, objective: Any, x0: Any):
        p = 1
        for s in x0.shape:
            p *= int(s)
        self.dense = self.hessian == "dense" or (self.hessian == "auto" and p <= 500)
        return super().init(objective, x0)

    def _cg(self, objective: Any, x: Any, g: Any, gnorm: float, xp: Any) -> Any:
        """Truncated CG for H d = -g (Steihaug's stopping rules, no trust region)."""
        tol = min(0.5, gnorm**0.5) * gnorm
        d = xp.zeros_like(g)
        r = -g
        p = r
        rr = to_float(vdot(r, r, xp))
        for _ in range(self.cg_max_iter):
            Hp = objective.hvp(x, p)
            curv = to_float(vdot(p, Hp, xp))
            if curv <= 1e-12 * rr:  # negative or zero curvature: stop
                return d if to_float(vdot(d, d, xp)) > 0 else -g
            a = rr / curv
            d = d + a * p
            r = r - a * Hp
            rr_new = to_float(vdot(r, r, xp))
            if rr_new**0.5 <= tol:
                break
            p = r + (rr_new / rr) * p
            rr = rr_new
        return d

    def step(self, objective: Any, state):
        xp = objective.xp
        if self.dense:
            H = objective.hessian(state.x)
            shape = state.x.shape
            d = host_solve(H, xp.reshape(-state.jac, (-1,)), xp)
            d = xp.reshape(d, shape)
        else:
            d = self._cg(objective, state.x, state.jac, state.grad_norm, xp)
        step, x, f, g, _ = armijo(
            objective, state.x, state.fun_float, state.jac, d, 1.0, xp, feps=self.feps
        )
        if step == 0.0:
            step, x, f, g, _ = armijo(
                objective,
                state.x,
                state.fun_float,
                state.jac,
                -state.jac,
                1.0 / max(state.grad_norm, 1.0),
                xp,
                feps=self.feps,
            )
            if step == 0.0:
                out = make_state(state.x, state.fun, state.jac, xp, nit=state.nit + 1)
                out.failed = Status.LINE_SEARCH_FAILED
                return out
        return make_state(x, f, g, xp, nit=state.nit + 1, step=step)

"""Newton's method with the exact tilted Hessian (dense or Newton-CG on a linearisation).

Safe where the Hessian is indefinite (tilts t < 0): the dense variant flips negative
eigenvalues (modified Newton), Newton-CG stops at the first direction of negative
curvature; both end with a backtracking line search, so every step descends.

Newton-CG evaluates the objective once per trial point, as a *linearisation*: the
value, the gradient and the losses and weights at that point, kept for the
Hessian-vector products of the next conjugate-gradient solve
(``objective.linearize(theta)``), so an outer step whose unit step is accepted costs
one evaluation of the losses and weights, however many CG iterations it makes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._base import Solver, failed_state, make_state
from ._checks import check_int
from ._linalg import armijo, host_solve, to_float, value_rtol, vdot, working_eps
from ._result import SolverState, Status

__all__ = ["Newton"]


class _HvpLinearization:
    """A linearisation for objectives without ``linearize``: products call ``hvp``."""

    def __init__(self, objective: Any, theta: Any):
        self._objective, self._theta = objective, theta
        self.value, self.gradient = objective.value_and_gradient(theta)

    def hvp(self, v: Any) -> Any:
        return self._objective.hvp(self._theta, v)


def _linearization(objective: Any, theta: Any) -> Any:
    """``objective.linearize(theta)`` where the objective has it, else an ``hvp`` wrapper.

    Either way the result has ``value``, ``gradient`` and ``hvp(v)`` at ``theta``.
    """
    linearize = getattr(objective, "linearize", None)
    if linearize is None:
        return _HvpLinearization(objective, theta)
    return linearize(theta)


class _Evaluator:
    """``value_and_gradient`` through linearisations, keeping the last one made."""

    def __init__(self, objective: Any):
        self.objective, self.last = objective, None

    def value_and_gradient(self, theta: Any) -> tuple[Any, Any]:
        self.last = _linearization(self.objective, theta)
        return self.last.value, self.last.gradient


class _Memo(NamedTuple):
    feps: float
    dense: bool
    lin: Any  # the linearisation at the current iterate (Newton-CG), or None
    hessian: Any = None  # the dense Hessian of the last step (at the previous iterate)


@dataclass(frozen=True)
class Newton(Solver):
    """Damped Newton.

    Options
    -------
    hessian : {"auto", "dense", "cg"}, default "auto"
        Dense Hessian solved on the host (small ``d``; ``auto`` picks it for
        ``d <= 500``) or truncated conjugate gradients on Hessian-vector products.
    cg_max_iter : int, default 100
        Iteration limit of the conjugate gradients.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> X = np.c_[np.ones(5), np.arange(5.0)]
    >>> obj = tl.TiltedObjective("squared", X, np.arange(5.0))
    >>> res = tl.minimize(obj, method="newton", hessian="cg")
    >>> res.success, (np.round(res.x, 6) + 0.0).tolist()
    (True, [0.0, 1.0])
    """

    name = "newton"
    default_max_iter = 200

    hessian: str = "auto"
    cg_max_iter: int = 100

    def __post_init__(self) -> None:
        if self.hessian not in ("auto", "dense", "cg"):
            raise ValueError(f"`hessian` must be 'auto', 'dense' or 'cg', got {self.hessian!r}")
        object.__setattr__(self, "cg_max_iter", check_int(self.cg_max_iter, "cg_max_iter", 1))

    def init(self, objective: Any, x0: Any, *, max_iter: int, warm: Any = None) -> SolverState:
        p = 1
        for s in x0.shape:
            p *= int(s)
        dense = self.hessian == "dense" or (self.hessian == "auto" and p <= 500)
        feps = value_rtol(working_eps(x0))
        if dense:
            state = super().init(objective, x0, max_iter=max_iter, warm=warm)
            lin = None
        else:
            lin = _linearization(objective, x0)
            state = make_state(x0, lin.value, lin.gradient, objective.xp)
        state.memo = _Memo(feps, dense, lin)
        return state

    def _cg(self, lin: Any, g: Any, gnorm: float, xp: Any) -> Any:
        """Truncated CG for H d = -g (Steihaug's stopping rules, no trust region)."""
        tol = min(0.5, gnorm**0.5) * gnorm
        d = xp.zeros_like(g)
        r = -g
        p = r
        rr = to_float(vdot(r, r, xp))
        for _ in range(self.cg_max_iter):
            Hp = lin.hvp(p)
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

    def step(self, objective: Any, state: SolverState) -> SolverState:
        xp = objective.xp
        memo = state.memo
        H = None
        if memo.dense:
            H = objective.hessian(state.x)
            d = host_solve(H, xp.reshape(-state.jac, (-1,)), xp)
            d = xp.reshape(d, state.x.shape)
            evaluator = objective
        else:
            d = self._cg(memo.lin, state.jac, state.grad_norm, xp)
            evaluator = _Evaluator(objective)
        f0 = state.fun_float
        step, x, f, g, _ = armijo(evaluator, state.x, f0, state.jac, d, 1.0, xp, feps=memo.feps)
        if step == 0.0:
            step0 = 1.0 / max(state.grad_norm, 1.0)
            step, x, f, g, _ = armijo(
                evaluator, state.x, f0, state.jac, -state.jac, step0, xp, feps=memo.feps
            )
            if step == 0.0:
                return failed_state(state, Status.LINE_SEARCH_FAILED)
        lin = None if memo.dense else evaluator.last  # the accepted point's linearisation
        memo = memo._replace(lin=lin, hessian=H)
        return make_state(x, f, g, xp, nit=state.nit + 1, step=step, memo=memo)

    def finish(
        self, objective: Any, state: SolverState, status: Status, detail: str
    ) -> tuple[SolverState, Status, str]:
        # the linearisation holds the objective's data: not part of the result
        if isinstance(state.memo, _Memo):
            state = dataclasses.replace(state, memo=state.memo._replace(lin=None))
        return state, status, detail

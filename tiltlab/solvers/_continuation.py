r"""Predictors for tilt paths: the tangent of the solution path and Hermite extrapolation.

Along a path of minimisers :math:`\theta(t)` of :math:`F(\theta; t)`, differentiating
the stationarity condition :math:`\nabla F(\theta(t); t) = 0` in ``t`` gives the tangent
equation

.. math:: H\,\frac{d\theta}{dt} = -\partial_t\nabla F(\theta; t),

with ``H`` the Hessian at the solution and the right-hand side from
:func:`tiltlab.objective.tilt_derivative.gradient_tilt_derivative`. A path solved with
tangents predicts the next solution by cubic Hermite extrapolation through the last two
points and their tangents (error of fourth order in the step where the path is smooth),
or by a step along the last tangent; the corrector is the path's solver.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .._compat import to_numpy
from ..objective.tilt_derivative import gradient_tilt_derivative
from ._linalg import host_solve, norm, to_float, vdot

__all__ = ["PathPoint", "Continuation", "tangent", "hermite", "supports_tangent"]


class PathPoint(NamedTuple):
    """A solved point of a path: the tilt, the solution and its tangent (or None)."""

    t: float
    x: Any
    d: Any = None


class Tangent(NamedTuple):
    """A tangent and the number of Hessian-vector products its solve made."""

    d: Any
    n_products: int


def supports_tangent(objective: Any) -> bool:
    """Whether :func:`tangent` applies: a sample-level linear-predictor objective."""
    problem = getattr(objective, "problem", None)
    return (
        problem is not None
        and not problem.is_hierarchical
        and problem.is_linear
        and problem.finite_tilts
        and hasattr(objective, "linearize")
    )


def tangent(
    objective: Any,
    x: Any,
    *,
    guess: Any = None,
    rtol: float = 1e-6,
    max_iter: int = 200,
    dense: bool = False,
    hessian: Any = None,
) -> Tangent | None:
    """The tangent ``d theta/dt`` of the path through the solution ``x`` of ``objective``.

    Solves ``H d = -b`` (``b`` the tilt derivative of the gradient) by conjugate
    gradients on the linearisation's Hessian-vector products, from ``guess`` when it
    is nearer than zero, to a relative residual ``rtol`` or ``max_iter`` products; or densely
    (``dense=True``: one Hessian, solved on the host; ``hessian``, when given, is used
    instead of computing it, e.g. the one of a Newton solver's last step). Returns
    ``None`` where ``H`` shows a direction of non-positive curvature or the result is not
    finite (then the path falls back to secant predictions).
    """
    xp = objective.xp
    b = gradient_tilt_derivative(objective, x)
    if dense:
        H = to_numpy(objective.hessian(x) if hessian is None else hessian).astype(np.float64)
        try:
            np.linalg.cholesky(0.5 * (H + H.T))  # positive definite: a strict minimum
        except np.linalg.LinAlgError:
            return None
        d = xp.reshape(host_solve(H, xp.reshape(-b, (-1,)), xp, shift_to_pd=False), x.shape)
        ok = math.isfinite(to_float(norm(d, xp)))
        return Tangent(d, 0) if ok else None
    lin = objective.linearize(x)
    bnorm = to_float(norm(b, xp))
    if not math.isfinite(bnorm):
        return None
    if bnorm == 0.0:
        return Tangent(xp.zeros_like(b), 0)
    goal = rtol * bnorm
    d, r, n = xp.zeros_like(b), -b, 0
    rr = bnorm * bnorm
    if guess is not None:
        r_guess = -b - lin.hvp(guess)
        n += 1
        rr_guess = to_float(vdot(r_guess, r_guess, xp))
        if rr_guess < rr:
            d, r, rr = guess, r_guess, rr_guess
    p = r
    while rr**0.5 > goal and n < max_iter:
        Hp = lin.hvp(p)
        n += 1
        curv = to_float(vdot(p, Hp, xp))
        if not (curv > 0 and math.isfinite(curv)):  # not a strict minimum: no tangent
            return None
        a = rr / curv
        d = d + a * p
        r = r - a * Hp
        rr_new = to_float(vdot(r, r, xp))
        p = r + (rr_new / rr) * p
        rr = rr_new
    if not math.isfinite(rr):
        return None
    return Tangent(d, n)


def hermite(points: list, t: float, *, derivative: bool = False) -> Any:
    """The Hermite interpolation polynomial through ``points`` (each a :class:`PathPoint`
    with its tangent ``d``) at ``t``, or its derivative in ``t`` with ``derivative=True``.

    ``q`` points give the polynomial of degree ``2q - 1`` matching the values and first
    derivatives (cubic for two points); outside the points' tilts it extrapolates. The
    Newton form over the doubled nodes ``t_0, t_0, t_1, t_1, ...`` is built from divided
    differences, in which a difference over a repeated node is the tangent there.
    """
    z = [p.t for p in points for _ in (0, 1)]
    table = [p.x for p in points for _ in (0, 1)]
    coef = [table[0]]
    for lvl in range(1, len(z)):
        table = [
            points[i // 2].d
            if z[i + lvl] == z[i]
            else (table[i + 1] - table[i]) * (1.0 / (z[i + lvl] - z[i]))
            for i in range(len(z) - lvl)
        ]
        coef.append(table[0])
    # Horner's scheme for the Newton form and its derivative
    value, slope = coef[-1], None
    for k in range(len(z) - 2, -1, -1):
        slope = value if slope is None else value + (t - z[k]) * slope
        value = coef[k] + (t - z[k]) * value
    return slope if derivative else value


class Continuation:
    """Predictions and solver warm starts along one tilt path.

    ``tangents`` says whether tangents are computed at the solved points (else the
    secant through the last two solutions predicts, and each solve inherits the previous
    solver state, as before tangents existed); ``method`` and ``options`` are the path's
    solver and its options (a dense-Hessian Newton solves its tangents densely).
    """

    #: relative residual of the conjugate-gradient tangent solves: the low-curvature
    #: directions, solved last, are those an iterative solver corrects most slowly
    RTOL = 1e-6
    #: Hessian-vector products allowed per tangent
    MAX_PRODUCTS = 200

    def __init__(self, method: str, options: dict, tangents: bool):
        self.method = method
        self.tangents = tangents
        self.hessian = options.get("hessian", "auto")
        self.user_warm = "warm_state" in options or "pairs" in options
        self.n_products = 0  # Hessian-vector products of the tangent solves

    def _dense(self, x: Any) -> bool:
        if self.method != "newton":
            return False
        p = math.prod(int(s) for s in x.shape)
        return self.hessian == "dense" or (self.hessian == "auto" and p <= 500)

    def point(self, objective: Any, t: float, result: Any, *, more: bool, branch: Any = None):
        """The solved point at ``t``, with its tangent when another tilt follows."""
        x = result.x
        if not (self.tangents and more and supports_tangent(objective)):
            return PathPoint(t, x)
        guess = None  # the tangent the last points predict, to start the solve from
        if branch and branch[-1].d is not None:
            pts = [p for p in branch[-2:] if p.d is not None]
            guess = hermite(pts, t, derivative=True) if len(pts) == 2 else pts[-1].d
        # a dense Newton run's last Hessian (one step before x: its error is of the order
        # of that step, small next to the prediction's) spares forming another
        hess = getattr(getattr(result, "solver_state", None), "memo", None)
        hess = getattr(hess, "hessian", None) if self._dense(x) else None
        tan = tangent(
            objective, x, guess=guess, dense=self._dense(x), rtol=self.RTOL,
            max_iter=self.MAX_PRODUCTS, hessian=hess,
        )  # fmt: skip
        if tan is None:
            return PathPoint(t, x)
        self.n_products += tan.n_products
        return PathPoint(t, x, tan.d)

    def predict(self, objective: Any, branch: list, t: float) -> Any:
        """The start at ``t``: the prediction from the branch, or the last solution where
        its gradient norm at ``t`` is the smaller."""
        last = branch[-1]
        if last.d is not None:
            pts = branch[-2:]
            if len(pts) == 2 and pts[0].d is not None and pts[0].t != last.t:
                guess = hermite(pts, t)  # cubic: error of fourth order in the step
            else:
                guess = last.x + (t - last.t) * last.d  # error of second order
        elif len(branch) >= 2 and branch[-2].t != last.t:
            prev = branch[-2]
            guess = last.x + ((t - last.t) / (last.t - prev.t)) * (last.x - prev.x)
        else:
            return last.x
        xp = objective.xp
        g_last = to_float(norm(objective.gradient(last.x), xp))
        g_guess = to_float(norm(objective.gradient(guess), xp))
        return guess if g_guess < g_last else last.x  # a NaN gradient never wins

    def solver_options(self, warm: Any) -> dict:
        """Warm-start options for the next solve (``warm``: the last solver state).

        With tangents, L-BFGS starts without the previous run's correction pairs: the
        pairs of the end of a run describe the curvature at the rounding level of the
        last tilt and slow the next run down (measured on HIV-1).
        """
        if self.user_warm or (self.tangents and self.method == "lbfgs"):
            return {}
        return {"warm_state": warm}

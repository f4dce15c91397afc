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

The conjugate-gradient solve of the tangent equation also measures the Hessian: its
directions ``p_k`` and their products ``H p_k`` span a Krylov subspace on which the
Rayleigh-Ritz procedure gives approximate eigenpairs of ``H``. The Ritz vectors ``s`` of
the lowest Ritz values and their products ``y = H s`` (linear combinations of the products
already made) are exact curvature pairs at the solved point, of well-conditioned scale;
they seed L-BFGS at the next tilt with the curvature of the directions it resolves last.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .._compat import array_namespace, device, to_numpy
from ..objective.tilt_derivative import gradient_tilt_derivative
from ._linalg import host_solve, norm, to_float, vdot, working_eps
from .lbfgs import LBFGS

__all__ = [
    "PathPoint", "Continuation", "tangent", "hermite", "ritz_pairs", "supports_tangent",
]  # fmt: skip

#: most elements (directions and products together) a tangent solve keeps for its Ritz
#: pairs (128 MiB in float64); a longer solve on a larger problem returns no pairs
PAIR_BUDGET = 2**24


class PathPoint(NamedTuple):
    """A solved point of a path: the tilt, the solution, its tangent (or None) and the
    Ritz pairs of the tangent solve (or None)."""

    t: float
    x: Any
    d: Any = None
    pairs: Any = None


class Tangent(NamedTuple):
    """A tangent, the number of Hessian-vector products its solve made, and the Ritz
    pairs ``(S, Y)`` of the solve (see :func:`ritz_pairs`) when they were asked for."""

    d: Any
    n_products: int
    pairs: Any = None


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
    pairs: int = 0,
) -> Tangent | None:
    """The tangent ``d theta/dt`` of the path through the solution ``x`` of ``objective``.

    Solves ``H d = -b`` (``b`` the tilt derivative of the gradient) by conjugate
    gradients on the linearisation's Hessian-vector products, from ``guess`` when it
    is nearer than zero, to a relative residual ``rtol`` or ``max_iter`` products; or densely
    (``dense=True``: one Hessian, solved on the host; ``hessian``, when given, is used
    instead of computing it, e.g. the one of a Newton solver's last step). Returns
    ``None`` where ``H`` shows a direction of non-positive curvature or the result is not
    finite (then the path falls back to secant predictions).

    With ``pairs > 0`` the conjugate-gradient solve keeps its directions and their
    products (within ``PAIR_BUDGET`` elements) and returns, in ``Tangent.pairs``, the
    ``pairs`` curvature pairs of the lowest Ritz values on their span
    (:func:`ritz_pairs`); the dense solve returns none.
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
    # every product of the solve is an exact curvature pair (v, H v) at x
    limit = PAIR_BUDGET // (2 * math.prod(int(k) for k in b.shape))
    keep = pairs > 0 and limit > 0
    S: list = []
    Y: list = []
    if guess is not None:
        Hg = lin.hvp(guess)
        n += 1
        r_guess = -b - Hg
        rr_guess = to_float(vdot(r_guess, r_guess, xp))
        if rr_guess < rr:
            d, r, rr = guess, r_guess, rr_guess
        if keep:
            S.append(guess)
            Y.append(Hg)
    p = r
    while rr**0.5 > goal and n < max_iter:
        Hp = lin.hvp(p)
        n += 1
        curv = to_float(vdot(p, Hp, xp))
        if not (curv > 0 and math.isfinite(curv)):  # not a strict minimum: no tangent
            return None
        if keep and len(S) < limit:
            S.append(p)
            Y.append(Hp)
        elif keep:  # over the budget: no pairs from this solve
            keep, S, Y = False, [], []
        a = rr / curv
        d = d + a * p
        r = r - a * Hp
        rr_new = to_float(vdot(r, r, xp))
        p = r + (rr_new / rr) * p
        rr = rr_new
    if not math.isfinite(rr):
        return None
    return Tangent(d, n, ritz_pairs(S, Y, pairs) if S else None)


def ritz_pairs(S: list, Y: list, m: int) -> tuple[list, list] | None:
    """Curvature pairs of the ``m`` lowest Ritz values of ``H`` on the span of ``S``.

    ``S`` are directions and ``Y`` their products ``H s`` with a symmetric ``H`` (e.g. the
    directions of a conjugate-gradient solve). The Rayleigh-Ritz procedure on the span of
    ``S`` solves the small generalised eigenproblem ``(S H S^T) c = lam (S S^T) c`` on the
    host (directions normalised; near-dependent combinations, below ``sqrt(eps)`` of the
    largest eigenvalue of ``S S^T``, dropped); each Ritz vector ``s = S^T c`` comes with
    ``y = Y^T c = H s`` without another product. Returns ``(S', Y')``, flattened arrays
    in the namespace and dtype of the inputs ordered by decreasing Ritz value (the last
    pair has the lowest, so that L-BFGS's initial scaling ``s'y / y'y`` is ``1 / lam_min``
    of the span), or ``None`` where no direction of positive curvature is found.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.solvers._continuation import ritz_pairs
    >>> H = np.diag([1.0, 2.0, 5.0])
    >>> S = [np.array([1.0, 1.0, 0.0]), np.array([0.0, 1.0, 1.0]),
    ...      np.array([1.0, 0.0, 1.0])]
    >>> s, y = ritz_pairs(S, [H @ v for v in S], 2)
    >>> [round(float(v @ w / (v @ v)), 12) for v, w in zip(s, y)]
    [2.0, 1.0]
    """
    if not S or m < 1:
        return None
    xp = array_namespace(S[0])
    Sm = xp.stack([xp.reshape(v, (-1,)) for v in S], axis=0)
    Ym = xp.stack([xp.reshape(v, (-1,)) for v in Y], axis=0)
    k = len(S)
    G = to_numpy(Sm @ xp.permute_dims(xp.concat([Sm, Ym], axis=0), (1, 0)))
    G = G.astype(np.float64)
    if not np.all(np.isfinite(G)):
        return None
    scale = np.sqrt(np.maximum(np.diag(G[:, :k]), 0.0))
    used = scale > 0  # zero directions carry nothing
    scale = np.where(used, scale, 1.0)
    B = (G[:, :k] / np.outer(scale, scale))[np.ix_(used, used)]  # normalised directions
    A = (G[:, k:] / np.outer(scale, scale))[np.ix_(used, used)]  # their products
    if B.size == 0:
        return None
    w, U = np.linalg.eigh(B)
    keep = w > math.sqrt(working_eps(S[0])) * w[-1]
    W = U[:, keep] / np.sqrt(w[keep])  # an orthonormal basis of the span: S^T W / scale
    lam, V = np.linalg.eigh(W.T @ (0.5 * (A + A.T)) @ W)
    chosen = [i for i in range(lam.size) if lam[i] > 0][:m][::-1]
    if not chosen:
        return None
    C = np.zeros((k, len(chosen)))  # coefficients of the Ritz vectors
    C[used] = (W @ V[:, chosen]) / scale[used, None]
    Cd = xp.asarray(C.T, dtype=Sm.dtype, device=device(Sm))
    Sr, Yr = Cd @ Sm, Cd @ Ym
    return [Sr[i, :] for i in range(len(chosen))], [Yr[i, :] for i in range(len(chosen))]


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
    solver and its options (a dense-Hessian Newton solves its tangents densely). With
    tangents, L-BFGS starts each tilt from the Ritz pairs of the last tangent solve
    (:func:`ritz_pairs`, as many as its ``memory``) unless the user gave pairs or a
    solver state.
    """

    #: relative residual of the conjugate-gradient tangent solves: the low-curvature
    #: directions, solved last, are those an iterative solver corrects most slowly
    RTOL = 1e-6
    #: Hessian-vector products allowed per tangent
    MAX_PRODUCTS = 200
    #: whether L-BFGS is seeded with the Ritz pairs of the tangent solves
    SEED_PAIRS = True

    def __init__(self, method: str, options: dict, tangents: bool):
        self.method = method
        self.tangents = tangents
        self.hessian = options.get("hessian", "auto")
        self.user_warm = "warm_state" in options or "pairs" in options
        self.n_products = 0  # Hessian-vector products of the tangent solves
        seeded = self.SEED_PAIRS and tangents and method == "lbfgs" and not self.user_warm
        self.n_pairs = int(options.get("memory", LBFGS.memory)) if seeded else 0

    def rtol(self, x: Any) -> float:
        """The tangent solves' relative residual: ``RTOL``, or ``sqrt(eps)`` of ``x``'s
        working precision where that is larger (float32: conjugate gradients in single
        precision stall far above ``RTOL`` and would spend ``MAX_PRODUCTS`` on every tilt)."""
        return max(self.RTOL, math.sqrt(working_eps(x)))

    def _dense(self, x: Any) -> bool:
        if self.method != "newton":
            return False
        p = math.prod(int(s) for s in x.shape)
        return self.hessian == "dense" or (self.hessian == "auto" and p <= 500)

    def point(self, objective: Any, t: float, result: Any, *, more: bool, branch: Any = None):
        """The solved point at ``t``, with its tangent (and Ritz pairs, for L-BFGS) when
        another tilt follows. The pairs of the branch's last point are dropped: only the
        newest point's are used."""
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
        if branch and branch[-1].pairs is not None:
            branch[-1] = branch[-1]._replace(pairs=None)
        tan = tangent(
            objective, x, guess=guess, dense=self._dense(x), rtol=self.rtol(x),
            max_iter=self.MAX_PRODUCTS, hessian=hess, pairs=self.n_pairs,
        )  # fmt: skip
        if tan is None:
            return PathPoint(t, x)
        self.n_products += tan.n_products
        return PathPoint(t, x, tan.d, tan.pairs)

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

    def solver_options(self, warm: Any, last: PathPoint | None = None) -> dict:
        """Warm-start options for the next solve (``warm``: the last solver state;
        ``last``: the branch's last point).

        With tangents, L-BFGS starts from the Ritz pairs of the tangent solve at ``last``
        (exact curvature pairs at the last solution, the lowest curvatures of the
        Krylov subspace) and not from the previous run's correction pairs: those of the
        end of a run describe the curvature at the rounding level of the last tilt and
        slow the next run down (measured on HIV-1).
        """
        if self.user_warm:
            return {}
        if self.tangents and self.method == "lbfgs":
            pairs = None if last is None else last.pairs
            return {} if pairs is None else {"pairs": pairs}
        return {"warm_state": warm}

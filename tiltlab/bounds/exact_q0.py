"""The exact minimum tail fraction Q0 (:func:`min_tail_fraction`).

Q0 is a combinatorial problem (a maximum feasible subsystem). It is solved exactly, on
the host in float64, for small problems only: 1-D and 2-D point estimation (critical
radii of covering disks) and linear regression with the squared loss (vertex enumeration
or a mixed-integer program with SciPy's HiGHS). See the notes of
:func:`min_tail_fraction`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import (
    host_real,
    is_array_api_obj,
    to_numpy,
)
from .curves import _host_thresholds

__all__ = ["min_tail_fraction"]


#: Relative margin that makes "loss < a" a closed constraint (see ``min_tail_fraction``).
_STRICT_MARGIN = 1e-6
#: Most candidate vertices and reference subsets the linear-case enumeration may visit.
_MAX_CANDIDATES = 2_000_000
#: Critical levels within this relative distance of sqrt(a) are taken as equal to it.
_TIE = 1e-10


# -- exact Q0: 2-D (and 1-D) point estimation ---------------------------------------


def _critical_radii(P: np.ndarray) -> np.ndarray:
    """Radii at which the most points a closed disk can cover may change (sorted)."""
    n = P.shape[0]
    i, j = np.triu_indices(n, 1)
    radii = [0.5 * np.linalg.norm(P[i] - P[j], axis=1)]
    if P.shape[1] == 2 and n >= 3:
        T = _combinations(n, 3)
        A, B, C = P[T[:, 0]], P[T[:, 1]], P[T[:, 2]]
        ab = np.linalg.norm(A - B, axis=1)
        bc = np.linalg.norm(B - C, axis=1)
        ca = np.linalg.norm(C - A, axis=1)
        cross = np.abs((B - A)[:, 0] * (C - A)[:, 1] - (B - A)[:, 1] * (C - A)[:, 0])
        ok = cross > 1e-14 * np.maximum(ab * ca, 1e-300)
        radii.append(ab[ok] * bc[ok] * ca[ok] / (2.0 * cross[ok]))  # circumradius
    return np.unique(np.concatenate(radii))


def _combinations(n: int, m: int) -> np.ndarray:
    """All m-subsets of range(n) as rows of an integer array of shape (C(n, m), m)."""
    import itertools

    flat = itertools.chain.from_iterable(itertools.combinations(range(n), m))
    return np.fromiter(flat, dtype=np.intp, count=math.comb(n, m) * m).reshape(-1, m)


def _disk_best(P: np.ndarray, p: np.ndarray, rho: float) -> tuple[float, np.ndarray]:
    """Largest prior mass a closed disk of radius ``rho`` covers, and its centre."""
    n = P.shape[0]
    centres = [P]
    if n >= 2:
        i, j = np.triu_indices(n, 1)
        diff = P[j] - P[i]
        dist = np.linalg.norm(diff, axis=1)
        ok = (dist <= 2.0 * rho) & (dist > 0)
        mid = 0.5 * (P[i][ok] + P[j][ok])
        h = np.sqrt(np.maximum(rho * rho - 0.25 * dist[ok] ** 2, 0.0))
        perp = np.stack([-diff[ok][:, 1], diff[ok][:, 0]], axis=1) / dist[ok][:, None]
        centres += [mid + h[:, None] * perp, mid - h[:, None] * perp]
    C = np.concatenate(centres, axis=0)
    best_mass, best_c = -1.0, P[0]
    lim = rho * rho * (1.0 + 1e-12) + 1e-300
    for s in range(0, C.shape[0], 4096):
        blk = C[s : s + 4096]
        d2 = ((blk[:, None, :] - P[None, :, :]) ** 2).sum(axis=-1)
        mass = (d2 <= lim) @ p
        k = int(np.argmax(mass))
        if mass[k] > best_mass:
            best_mass, best_c = float(mass[k]), blk[k]
    return best_mass, best_c


def _q0_points(P: np.ndarray, p: np.ndarray, aa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact Q0 for the losses ||x_i - theta||^2 (points in 1-D or 2-D)."""
    n, d = P.shape
    out = np.ones(aa.size)
    thetas = np.tile(P.mean(axis=0), (aa.size, 1))
    radii = _critical_radii(P) if d == 2 else None
    order = np.argsort(P[:, 0]) if d == 1 else None
    for k, a_k in enumerate(aa.reshape(-1)):
        if a_k <= 0:
            continue  # every loss is >= 0 >= a: Q = 1
        r = math.sqrt(a_k)
        if d == 1:
            x = P[order, 0]
            w = p[order]
            cum = np.concatenate([[0.0], np.cumsum(w)])
            ends = np.searchsorted(x, x + 2.0 * r, side="left")  # points in [x_i, x_i + 2r)
            mass = cum[ends] - cum[np.arange(n)]
            i = int(np.argmax(mass))
            centre = np.array([0.5 * (x[i] + x[ends[i] - 1])])
        else:
            assert radii is not None  # computed above for d == 2
            # radii within a relative _TIE of r count as equal to r (rounding in their
            # computation must not turn a tie at the boundary into a strict inclusion)
            below = radii[radii < r * (1.0 - _TIE)]
            # the most points a closed disk covers is constant between consecutive critical
            # radii, so any radius in (largest critical radius below r, r) gives the supremum
            # over radii < r, which is the most points an open disk of radius r covers
            rho = 0.5 * (below[-1] + r) if below.size else 0.5 * r
            _, centre = _disk_best(P, p, rho)
        loss = ((P - centre) ** 2).sum(axis=1)
        out[k] = float(p[loss >= a_k].sum())
        thetas[k] = centre
    return out.reshape(aa.shape), thetas.reshape(aa.shape + (d,))


# -- exact Q0: linear regression with the squared loss ----------------------------------


def _row_space(X: np.ndarray) -> np.ndarray:
    """Orthonormal basis (d, r) of the row space of X."""
    _, S, Vt = np.linalg.svd(X, full_matrices=False)
    r = int(np.sum(S > 1e-12 * S[0])) if S.size and S[0] > 0 else 0
    if r == 0:
        raise ValueError("`X` of the objective is all zero; Q0 is trivial and not computed")
    return Vt[:r].T


def _enumeration_size(n: int, r: int) -> int:
    """Candidate vertices plus reference subsets visited by the enumeration."""
    vertices = sum(math.comb(n, m) * 2**m for m in range(1, r + 1))
    references = sum(math.comb(n, m + 1) for m in range(1, r + 1))
    return vertices + references


def _vertex_systems(Xr: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For every linearly independent row subset B (sizes 1..r): B, pinv(X_B), signs."""
    import itertools

    n, r = Xr.shape
    scale = float(np.linalg.norm(Xr, 2))
    out = []
    for m in range(1, min(r, n) + 1):
        B = _combinations(n, m)
        XB = Xr[B]  # (K, m, r)
        sv = np.linalg.svd(XB, compute_uv=False)
        keep = sv[:, -1] > 1e-10 * scale
        B, XB = B[keep], XB[keep]
        if B.shape[0] == 0:
            continue
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=m)))  # (2^m, m)
        out.append((B, np.linalg.pinv(XB), signs))
    return out


def _vertices(systems, y: np.ndarray, s: float):
    """Blocks of candidate vertices pinv(X_B) (y_B +- s)."""
    for B, Pinv, signs in systems:
        yB = y[B]
        for sg in signs:
            V = np.einsum("kij,kj->ki", Pinv, yB + s * sg)
            for c in range(0, V.shape[0], 20000):
                yield V[c : c + 20000]


def _critical_levels(Xr: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Chebyshev (minimax) residuals of the row subsets T with |T| = rank(X_T) + 1, sorted.

    The smallest ``s`` for which a set ``S`` of samples fits in a strip
    ``|x_i theta - y_i| <= s`` is the Chebyshev residual of ``S``, attained on such a
    subset ``T`` (a basic solution of the LP dual), where it is ``|lam . y_T| / ||lam||_1``
    with ``lam`` spanning the left null space of ``X_T``.
    """
    n, r = Xr.shape
    scale = float(np.linalg.norm(Xr, 2))
    levels = [np.zeros(1)]
    for m in range(1, min(r, n - 1) + 1):
        T = _combinations(n, m + 1)
        for c in range(0, T.shape[0], 50000):
            blk = T[c : c + 50000]
            U, S, _ = np.linalg.svd(Xr[blk], full_matrices=True)  # U: (K, m+1, m+1)
            # rank exactly m: m singular values above the noise level (S has min(m+1, r))
            big = np.sum(S > 1e-10 * scale, axis=1)
            ok = big == m
            lam = U[:, :, -1]
            h = np.abs(np.sum(lam * y[blk], axis=1)) / np.sum(np.abs(lam), axis=1)
            levels.append(h[ok])
    return np.unique(np.concatenate(levels))


def _q0_linear_enumerate(Xr, y, p, aa):
    """Exact Q0 by enumerating the vertices of the strip arrangement (small rank)."""
    systems = _vertex_systems(Xr)
    levels = _critical_levels(Xr, y)
    out = np.ones(aa.size)
    phis = np.zeros((aa.size, Xr.shape[1]))
    for k, a_k in enumerate(aa.reshape(-1)):
        if a_k <= 0:
            continue
        s = math.sqrt(a_k)
        # the most mass a closed strip of half-width s' can hold changes only at critical
        # levels, so any s' between the largest level below s and s gives the supremum over
        # s' < s: the most mass an open strip of half-width s holds
        below = levels[levels < s * (1.0 - _TIE)]
        s_in = 0.5 * (below[-1] + s) if below.size else 0.5 * s
        best, phi = -1.0, np.zeros(Xr.shape[1])
        for V in _vertices(systems, y, s_in):
            mass = (np.abs(V @ Xr.T - y) <= s_in * (1.0 + 1e-12)) @ p
            j = int(np.argmax(mass))
            if mass[j] > best:
                best, phi = float(mass[j]), V[j]
        out[k] = float(p[(Xr @ phi - y) ** 2 >= a_k].sum())
        phis[k] = phi
    return out, phis


def _box_from_vertices(Xr, y, p, s, systems):
    """Box (lo, hi) that contains a minimiser of the tail share (see min_tail_fraction)."""
    verts, closed_mass, strict_best = [], [], 0.0
    for V in _vertices(systems, y, s):
        R = np.abs(V @ Xr.T - y)
        verts.append(V)
        closed_mass.append((R <= s * (1 + 1e-9) + 1e-12) @ p)
        strict_best = max(strict_best, float(((R < s * (1 - 1e-9)) @ p).max()))
    V = np.concatenate(verts)
    keep = np.concatenate(closed_mass) >= strict_best - 1e-12
    lo, hi = V[keep].min(axis=0), V[keep].max(axis=0)
    pad = 1e-6 * (hi - lo) + 1e-9 * (1.0 + np.abs(lo) + np.abs(hi))
    return lo - pad, hi + pad


def _milp_tail(Xr, y, p, s, lo, hi, margin, time_limit, cuts=()):
    """min sum p_i z_i  s.t. |x_i phi - y_i| <= s - margin + M_i z_i, phi in [lo, hi],
    and sum_{i in S} z_i >= 1 for each set S of ``cuts`` (sets known not to fit)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, r = Xr.shape
    centre, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    M = np.maximum(np.abs(Xr) @ half + np.abs(Xr @ centre - y) - s + margin, 0.0)
    D = np.diag(M)
    A = np.block([[Xr, -D], [-Xr, -D]])
    ub = np.concatenate([y + s - margin, -y + s - margin])
    constraints = [LinearConstraint(A, -np.inf, ub)]
    if cuts:
        C = np.concatenate([np.zeros((len(cuts), r)), np.array(cuts, dtype=np.float64)], axis=1)
        constraints.append(LinearConstraint(C, 1.0, np.inf))
    with _quiet_stdout():  # HiGHS prints MIP debug lines to the C-level stdout
        res = milp(
            np.concatenate([np.zeros(r), p]),
            integrality=np.concatenate([np.zeros(r), np.ones(n)]),
            bounds=Bounds(np.concatenate([lo, np.zeros(n)]), np.concatenate([hi, np.ones(n)])),
            constraints=constraints,
            options={"time_limit": float(time_limit), "mip_rel_gap": 0.0},
        )
    if res.status == 1:
        raise RuntimeError(
            f"the MILP for Q0 hit `time_limit`={time_limit} s before proving optimality; raise "
            "it or use fewer samples"
        )
    if res.x is None or res.status != 0:  # pragma: no cover - the problem is always feasible
        raise RuntimeError(f"the MILP for Q0 failed: {res.message}")
    return res.x[:r], res.x[r:] < 0.5


class _quiet_stdout:
    """Silence writes to file descriptor 1 (C libraries) for the duration of a block."""

    def __enter__(self):
        import os
        import sys

        sys.stdout.flush()
        try:
            self._saved = os.dup(1)
        except OSError:  # pragma: no cover - no fd 1 (embedded interpreters)
            self._saved = None
            return self
        self._null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self._null, 1)
        return self

    def __exit__(self, *exc):
        import os

        if self._saved is not None:
            os.dup2(self._saved, 1)
            os.close(self._saved)
            os.close(self._null)
        return False


def _polish(Xr, y, s, lo, hi, inside):
    """A point with |x_i phi - y_i| <= s - delta on ``inside``, delta as large as possible."""
    from scipy.optimize import linprog

    r = Xr.shape[1]
    Xi, yi = Xr[inside], y[inside]
    ones = np.ones((Xi.shape[0], 1))
    A = np.block([[Xi, ones], [-Xi, ones]])
    ub = np.concatenate([yi + s, -yi + s])
    c = np.zeros(r + 1)
    c[-1] = -1.0
    res = linprog(c, A_ub=A, b_ub=ub, bounds=list(zip(lo, hi, strict=True)) + [(None, s)])
    return (res.x[:r], float(res.x[-1])) if res.status == 0 else (None, -np.inf)


def _q0_linear_milp(Xr, y, p, aa, box, time_limit):
    """Q0 by the big-M MILP; ``box`` is (lo, hi) or None (box from the vertices)."""
    systems = _vertex_systems(Xr) if box is None else None
    out = np.ones(aa.size)
    phis = np.zeros((aa.size, Xr.shape[1]))
    n = Xr.shape[0]
    for k, a_k in enumerate(aa.reshape(-1)):
        if a_k <= 0:
            continue
        s = math.sqrt(a_k)
        margin = _STRICT_MARGIN * max(1.0, s)
        lo, hi = _box_from_vertices(Xr, y, p, s, systems) if box is None else box
        cuts: list[np.ndarray] = []
        best_q, best_phi = math.inf, np.zeros(Xr.shape[1])
        while True:
            phi, inside = _milp_tail(Xr, y, p, s, lo, hi, margin, time_limit, cuts)
            q_milp = float(p[~inside].sum())
            q = float(p[(Xr @ phi - y) ** 2 >= a_k].sum())
            fits = q <= q_milp + 1e-12
            if not fits:
                # the solver's integrality/feasibility tolerances (of the size of the margin)
                # let a "fitted" residual reach sqrt(a): re-centre the fitted set with an LP,
                # then re-check exactly
                phi2, delta = _polish(Xr, y, s, lo, hi, inside)
                if phi2 is not None and delta > 0:
                    phi = phi2
                    q = float(p[(Xr @ phi - y) ** 2 >= a_k].sum())
                    fits = True
            if q < best_q:
                best_q, best_phi = q, phi
            if fits or len(cuts) >= 4 * n:
                break
            # the set touches the strip's edge and cannot be fitted strictly (nor can any
            # set holding it): cut it off and solve again
            cuts.append(inside.astype(np.float64))
        out[k] = best_q
        phis[k] = best_phi
    return out, phis


def _q0_linear(X, y, p, aa, method, theta_bound, time_limit):
    n, d = X.shape
    if theta_bound is not None:
        b = np.broadcast_to(np.asarray(theta_bound, dtype=np.float64), (d,))
        if not np.all(np.isfinite(b)) or np.any(b <= 0):
            raise ValueError(
                "`theta_bound` must be positive and finite (scalar or one per feature)"
            )
        if method == "enumerate":
            raise ValueError("`theta_bound` is for method='milp'")
        q, th = _q0_linear_milp(X, y, p, aa, (-b, b), time_limit)
        return q.reshape(aa.shape), th.reshape(aa.shape + (d,))
    V = _row_space(X)
    Xr = X @ V
    size = _enumeration_size(n, Xr.shape[1])
    if size > _MAX_CANDIDATES:
        raise ValueError(
            f"too large to solve exactly: the enumeration (which also bounds the MILP's "
            f"parameters) visits {size} vertices and subsets for N={n} samples of rank "
            f"{Xr.shape[1]}; at most {_MAX_CANDIDATES} are allowed. Use fewer samples or "
            "features, or method='milp' with a `theta_bound` known to hold a minimiser."
        )
    if method == "milp":
        q, phi = _q0_linear_milp(Xr, y, p, aa, None, time_limit)
    else:
        q, phi = _q0_linear_enumerate(Xr, y, p, aa)
    return q.reshape(aa.shape), (phi @ V.T).reshape(aa.shape + (d,))


def min_tail_fraction(
    objective: Any,
    a: Any,
    *,
    method: str = "auto",
    weights: Any = None,
    theta_bound: Any = None,
    max_samples: int = 200,
    time_limit: float = 60.0,
    return_minimizers: bool = False,
) -> Any:
    r"""Exact :math:`Q^0(a) = \min_\theta Q(a;\theta)` for small problems.

    :math:`Q(a;\theta)` is the share of samples whose loss is at least ``a``; its global
    minimum over the parameters is the paper's :math:`Q^0`, the reference for the TERM
    curves :math:`Q^1 \le Q^2 \le Q^3` (:func:`quantile_curves`). It is a non-convex
    combinatorial problem (a maximum feasible subsystem); two cases are solved exactly.
    The value returned is always attained: it is the tail share, recomputed from the
    losses, of the minimiser found (``return_minimizers=True`` returns it).

    **Linear regression, squared loss** (``objective`` a :class:`~tiltlab.TiltedObjective`
    with ``loss="squared"``; its tilt and ridge penalty play no role). A sample stays
    below ``a`` iff :math:`|x_i\theta - y_i| < s`, :math:`s = \sqrt a`, so
    :math:`1 - Q^0(a)` is the largest prior mass of samples an open strip of half-width
    ``s`` around a hyperplane can hold. ``theta`` is written in the row space of ``X``
    (directions ``X`` cannot see change no loss), of dimension ``r``.

    * ``method="enumerate"`` (exact): for a *closed* strip of half-width ``s'`` the best
      set ``S`` of samples is fitted by a bounded polytope of ``theta`` (in the row
      space of ``X_S``), whose vertices solve ``x_i theta = y_i +- s'`` on a linearly
      independent subset ``B`` of ``S``: ``theta = pinv(X_B)(y_B +- s')``. Enumerating these
      candidate vertices and counting the samples each fits gives the closed-strip
      optimum. That optimum changes with ``s'`` only at *critical levels*, the Chebyshev
      residuals of subsets ``T`` with ``|T| = rank(X_T) + 1`` (``|lam . y_T| / ||lam||_1``,
      ``lam`` the left null vector of ``X_T``), so evaluating it at ``s'`` halfway between
      the largest critical level below ``s`` and ``s`` gives the open-strip optimum
      exactly. Levels within a relative ``1e-10`` of ``s`` count as equal to it. Cost:
      ``sum_{m<=r} C(N, m) (2^m + 1)``, about ``2 N^2`` for a feature plus an intercept
      and ``N^3`` for two features plus an intercept.
    * ``method="milp"``: the mixed-integer program

      .. math:: \min \sum_i p_i z_i \quad\text{s.t.}\quad
                \pm(x_i\theta - y_i) \le s - m + M_i z_i,\;
                z_i \in \{0, 1\},\; \theta \in [\ell, u],

      solved with :func:`scipy.optimize.milp` (HiGHS, relative gap 0). The strict
      inequality is made closed with a margin ``m = 1e-6 max(1, s)`` (a residual within
      ``m`` of ``s`` counts as in the tail). *Box and big-M:* the vertices above (with
      ``s' = s``) of the best set's polytope each fit at least as much mass as the best
      strictly feasible candidate vertex, a lower bound on the optimum; so the box
      spanned by the candidate vertices that fit that much mass contains a minimiser, and
      ``M_i`` is the largest ``|x_i theta - y_i| - s + m`` over it (tight: of the order of
      the residuals). With ``theta_bound`` the box is ``[-theta_bound, theta_bound]``
      instead (no enumeration, for more features; then the result is exact only if the
      box holds a global minimiser, which the caller guarantees). HiGHS's minimiser is
      re-checked exactly (re-centred by an LP where a fitted residual touches ``s``); a
      set that no point fits strictly (integer data) is cut off and the program solved
      again. On a degenerate instance (equally spaced ``x``, alternating ``y``, scipy
      1.17.1) HiGHS called a non-optimal point optimal: ``"auto"`` prefers enumeration.
    * ``method="auto"`` (default): the enumeration when its size is at most two million
      candidates, otherwise ``ValueError`` (use ``"milp"`` with ``theta_bound``).

    **Point estimation** (``objective`` an ``(N, 2)`` or ``(N, 1)`` array of points, the
    loss :math:`\|x_i - \theta\|^2` of :func:`tiltlab.datasets.point_estimation_losses`).
    The best ``theta`` centres an open disk of radius ``s`` holding the most mass. The most
    mass a *closed* disk of radius ``rho`` holds is attained by a disk centred on a point
    or with two points on its boundary (slide, then rotate an optimal disk), so
    enumerating those ``O(N^2)`` centres finds it in ``O(N^3)``; it changes only at half
    pairwise distances and circumradii of triples, so evaluating it halfway between the
    largest such radius below ``s`` and ``s`` gives the open-disk optimum exactly (the
    same ``1e-10`` tie rule). In 1-D a sliding window over the sorted points does it.
    ``method`` is ignored.

    Parameters
    ----------
    objective : TiltedObjective or array of shape (N, 2) or (N, 1)
        A sample-level objective with the squared loss of a linear model, or the points
        of a point-estimation problem.
    a : float or 1-d array
        Thresholds. ``a <= 0`` gives 1 (every loss is non-negative).
    method : {"auto", "enumerate", "milp"}, default "auto"
        Linear case only (see above).
    weights : array of shape (N,), optional
        Prior weights for the point-estimation case (an objective brings its own prior);
        :math:`Q` is then the prior mass at or above ``a``.
    theta_bound : float or array of shape (d,), optional
        ``method="milp"``: a box ``|theta_j| <= theta_bound_j`` known to contain a global
        minimiser, replacing the enumerated box.
    max_samples : int, default 200
        Larger problems raise ``ValueError`` rather than run for a long time.
    time_limit : float, default 60
        Seconds allowed for each MILP; one that stops before proving optimality raises
        ``RuntimeError``.
    return_minimizers : bool, default False
        Also return the minimisers :math:`\theta^0(a)`.

    Returns
    -------
    Q0 : ndarray
        Shape of ``a``, float64. NumPy and SciPy only: the data are moved to the host.
    theta0 : ndarray
        Only with ``return_minimizers=True``: shape ``a.shape + (d,)``.

    Raises
    ------
    ValueError
        More than ``max_samples`` samples or too many candidates ("too large to solve
        exactly"), bad ``a``, ``method`` or ``theta_bound``.
    NotImplementedError
        Other losses, multi-output or hierarchical objectives, points in 3 or more
        dimensions: no exact method is implemented for them.
    RuntimeError
        A MILP that hit ``time_limit``.

    See Also
    --------
    quantile_curves : The approximations Q^1, Q^2, Q^3 along a tilt path.
    tail_fraction : The tail share at one model.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import min_tail_fraction
    >>> points = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, 0.8], [5.0, 5.0]])
    >>> min_tail_fraction(points, np.array([0.2, 0.25, 0.5])).tolist()  # radius sqrt(a)
    [0.75, 0.5, 0.25]
    >>> import tiltlab as tl
    >>> X = np.c_[np.arange(6.0), np.ones(6)]
    >>> y = np.array([0.0, 1.0, 2.0, 3.0, 10.0, -10.0])
    >>> float(min_tail_fraction(tl.TiltedObjective("squared", X, y), 0.01))
    0.3333333333333333
    """
    aa = _host_thresholds(a)
    if method not in ("auto", "enumerate", "milp"):
        raise ValueError(f"`method` must be 'auto', 'enumerate' or 'milp', got {method!r}")
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)):
        raise TypeError(f"`max_samples` must be an integer, got {max_samples!r}")
    if not time_limit > 0:
        raise ValueError(f"`time_limit` must be positive, got {time_limit!r}")
    if is_array_api_obj(objective) or isinstance(objective, (list, tuple, np.ndarray)):
        P = _host_points(objective)
        n = P.shape[0]
        p = _host_prior(weights, n)
        _check_size(n, max_samples)
        q0, thetas = _q0_points(P, p, aa)
    else:
        X, y, p = _linear_problem(objective, weights)
        _check_size(X.shape[0], max_samples)
        q0, thetas = _q0_linear(X, y, p, aa, method, theta_bound, time_limit)
    return (q0, thetas) if return_minimizers else q0


def _check_size(n: int, max_samples: int) -> None:
    if n > max_samples:
        raise ValueError(
            f"too large to solve exactly: {n} samples > `max_samples`={max_samples} (the "
            "exact methods are combinatorial; raise `max_samples` to try anyway)"
        )


def _host_points(objective: Any) -> np.ndarray:
    P = np.asarray(to_numpy(objective) if is_array_api_obj(objective) else objective)
    if P.dtype.kind not in "iuf":
        raise TypeError(f"`objective` points must be real numbers, got dtype {P.dtype}")
    P = P.astype(np.float64)
    if P.ndim != 2 or P.shape[0] == 0:
        raise ValueError(f"points must have shape (N, 1) or (N, 2), got {P.shape}")
    if P.shape[1] > 2:
        raise NotImplementedError(
            f"exact Q0 for point estimation is implemented in 1-D and 2-D, not in {P.shape[1]}-D"
        )
    if not np.all(np.isfinite(P)):
        raise ValueError("points must be finite")
    return P


def _host_prior(weights: Any, n: int) -> np.ndarray:
    if weights is None:
        return np.full(n, 1.0 / n)
    p = host_real(weights, "weights", "N finite non-negative numbers").astype(np.float64)
    if p.shape != (n,) or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("`weights` must be N finite non-negative numbers, not all zero")
    return p / p.sum()


def _linear_problem(obj: Any, weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    loss = getattr(obj, "loss", None)
    if loss is None or not hasattr(obj, "losses"):
        raise TypeError(
            "`objective` must be a TiltedObjective (squared loss) or an array of points"
        )
    if getattr(obj, "is_hierarchical", False):
        raise NotImplementedError("exact Q0 is implemented for sample-level objectives")
    if loss.name != "squared" or not loss.is_linear or len(obj.shape) != 1:
        raise NotImplementedError(
            f"exact Q0 is implemented for the squared loss of a linear model and for point "
            f"estimation, not for the {loss.name!r} loss"
        )
    if weights is not None:
        raise ValueError("`weights` is for points; an objective brings its own prior")
    X = np.asarray(to_numpy(obj.X), dtype=np.float64)
    y = np.asarray(to_numpy(obj.y), dtype=np.float64)
    prior = obj.prior()
    n = X.shape[0]
    p = np.full(n, 1.0 / n) if prior is None else np.asarray(to_numpy(prior), dtype=np.float64)
    return X, y, p

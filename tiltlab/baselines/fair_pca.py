"""Min-max fair PCA: the semidefinite relaxation of Samadi et al. (2018), solved with SciPy.

For groups ``X_g`` (``n_g x d``) and a target dimension ``r``, the excess reconstruction
loss of a projection matrix ``P`` is

``loss_g(P) = (||X_g - X_g P||_F^2 - ||X_g - Xhat_g||_F^2) / n_g``

(``Xhat_g`` the best rank-``r`` approximation of ``X_g``), the group loss of
:class:`tiltlab.losses.FairPCALoss`. For a projector ``P = U U^T`` it equals
``c_g - <B_g, P>`` with ``B_g = X_g^T X_g / n_g`` and ``c_g = (||X_g||_F^2 -
||X_g - Xhat_g||_F^2) / n_g``: linear in ``P``. Samadi et al. relax the rank-``r`` projectors
to their convex hull, the Fantope ``{P : 0 <= P <= I, tr P = r}``, and solve

``min_P max_g loss_g(P)``  over the Fantope,

a semidefinite program whose value is a lower bound on the loss of every rank-``r``
projection (for two groups they show an optimal ``P`` of rank at most ``r + 1`` exists).
Its value is the limit of TERM-PCA as ``t -> +inf`` when that limit closes the relaxation.

No SDP solver is needed: the extreme points of the Fantope are the rank-``r`` projectors,
and the linear function ``<M, P>`` is maximised over it by the projector onto the top ``r``
eigenvectors of ``M``. :func:`fair_pca_sdp` therefore solves the program by column
generation (Dantzig-Wolfe) with SciPy's HiGHS linear programming: ``P`` is kept as a convex
combination of projectors; the LP over the combination weights gives an upper bound and the
group prices ``lambda`` (its dual); the projector onto the top ``r`` eigenvectors of
``sum_g lambda_g B_g`` is the next column, and the Lagrangian dual value
``sum_g lambda_g c_g - (sum of the top r eigenvalues of sum_g lambda_g B_g)`` is a lower
bound. It stops when the two bounds meet.

Reference: S. Samadi, U. Tantipongpipat, J. Morgenstern, M. Singh, S. Vempala, "The Price
of Fair PCA: One Extra Dimension", NeurIPS 2018.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
import scipy.optimize

from ._linalg import _check_iterations

__all__ = ["FairPCASDPResult", "fair_pca_sdp"]


@dataclass(frozen=True)
class FairPCASDPResult:
    """Solution of the min-max fair-PCA relaxation (see :func:`fair_pca_sdp`).

    Attributes
    ----------
    projection : ndarray, shape (d, d)
        The optimal ``P`` in the Fantope (symmetric, eigenvalues in ``[0, 1]``, trace ``r``).
    losses : ndarray, shape (G,)
        ``loss_g(P)`` per group.
    value : float
        ``max_g loss_g(P)``, the relaxation's optimal value (up to ``gap``).
    lower_bound : float
        The Lagrangian dual value at ``group_weights``: no ``P`` in the Fantope (hence no
        rank-``r`` projection) has a worst-group loss below it.
    group_weights : ndarray, shape (G,)
        The optimal dual prices ``lambda`` (non-negative, summing to one).
    rank : int
        Number of eigenvalues of ``projection`` above ``1e-8``.
    n_iter : int
        Column-generation iterations.

    See Also
    --------
    fair_pca_sdp : The solver that returns this result.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import fair_pca_sdp
    >>> a = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    >>> res = fair_pca_sdp([a, a[:, ::-1]], 1)
    >>> res.rank, round(res.value, 6), bool(0.0 <= res.gap <= 1e-6 * res.value)
    (2, 0.75, True)
    """

    projection: np.ndarray
    losses: np.ndarray
    value: float
    lower_bound: float
    group_weights: np.ndarray
    rank: int
    n_iter: int

    @property
    def gap(self) -> float:
        """``value - lower_bound`` (non-negative; the certified optimality gap)."""
        return self.value - self.lower_bound


def _top_projector(M: np.ndarray, r: int) -> tuple[np.ndarray, float]:
    """Projector onto the top ``r`` eigenvectors of symmetric ``M``, and their sum."""
    d = M.shape[0]
    vals, vecs = scipy.linalg.eigh(M, subset_by_index=(d - r, d - 1))
    return vecs @ vecs.T, float(np.sum(vals))


def _check_inputs(
    groups_data: Any, n_components: Any, rtol: float, atol: float
) -> tuple[list[np.ndarray], int]:
    """The groups as float64 matrices and the target rank, checked (errors name them)."""
    if isinstance(groups_data, np.ndarray) or not isinstance(groups_data, Sequence):
        raise TypeError("`groups_data` must be a sequence of (n_g, d) arrays, one per group")
    if len(groups_data) == 0:
        raise ValueError("`groups_data` must hold at least one group")
    mats = [np.asarray(g, dtype=np.float64) for g in groups_data]
    for i, m in enumerate(mats):
        if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
            raise ValueError(f"`groups_data[{i}]` must be a non-empty 2-d array, got {m.shape}")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"`groups_data[{i}]` must be finite")
    d = mats[0].shape[1]
    if any(m.shape[1] != d for m in mats):
        raise ValueError("`groups_data` arrays must all have the same number of columns")
    if isinstance(n_components, bool) or int(n_components) != n_components:
        raise ValueError(f"`n_components` must be an integer, got {n_components!r}")
    r = int(n_components)
    if not 1 <= r <= d:
        raise ValueError(f"`n_components` must lie in [1, {d}], got {r}")
    if not (rtol > 0 and atol >= 0):
        raise ValueError(f"`rtol` must be positive and `atol` non-negative, got {rtol!r}, {atol!r}")
    return mats, r


def fair_pca_sdp(
    groups_data: Sequence[np.ndarray],
    n_components: int,
    *,
    rtol: float = 1e-6,
    atol: float = 1e-12,
    max_iter: int = 2000,
) -> FairPCASDPResult:
    """Samadi et al.'s min-max fair-PCA semidefinite relaxation, solved exactly with SciPy.

    Minimises the largest excess reconstruction loss ``loss_g(P)`` over the Fantope
    ``{0 <= P <= I, tr P = r}`` by column generation over rank-``r`` projectors (see the
    module docstring), until the primal value and the dual lower bound differ by at most
    ``rtol * value + atol * max_g c_g`` (``c_g``: the loss of the zero matrix, the scale).

    Parameters
    ----------
    groups_data : sequence of array_like
        One ``(n_g, d)`` matrix per group (already centred/scaled as wanted).
    n_components : int
        Target dimension ``r`` (``1 <= r <= d``).
    rtol, atol : float, default 1e-6 and 1e-12
        Relative and absolute tolerances on the certified duality gap.
    max_iter : int, default 2000
        Cap on the column-generation iterations; a ``RuntimeError`` past it.

    Returns
    -------
    FairPCASDPResult
        The optimal projection, the per-group losses, the certified lower bound and the
        dual group weights.

    Raises
    ------
    TypeError
        If `groups_data` is not a sequence of arrays.
    ValueError
        If a group is empty, non-finite or of another width, or `n_components`, `rtol`
        or `atol` is out of range.
    RuntimeError
        If the column generation does not converge within `max_iter` iterations.

    See Also
    --------
    FairPCASDPResult : The returned solution.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import fair_pca_sdp
    >>> a = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    >>> b = a[:, ::-1]  # the same data with the axes swapped
    >>> res = fair_pca_sdp([a, b], 1)
    >>> res.projection.round(6)  # half of each axis: the two groups are served equally
    array([[0.5, 0. ],
           [0. , 0.5]])
    >>> res.losses.round(6)
    array([0.75, 0.75])
    """
    mats, r = _check_inputs(groups_data, n_components, rtol, atol)
    max_iter = _check_iterations(max_iter, "max_iter")
    G = len(mats)
    B = np.stack([m.T @ m / m.shape[0] for m in mats])  # (G, d, d)
    c = np.empty(G)
    for g, m in enumerate(mats):
        sv = np.linalg.svd(m, compute_uv=False)
        c[g] = float(np.sum(sv[:r] ** 2)) / m.shape[0]  # ||X||^2 - tail = top-r energy
    # loss_g(P) = c_g - <B_g, P>; c_g is also the loss of the zero matrix, the scale
    scale = float(np.max(c))

    # start from each group's own PCA and the unweighted combination
    columns = [_top_projector(B[g], r)[0] for g in range(G)]
    columns.append(_top_projector(B.mean(axis=0), r)[0])
    gains = [np.einsum("gij,ij->g", B, P) for P in columns]  # <B_g, P_k>

    best_lower = -np.inf
    best_weights = np.full(G, 1.0 / G)
    n_iter = 0
    while True:
        n_iter += 1
        K = len(columns)
        # loss of every column, L[g, k] = loss_g(P_k): the master LP works with these small
        # numbers (not c_g and <B_g, P_k>, which nearly cancel), scaled to order one, so
        # that HiGHS's absolute tolerances do not limit the gap
        L = c[:, None] - np.stack(gains, axis=1)  # (G, K)
        unit = max(float(np.max(np.abs(L))), np.finfo(np.float64).tiny)
        # variables (mu_1..mu_K, z): min z s.t. L_g mu / unit <= z, sum mu = 1, mu >= 0
        cost = np.zeros(K + 1)
        cost[-1] = 1.0
        A_ub = np.hstack([L / unit, -np.ones((G, 1))])
        A_eq = np.concatenate([np.ones(K), [0.0]])[None, :]
        bounds = [(0.0, None)] * K + [(None, None)]
        lp = scipy.optimize.linprog(
            cost,
            A_ub=A_ub,
            b_ub=np.zeros(G),
            A_eq=A_eq,
            b_eq=[1.0],
            bounds=bounds,
            method="highs",
            options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
        )
        if lp.status != 0:  # pragma: no cover - the LP is always feasible and bounded
            raise RuntimeError(f"fair-PCA master LP failed: {lp.message}")
        mu = np.clip(lp.x[:K], 0.0, None)
        mu /= mu.sum()
        upper = float(np.max(L @ mu))  # the worst group's loss at the primal point
        lam = np.clip(-np.asarray(lp.ineqlin.marginals, dtype=np.float64), 0.0, None)
        lam = lam / lam.sum() if lam.sum() > 0 else np.full(G, 1.0 / G)
        P_new, top = _top_projector(np.einsum("g,gij->ij", lam, B), r)
        lower = float(lam @ c) - top
        if lower > best_lower:
            best_lower, best_weights = lower, lam
        if upper - best_lower <= rtol * abs(upper) + atol * scale:
            break
        if n_iter >= max_iter:
            raise RuntimeError(
                f"fair_pca_sdp did not converge in `max_iter` = {max_iter} iterations "
                f"(gap {upper - best_lower:.3g})"
            )
        columns.append(P_new)
        gains.append(np.einsum("gij,ij->g", B, P_new))
    P = np.einsum("k,kij->ij", mu, np.stack(columns[:K]))
    P = 0.5 * (P + P.T)
    losses = c - np.einsum("gij,ij->g", B, P)
    eig = np.linalg.eigvalsh(P)
    return FairPCASDPResult(
        projection=P,
        losses=losses,
        value=float(np.max(losses)),
        lower_bound=float(best_lower),
        group_weights=best_weights,
        rank=int(np.sum(eig > 1e-8)),
        n_iter=n_iter,
    )

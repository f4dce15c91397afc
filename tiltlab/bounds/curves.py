"""The paper's curves along a tilt path: :func:`quantile_curves` (Q1, Q2, Q3).

Host-side NumPy code: a path's solutions and losses are moved to the host in float64
whatever their backend, and the results are NumPy arrays. The exact Q0 is in
:mod:`tiltlab.bounds.exact_q0`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import (
    host_real,
    to_numpy,
)
from .quantiles import tail_fraction
from .tail_bounds import tilted_tail_bound

__all__ = ["quantile_curves"]


def _host_thresholds(a: Any) -> np.ndarray:
    """Thresholds as a finite float64 host array (0-d or 1-d)."""
    if isinstance(a, bool) or a is None:
        raise TypeError(f"`a` must be a real number or a 1-d array, got {a!r}")
    arr = host_real(a, "a", "a real number or a 1-d array").astype(np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size == 0):
        raise ValueError(f"`a` must be a scalar or a non-empty 1-d array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("`a` must be finite")
    return arr


def _path_losses(path: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(ts, losses of shape (T, N), prior or None) of a tilt path, on the host."""
    for attr in ("ts", "x", "objective"):
        if not hasattr(path, attr):
            raise TypeError(f"`path` must be a TiltPath (from tiltlab.tilt_path); no `{attr}`")
    ts = np.asarray(path.ts, dtype=np.float64)
    obj = path.objective
    rows = [
        np.asarray(to_numpy(obj.losses(path.x[k, ...])), dtype=np.float64) for k in range(ts.size)
    ]
    prior = obj.prior() if hasattr(obj, "prior") else None
    p = None if prior is None else np.asarray(to_numpy(prior), dtype=np.float64)
    return ts, np.stack(rows, axis=0), p


def quantile_curves(path: Any, a: Any, *, floor: Any = None) -> dict[str, np.ndarray]:
    r"""The paper's curves :math:`Q^1, Q^2, Q^3` (and :math:`\tilde t`) along a tilt path.

    With :math:`Q(a;\theta)` the share of losses at or above ``a``
    (:func:`tail_fraction`) and :math:`\breve\theta(t)` the path's solutions
    (appendix "TERM as an Approximate Superquantile Method", theorem "Q^0 <= Q^1 <= Q^2 <=
    Q^3"):

    * :math:`Q^1(a) = \min_t Q(a; \breve\theta(t))`, the best tail share on the path;
    * :math:`Q^3(a) = \min_t \widetilde Q(a; t, \breve\theta(t))`, the smallest value of the
      tilted tail bound (:func:`tilted_tail_bound`) at the path's own solutions, and
      :math:`\tilde t(a)` the tilt that attains it;
    * :math:`Q^2(a) = Q(a; \breve\theta(\tilde t(a)))`, the tail share of that solution.

    The minima run over the path's tilts (a grid), so they are the paper's infima
    restricted to the grid; :math:`Q^1 \le Q^2 \le Q^3` holds exactly for every grid
    (``Q^2`` is one of the values ``Q^1`` minimises over, and the bound holds for every
    tilt and parameter). The losses are those of the objective's loss function (the ridge
    penalty is not a loss), weighted by the objective's prior when it has one.

    Parameters
    ----------
    path : TiltPath
        Output of :func:`tiltlab.tilt_path` (any backend; the losses are moved to the
        host in float64).
    a : float or 1-d array
        Thresholds; every one must exceed the floor.
    floor : float, optional
        ``F``, a lower bound on every loss for every parameter value (the paper's
        :math:`\widehat F(-\infty)`). Default 0, which requires the path's losses to be
        non-negative (pass ``floor`` explicitly for losses that can be negative).

    Returns
    -------
    dict of ndarray
        ``"a"`` (the thresholds), ``"Q1"``, ``"Q2"``, ``"Q3"`` and ``"t_tilde"``, each of
        the shape of ``a``; ``"Q_path"`` and ``"bound_path"``, shape ``a.shape + (T,)``,
        the tail share and the bound at each path solution. Ties in :math:`\tilde t` go to
        the first tilt in path order. ``Q3`` is not clipped: values above one mean the
        bound is vacuous there.

    Raises
    ------
    TypeError
        ``path`` is not a tilt path, ``a`` not numeric.
    ValueError
        A threshold at or below the floor; negative losses with the default floor.

    See Also
    --------
    min_tail_fraction : The exact curve Q^0.
    tiltlab.plot.plot_quantile_curves : Draws the curves.
    tiltlab.tilt_path : The path it reads.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.bounds import quantile_curves
    >>> X = np.c_[np.linspace(0, 1, 20), np.ones(20)]
    >>> y = 2 * X[:, 0] + np.where(np.arange(20) < 4, 3.0, 0.0)
    >>> path = tl.tilt_path(tl.TiltedObjective("squared", X, y, l2=1e-3), [-1.0, 0.0, 1.0])
    >>> c = quantile_curves(path, [0.5, 2.0])
    >>> bool(np.all(c["Q1"] <= c["Q2"])) and bool(np.all(c["Q2"] <= c["Q3"]))
    True
    """
    aa = _host_thresholds(a)
    ts, L, p = _path_losses(path)
    lmin = float(L.min())
    if floor is None:
        if lmin < 0:
            raise ValueError(
                "the path has negative losses; pass `floor`, a lower bound F(-inf) on every "
                "loss for every parameter value"
            )
        F = 0.0
    else:
        F = float(floor)
        if not np.isfinite(F):
            raise ValueError("`floor` must be finite")
        if F > lmin:
            raise ValueError(
                f"`floor`={F} exceeds the smallest loss on the path ({lmin}); it must be a "
                "lower bound on every loss"
            )
    if np.any(aa <= F):
        raise ValueError(f"every threshold `a` must exceed the floor F={F} (the bound needs a > F)")
    a1 = np.atleast_1d(aa)
    Q = np.asarray(tail_fraction(L, a1, weights=p), dtype=np.float64)  # (A, T)
    bound = np.stack(
        [
            np.asarray(tilted_tail_bound(L[k], a1, float(t), floor=F, weights=p))
            for k, t in enumerate(ts)
        ],
        axis=-1,
    )  # (A, T)
    best = np.argmin(bound, axis=-1)
    rows = np.arange(a1.size)
    shape = aa.shape
    return {
        "a": aa.copy(),
        "Q1": Q.min(axis=-1).reshape(shape),
        "Q2": Q[rows, best].reshape(shape),
        "Q3": bound[rows, best].reshape(shape),
        "t_tilde": ts[best].reshape(shape),
        "Q_path": Q.reshape(shape + (ts.size,)),
        "bound_path": bound.reshape(shape + (ts.size,)),
    }

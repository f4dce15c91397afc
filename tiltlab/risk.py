"""Tilted risks and tilted weights, sample-level and hierarchical.

The t-tilted risk of losses ``l`` under prior weights ``p`` (summing to one) is

    R(t) = (1/t) log sum_i p_i exp(t l_i),

with its continuous extensions R(0) = sum_i p_i l_i, R(+inf) = max l, R(-inf) = min l
(over the support p_i > 0). The tilted weights are w_i = p_i exp(t l_i) / sum_j p_j exp(t l_j).

Numerics
--------
Every evaluation shifts the losses by the extreme loss on the side the tilt favours
(``c = max l`` for t > 0, ``min l`` for t < 0), so that ``u_i = t (l_i - c) <= 0`` and no
exponential can overflow. The log of the normaliser ``Z = sum p_i exp(u_i)`` is then taken
in one of two forms, chosen per tilt on ``|t| * (max l - min l)``:

* ``|t| * spread <= 1``: ``log Z = log1p(sum p_i expm1(u_i))``. All terms have one sign, so
  the sum keeps full relative precision and R keeps it as t -> 0 (where ``log(Z) / t`` would
  amplify the rounding of Z by 1/t).
* otherwise ``log Z`` directly; Z >= p_k > 0 for the extreme sample, so it never underflows.

Below ``|t| * spread < sqrt(tiny)`` (where ``u_i`` would be subnormal) the cumulant series
``mean + t var / 2`` is exact to rounding and is used. t = 0 and t = +-inf are exact.
A grid of tilts is evaluated in one vectorised pass (the tilt axis leads the result).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import segments as _segments
from ._compat import (
    as_array,
    as_float_array,
    check_finite,
    device,
    is_array_api_obj,
    is_cupy_namespace,
    is_dask_namespace,
    is_lazy,
    is_numpy_namespace,
    is_torch_namespace,
    namespace_of,
    normalize_axis,
    tiny_sqrt,
    to_numpy,
)
from .accumulator import TiltState, _extremes, block_state, finalize_risk
from .segments import Segments

__all__ = ["tilted_risk", "tilted_weights", "hierarchical_risk", "hierarchical_weights"]


# ---------------------------------------------------------------------------
# input handling


def prepare_losses(losses: Any, xp: Any, check: bool) -> Any:
    arr = as_float_array(losses, xp, name="losses")
    if arr.ndim == 0:
        raise ValueError("`losses` must have at least one dimension (got a scalar)")
    if any(s == 0 for s in arr.shape):
        raise ValueError(f"`losses` must not be empty (shape {tuple(arr.shape)})")
    if check:
        check_finite(arr, xp, name="losses")
    return arr


def prepare_tilt(t: Any, xp: Any, like: Any) -> tuple[Any, bool]:
    """Tilt(s) as an array of ``like``'s dtype/device; returns (t, is_grid)."""
    if isinstance(t, bool) or t is None:
        raise TypeError(f"`t` must be a real number or a 1-d array of tilts, got {t!r}")
    if is_array_api_obj(t):
        tt = as_array(t, xp, name="t")
        if xp.isdtype(tt.dtype, "complex floating"):
            raise TypeError("`t` must be real")
        tt = xp.astype(tt, like.dtype) if tt.dtype != like.dtype else tt
    else:
        try:
            tt = xp.asarray(t, dtype=like.dtype, device=device(like))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"`t` must be a real number or a 1-d array of tilts: {exc}") from None
    if tt.ndim > 1:
        raise ValueError(f"`t` must be a scalar or a 1-d array of tilts, got shape {tt.shape}")
    if tt.ndim == 1 and tt.shape[0] == 0:
        raise ValueError("`t` must not be an empty array")
    if bool(xp.any(xp.isnan(tt))):
        raise ValueError("`t` must not be NaN")
    return tt, tt.ndim == 1


def prepare_prior(weights: Any, l: Any, xp: Any) -> Any:
    """Normalised prior weights broadcast to the shape of ``l`` (axis moved last)."""
    if weights is None:
        return None
    p = as_float_array(weights, xp, name="weights", dev=device(l))
    if p.dtype != l.dtype:
        p = xp.astype(p, l.dtype)
    if p.ndim == 1:
        if p.shape[0] != l.shape[-1]:
            raise ValueError(
                f"`weights` has length {p.shape[0]} but `losses` has {l.shape[-1]} samples "
                "along `axis`"
            )
    elif tuple(p.shape) != tuple(l.shape):
        raise ValueError(
            f"`weights` must be 1-d with one entry per sample or have the shape of `losses`; "
            f"got {tuple(p.shape)} for losses of shape {tuple(l.shape)} (axis moved last)"
        )
    check_finite(p, xp, name="weights")
    if not bool(xp.all(p >= 0)):
        raise ValueError("`weights` must be non-negative")
    total = xp.sum(p, axis=-1, keepdims=True)
    if not bool(xp.all(total > 0)):
        raise ValueError("`weights` must not be all zero")
    return p / total


# ---------------------------------------------------------------------------
# kernels (no validation; l has samples on the last axis, p normalised or None)


@dataclass
class _Shifted:
    """Quantities shared by the risk and the weights for one set of tilts."""

    t_fin: Any  # tilt with 0/inf replaced by +-1 (placeholders, masked later)
    c: Any  # shift: max over the support for t > 0, min for t < 0
    u: Any  # t_fin * (l - c) <= 0, zero off the support
    lmax: Any
    lmin: Any


def _moments(l: Any, p: Any, xp: Any) -> tuple[Any, Any]:
    """(max, min) over the support of ``p`` along the last axis."""
    if p is None:
        return xp.max(l, axis=-1), xp.min(l, axis=-1)
    ninf = xp.asarray(-xp.inf, dtype=l.dtype, device=device(l))
    pinf = xp.asarray(xp.inf, dtype=l.dtype, device=device(l))
    on = p > 0
    return xp.max(xp.where(on, l, ninf), axis=-1), xp.min(xp.where(on, l, pinf), axis=-1)


def _wsum(a: Any, p: Any, xp: Any) -> Any:
    """Prior-weighted sum along the last axis (the mean when ``p`` is None)."""
    if p is None:
        return xp.mean(a, axis=-1)
    return xp.sum(p * a, axis=-1)


def _shift(l: Any, p: Any, tt: Any, xp: Any) -> _Shifted:
    lmax, lmin = _moments(l, p, xp)
    one = xp.ones_like(tt)
    fin = xp.isfinite(tt) & (tt != 0)
    t_fin = xp.where(fin, tt, xp.where(tt < 0, -one, one))
    # broadcast tilt against the batch shape of l (grid axis leads)
    tb = xp.reshape(t_fin, tuple(tt.shape) + (1,) * (l.ndim - 1))
    c = xp.where(tb > 0, lmax, lmin)
    d = l - c[..., None]
    if p is not None:
        d = xp.where(p > 0, d, xp.zeros_like(d))
    u = tb[..., None] * d
    return _Shifted(t_fin=tb, c=c, u=u, lmax=lmax, lmin=lmin)


def _risk_kernel(l: Any, p: Any, tt: Any, xp: Any) -> Any:
    """Tilted risk along the last axis of ``l`` for tilts ``tt`` (0-d or 1-d)."""
    s = _shift(l, p, tt, xp)
    spread = s.lmax - s.lmin
    tb = xp.reshape(tt, tuple(tt.shape) + (1,) * (l.ndim - 1))
    scale = xp.abs(s.t_fin) * spread
    small = scale <= 1
    # log Z in the two forms described in the module docstring
    S = _wsum(xp.expm1(s.u), p, xp)
    S = xp.where(small, S, xp.zeros_like(S))
    Z = _wsum(xp.exp(s.u), p, xp)
    Z = xp.where(small, xp.ones_like(Z), Z)
    logZ = xp.where(small, xp.log1p(S), xp.log(Z))
    r = s.c + logZ / s.t_fin
    mean = _wsum(l, p, xp)
    lmax = s.lmax + xp.zeros_like(r)
    lmin = s.lmin + xp.zeros_like(r)
    tiny = tiny_sqrt(l.dtype, xp)
    r = xp.where((tb == 0) | (scale < tiny), mean + xp.zeros_like(r), r)
    r = xp.where(tb == xp.inf, lmax, r)
    r = xp.where(tb == -xp.inf, lmin, r)
    return r


def _weights_kernel(l: Any, p: Any, tt: Any, xp: Any) -> Any:
    """Tilted weights along the last axis; the tilt grid (if any) leads."""
    s = _shift(l, p, tt, xp)
    tb = xp.reshape(tt, tuple(tt.shape) + (1,) * l.ndim)
    prior = xp.ones_like(l) / l.shape[-1] if p is None else p
    e = prior * xp.exp(s.u)
    w = e / xp.sum(e, axis=-1, keepdims=True)
    # t = +-inf: prior restricted to the tied extreme set (the limit of w as t -> +-inf)
    is_ext = s.u == 0
    if p is not None:
        is_ext = is_ext & (p > 0)
    ext = xp.where(is_ext, prior + xp.zeros_like(w), xp.zeros_like(w))
    ext = ext / xp.sum(ext, axis=-1, keepdims=True)
    w = xp.where(xp.isinf(tb), ext, w)
    w = xp.where(tb == 0, prior + xp.zeros_like(w), w)
    return w


# ---------------------------------------------------------------------------
# the fast path: one-dimensional losses on eager backends


def _check_losses(l: Any, xp: Any) -> None:
    check_finite(l, xp, name="losses")


def _use_fast_path(l: Any, xp: Any, check: bool) -> bool:
    """One-dimensional losses on an eager backend, with host reads allowed.

    ``check_finite=False`` on PyTorch keeps the synchronisation-free vectorised kernels,
    so that ``torch.compile(fullgraph=True)`` and ``torch.func.vmap`` trace through.
    """
    if l.ndim != 1 or is_lazy(xp):
        return False
    return check or not is_torch_namespace(xp)


def _finite_nonzero(tt: Any) -> bool:
    v = float(to_numpy(tt))
    return v != 0.0 and math.isfinite(v)


def _risk_1d(l: Any, p: Any, tt: Any, grid: bool, xp: Any, check: bool) -> Any:
    """Tilted risk of 1-d losses for a host tilt (or a grid of them): one exponential
    per loss and tilt, the extremes read once, temporaries of one loss vector."""
    if check and p is not None:
        _check_losses(l, xp)  # zero-weight samples are outside the extremes' support
    ts = [float(v) for v in np.atleast_1d(to_numpy(tt))]
    ext = None
    out = []
    for t in ts:
        if t == 0.0:
            r = _wsum(l, p, xp)
            if not math.isfinite(float(r)):
                if check:
                    _check_losses(l, xp)
                # a sum that overflowed although the losses are finite
                half = 0.5 * l / l.shape[0] if p is None else 0.5 * p * l
                r = 2.0 * xp.sum(half)
        elif math.isinf(t):
            if ext is None:
                ext = _checked_extremes(l, p, xp, check)
            r = xp.asarray(ext[0] if t > 0 else ext[1], dtype=l.dtype, device=device(l))
        else:
            if ext is None:
                ext = _checked_extremes(l, p, xp, check)
            r = finalize_risk(block_state(l, p, t, xp, extremes=ext), xp, l.dtype)
        out.append(r)
    return xp.stack(out) if grid else out[0]


def _checked_extremes(l: Any, p: Any, xp: Any, check: bool) -> tuple[float, float]:
    hi, lo = _extremes(l, p, xp)
    if check and not (math.isfinite(hi) and math.isfinite(lo)):
        _check_losses(l, xp)
    return hi, lo


def _weights_1d(l: Any, p: Any, t: float, hi: float, lo: float, xp: Any) -> Any:
    """Tilted weights of 1-d losses: one exponential per loss, normalised in place."""
    u = l - (hi if t > 0 else lo)
    if p is not None:
        u = xp.where(p > 0, u, xp.zeros_like(u))
    u *= t
    e = _inplace_exp(u, xp)
    if p is not None:
        e *= p
    e /= xp.sum(e)
    return e


# ---------------------------------------------------------------------------
# public sample-level API

#: elements of (tilts x losses) evaluated at once by tilted_risk on a grid of tilts
_GRID_CHUNK = 1 << 23


def tilted_risk(
    losses: Any,
    t: Any,
    *,
    axis: int = -1,
    weights: Any = None,
    keepdims: bool = False,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Tilted risk :math:`R(t) = \frac{1}{t}\log\sum_i p_i e^{t\,\ell_i}`.

    Exact at every tilt: ``t = 0`` gives the (prior-weighted) mean, ``t = +inf`` the
    maximum and ``t = -inf`` the minimum over the samples with positive prior weight.
    Accurate to a few ulps of ``max |losses|`` at every tilt from ``-1e8`` to ``1e8``,
    including tilts as small as ``1e-300`` (see the module notes).

    Parameters
    ----------
    losses : array
        Per-sample losses; samples lie along ``axis``. Integer and boolean losses are
        promoted to the namespace's default floating dtype.
    t : float, 0-d or 1-d array
        The tilt, or a grid of tilts. With a 1-d grid of length T the result gains a
        leading axis of length T (vectorised, no Python loop).
    axis : int, optional
        The sample axis. Default: the last.
    weights : array, optional
        Non-negative prior weights, 1-d with one entry per sample or of the shape of
        ``losses``; normalised to sum to one. Default: uniform.
    keepdims : bool, optional
        Keep the reduced axis with length one.
    check_finite : bool, optional
        Raise ``ValueError`` for NaN or infinite losses (default). Pass ``False`` to skip
        the check (results for non-finite losses are then whatever IEEE arithmetic gives).
    xp : namespace, optional
        The array namespace; inferred from the inputs by default.

    Returns
    -------
    array
        The tilted risk, in the namespace, dtype and device of ``losses``.

    Raises
    ------
    ValueError
        Empty or non-finite ``losses``, NaN ``t``, negative or all-zero ``weights``,
        mismatched shapes.
    TypeError
        Complex input, or arrays from two different libraries.

    Notes
    -----
    Supported backends: NumPy, CuPy, PyTorch, array-api-strict and Dask (through
    array-api-compat).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import tilted_risk
    >>> l = np.array([0.0, 1.0, 4.0])
    >>> float(tilted_risk(l, 0.0))
    1.6666666666666667
    >>> float(tilted_risk(l, np.inf)), float(tilted_risk(l, -np.inf))
    (4.0, 0.0)
    >>> tilted_risk(l, np.array([-1.0, 1.0])).shape
    (2,)
    """
    xp = namespace_of(losses=losses, weights=weights, t=t) if xp is None else xp
    if is_dask_namespace(xp):  # issue-12 hook: one lazy reduction (tiltlab.distributed)
        from .distributed import dask_tilted_risk

        out = dask_tilted_risk(losses, t, axis=axis, weights=weights, keepdims=keepdims,
                               check_finite=check_finite)
        if out is not None:
            return out
    l = prepare_losses(losses, xp, False)
    ax = normalize_axis(axis, l.ndim)
    l = xp.moveaxis(l, ax, -1) if ax != l.ndim - 1 else l
    tt, grid = prepare_tilt(t, xp, l)
    p = prepare_prior(weights, l, xp)
    if _use_fast_path(l, xp, check_finite):
        r = _risk_1d(l, p, tt, grid, xp, check_finite)
        if keepdims:
            r = xp.expand_dims(r, axis=ax + (1 if grid else 0))
        return r
    if check_finite:
        _check_losses(l, xp)
    n_elem = 1
    for s in l.shape:
        n_elem *= int(s)
    if grid and tt.shape[0] * n_elem > _GRID_CHUNK:
        # bound the temporaries: blocks of tilts, each block vectorised
        step = max(1, _GRID_CHUNK // n_elem)
        parts = [_risk_kernel(l, p, tt[i : i + step], xp) for i in range(0, tt.shape[0], step)]
        r = xp.concat(parts, axis=0)
    else:
        r = _risk_kernel(l, p, tt, xp)
    if keepdims:
        r = xp.expand_dims(r, axis=ax + (1 if grid else 0))
    return r


def tilted_weights(
    losses: Any,
    t: Any,
    *,
    axis: int = -1,
    weights: Any = None,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Tilted weights :math:`w_i = p_i e^{t\ell_i} / \sum_j p_j e^{t\ell_j}`.

    The weights sum to one along ``axis`` and give the tilted gradient
    :math:`\nabla R(t) = \sum_i w_i \nabla \ell_i`. ``t = 0`` returns the prior; ``t = +inf``
    (``-inf``) returns the prior restricted to the tied maximisers (minimisers) and
    renormalised, which is uniform over them for uniform priors and is the limit of the
    weights as ``t`` grows.

    Parameters
    ----------
    losses, t, axis, weights, check_finite, xp
        As for :func:`tilted_risk`.

    Returns
    -------
    array
        Weights of the shape of ``losses`` (with a leading tilt axis for a 1-d grid of
        tilts), in the namespace, dtype and device of ``losses``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import tilted_weights
    >>> w = tilted_weights(np.array([0.0, 1.0, 1.0]), np.inf)
    >>> w.tolist()
    [0.0, 0.5, 0.5]
    >>> float(tilted_weights(np.array([0.0, 1.0]), 1000.0)[1])
    1.0
    """
    xp = namespace_of(losses=losses, weights=weights, t=t) if xp is None else xp
    l = prepare_losses(losses, xp, False)
    ax = normalize_axis(axis, l.ndim)
    l = xp.moveaxis(l, ax, -1) if ax != l.ndim - 1 else l
    tt, grid = prepare_tilt(t, xp, l)
    p = prepare_prior(weights, l, xp)
    if _use_fast_path(l, xp, check_finite) and not grid and _finite_nonzero(tt):
        if check_finite and p is not None:
            _check_losses(l, xp)
        try:
            hi, lo = _extremes(l, p, xp)
            if not (math.isfinite(hi) and math.isfinite(lo)):
                raise ValueError("`losses` contains NaN or infinite values")
        except ValueError:
            _check_losses(l, xp)
            raise
        return _weights_1d(l, p, float(tt), hi, lo, xp)
    if check_finite:
        _check_losses(l, xp)
    w = _weights_kernel(l, p, tt, xp)
    if ax != l.ndim - 1:
        w = xp.moveaxis(w, -1, ax + (1 if grid else 0))
    return w


# ---------------------------------------------------------------------------
# hierarchical tilting


def _codes_of(labels: np.ndarray) -> np.ndarray:
    """Integer codes in [0, G) for a label array (no sort for dense integer codes)."""
    if labels.dtype.kind in "iu" and labels.size and int(labels.min()) >= 0:
        top = int(labels.max())
        if top < 2 * labels.size + 1024:
            counts = np.bincount(labels, minlength=top + 1)
            if np.all(counts > 0):
                return labels.astype(np.int64, copy=False)
    return np.unique(labels, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _build_levels(groups: Any, n: int) -> list[Segments]:
    """Levels innermost first (children -> groups) from label arrays given outermost first."""
    from ._compat import seq_of_arrays

    if groups is None:
        raise TypeError("`groups` is required")
    label_arrays = list(groups) if seq_of_arrays(groups) else [groups]
    labels = []
    for k, g in enumerate(label_arrays):
        if g is None:
            raise TypeError(f"`groups` level {k} is None; pass one label per sample")
        a = to_numpy(g)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(
                f"`groups` level {k} must be a 1-d label array of length {n} (one label per "
                f"sample), got shape {a.shape}"
            )
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise ValueError(f"`groups` level {k} contains NaN or infinite labels")
        if a.dtype.kind == "O" and any(v is None for v in a):
            raise TypeError(f"`groups` level {k} contains None labels")
        labels.append(a)
    codes = [_codes_of(a) for a in labels]
    parents = []
    for k in range(1, len(codes)):
        outer, inner = codes[k - 1], codes[k]
        n_inner = int(inner.max()) + 1
        parent = np.full(n_inner, -1, dtype=np.int64)
        parent[inner] = outer
        if np.any(parent[inner] != outer):
            bad = int(inner[parent[inner] != outer][0])
            raise ValueError(
                f"`groups` levels are not nested: a group of level {k} (label "
                f"{np.unique(labels[k])[bad]!r}) spans several groups of level {k - 1}"
            )
        parents.append(parent)
    # levels from the inside out: samples -> innermost groups -> ... -> outermost groups
    levels = [Segments.from_codes(codes[-1])]
    for k in range(len(codes) - 2, -1, -1):
        levels.append(Segments.from_codes(parents[k], int(codes[k].max()) + 1))
    return levels


def prepare_tilts(tilts: Any, n_levels: int) -> list[float]:
    if is_array_api_obj(tilts):
        tilts = [float(v) for v in to_numpy(tilts).reshape(-1)]
    if not isinstance(tilts, Sequence) or isinstance(tilts, (str, bytes)):
        raise TypeError(f"`tilts` must be a sequence of {n_levels + 1} numbers (outermost first)")
    if len(tilts) != n_levels + 1:
        raise ValueError(
            f"`tilts` must have {n_levels + 1} entries (one per grouping level plus the "
            f"sample level, outermost first), got {len(tilts)}"
        )
    out = []
    for k, v in enumerate(tilts):
        if isinstance(v, bool):
            raise TypeError(f"`tilts[{k}]` must be a real number")
        try:
            f = float(to_numpy(v)) if is_array_api_obj(v) else float(v)
        except (TypeError, ValueError):
            raise TypeError(f"`tilts[{k}]` must be a real number, got {v!r}") from None
        if np.isnan(f):
            raise ValueError(f"`tilts[{k}]` must not be NaN")
        out.append(f)
    return out


@dataclass(frozen=True)
class GroupTree:
    """Group structure of a hierarchy, built once on the host from label arrays.

    ``levels`` (innermost first) map the nodes of one level to the groups of the next and
    drive the bottom-up evaluation; ``sample_layouts`` (innermost first) map samples
    directly to the nodes of each grouping level, for segment sums over samples
    (Hessians of hierarchical objectives). Both are :class:`~tiltlab.segments.Segments`:
    reductions cost O(N) whatever the group sizes.
    """

    n_samples: int
    levels: tuple
    sample_layouts: tuple

    @property
    def depth(self) -> int:
        """Number of grouping levels (tilts needed: depth + 1)."""
        return len(self.levels)


def build_tree(groups: Any, n: int) -> GroupTree:
    """Validate label arrays (outermost first) and build a :class:`GroupTree`."""
    levels = _build_levels(groups, n)
    layouts = [levels[0]]
    codes = levels[0].codes
    for lev in levels[1:]:
        codes = lev.codes[codes]
        layouts.append(Segments.from_codes(codes, lev.n_groups))
    return GroupTree(n_samples=n, levels=tuple(levels), sample_layouts=tuple(layouts))


def segment_sum(values: Any, layout: Segments, xp: Any) -> Any:
    """Sum ``values`` (..., N) over the groups of a sample layout -> (..., G)."""
    return _segments.segment_sum(values, layout, xp)


def broadcast_groups(values: Any, layout: Segments, xp: Any) -> Any:
    """Per-group ``values`` (..., G) repeated to one entry per sample (..., N)."""
    return _segments.expand(values, layout, xp)


def _scalar_risk_weights(l: Any, p: Any, t: float, xp: Any, want_weights: bool):
    """Risk and weights for a host tilt over the last axis (any batch shape)."""
    if l.ndim == 1 and math.isfinite(t) and t != 0.0:
        return risk_weights_scalar(l, p, t, xp, weights=want_weights)
    tt = xp.asarray(t, dtype=l.dtype, device=device(l))
    r = _risk_kernel(l, p, tt, xp)
    return r, (_weights_kernel(l, p, tt, xp) if want_weights else None)


def _group_level(v: Any, m: Any, M: Any, seg: Segments, tau: float, xp: Any, want: bool):
    """Tilted risk of each group of ``seg`` at tilt ``tau``, and the conditional weights.

    ``v`` (..., n) are the children's values, ``m`` their (non-negative) masses and ``M``
    (..., G) the groups' masses. Returns ``(R_g, w_cond)`` with ``w_cond`` the weight of
    each child within its group (None unless ``want``).
    """
    dev = device(v)
    on = m > 0
    ninf = xp.asarray(-xp.inf, dtype=v.dtype, device=dev)
    pinf = xp.asarray(xp.inf, dtype=v.dtype, device=dev)
    if tau == 0.0:
        R = _segments.segment_sum(m * v, seg, xp) / M
        w = m / _segments.expand(M, seg, xp) if want else None
        return R, w
    hi = _segments.segment_max(xp.where(on, v, ninf), seg, xp)
    lo = _segments.segment_min(xp.where(on, v, pinf), seg, xp)
    if math.isinf(tau):
        R = hi if tau > 0 else lo
        if not want:
            return R, None
        ext = on & (v == _segments.expand(R, seg, xp))
        mm = xp.where(ext, m, xp.zeros_like(m))
        return R, mm / _segments.expand(_segments.segment_sum(mm, seg, xp), seg, xp)
    c = hi if tau > 0 else lo
    u = xp.where(on, v - _segments.expand(c, seg, xp), xp.zeros_like(v))
    u = tau * u
    scale = abs(tau) * (hi - lo)
    small = scale <= 1
    n_small = int(to_numpy(xp.sum(xp.astype(small, xp.int64))))
    n_all = int(np.prod(tuple(small.shape)))
    R = None
    if n_small > 0:
        e1 = xp.expm1(u)
        q = _segments.segment_sum(m * e1, seg, xp)
        R_small = c + xp.log1p(q / M) / tau
        if n_small == n_all:
            R = R_small
            ew = e1 + 1.0 if want else None
            s = M + q
    if n_small < n_all:
        ew = xp.exp(u)
        s = _segments.segment_sum(m * ew, seg, xp)
        R_large = c + xp.log(s / M) / tau
        R = R_large if n_small == 0 else xp.where(small, R_small, R_large)
    tiny = tiny_sqrt(v.dtype, xp)
    if bool(to_numpy(xp.any(scale < tiny))):
        mean = _segments.segment_sum(m * v, seg, xp) / M
        R = xp.where(scale < tiny, mean, R)
    if not want:
        return R, None
    return R, (m * ew) / _segments.expand(s, seg, xp)


def risk_weights_scalar(l: Any, p: Any, t: float, xp: Any, *, weights: bool = True):
    """Risk (and weights) along the last axis for one host-side tilt ``t``.

    One-dimensional losses at a finite non-zero tilt go through the tilted accumulator
    (one exponential per loss, one synchronisation, at most two temporaries of ``l``'s
    size); everything else through the vectorised kernels. For eager backends.
    """
    t = float(t)
    if l.ndim != 1 or t == 0.0 or not math.isfinite(t):
        tt = xp.asarray(t, dtype=l.dtype, device=device(l))
        r = _risk_kernel(l, p, tt, xp)
        return (r, _weights_kernel(l, p, tt, xp)) if weights else (r, None)
    st = block_state(l, p, t, xp)
    r = finalize_risk(st, xp, l.dtype)
    if not weights:
        return r, None
    return r, _weights_from_state(l, p, st, xp)


def _weights_from_state(l: Any, p: Any, st: TiltState, xp: Any) -> Any:
    """Tilted weights of 1-d losses given their merged state (shift and normaliser)."""
    u = l - st.shift
    if p is not None:
        u = xp.where(p > 0, u, xp.zeros_like(u))
    u *= st.t
    e = _inplace_exp(u, xp)
    if p is not None:
        e = e * p
    return e / st.s


def _inplace_exp(u: Any, xp: Any) -> Any:
    if is_numpy_namespace(xp) or is_cupy_namespace(xp) or is_torch_namespace(xp):
        return xp.exp(u, out=u)
    return xp.exp(u)


def risk_and_weights(l: Any, p: Any, t: Any, xp: Any) -> tuple[Any, Any]:
    """Sample-level risk and weights along the last axis, without validation.

    ``p`` is a normalised prior or None; ``t`` a 0-d array of ``l``'s dtype. For
    internal callers (objectives, solvers) that validated their inputs once.
    """
    return _risk_kernel(l, p, t, xp), _weights_kernel(l, p, t, xp)


def _level_masses(p: Any, tree: GroupTree, like: Any, xp: Any) -> list[Any]:
    """Masses of the children of every level (innermost first) and of the top groups."""
    if p is None:
        n = tree.n_samples
        key = ("uniform-masses", xp.__name__, str(device(like)), str(like.dtype))
        cache = tree.levels[0]._cache
        if key not in cache:
            host = [np.full(n, 1.0 / n)]
            for lev in tree.levels:
                host.append(np.bincount(lev.codes, weights=host[-1], minlength=lev.n_groups))
            cache[key] = [xp.asarray(h, dtype=like.dtype, device=device(like)) for h in host]
        return cache[key]
    masses = [p]
    for lev in tree.levels:
        masses.append(_segments.segment_sum(masses[-1], lev, xp))
    return masses


def hierarchy_eval(l: Any, p: Any, tree: GroupTree, ts: Sequence[float], xp: Any, *,
                   weights: bool = True):
    """Hierarchical risk and per-sample weights, without validation.

    ``ts`` holds ``tree.depth + 1`` floats, outermost first; ``p`` a normalised prior
    or None. Returns ``(risk, weights)`` (weights None unless ``weights``).
    """
    masses = _level_masses(p, tree, l, xp)
    values = l
    conditional = []
    for depth, lev in enumerate(tree.levels):
        tau = float(ts[len(tree.levels) - depth])
        m = masses[depth]
        R, w = _group_level(values, m, masses[depth + 1], lev, tau, xp, weights)
        conditional.append((lev, w))
        values = R
    top_mass = masses[-1]
    if top_mass.ndim < values.ndim:
        top_mass = top_mass + xp.zeros_like(values)
    risk, w_top = _scalar_risk_weights(values, top_mass, float(ts[0]), xp, weights)
    if not weights:
        return risk, None
    w = w_top
    for lev, cond in reversed(conditional):
        w = _segments.expand(w, lev, xp) * cond
    return risk, w


def check_group_mass(p: Any, tree: GroupTree, xp: Any) -> None:
    """Every group of every level needs positive prior mass."""
    if p is None:
        return
    for lay in tree.sample_layouts:
        if not bool(xp.all(segment_sum(p, lay, xp) > 0)):
            raise ValueError(
                "`weights` give a group zero total weight (an empty group); every group needs "
                "at least one sample with positive weight"
            )


def _prepare_hierarchy(losses: Any, groups: Any, tilts: Any, weights: Any, xp: Any, check: bool):
    """Validated ``(losses, prior, tree, tilts)`` for the public hierarchical functions."""
    l = prepare_losses(losses, xp, check)
    tree = build_tree(groups, l.shape[-1])
    ts = prepare_tilts(tilts, tree.depth)
    p = prepare_prior(weights, l, xp)
    check_group_mass(p, tree, xp)
    return l, p, tree, ts


def hierarchical_risk(
    losses: Any,
    groups: Any,
    tilts: Any,
    *,
    weights: Any = None,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Hierarchical (multi-objective) tilted risk of any depth.

    With one grouping level and ``tilts = (t, tau)`` this is the paper's class-level
    objective

    .. math:: J(t, \tau) = \frac1t \log \sum_g P_g\, e^{t R_g(\tau)}, \qquad
              R_g(\tau) = \frac1\tau \log \sum_{x\in g} \frac{p_x}{P_g} e^{\tau \ell_x},

    with group masses :math:`P_g = \sum_{x \in g} p_x` (``|g|/N`` for uniform priors).
    Deeper hierarchies nest the same construction: ``tilts = (m, t, tau)`` for two grouping
    levels, outermost first. Every tilt may be 0 or +-inf (their exact limits).

    Parameters
    ----------
    losses : array, shape (..., N)
        Per-sample losses, samples along the last axis.
    groups : array or sequence of arrays
        One label array of length N (two levels), or a sequence of label arrays,
        outermost first, each level nested in the one before (every inner label lies in
        one outer group). Labels may be any sortable values.
    tilts : sequence of float
        One more entry than grouping levels, outermost first.
    weights : array, optional
        Prior sample weights (default uniform).
    check_finite : bool, optional
        Reject NaN/infinite losses (default).
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        The hierarchical risk (shape ``losses.shape[:-1]``).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import hierarchical_risk, tilted_risk
    >>> l = np.array([0.1, 0.5, 2.0, 3.0])
    >>> g = np.array([0, 0, 1, 1])
    >>> bool(np.isclose(hierarchical_risk(l, g, (1.5, 1.5)), tilted_risk(l, 1.5)))
    True
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    if is_dask_namespace(xp):  # issue-12 hook: one lazy reduction (tiltlab.distributed)
        from .distributed import dask_hierarchical_risk

        out = dask_hierarchical_risk(losses, groups, tilts, weights=weights,
                                     check_finite=check_finite)
        if out is not None:
            return out
    l, p, tree, ts = _prepare_hierarchy(losses, groups, tilts, weights, xp, check_finite)
    return hierarchy_eval(l, p, tree, ts, xp, weights=False)[0]


def hierarchical_weights(
    losses: Any,
    groups: Any,
    tilts: Any,
    *,
    weights: Any = None,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Per-sample weights of the hierarchical tilted risk.

    The weights satisfy :math:`\nabla J = \sum_x w_x \nabla \ell_x` (the paper's
    hierarchical gradient lemma) and sum to one. Each weight is the product, along the
    sample's path in the hierarchy, of its tilted weight within its group and of each
    group's tilted weight within its parent.

    Parameters
    ----------
    losses, groups, tilts, weights, check_finite, xp
        As for :func:`hierarchical_risk`.

    Returns
    -------
    array
        Weights of the shape of ``losses``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import hierarchical_weights
    >>> w = hierarchical_weights(np.array([0.1, 0.5, 2.0, 3.0]), [0, 0, 1, 1], (0.0, 0.0))
    >>> w.tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p, tree, ts = _prepare_hierarchy(losses, groups, tilts, weights, xp, check_finite)
    return hierarchy_eval(l, p, tree, ts, xp)[1]

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

from ._compat import (
    as_float_array,
    as_parameter,
    check_finite,
    device,
    host_labels,
    is_array_api_obj,
    namespace_of,
    normalize_axis,
    real_number,
    tiny_sqrt,
    to_numpy,
)

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
        check_finite(arr, xp, name="losses", skip="check_finite=False")
    return arr


def prepare_tilt(t: Any, xp: Any, like: Any) -> tuple[Any, bool]:
    """Tilt(s) as an array of ``like``'s dtype/device; returns (t, is_grid).

    Tilts are parameters, not data: a Python number, a NumPy scalar or array, or an
    array of any other library is converted to ``like``'s namespace; only strings,
    booleans, complex values, NaN and more than one dimension are rejected.
    """
    tt = as_parameter(t, xp, like, name="t", allow_nan=False)
    return tt, tt.ndim == 1


def prepare_prior(weights: Any, l: Any, xp: Any, axis: int | None = None) -> Any:
    """Normalised prior weights broadcast to the shape of ``l`` (axis moved last).

    ``axis`` is the sample axis of the caller's ``losses`` before it was moved last:
    full-shape weights (of the losses' original shape) have their sample axis there
    too and are moved the same way. 1-d weights always index the samples.
    """
    if weights is None:
        return None
    p = as_float_array(weights, xp, name="weights", dev=device(l))
    if p.dtype != l.dtype:
        p = xp.astype(p, l.dtype)
    if p.ndim == 0:
        raise ValueError(
            "`weights` must be 1-d with one entry per sample or have the shape of `losses`; "
            "got a scalar"
        )
    if p.ndim == 1:
        if p.shape[0] != l.shape[-1]:
            raise ValueError(
                f"`weights` has length {p.shape[0]} but `losses` has {l.shape[-1]} samples "
                "along `axis`"
            )
    else:
        ax = l.ndim - 1 if axis is None else axis
        expected = list(l.shape[:-1])
        expected.insert(ax, l.shape[-1])
        if p.ndim != l.ndim or tuple(p.shape) != tuple(expected):
            raise ValueError(
                "`weights` must be 1-d with one entry per sample or have the shape of "
                f"`losses` {tuple(expected)}; got {tuple(p.shape)}"
            )
        if ax != l.ndim - 1:
            p = xp.moveaxis(p, ax, -1)
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
        leading axis of length T (vectorised, no Python loop). Tilts are parameters:
        Python or NumPy numbers and arrays of any supported library are converted to
        the namespace, dtype and device of ``losses`` (an array of that namespace is
        kept, so autograd through ``t`` works). Strings and booleans raise ``TypeError``.
    axis : int, optional
        The sample axis. Default: the last.
    weights : array, optional
        Non-negative prior weights, 1-d with one entry per sample or of the shape of
        ``losses`` (then their sample axis is ``axis`` too, as for the losses);
        normalised to sum to one along it. Default: uniform.
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
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l = prepare_losses(losses, xp, check_finite)
    ax = normalize_axis(axis, l.ndim)
    l = xp.moveaxis(l, ax, -1) if ax != l.ndim - 1 else l
    tt, grid = prepare_tilt(t, xp, l)
    p = prepare_prior(weights, l, xp, ax)
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
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l = prepare_losses(losses, xp, check_finite)
    ax = normalize_axis(axis, l.ndim)
    l = xp.moveaxis(l, ax, -1) if ax != l.ndim - 1 else l
    tt, grid = prepare_tilt(t, xp, l)
    p = prepare_prior(weights, l, xp, ax)
    w = _weights_kernel(l, p, tt, xp)
    if ax != l.ndim - 1:
        w = xp.moveaxis(w, -1, ax + (1 if grid else 0))
    return w


# ---------------------------------------------------------------------------
# hierarchical tilting


@dataclass(frozen=True)
class _Level:
    """One grouping level: ``codes`` maps each node of the level below to a group.

    ``idx`` (G, L) gathers the children of each group (padded); ``mask`` marks real
    entries; ``pos`` is the flat position of each child inside ``idx`` (for gathering
    per-child quantities back without a scatter).
    """

    n_groups: int
    codes: np.ndarray  # (n_children,) group code of each child
    idx: np.ndarray  # (G, L) child indices, padded with 0
    mask: np.ndarray  # (G, L) bool
    pos: np.ndarray  # (n_children,) flat position in idx


def _make_level(codes: np.ndarray, n_groups: int) -> _Level:
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=n_groups)
    L = int(counts.max())
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(codes.size) - np.repeat(starts, counts)
    idx = np.zeros((n_groups, L), dtype=np.int64)
    mask = np.zeros((n_groups, L), dtype=bool)
    idx[codes[order], rank] = order
    mask[codes[order], rank] = True
    pos = np.empty(codes.size, dtype=np.int64)
    pos[order] = codes[order] * L + rank
    return _Level(n_groups=n_groups, codes=codes, idx=idx, mask=mask, pos=pos)


def _build_tree(groups: Any, n: int) -> list[_Level]:
    """Levels innermost first from label arrays given outermost first."""
    from ._compat import seq_of_arrays

    if groups is None:
        raise TypeError("`groups` is required")
    label_arrays = list(groups) if seq_of_arrays(groups) else [groups]
    labels = []
    for k, g in enumerate(label_arrays):
        a = host_labels(g, name="groups" if len(label_arrays) == 1 else f"groups[{k}]")
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(
                f"`groups` level {k} must be a 1-d label array of length {n} (one label per "
                f"sample), got shape {a.shape}"
            )
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise ValueError(f"`groups` level {k} contains NaN or infinite labels")
        labels.append(a)
    # integer codes per level; inner labels must nest in the outer level
    codes = [np.unique(a, return_inverse=True)[1].reshape(-1) for a in labels]
    for k in range(1, len(codes)):
        outer, inner = codes[k - 1], codes[k]
        n_inner = int(inner.max()) + 1
        parent = np.full(n_inner, -1)
        parent[inner] = outer
        if np.any(parent[inner] != outer):
            bad = int(inner[parent[inner] != outer][0])
            raise ValueError(
                f"`groups` levels are not nested: a group of level {k} (label "
                f"{np.unique(labels[k])[bad]!r}) spans several groups of level {k - 1}"
            )
    # levels from the inside out: samples -> innermost groups -> ... -> outermost groups
    levels = []
    child_codes = codes[-1]
    levels.append(_make_level(child_codes, int(child_codes.max()) + 1))
    for k in range(len(codes) - 2, -1, -1):
        inner, outer = codes[k + 1], codes[k]
        n_inner = int(inner.max()) + 1
        parent = np.empty(n_inner, dtype=np.int64)
        parent[inner] = outer
        levels.append(_make_level(parent, int(outer.max()) + 1))
    return levels


def prepare_tilts(tilts: Any, n_levels: int) -> list[float]:
    """``n_levels + 1`` host tilts (outermost first) from a sequence or 1-d array."""
    need = f"`tilts` must be a sequence of {n_levels + 1} real numbers (outermost first)"
    if isinstance(tilts, (str, bytes)) or tilts is None:
        raise TypeError(f"{need}, got {tilts!r}")
    if is_array_api_obj(tilts):
        arr = to_numpy(tilts)
        if arr.ndim != 1:
            raise ValueError(f"{need}, got an array of shape {arr.shape}")
        tilts = list(arr)
    if not isinstance(tilts, Sequence):
        raise TypeError(f"{need}, got {type(tilts).__name__}")
    if len(tilts) != n_levels + 1:
        raise ValueError(
            f"`tilts` must have {n_levels + 1} entries (one per grouping level plus the "
            f"sample level, outermost first), got {len(tilts)}"
        )
    return [real_number(v, f"tilts[{k}]") for k, v in enumerate(tilts)]


def _gather(x: Any, idx: np.ndarray, xp: Any) -> Any:
    """``x[..., idx]`` for a 2-d host index array (array-API take is 1-d only)."""
    flat = xp.asarray(idx.reshape(-1), device=device(x))
    out = xp.take(x, flat, axis=-1)
    return xp.reshape(out, tuple(x.shape[:-1]) + idx.shape)


@dataclass(frozen=True)
class GroupTree:
    """Group structure of a hierarchy, built once on the host from label arrays.

    ``levels`` (innermost first) drive the bottom-up evaluation; ``sample_layouts``
    (innermost first) map samples directly to the nodes of each grouping level, for
    segment sums over samples (Hessians of hierarchical objectives).
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
    levels = _build_tree(groups, n)
    layouts = []
    codes = levels[0].codes
    layouts.append(levels[0])
    for lev in levels[1:]:
        codes = lev.codes[codes]
        layouts.append(_make_level(codes, lev.n_groups))
    return GroupTree(n_samples=n, levels=tuple(levels), sample_layouts=tuple(layouts))


def segment_sum(values: Any, layout: _Level, xp: Any) -> Any:
    """Sum ``values`` (..., N) over the groups of a sample layout -> (..., G)."""
    v = _gather(values, layout.idx, xp)
    mask = xp.asarray(layout.mask, device=device(values))
    return xp.sum(xp.where(mask, v, xp.zeros_like(v)), axis=-1)


def broadcast_groups(values: Any, layout: _Level, xp: Any) -> Any:
    """Per-group ``values`` (..., G) repeated to one entry per sample (..., N)."""
    return xp.take(values, xp.asarray(layout.codes, device=device(values)), axis=-1)


def risk_weights_scalar(l: Any, p: Any, t: float, xp: Any, *, weights: bool = True):
    """Risk (and weights) along the last axis for one host-side tilt ``t``.

    The same branches as the vectorised kernels, chosen on the host: the spread is read
    once (one synchronisation) and only one exponential is formed, so the peak memory is
    a few arrays of ``l``'s size instead of a dozen. For eager backends.
    """
    t = float(t)
    if t == 0.0 or not math.isfinite(t):
        tt = xp.asarray(t, dtype=l.dtype, device=device(l))
        r = _risk_kernel(l, p, tt, xp)
        return (r, _weights_kernel(l, p, tt, xp)) if weights else (r, None)
    lmax, lmin = _moments(l, p, xp)
    spread = float(to_numpy(xp.max(lmax - lmin)))
    if abs(t) * spread < tiny_sqrt(l.dtype, xp):
        r = _wsum(l, p, xp)
        w = (xp.ones_like(l) / l.shape[-1] if p is None else p) if weights else None
        return r, w
    c = lmax if t > 0 else lmin
    d = l - c[..., None]
    if p is not None:
        d = xp.where(p > 0, d, xp.zeros_like(d))
    u = t * d
    del d
    if abs(t) * spread <= 1:
        e = xp.expm1(u)
        del u
        S = _wsum(e, p, xp)
        r = c + xp.log1p(S) / t
        if not weights:
            return r, None
        e = e + 1.0  # exp(u) >= exp(-1): no cancellation
        Z = 1.0 + S
    else:
        e = xp.exp(u)
        del u
        Z = _wsum(e, p, xp)
        r = c + xp.log(Z) / t
        if not weights:
            return r, None
    if p is None:
        w = e / (Z[..., None] * l.shape[-1])
    else:
        w = (p * e) / Z[..., None]
    return r, w


def risk_and_weights(l: Any, p: Any, t: Any, xp: Any) -> tuple[Any, Any]:
    """Sample-level risk and weights along the last axis, without validation.

    ``p`` is a normalised prior or None; ``t`` a 0-d array of ``l``'s dtype. For
    internal callers (objectives, solvers) that validated their inputs once.
    """
    return _risk_kernel(l, p, t, xp), _weights_kernel(l, p, t, xp)


def hierarchy_eval(l: Any, p: Any, tree: GroupTree, ts: Sequence[float], xp: Any):
    """Hierarchical risk and per-sample weights, without validation.

    ``ts`` holds ``tree.depth + 1`` floats, outermost first; ``p`` a normalised prior
    or None. Returns ``(risk, weights)``.
    """
    risk, conditional, w = _hierarchy_core(l, p, tree.levels, ts, xp)
    for lev, cond in reversed(conditional):
        w = xp.take(w, xp.asarray(lev.codes, device=device(cond)), axis=-1) * cond
    return risk, w


def _hierarchy_core(l: Any, p: Any, levels: Sequence[_Level], ts: Sequence[float], xp: Any):
    """Evaluate the hierarchy bottom-up.

    Returns ``(risk, conditional, w_top)``: ``conditional`` lists, innermost first, the
    weight of each child within its group (shape (..., n_children)) with the level
    structure, and ``w_top`` the weights of the outermost groups, so that sample
    weights are the product of conditionals along the path.
    """
    n = l.shape[-1]
    if p is None:
        p = xp.ones_like(l) / n
    values, mass = l, p
    conditional = []
    # tilts are outermost first; levels innermost first
    for depth, lev in enumerate(levels):
        tilt = ts[len(levels) - depth]
        mask = xp.asarray(lev.mask, device=device(l))
        v = _gather(values, lev.idx, xp)
        m = xp.where(mask, _gather(mass, lev.idx, xp), xp.zeros_like(v))
        gmass = xp.sum(m, axis=-1)
        prior = m / gmass[..., None]
        tt = xp.asarray(tilt, dtype=l.dtype, device=device(l))
        group_risk, w = risk_and_weights(v, prior, tt, xp)
        # back to one entry per child (gather through the flat position)
        w_flat = xp.reshape(w, tuple(w.shape[:-2]) + (-1,))
        pos = xp.asarray(lev.pos, device=device(l))
        conditional.append((lev, xp.take(w_flat, pos, axis=-1)))
        values, mass = group_risk, gmass
    top = xp.asarray(ts[0], dtype=l.dtype, device=device(l))
    risk, w_top = risk_and_weights(values, mass, top, xp)
    return risk, conditional, w_top


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
    l, p, tree, ts = _prepare_hierarchy(losses, groups, tilts, weights, xp, check_finite)
    return _hierarchy_core(l, p, tree.levels, ts, xp)[0]


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

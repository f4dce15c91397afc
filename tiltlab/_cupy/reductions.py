"""``tilted_risk`` and ``tilted_weights`` of one-dimensional CuPy losses as reductions
over the tilted state (``tilt.cuh``), ``hierarchical_risk`` and ``hierarchical_weights``
through the tree of :mod:`.hierarchy` (built on the device from integer or boolean device
labels, else on the host from any labels), and the extremes of a loss vector.

``tilted_extremes_blocks`` takes the largest and smallest loss of each block's share,
``tilted_sums_blocks`` merges those pairs in every block and sums each share relative to
the extreme on the tilt's side, one transcendental a loss (``expm1`` while
``|t| (hi - lo) <= 1``, else ``exp``; no shift moves), and ``tilted_state_finish`` (one
block) merges the blocks' states and finishes the risk by the rule of
:mod:`tiltlab.accumulator` (the mean near ``t = 0``, ``log1p`` of the ``expm1`` sums
while ``|t| (hi - lo) <= 1``, the shifted log otherwise). The weights take one more
elementwise pass. No extreme is read on the host: a status written next to the result
says whether every loss was finite, and is read once when ``check_finite`` asks for it
(NaN and infinite losses then raise the library's error); with ``check_finite=False``
nothing is read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import check_finite as _check_finite
from . import hierarchy, source

__all__ = [
    "extremes",
    "hierarchical_risk",
    "hierarchical_weights",
    "tilted_risk",
    "tilted_weights",
]

#: threads per block of the reductions (``TL_BLOCK_THREADS`` in kernels.cu)
BLOCK_THREADS = 256
#: the most blocks of the first stage (the finish merges their states in one block)
MAX_BLOCKS = 1024
FINISH_THREADS = 512


def _host_tilt(t: Any) -> float | None:
    """A finite non-zero Python/NumPy real tilt as a float, else None."""
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)):
        return None
    v = float(t)
    return v if v != 0.0 and math.isfinite(v) else None


def _served(losses: Any, t: Any, axis: int, weights: Any) -> float | None:
    try:
        import cupy
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(losses, cupy.ndarray) or losses.ndim != 1 or weights is not None:
        return None
    if axis not in (0, -1) or losses.shape[0] == 0:
        return None
    if losses.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    return _host_tilt(t)


def _state(l: Any, t: float) -> tuple[Any, Any, Any]:
    """The three launches of the reduction: ``(source, losses, out)``, ``out`` = (risk,
    status, shift, normaliser) on the device."""
    import cupy

    src = source.reduction_source(l.dtype)
    n = int(l.shape[0])
    blocks = max(1, min(MAX_BLOCKS, -(-n // (BLOCK_THREADS * 8))))
    ext = cupy.empty(2 * blocks, dtype=l.dtype)
    parts = cupy.empty((blocks, 7), dtype=l.dtype)
    out = cupy.empty(4, dtype=l.dtype)
    T = l.dtype.type
    tiny = math.sqrt(float(np.finfo(l.dtype).tiny))
    lc = cupy.ascontiguousarray(l)
    nn, nb = cupy.int64(n), cupy.int64(blocks)
    source.function(src, "tilted_extremes_blocks")((blocks,), (BLOCK_THREADS,), (lc, nn, ext))
    source.function(src, "tilted_sums_blocks")(
        (blocks,), (BLOCK_THREADS,), (lc, nn, T(t), ext, nb, parts)
    )
    source.function(src, "tilted_state_finish")(
        (1,), (FINISH_THREADS,), (parts, nb, T(t), T(tiny), out)
    )
    return src, lc, out


def _check(l: Any, out: Any, check: bool) -> None:
    """The one read (with ``check``): the status; non-finite losses raise the library's
    error (found again by its check, on this failing path only)."""
    if check and out[1:2].get()[0] != 0:
        import cupy

        _check_finite(l, cupy, name="losses", skip="check_finite=False")


def tilted_risk(
    losses: Any,
    t: Any,
    *,
    axis: int = -1,
    weights: Any = None,
    keepdims: bool = False,
    check_finite: bool = True,
) -> Any:
    """The tilted risk of 1-d CuPy losses at a finite non-zero host tilt (uniform prior),
    or None for every other case (the generic path serves it)."""
    tt = _served(losses, t, axis, weights)
    if tt is None:
        return None
    _, lc, out = _state(losses, tt)
    _check(lc, out, check_finite)
    r = out[0]
    return r.reshape(1) if keepdims else r


def tilted_weights(
    losses: Any, t: Any, *, axis: int = -1, weights: Any = None, check_finite: bool = True
) -> Any:
    """The tilted weights of 1-d CuPy losses at a finite non-zero host tilt (uniform
    prior), or None for every other case."""
    import cupy

    tt = _served(losses, t, axis, weights)
    if tt is None:
        return None
    src, lc, out = _state(losses, tt)
    n = int(lc.shape[0])
    w = cupy.empty_like(lc)
    blocks = max(1, min(4 * MAX_BLOCKS, -(-n // BLOCK_THREADS)))
    source.function(src, "tilted_weights_apply")(
        (blocks,), (BLOCK_THREADS,), (lc, cupy.int64(n), lc.dtype.type(tt), out, w)
    )
    _check(lc, out, check_finite)
    return w


def _tilt_pair(tilts: Any) -> tuple[float, float] | None:
    """``(top, inner)`` for two host tilts (outermost first; +-inf allowed), else None."""
    if isinstance(tilts, (str, bytes)):
        return None
    try:
        pair = list(tilts)
    except TypeError:
        return None
    if len(pair) != 2:
        return None
    out = []
    for v in pair:
        if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, (int, float, np.integer, np.floating)
        ):
            return None
        if math.isnan(float(v)):
            return None
        out.append(float(v))
    return out[0], out[1]


def hierarchical_risk(
    losses: Any, groups: Any, tilts: Any, *, weights: Any = None, check_finite: bool = True
) -> Any:
    """The hierarchical risk of 1-d CuPy losses.

    With one grouping level given by CuPy integer labels (used as group codes: none
    negative, all below ``2 N + 1024``; unused codes are empty groups), two host tilts
    and the uniform prior: one read of the labels' range, the groups' counts on the
    device (:meth:`.hierarchy.DeviceTree.from_device_codes`), the tree's passes
    (:func:`.hierarchy.tree_eval`: the groups' extremes, their sums, the top level in one
    block) and, with ``check_finite``, one read of the status. Every other hierarchy of
    float losses with host tilts goes through the tree built on the host
    (:func:`hierarchical`); other cases give None, as do finite losses whose
    group sums leave the floating-point range (the status flags them)."""
    import cupy

    pair = _tilt_pair(tilts)
    if pair is None or _served(losses, 1.0, -1, weights) is None:
        return hierarchical(losses, groups, tilts, weights, check_finite, False)
    if not isinstance(groups, cupy.ndarray) or groups.shape != losses.shape:
        return hierarchical(losses, groups, tilts, weights, check_finite, False)
    if groups.dtype.kind not in "iu":
        return hierarchical(losses, groups, tilts, weights, check_finite, False)
    tau, t = pair
    n = int(losses.shape[0])
    codes = cupy.ascontiguousarray(groups, dtype=cupy.int64)
    lo_code, hi_code = (int(v) for v in cupy.stack([codes.min(), codes.max()]).get())
    if lo_code < 0 or hi_code >= 2 * n + 1024:
        return hierarchical(losses, groups, tilts, weights, check_finite, False)
    tree = hierarchy.DeviceTree.from_device_codes(codes, hi_code + 1, losses.dtype)
    out, _ = hierarchy.tree_eval(losses, tree, (tau, t))
    if check_finite and out[1:2].get()[0] != 0:
        _check_finite(losses, cupy, name="losses", skip="check_finite=False")
        return None  # finite losses whose sums left the range: the host's path
    return out[0]


def hierarchical_weights(
    losses: Any, groups: Any, tilts: Any, *, weights: Any = None, check_finite: bool = True
) -> Any:
    """The hierarchical weights of 1-d CuPy losses through the tree on the device
    (:func:`hierarchical`), or None for the cases it does not serve."""
    return hierarchical(losses, groups, tilts, weights, check_finite, True)


def _split(x: Any, k: int = 1024):
    """``x`` as (k, m) rows plus a tail: a reduction along the rows runs in k blocks."""
    n = x.shape[0]
    m = n // k
    if m < 256:
        return None, x
    return x[: m * k].reshape(k, m), x[m * k :]


def extremes(l: Any) -> tuple[float, float]:
    """(max, min) of a 1-d CuPy array, read to the host in one transfer."""
    import cupy

    head, tail = _split(l)
    if head is None:
        both = cupy.stack([l.max(), l.min()])
    else:
        parts = [head.max(axis=1), head.min(axis=1)]
        if tail.size:
            parts = [cupy.concatenate([parts[0], tail]), cupy.concatenate([parts[1], tail])]
        both = cupy.stack([parts[0].max(), parts[1].min()])
    hi, lo = (float(v) for v in both.get())
    return hi, lo


def _host_numbers(tilts: Any) -> bool:
    """Whether ``tilts`` is a sequence of host real numbers (no device or autograd tilt)."""
    if isinstance(tilts, (str, bytes)) or not isinstance(tilts, (list, tuple)):
        return False
    return all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        for v in tilts
    )


def device_labels_tree(groups: Any, losses: Any) -> hierarchy.DeviceTree | None:
    """The tree of nested device integer (or boolean) labels under the uniform prior,
    built on the device (:meth:`.hierarchy.DeviceTree.from_device_labels`), or None where
    ``groups`` is not one CuPy integer array or a sequence of them, each of one label per
    sample (those labels take the tree built on the host).

    Reads the labels' ranges once. A level of labels in ``[0, 2 N + 1024)`` takes them as
    group codes (unused values are empty groups), one whose labels span fewer values
    than that takes them shifted by its smallest label; a wider level is first numbered on the
    device (``cupy.unique`` with the inverse, which reads the number of distinct labels).
    The nesting test is read once for two levels or more (labels that do not nest raise
    ``ValueError`` as on the host)."""
    import cupy

    n = int(losses.shape[0])
    arrays = [groups] if isinstance(groups, cupy.ndarray) else groups
    if not isinstance(arrays, (list, tuple)) or not arrays:
        return None
    for a in arrays:
        if not isinstance(a, cupy.ndarray) or a.dtype.kind not in "iub" or a.shape != (n,):
            return None
    ends = cupy.stack([a.min() for a in arrays] + [a.max() for a in arrays])
    ends = [int(v) for v in ends.get()]
    lows, highs = ends[: len(arrays)], ends[len(arrays) :]
    labels, sizes = [], []
    for a, lo, hi in zip(reversed(arrays), reversed(lows), reversed(highs), strict=True):
        if 0 <= lo and hi < 2 * n + 1024:  # the labels are the group codes
            labels.append(cupy.ascontiguousarray(a, dtype=cupy.int64))
            sizes.append(hi + 1)
        elif hi - lo < 2 * n + 1024:  # so are the labels shifted by the smallest
            labels.append(cupy.ascontiguousarray(a - lo, dtype=cupy.int64))
            sizes.append(hi - lo + 1)
        else:  # sparse labels: numbered on the device
            uniq, inverse = cupy.unique(a, return_inverse=True)
            labels.append(cupy.ascontiguousarray(inverse.reshape(n), dtype=cupy.int64))
            sizes.append(int(uniq.shape[0]))
    tree, bad = hierarchy.DeviceTree.from_device_labels(labels, sizes, losses.dtype)
    if bad is not None and int(bad.get()[0]) != 0:
        raise ValueError(
            "`groups` levels are not nested: a group of an inner level spans several groups "
            "of the level outside it"
        )
    return tree


def hierarchical(
    losses: Any, groups: Any, tilts: Any, weights: Any, check_finite: bool, want: bool
) -> Any:
    """``hierarchical_risk`` (``want`` False) or ``hierarchical_weights`` of 1-d
    float32/float64 CuPy losses with any nesting of label arrays, host tilts and a CuPy
    prior or none, or None for every other case.

    Nested CuPy integer or boolean labels under the uniform prior build the tree on the
    device (:func:`device_labels_tree`); other labels are read and the tree built on the host
    (:func:`~tiltlab.risk.build_tree`, the validation of the NumPy path) and uploaded.
    The tree is evaluated by :func:`.hierarchy.tree_eval`. The
    status is read once when ``check_finite`` asks for it (non-finite losses raise the
    library's error) and, for the weights, always (their NaN result); the risk of
    non-finite losses is NaN on the device. Where the status flags finite losses (a
    group's sums beyond the largest float), the answer is None: the caller's path."""
    import cupy

    from .._compat import namespace_of
    from ..risk import build_tree, check_group_mass, prepare_prior, prepare_tilts

    if not isinstance(losses, cupy.ndarray) or losses.ndim != 1 or losses.shape[0] == 0:
        return None
    if losses.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    if (weights is not None and not isinstance(weights, cupy.ndarray)) or not _host_numbers(tilts):
        return None
    dtree = device_labels_tree(groups, losses) if weights is None else None
    if dtree is not None:
        ts = prepare_tilts(tilts, dtree.depth)
    else:
        tree = build_tree(groups, int(losses.shape[0]))
        ts = prepare_tilts(tilts, tree.depth)
        prior = None
        if weights is not None:
            xp = namespace_of(losses=losses, weights=weights)
            prior = prepare_prior(weights, losses, xp)
            check_group_mass(prior, tree, xp)
        dtree = hierarchy.DeviceTree.from_tree(tree, losses.dtype, prior)
    out, w = hierarchy.tree_eval(losses, dtree, ts, weights=want)
    if (check_finite or want) and out[1:2].get()[0] != 0:
        if check_finite:
            _check_finite(losses, cupy, name="losses", skip="check_finite=False")
        if bool(cupy.all(cupy.isfinite(losses))):
            return None  # finite losses whose sums left the range: the host tree's path
        return cupy.full(losses.shape if want else (), math.nan, dtype=losses.dtype)
    return w if want else out[0]

"""Segment reductions: sums, maxima and minima of per-item values over groups.

A :class:`Segments` describes a partition of ``n`` items (samples, or the groups of a lower
level of a hierarchy) into ``G`` groups by integer codes in ``[0, G)``. Reductions run in
O(n) time and O(G) extra memory whatever the group sizes (no padding to the largest group):

* NumPy: one compiled pass for 1-d sums and counts of long inputs (the kernels registered
  in ``SEGMENT_KERNELS``: numba's, from the compiled CPU kernels), else
  ``np.bincount`` with weights, and ``np.maximum.at``/``np.minimum.at``;
* PyTorch: ``index_add`` and ``scatter_reduce``;
* CuPy: the ufuncs' ``at`` (``cupy.add.at``, ``cupy.maximum.at``, ``cupy.minimum.at``;
  ``cupyx.scatter_*`` on CuPy releases without them);
* other namespaces (array-api-strict, Dask): a padded ``(G, L)`` gather, correct but with
  memory proportional to ``G`` times the largest group.

Values carry the items on their last axis; leading (batch) axes are allowed.

The host routines on NumPy codes (``segment_counts``, ``segment_sums``,
``segment_counts_sums``, ``members_of``, ``present_means``,
``accept_shared_shift``, ``scale_by_group``, ``int_range``,
``nest_parents``) use the compiled kernels when they are registered and the input is
long enough (``MIN_ITEMS``) that the first call's compilation or cache load does not
dominate; otherwise NumPy (same results up to rounding: up to ``MAX_LANED_GROUPS``
groups the kernels add in four interleaved lanes). Their codes must be int64 in
``[0, n_groups)`` (checked by the callers, not here).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._compat import (
    device,
    is_array_api_obj,
    is_cupy_namespace,
    is_numpy_namespace,
    is_torch_namespace,
    to_numpy,
)
from ._dispatch import Dispatch

__all__ = ["Segments", "segment_sum", "segment_max", "segment_min", "expand"]

#: below this many items ``np.bincount`` is used (no compilation for small inputs)
MIN_ITEMS = 1 << 16
#: up to this many groups the sums use four interleaved accumulators (items ``i mod 4``),
#: added in a fixed order at the end: a run of items of one group then updates four
#: memory locations in turn instead of one (no chain of dependent additions)
MAX_LANED_GROUPS = 1 << 15
#: up to this many groups the counts go beside the sums in those four lanes (a table of
#: 16 KiB, in the core's first-level cache); between this and :data:`MAX_LANED_GROUPS`
#: two laned passes, each over a smaller table, are faster
MAX_SIDE_LANED_GROUPS = 1 << 9

#: compiled segment kernels for NumPy codes: the registered object has ``available()``
#: (whether they may be used) and ``kernels()`` (their namespace: ``sums1``, ``sums4``,
#: ``counts1``, ``counts2``, ``counts_sums``, ``counts_sums4``, ``members``,
#: ``present_means``, ``accept``, ``scale_by_group``, ``int_range``, ``parents``); the
#: compiled CPU kernels register theirs (``tiltlab/_backends.py`` names them)
SEGMENT_KERNELS = Dispatch("segment kernels")


@dataclass(frozen=True, eq=False)
class Segments:
    """A partition of ``n`` items into ``n_groups`` groups given by host integer codes."""

    codes: np.ndarray
    n_groups: int
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_codes(cls, codes: Any, n_groups: int | None = None) -> Segments:
        """A partition from integer codes in ``[0, n_groups)`` (one per item).

        Parameters
        ----------
        codes : array_like of int, shape (n,)
            The group of each item: a 1-d integer array of any supported library, or a
            list. Booleans, floats and other types raise ``TypeError``.
        n_groups : int, optional
            Number of groups (default: the largest code plus one). Groups without items
            are allowed.

        Returns
        -------
        Segments

        Raises
        ------
        TypeError
            Codes that are not integers, or a non-integer ``n_groups``.
        ValueError
            Codes that are not 1-d, negative or not below ``n_groups``; no codes and no
            ``n_groups``.

        Examples
        --------
        >>> Segments.from_codes([0, 2, 2]).counts.tolist()
        [1, 0, 2]
        """
        a = to_numpy(codes) if is_array_api_obj(codes) else np.asarray(codes)
        if a.dtype.kind not in "iu" and not (a.size == 0 and a.dtype.kind == "f"):
            raise TypeError(f"`codes` must be integers, got an array of dtype {a.dtype}")
        if a.ndim != 1:
            raise ValueError(f"`codes` must be 1-d (one group per item), got shape {a.shape}")
        c = np.ascontiguousarray(a, dtype=np.int64)
        if n_groups is None:
            if c.size == 0:
                raise ValueError("`codes` is empty: pass `n_groups` to say how many groups")
            g = int(c.max()) + 1
        else:
            if isinstance(n_groups, (bool, np.bool_)) or not isinstance(
                n_groups, (int, np.integer)
            ):
                raise TypeError(f"`n_groups` must be an integer, got {n_groups!r}")
            g = int(n_groups)
            if g < 1:
                raise ValueError(f"`n_groups` must be at least 1, got {g}")
        if c.size and (int(c.min()) < 0 or int(c.max()) >= g):
            raise ValueError(
                f"`codes` must lie in [0, {g}), got values from {int(c.min())} to "
                f"{int(c.max())}"
            )
        return cls(codes=c, n_groups=g)

    @classmethod
    def _trusted(cls, codes: np.ndarray, counts: np.ndarray) -> Segments:
        """A partition from int64 codes already known to lie in ``[0, len(counts))``, with
        their counts (no validation pass: for callers that counted the codes)."""
        seg = cls(codes=codes, n_groups=int(counts.shape[0]))
        seg._cache["counts"] = counts
        return seg

    @property
    def n_items(self) -> int:
        """The number of items partitioned (the length of ``codes``)."""
        return int(self.codes.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """The number of items in each group, shape ``(n_groups,)`` (cached)."""
        if "counts" not in self._cache:
            self._cache["counts"] = segment_counts(self.codes, self.n_groups)
        return self._cache["counts"]

    def codes_on(self, xp: Any, dev: Any) -> Any:
        """The codes as an integer array of ``xp`` on ``dev`` (cached)."""
        key = ("codes", xp.__name__, str(dev))
        if key not in self._cache:
            self._cache[key] = xp.asarray(self.codes, device=dev)
        return self._cache[key]

    def members(self) -> list[np.ndarray]:
        """The item indices of each group (host arrays, ascending), cached."""
        if "members" not in self._cache:
            order = np.argsort(self.codes, kind="stable")
            self._cache["members"] = np.split(order, np.cumsum(self.counts)[:-1])
        return self._cache["members"]

    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """``(idx, mask)`` of shape (G, L): the generic fallback layout."""
        if "padded" not in self._cache:
            counts = self.counts
            L = int(counts.max())
            order = np.argsort(self.codes, kind="stable")
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            rank = np.arange(self.n_items) - np.repeat(starts, counts)
            idx = np.zeros((self.n_groups, L), dtype=np.int64)
            mask = np.zeros((self.n_groups, L), dtype=bool)
            idx[self.codes[order], rank] = order
            mask[self.codes[order], rank] = True
            self._cache["padded"] = (idx, mask)
        return self._cache["padded"]

    def __getstate__(self):
        return {"codes": self.codes, "n_groups": self.n_groups}

    def __setstate__(self, state):
        object.__setattr__(self, "codes", state["codes"])
        object.__setattr__(self, "n_groups", state["n_groups"])
        object.__setattr__(self, "_cache", {})


def _flat_codes(seg: Segments, values: Any, xp: Any) -> tuple[Any, tuple, int]:
    """Codes offset per batch row so that a batched reduction is one 1-d scatter."""
    batch = tuple(values.shape[:-1])
    n_rows = 1
    for b in batch:
        n_rows *= int(b)
    codes = seg.codes_on(xp, device(values))
    if n_rows == 1:
        return codes, batch, 1
    key = ("flat", n_rows, xp.__name__, str(device(values)))
    if key not in seg._cache:
        off = np.arange(n_rows, dtype=np.int64)[:, None] * seg.n_groups
        seg._cache[key] = xp.asarray((seg.codes[None, :] + off).reshape(-1), device=device(values))
    return seg._cache[key], batch, n_rows


def _padded_gather(values: Any, seg: Segments, xp: Any, fill: float) -> Any:
    idx, mask = seg.padded()
    dev = device(values)
    flat = xp.asarray(idx.reshape(-1), device=dev)
    v = xp.take(values, flat, axis=-1)
    v = xp.reshape(v, tuple(values.shape[:-1]) + idx.shape)
    m = xp.asarray(mask, device=dev)
    return xp.where(m, v, xp.asarray(fill, dtype=values.dtype, device=dev))


def segment_sum(values: Any, seg: Segments, xp: Any) -> Any:
    """Sum of ``values`` (..., n) over each group -> (..., G)."""
    G = seg.n_groups
    if is_numpy_namespace(xp):
        if values.ndim == 1:
            out = segment_sums(seg.codes, values, G)
        else:
            flat, batch, rows = _flat_codes(seg, values, xp)
            out = np.bincount(flat, weights=np.reshape(values, (-1,)), minlength=G * rows)
            out = out.reshape(batch + (G,))
        return out.astype(values.dtype, copy=False)
    if is_torch_namespace(xp):
        flat, batch, rows = _flat_codes(seg, values, xp)
        out = xp.zeros((G * rows,), dtype=values.dtype, device=device(values))
        out = out.index_add(0, flat, xp.reshape(values, (-1,)))
        return xp.reshape(out, batch + (G,))
    if is_cupy_namespace(xp):
        flat, batch, rows = _flat_codes(seg, values, xp)
        out = xp.zeros((G * rows,), dtype=values.dtype, device=device(values))
        _cupy_scatter("add")(out, flat, xp.reshape(values, (-1,)))
        return xp.reshape(out, batch + (G,))
    return xp.sum(_padded_gather(values, seg, xp, 0.0), axis=-1)


def _segment_extreme(values: Any, seg: Segments, xp: Any, kind: str) -> Any:
    G = seg.n_groups
    fill = -np.inf if kind == "max" else np.inf
    if is_numpy_namespace(xp):
        flat, batch, rows = _flat_codes(seg, values, xp)
        out = np.full(G * rows, fill, dtype=values.dtype)
        ufunc = np.maximum if kind == "max" else np.minimum
        ufunc.at(out, flat, np.reshape(values, (-1,)))
        return out.reshape(batch + (G,))
    if is_torch_namespace(xp):
        flat, batch, rows = _flat_codes(seg, values, xp)
        out = xp.full((G * rows,), fill, dtype=values.dtype, device=device(values))
        out = out.scatter_reduce(
            0, flat, xp.reshape(values, (-1,)), reduce="amax" if kind == "max" else "amin"
        )
        return xp.reshape(out, batch + (G,))
    if is_cupy_namespace(xp):
        return _cupy_extreme(values, seg, xp, kind, fill)
    v = _padded_gather(values, seg, xp, fill)
    return xp.max(v, axis=-1) if kind == "max" else xp.min(v, axis=-1)


def segment_max(values: Any, seg: Segments, xp: Any) -> Any:
    """Maximum of ``values`` (..., n) over each group -> (..., G)."""
    return _segment_extreme(values, seg, xp, "max")


def segment_min(values: Any, seg: Segments, xp: Any) -> Any:
    """Minimum of ``values`` (..., n) over each group -> (..., G)."""
    return _segment_extreme(values, seg, xp, "min")


def expand(group_values: Any, seg: Segments, xp: Any) -> Any:
    """Per-group values (..., G) repeated to one entry per item (..., n)."""
    return xp.take(group_values, seg.codes_on(xp, device(group_values)), axis=-1)


def _cupy_scatter(ufunc: str) -> Any:
    """CuPy's unbuffered in-place ``ufunc`` at indices: ``cupy.<ufunc>.at`` (``cupyx``'s
    ``scatter_*`` functions, deprecated since, where a release lacks it)."""
    import cupy

    at = getattr(getattr(cupy, ufunc), "at", None)
    if at is not None:
        return at
    import cupyx

    return getattr(cupyx, {"add": "scatter_add", "maximum": "scatter_max",
                           "minimum": "scatter_min"}[ufunc])


def _cupy_extreme(values: Any, seg: Segments, xp: Any, kind: str, fill: float) -> Any:
    """Segment max/min on CuPy through integer atomics on an order-preserving key.

    Floating-point atomics are not exact for every dtype there, while the integer view of
    an IEEE number, with the magnitude bits of negative numbers flipped, orders exactly as
    the numbers do (and the map is its own inverse).
    """
    import cupy

    flat, batch, rows = _flat_codes(seg, values, xp)
    itype = cupy.int64 if values.dtype == cupy.float64 else cupy.int32
    flip = itype(np.iinfo(itype).max)

    def key(a):
        bits = cupy.ascontiguousarray(a).view(itype)
        return cupy.where(bits >= 0, bits, bits ^ flip)

    out = key(cupy.full((seg.n_groups * rows,), fill, dtype=values.dtype))
    scatter = _cupy_scatter("maximum" if kind == "max" else "minimum")
    scatter(out, flat, key(cupy.reshape(values, (-1,))))
    res = cupy.where(out >= 0, out, out ^ flip).view(values.dtype)
    return cupy.reshape(res, batch + (seg.n_groups,))


# ---------------------------------------------------------------------------------------
# host routines on NumPy codes: compiled kernels for long inputs, else NumPy


@functools.cache
def _numba_found() -> bool:
    """Whether compiled segment kernels are registered for NumPy and may be used."""
    provider = SEGMENT_KERNELS.lookup("numpy")
    return provider is not None and bool(provider.available())


def _kernels() -> Any:
    return SEGMENT_KERNELS.lookup("numpy").kernels()


def use_kernels(n_items: int) -> bool:
    """Whether inputs of ``n_items`` items go through the compiled kernels.

    Examples
    --------
    >>> from tiltlab.segments import use_kernels
    >>> use_kernels(10)
    False
    """
    return n_items >= MIN_ITEMS and _numba_found()


def _codes(codes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(codes, dtype=np.int64)


def segment_counts(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Number of items with each code in ``[0, n_groups)`` (int64, length ``n_groups``).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import segment_counts
    >>> segment_counts(np.array([0, 2, 2]), 4).tolist()
    [1, 0, 2, 0]
    """
    if use_kernels(codes.shape[0]):
        k = _kernels()
        kernel = k.counts2 if n_groups <= MAX_LANED_GROUPS else k.counts1
        return kernel(_codes(codes), int(n_groups))
    return np.bincount(codes, minlength=n_groups)


def segment_sums(
    codes: np.ndarray, values: np.ndarray, n_groups: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Float64 sums of ``values`` (times ``weights``, if given) over each code.

    ``values`` and ``weights`` are 1-d float arrays of the codes' length.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import segment_sums
    >>> segment_sums(np.array([1, 0, 1]), np.array([1.0, 2.0, 3.0]), 3).tolist()
    [2.0, 4.0, 0.0]
    """
    if use_kernels(codes.shape[0]) and values.dtype in (np.float32, np.float64):
        if weights is not None:
            values = values * weights
        k = _kernels()
        kernel = k.sums4 if n_groups <= MAX_LANED_GROUPS else k.sums1
        return kernel(_codes(codes), np.ascontiguousarray(values), int(n_groups))
    if weights is not None:
        values = values * weights
    return np.bincount(codes, weights=values, minlength=n_groups)


def segment_counts_sums(
    codes: np.ndarray, values: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """The number of items with each code and the float64 sums of ``values`` over each
    code, ``(counts, sums)`` (both float64, length ``n_groups``), from one pass.

    The counts and the sums are accumulated side by side, so that each item updates one
    cache line instead of two: above :data:`MAX_LANED_GROUPS` groups, and up to
    :data:`MAX_SIDE_LANED_GROUPS` in the four lanes of :func:`segment_sums` (the same sums,
    bit for bit); in between, the laned kernels of :func:`segment_counts` and
    :func:`segment_sums` are faster.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import segment_counts_sums
    >>> n, s = segment_counts_sums(np.array([1, 0, 1]), np.array([1.0, 2.0, 3.0]), 3)
    >>> n.tolist(), s.tolist()
    ([1.0, 2.0, 0.0], [2.0, 4.0, 0.0])
    """
    compiled = use_kernels(codes.shape[0]) and values.dtype in (np.float32, np.float64)
    side_laned = n_groups <= min(MAX_SIDE_LANED_GROUPS, MAX_LANED_GROUPS)
    if compiled and (side_laned or n_groups > MAX_LANED_GROUPS):
        k = _kernels()
        args = (_codes(codes), np.ascontiguousarray(values), int(n_groups))
        if side_laned:  # the lanes of segment_sums: the same sums
            return k.counts_sums4(*args)
        acc = k.counts_sums(*args)
        return acc[:, 0], acc[:, 1]
    counts = segment_counts(codes, n_groups).astype(np.float64)
    return counts, segment_sums(codes, values, n_groups)


def present_means(
    counts: np.ndarray, sums: np.ndarray, *, compiled: bool | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sums / counts, counts, index)`` over the groups with a positive count, in
    order (float64, float64, int64), in one compiled pass (NumPy where numba is absent
    or ``compiled`` is False: short inputs need not load the kernels).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import present_means
    >>> q, m, where = present_means(np.array([2.0, 0.0, 1.0]), np.array([3.0, 0.0, 5.0]))
    >>> q.tolist(), m.tolist(), where.tolist()
    ([1.5, 5.0], [2.0, 1.0], [0, 2])
    """
    if not (_numba_found() if compiled is None else compiled and _numba_found()):
        where = np.flatnonzero(counts > 0)
        mass = counts[where].astype(np.float64)
        return sums[where] / mass, mass, where
    return _kernels().present_means(counts, sums)


def accept_shared_shift(
    d: np.ndarray,
    t: float,
    c: float,
    k: float,
    rho: float,
    floor: float | None,
    *,
    compiled: bool | None = None,
) -> np.ndarray:
    """The last step of a shared-shift group risk, in one compiled pass over the groups
    (NumPy where numba is absent or ``compiled`` is False).

    ``d`` (float64, overwritten with the risks) holds each group's log-normaliser (or its
    mean where ``t`` is None: no division); the risk is ``d / t + c``. A group is kept
    where ``|d / t| + k <= rho |r|`` (``|d / t| >= k / (rho - 1)`` when ``c`` is zero),
    ``r`` is finite and, when ``floor`` is given, ``d >= floor``. Returns the indices of
    the others (ascending, int64).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import accept_shared_shift
    >>> d = np.array([2.0, 1e-9, np.nan])
    >>> accept_shared_shift(d, 2.0, 0.0, 0.5, 8.0, -700.0).tolist()
    [1, 2]
    >>> d.tolist()[:2]
    [1.0, 5e-10]
    """
    by_t = t is not None
    tt = float(t) if by_t else 1.0
    lim = -math.inf if floor is None else float(floor)
    if not (_numba_found() if compiled is None else compiled and _numba_found()):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            fine = d >= lim
            if by_t:
                d /= tt
            if c == 0.0:
                ok = np.abs(d) >= k / (rho - 1.0)
            else:
                err = np.abs(d) + k
                d += c
                ok = err <= rho * np.abs(d)
            ok &= fine if floor is not None else np.isfinite(d)
        return np.flatnonzero(~ok)
    return _kernels().accept(d, tt, float(c), float(k), float(rho), lim, by_t, floor is not None)


def scale_by_group(values: np.ndarray, codes: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """``values * factors[codes]``, written over ``values`` (a float array of the codes'
    length that the caller owns) in one compiled pass for long inputs (each product
    rounded once to ``values``' dtype); returns ``values``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import scale_by_group
    >>> scale_by_group(np.array([1.0, 2.0, 3.0]), np.array([1, 0, 1]),
    ...                np.array([10.0, 0.5]))
    array([ 0.5, 20. ,  1.5])
    """
    if use_kernels(codes.shape[0]) and values.flags.c_contiguous:
        _kernels().scale_by_group(values, _codes(codes), np.ascontiguousarray(factors))
        return values
    values *= np.take(factors.astype(values.dtype, copy=False), codes)
    return values


def members_of(codes: np.ndarray, flags: np.ndarray, size: int | None = None) -> np.ndarray:
    """Indices (ascending, int64) of the items whose code is flagged (``flags``: bool, one
    per group); ``size``, if given, is their number (the flagged groups' counts): the scan
    stops at the last of them.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import members_of
    >>> members_of(np.array([0, 2, 1, 2]), np.array([False, False, True])).tolist()
    [1, 3]
    """
    if use_kernels(codes.shape[0]):
        flags = np.ascontiguousarray(flags, dtype=np.bool_)
        size = codes.shape[0] if size is None else int(size)
        return _kernels().members(_codes(codes), flags, size)
    return np.flatnonzero(flags[codes])


def int_range(codes: np.ndarray) -> tuple[int, int]:
    """``(min, max)`` of a non-empty 1-d integer array, read in one pass.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import int_range
    >>> int_range(np.array([3, -1, 7]))
    (-1, 7)
    """
    if use_kernels(codes.shape[0]) and codes.dtype == np.int64 and codes.flags.c_contiguous:
        lo, hi = _kernels().int_range(codes)
        return int(lo), int(hi)
    return int(codes.min()), int(codes.max())


def nest_parents(inner: np.ndarray, outer: np.ndarray, n_inner: int) -> tuple[np.ndarray, int]:
    """The outer code of each of the ``n_inner`` inner groups, from the codes of the same
    items at two levels (int64, ``inner`` in ``[0, n_inner)``), and an item whose outer
    code differs from its inner group's (-1 when the levels nest). An inner group without
    items gets the parent -1. One pass over the items with the kernels (stopping at the
    first item that breaks the nesting), else a scatter and a gather.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import nest_parents
    >>> parent, bad = nest_parents(np.array([0, 2, 0, 2]), np.array([1, 0, 1, 0]), 3)
    >>> parent.tolist(), bad
    ([1, -1, 0], -1)
    >>> nest_parents(np.array([0, 0]), np.array([0, 1]), 1)[1] >= 0  # not nested
    True
    """
    n_inner = int(n_inner)
    if (
        use_kernels(inner.shape[0])
        and inner.dtype == np.int64
        and outer.dtype == np.int64
        and inner.flags.c_contiguous
        and outer.flags.c_contiguous
    ):
        parent, bad = _kernels().parents(inner, outer, n_inner)
        return parent, int(bad)
    parent = np.full(n_inner, -1, dtype=np.int64)
    parent[inner] = outer
    wrong = np.flatnonzero(parent[inner] != outer)
    return parent, int(wrong[0]) if wrong.size else -1

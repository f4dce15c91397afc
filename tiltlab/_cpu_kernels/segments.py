"""Segment counts and sums in one compiled pass (numba), for the NumPy segment reductions.

``np.bincount`` first scans the codes for their range and converts the values to float64
before it accumulates; for validated codes (the partitions of :mod:`tiltlab.segments`)
those scans are wasted, and they dominate a hierarchy's sample-level pass. The kernels
here walk the items once, serially, in their order, with float64 accumulators: the
result is the same for any number of threads, and a float32 input is summed as
accurately as ``np.bincount`` sums it.

:func:`segment_counts`, :func:`segment_sums`, :func:`segment_counts_sums` and
:func:`members_of` use the kernels when
numba imports and the input is long enough (:data:`MIN_ITEMS`) that the first call's
compilation or cache load does not dominate; otherwise they fall back on ``np.bincount``
(same results up to rounding: up to :data:`MAX_LANED_GROUPS` groups the kernels add in
four interleaved lanes).
Codes must be int64 in ``[0, n_groups)`` (checked by the callers, not here).
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = [
    "MIN_ITEMS",
    "accept_shared_shift",
    "present_means",
    "int_range",
    "nest_parents",
    "scale_by_group",
    "members_of",
    "segment_counts",
    "segment_counts_sums",
    "segment_sums",
    "use_kernels",
]

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


@functools.cache
def _kernels() -> Any:
    """The compiled kernels (numba is imported on the first call)."""
    from ._cache import jit as cached_jit
    from ._cache import refresh_cache

    refresh_cache()  # one fingerprint for every cached kernel of the package
    jit = cached_jit(fastmath=False, nogil=True)

    @jit
    def sums(codes, values, n_groups):  # pragma: no cover - compiled
        out = np.zeros(n_groups, np.float64)
        for i in range(codes.shape[0]):
            out[codes[i]] += values[i]
        return out

    @jit
    def sums4(codes, values, n_groups):  # pragma: no cover - compiled
        a = np.zeros(n_groups, np.float64)
        b = np.zeros(n_groups, np.float64)
        c = np.zeros(n_groups, np.float64)
        d = np.zeros(n_groups, np.float64)
        n = codes.shape[0]
        m = n - n % 4
        for i in range(0, m, 4):
            a[codes[i]] += values[i]
            b[codes[i + 1]] += values[i + 1]
            c[codes[i + 2]] += values[i + 2]
            d[codes[i + 3]] += values[i + 3]
        for i in range(m, n):
            a[codes[i]] += values[i]
        return (a + b) + (c + d)

    @jit
    def members(codes, flags, size):  # pragma: no cover - compiled
        out = np.empty(max(size, 0), np.int64)
        k = 0
        if size <= 0:
            return out
        for i in range(codes.shape[0]):
            if flags[codes[i]]:
                out[k] = i
                k += 1
                if k == size:  # all found: the rest of the codes is not read
                    break
        return out[:k]

    @jit
    def counts1(codes, n_groups):  # pragma: no cover - compiled
        out = np.zeros(n_groups, np.int64)
        for i in range(codes.shape[0]):
            out[codes[i]] += 1
        return out

    @jit
    def counts2(codes, n_groups):  # pragma: no cover - compiled
        a = np.zeros(n_groups, np.int64)
        b = np.zeros(n_groups, np.int64)
        n = codes.shape[0]
        m = n - n % 2
        for i in range(0, m, 2):
            a[codes[i]] += 1
            b[codes[i + 1]] += 1
        for i in range(m, n):
            a[codes[i]] += 1
        return a + b

    @jit
    def counts_sums(codes, values, n_groups):  # pragma: no cover - compiled
        # count and sum side by side: one cache line per item when the groups are many
        acc = np.zeros((n_groups, 2), np.float64)
        for i in range(codes.shape[0]):
            c = codes[i]
            acc[c, 0] += 1.0
            acc[c, 1] += values[i]
        return acc

    @jit
    def counts_sums4(codes, values, n_groups):  # pragma: no cover - compiled
        # the lanes of sums4, each with its count beside its sum: the same additions in
        # the same order as sums4, and the counts in the same pass
        acc = np.zeros((4, n_groups, 2), np.float64)
        n = codes.shape[0]
        m = n - n % 4
        for i in range(0, m, 4):
            c = codes[i]
            acc[0, c, 0] += 1.0
            acc[0, c, 1] += values[i]
            c = codes[i + 1]
            acc[1, c, 0] += 1.0
            acc[1, c, 1] += values[i + 1]
            c = codes[i + 2]
            acc[2, c, 0] += 1.0
            acc[2, c, 1] += values[i + 2]
            c = codes[i + 3]
            acc[3, c, 0] += 1.0
            acc[3, c, 1] += values[i + 3]
        for i in range(m, n):
            c = codes[i]
            acc[0, c, 0] += 1.0
            acc[0, c, 1] += values[i]
        counts = (acc[0, :, 0] + acc[1, :, 0]) + (acc[2, :, 0] + acc[3, :, 0])
        sums = (acc[0, :, 1] + acc[1, :, 1]) + (acc[2, :, 1] + acc[3, :, 1])
        return counts, sums

    return SimpleNamespace(
        sums1=sums,
        sums4=sums4,
        counts1=counts1,
        counts2=counts2,
        members=members,
        counts_sums=counts_sums,
        counts_sums4=counts_sums4,
        **vars(_group_kernels(jit)),
    )


def _group_kernels(jit: Any) -> Any:
    """The kernels over the groups (means, acceptance) and the gathers by code."""

    @jit
    def present_means(counts, sums):  # pragma: no cover - compiled
        n = counts.shape[0]
        q = np.empty(n, np.float64)
        mass = np.empty(n, np.float64)
        where = np.empty(n, np.int64)
        k = 0
        for g in range(n):
            m = counts[g]
            if m > 0:
                q[k] = sums[g] / m
                mass[k] = m
                where[k] = g
                k += 1
        return q[:k], mass[:k], where[:k]

    @jit
    def accept(d, t, c, k, rho, floor, by_t, use_floor):  # pragma: no cover - compiled
        n = d.shape[0]
        bad = np.empty(n, np.int64)
        nb = 0
        least = k / (rho - 1.0)
        for i in range(n):
            x = d[i]
            fine = x >= floor  # False for NaN
            if by_t:
                x = x / t
            if c == 0.0:
                r = x
                ok = abs(x) >= least
            else:
                r = x + c
                ok = abs(x) + k <= rho * abs(r)
            if use_floor:
                ok = ok and fine
            else:
                ok = ok and np.isfinite(r)
            d[i] = r
            if not ok:
                bad[nb] = i
                nb += 1
        return bad[:nb]

    @jit
    def scale_by_group(values, codes, factors):  # pragma: no cover - compiled
        for i in range(codes.shape[0]):
            values[i] = values[i] * factors[codes[i]]

    @jit
    def parents(inner, outer, n_inner):  # pragma: no cover - compiled
        parent = np.full(n_inner, -1, np.int64)
        for i in range(inner.shape[0]):
            g = inner[i]
            p = parent[g]
            if p < 0:
                parent[g] = outer[i]
            elif p != outer[i]:
                return parent, i
        return parent, -1

    @jit
    def int_range(codes):  # pragma: no cover - compiled
        lo = codes[0]
        hi = codes[0]
        for i in range(1, codes.shape[0]):
            c = codes[i]
            lo = min(lo, c)
            hi = max(hi, c)
        return lo, hi

    return SimpleNamespace(
        present_means=present_means,
        accept=accept,
        int_range=int_range,
        parents=parents,
        scale_by_group=scale_by_group,
    )


@functools.cache
def _numba_found() -> bool:
    from . import available

    return available()


def use_kernels(n_items: int) -> bool:
    """Whether inputs of ``n_items`` items go through the compiled kernels.

    Examples
    --------
    >>> from tiltlab._cpu_kernels.segments import use_kernels
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
    >>> from tiltlab._cpu_kernels.segments import segment_counts
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
    >>> from tiltlab._cpu_kernels.segments import segment_sums
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
    >>> from tiltlab._cpu_kernels.segments import segment_counts_sums
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
    >>> from tiltlab._cpu_kernels.segments import present_means
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
    >>> from tiltlab._cpu_kernels.segments import accept_shared_shift
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
    >>> from tiltlab._cpu_kernels.segments import scale_by_group
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
    >>> from tiltlab._cpu_kernels.segments import members_of
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
    >>> from tiltlab._cpu_kernels.segments import int_range
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
    >>> from tiltlab._cpu_kernels.segments import nest_parents
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

"""Segment counts and sums in one compiled pass (numba): the kernels behind the NumPy
segment reductions of :mod:`tiltlab.segments`.

``np.bincount`` first scans the codes for their range and converts the values to float64
before it accumulates; for validated codes (the partitions of :mod:`tiltlab.segments`)
those scans are wasted, and they dominate a hierarchy's sample-level pass. The kernels
here walk the items once, serially, in their order, with float64 accumulators: the
result is the same for any number of threads, and a float32 input is summed as
accurately as ``np.bincount`` sums it.

:func:`kernels` compiles them (numba is imported on its first call); :mod:`tiltlab.segments`
reaches them through its table :data:`~tiltlab.segments.SEGMENT_KERNELS`, in which this
package registers this module, and decides when they pay (long inputs) and what to do
where they are absent (``np.bincount`` and NumPy).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["available", "kernels"]


@functools.cache
def kernels() -> Any:
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
def available() -> bool:
    """Whether the kernels may be used (numba imports and ``TILTLAB_FUSED`` allows them).

    Examples
    --------
    >>> from tiltlab._cpu_kernels.segments import available
    >>> isinstance(available(), bool)
    True
    """
    from ._launch import available as kernels_available

    return kernels_available()

"""Segment reductions: sums, maxima and minima of per-item values over groups.

A :class:`Segments` describes a partition of ``n`` items (samples, or the groups of a lower
level of a hierarchy) into ``G`` groups by integer codes in ``[0, G)``. Reductions run in
O(n) time and O(G) extra memory whatever the group sizes (no padding to the largest group):

* NumPy: one compiled pass for 1-d sums and counts of long inputs
  (:mod:`tiltlab._cpu_kernels.segments`, numba), else ``np.bincount`` with weights, and
  ``np.maximum.at``/``np.minimum.at``;
* PyTorch: ``index_add`` and ``scatter_reduce``;
* CuPy: the ufuncs' ``at`` (``cupy.add.at``, ``cupy.maximum.at``, ``cupy.minimum.at``;
  ``cupyx.scatter_*`` on CuPy releases without them);
* other namespaces (array-api-strict, Dask): a padded ``(G, L)`` gather, correct but with
  memory proportional to ``G`` times the largest group.

Values carry the items on their last axis; leading (batch) axes are allowed.
"""

from __future__ import annotations

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
from ._cpu_kernels import segments as _kernels

__all__ = ["Segments", "segment_sum", "segment_max", "segment_min", "expand"]


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
            self._cache["counts"] = _kernels.segment_counts(self.codes, self.n_groups)
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
            out = _kernels.segment_sums(seg.codes, values, G)
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

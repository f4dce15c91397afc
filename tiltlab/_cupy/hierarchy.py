"""Hierarchies on the device: the group tree uploaded once, risks and weights as
segment-wise reductions of the tilted state (``tilt.cuh``) level by level.

:class:`DeviceTree` holds a hierarchy's partition on the device: every level's codes
(item -> group, the samples first, then the groups of each level as the items of the
next), every level's group masses, and their sizes on the host. It is built once from a
:class:`~tiltlab.risk.GroupTree` (or from host codes: two uploads), or on the device from
nested integer label arrays (:meth:`DeviceTree.from_device_labels`: nothing uploaded),
and reused by every evaluation: :func:`tree_eval` uploads nothing.

An evaluation of a tree of ``D`` grouping levels is ``3 D + 1`` launches for the risk
(one initialisation of the work space; per level, the groups' extremes, their sums
relative to their shifts and, below the top, every group's risk; one block for the top
level) and ``D`` more for the weights (one per level, from the outermost groups down to
the samples), with no read: the risk and a status (0 when every loss was finite) stay on
the device for the caller. Tilts may be any real numbers, 0 and +-inf included (the rule
of :mod:`tiltlab.accumulator`, through ``tl_risk``). A level of at most
:data:`SHARED_GROUPS` groups is gathered per block in shared memory and added to the
global sums once per block and group; larger levels use global atomics per item.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import numpy as np

from . import source

__all__ = ["DeviceTree", "tree_eval"]

#: threads per block of the elementwise and atomic passes
BLOCK_THREADS = 256
#: the most blocks of a pass (grid-stride loops cover the rest)
MAX_BLOCKS = 4096
#: threads of the top level's block (``TL_FINISH_THREADS`` in kernels.cu)
FINISH_THREADS = 512
#: the most groups of a level gathered per block in shared memory (``TL_SHARED_GROUPS``)
SHARED_GROUPS = 1024


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceTree:
    """A hierarchy's partition on the device (see the module doc).

    ``sizes[k]`` is the number of groups of level ``k`` (innermost first) and
    ``items[k]`` the number of its items (``items[0]`` the samples, ``items[k] =
    sizes[k - 1]``); ``codes[k]`` are level ``k``'s codes (one per item) and ``mass[k]``
    its groups' masses (a group without mass is empty); ``group_offsets[k]`` places level
    ``k``'s groups in the work space of :func:`tree_eval`. ``prior`` is the samples'
    masses on the device, or None (the uniform prior: every sample has the mass
    ``1 / N``, and a group its size over ``N``).
    """

    sizes: tuple[int, ...]
    items: tuple[int, ...]
    group_offsets: tuple[int, ...]
    codes: tuple
    mass: tuple
    prior: Any = None

    @property
    def depth(self) -> int:
        """The number of grouping levels."""
        return len(self.sizes)

    @property
    def n_samples(self) -> int:
        """The number of samples (the items of the innermost level)."""
        return self.items[0]

    @staticmethod
    def _offsets(sizes: list) -> tuple[int, ...]:
        return tuple(int(v) for v in np.concatenate(([0], np.cumsum(sizes)[:-1])))

    @classmethod
    def from_codes(
        cls, codes: list, sizes: list, dtype: Any, prior: Any = None, host_prior: Any = None
    ) -> DeviceTree:
        """A tree from host integer codes per level (innermost first: ``codes[0]`` maps
        the samples to the ``sizes[0]`` groups of level 0, ``codes[k]`` the groups of
        level ``k - 1`` to those of level ``k``). ``prior`` is the samples' masses on the
        device and ``host_prior`` the same on the host (both None: the uniform prior). Two
        uploads: the codes and the groups' masses."""
        import cupy

        codes = [np.ascontiguousarray(c, dtype=np.int64) for c in codes]
        sizes = [int(s) for s in sizes]
        items = [int(c.shape[0]) for c in codes]
        if len(codes) != len(sizes) or items[1:] != sizes[:-1]:
            raise ValueError("`codes`: each level's items must be the groups below it")
        for k, (c, g) in enumerate(zip(codes, sizes, strict=True)):
            if c.size and (int(c.min()) < 0 or int(c.max()) >= g):
                raise ValueError(f"`codes`: level {k}'s codes must lie in [0, {g})")
        masses = []
        m = None if host_prior is None else np.asarray(host_prior, dtype=np.float64)
        for c, g in zip(codes, sizes, strict=True):
            m = np.bincount(c, weights=m, minlength=g).astype(np.float64)
            if not masses and host_prior is None:
                m = m / max(items[0], 1)
            masses.append(m)
        all_codes = cupy.asarray(np.concatenate(codes))
        all_mass = cupy.asarray(np.concatenate(masses).astype(dtype))
        item_off, group_off = cls._offsets(items), cls._offsets(sizes)
        return cls(
            sizes=tuple(sizes),
            items=tuple(items),
            group_offsets=group_off,
            codes=tuple(all_codes[a : a + i] for a, i in zip(item_off, items, strict=True)),
            mass=tuple(all_mass[a : a + g] for a, g in zip(group_off, sizes, strict=True)),
            prior=prior,
        )

    @classmethod
    def from_tree(cls, tree: Any, dtype: Any, prior: Any = None) -> DeviceTree:
        """The device form of a :class:`~tiltlab.risk.GroupTree` (and of the samples'
        normalised prior ``prior``, a CuPy array, or None: uniform), read once."""
        import cupy

        codes = [lev.codes for lev in tree.levels]
        sizes = [lev.n_groups for lev in tree.levels]
        host_prior = None
        if prior is not None:
            prior = cupy.ascontiguousarray(prior, dtype=dtype)
            host_prior = cupy.asnumpy(prior)
        return cls.from_codes(codes, sizes, dtype, prior=prior, host_prior=host_prior)

    @classmethod
    def from_device_labels(cls, labels: list, sizes: list, dtype: Any) -> tuple[DeviceTree, Any]:
        """A tree under the uniform prior from device int64 label arrays, one per level
        and innermost first, each of one label per sample in ``[0, sizes[k])`` (unused
        labels are empty groups): nothing is uploaded or read. Per level a fill and a
        count of its groups' masses; per level above the first, the parent of each inner
        group (a fill and one launch) and the test that the labels nest (one launch).
        Returns the tree and a device flag, nonzero when the labels do not nest (None
        for one level)."""
        import cupy

        n = int(labels[0].shape[0])
        sizes = [int(g) for g in sizes]
        fn = partial(source.function, source.reduction_source(dtype))
        unit = np.dtype(dtype).type(1.0 / max(n, 1))
        grid = (_blocks(n),)
        masses, codes = [], [labels[0]]
        bad = cupy.zeros(1, dtype=cupy.int64) if len(labels) > 1 else None
        for k, (lab, g) in enumerate(zip(labels, sizes, strict=True)):
            mass = cupy.zeros(g, dtype=dtype)
            fn("tilted_level_count")(
                (_level_blocks(n, g),),
                (BLOCK_THREADS,),
                (lab, cupy.int64(n), cupy.int64(g), unit, mass),
            )
            masses.append(mass)
            if k:
                parent = cupy.zeros(sizes[k - 1], dtype=cupy.int64)
                args = (labels[k - 1], lab, cupy.int64(n))
                fn("tilted_level_parent")(grid, (BLOCK_THREADS,), (*args, parent))
                fn("tilted_level_nested")(grid, (BLOCK_THREADS,), (*args, parent, bad))
                codes.append(parent)
        return cls(
            sizes=tuple(sizes),
            items=(n, *sizes[:-1]),
            group_offsets=cls._offsets(sizes),
            codes=tuple(codes),
            mass=tuple(masses),
        ), bad

    @classmethod
    def from_device_codes(cls, codes: Any, n_groups: int, dtype: Any) -> DeviceTree:
        """One level from device int64 codes in ``[0, n_groups)`` (unused codes are
        empty groups) under the uniform prior (:meth:`from_device_labels`: a fill and one
        launch, nothing uploaded or read)."""
        return cls.from_device_labels([codes], [n_groups], dtype)[0]

    def level_codes(self, k: int) -> Any:
        """Level ``k``'s codes."""
        return self.codes[k]

    def level_mass(self, k: int) -> Any:
        """The masses of level ``k``'s groups."""
        return self.mass[k]


def _blocks(n: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-n // BLOCK_THREADS)))


def _level_blocks(n: int, groups: int) -> int:
    """Blocks of a level's atomic passes: with at most :data:`SHARED_GROUPS` groups every
    block gathers its items in shared memory and flushes each group once, so a few waves
    of blocks (four per multiprocessor) rather than one thread per item."""
    if groups > SHARED_GROUPS:
        return _blocks(n)
    return max(1, min(_blocks(n), 4 * source.multiprocessors()))


def _check_tilts(tilts: Any, depth: int) -> list[float]:
    ts = [float(v) for v in tilts]
    if len(ts) != depth + 1 or any(math.isnan(v) for v in ts):
        raise ValueError(f"`tilts`: {depth + 1} real numbers for {depth} levels, got {tilts!r}")
    return ts


def tree_eval(
    losses: Any, tree: DeviceTree, tilts: Any, *, weights: bool = False, d1: Any = None
) -> tuple[Any, Any]:
    """``(out, w)``: ``out`` a device array (risk, status, top shift, top sum), the status
    1 when a loss was not finite; ``w`` the samples' weights (times ``d1`` when given),
    or None without ``weights``. ``tilts`` outermost first, host numbers. No read, no
    upload (see the module doc for the launches)."""
    import cupy

    D = tree.depth
    ts = _check_tilts(tilts, D)  # ts[0]: the top; ts[D - k]: level k's groups
    dtype = losses.dtype
    T = dtype.type
    key = np.int32 if dtype == np.float32 else np.int64
    fn = partial(source.function, source.reduction_source(dtype))
    n_groups = sum(tree.sizes)
    hi = cupy.empty(n_groups, dtype=key)
    lo = cupy.empty(n_groups, dtype=key)
    sums = cupy.empty(3 * n_groups, dtype=dtype)
    risks = cupy.empty(max(1, n_groups), dtype=dtype)
    out = cupy.empty(4, dtype=dtype)
    tiny = T(math.sqrt(float(np.finfo(dtype).tiny)))
    unit_mass = 1.0 / tree.n_samples  # the uniform prior's mass of a sample
    lc = cupy.ascontiguousarray(losses)
    fn("tilted_tree_init")(
        (_blocks(3 * n_groups),),
        (BLOCK_THREADS,),
        (hi, lo, cupy.int64(n_groups), sums, cupy.int64(3 * n_groups), out),
    )

    def level(k):  # the arrays of level k: items' values and masses, groups' work space
        a, g = tree.group_offsets[k], tree.sizes[k]
        if k == 0:
            v = lc
            m, unit = (tree.prior, 0.0) if tree.prior is not None else (lc, unit_mass)
        else:
            b, gb = tree.group_offsets[k - 1], tree.sizes[k - 1]
            v, m, unit = risks[b : b + gb], tree.level_mass(k - 1), 0.0
        return (
            v,
            m,
            T(unit),
            tree.level_codes(k),
            cupy.int64(tree.items[k]),
            hi[a : a + g],
            lo[a : a + g],
            sums[3 * a : 3 * (a + g)],
        )

    for k in range(D):
        v, m, unit, codes, n, h, l_, s = level(k)
        t = T(ts[D - k])
        G = cupy.int64(tree.sizes[k])
        grid = (_level_blocks(tree.items[k], tree.sizes[k]),)
        fn("tilted_level_extremes")(grid, (BLOCK_THREADS,), (v, m, unit, codes, n, G, h, l_))
        fn("tilted_level_sums")(grid, (BLOCK_THREADS,), (v, m, unit, codes, n, G, t, h, l_, s))
        if k < D - 1:
            a, g = tree.group_offsets[k], tree.sizes[k]
            fn("tilted_level_finish")(
                (_blocks(g),),
                (BLOCK_THREADS,),
                (h, l_, s, tree.level_mass(k), cupy.int64(g), t, tiny, risks[a : a + g], out),
            )
    top = D - 1
    a, g = tree.group_offsets[top], tree.sizes[top]
    w_groups = cupy.empty(max(1, g), dtype=dtype)
    fn("tilted_tree_top")(
        (1,),
        (FINISH_THREADS,),
        (
            hi[a : a + g],
            lo[a : a + g],
            sums[3 * a : 3 * (a + g)],
            tree.level_mass(top),
            cupy.int64(g),
            T(ts[1]),
            T(ts[0]),
            tiny,
            cupy.int32(1 if weights else 0),
            w_groups,
            out,
        ),
    )
    if not weights:
        return out, None
    for k in range(D - 1, -1, -1):
        v, m, unit, codes, n, h, l_, s = level(k)
        w_items = cupy.empty(tree.items[k], dtype=dtype)
        last = k == 0 and d1 is not None
        fn("tilted_level_weights")(
            (_blocks(tree.items[k]),),
            (BLOCK_THREADS,),
            (
                v,
                m,
                unit,
                codes,
                n,
                T(ts[D - k]),
                h,
                l_,
                s,
                w_groups,
                d1 if last else lc,
                cupy.int32(1 if last else 0),
                w_items,
            ),
        )
        w_groups = w_items
    return out, w_groups

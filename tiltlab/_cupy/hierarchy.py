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

:class:`HierarchicalCudaEngine` evaluates the value and gradient of a hierarchical
objective this way: the product ``X theta``, one kernel for the losses and their
derivatives, the tree, one product with ``X^T`` (and one launch for a ridge term), then
one read of the status. Its value alone skips the weights and the product with ``X^T``;
its Hessian-vector product (:func:`hvp`) adds, per level, the weighted means of the
directional derivatives over the groups, and also makes one read. The tree is kept in the
problem's cache.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import numpy as np

from . import source

__all__ = [
    "HIERARCHICAL_CUDA",
    "DeviceTree",
    "HierarchicalCudaEngine",
    "device_tree",
    "hvp",
    "tree_eval",
    "value",
    "value_and_gradient",
]

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


def device_tree(problem: Any) -> DeviceTree:
    """The problem's tree on the device, built at the first call and kept in its cache
    (shared by the copies of the problem with other tilts)."""
    key = ("cuda-tree", np.dtype(problem.dtype).name)
    tree = problem.cache.get(key)
    if tree is None:
        tree = DeviceTree.from_tree(problem.tree, problem.dtype, problem.prior)
        problem.cache[key] = tree
    return tree


def _losses(X: Any, y: Any, theta: Any, loss: str) -> tuple[Any, Any, Any, Any]:
    """``(theta, kernels, losses, first derivatives)`` at ``X theta``: the product and one
    launch (``theta`` made contiguous in ``X``'s dtype; ``kernels(name)`` the loss's
    compiled kernel ``name``)."""
    import cupy

    n, d = int(X.shape[0]), int(X.shape[1])
    th = cupy.ascontiguousarray(theta, dtype=X.dtype)
    yy = cupy.ascontiguousarray(y, dtype=X.dtype)
    z = cupy.matmul(X, th)
    fn = partial(source.function, source.vg_source(loss, X.dtype, d))
    ell = cupy.empty(n, dtype=X.dtype)
    d1 = cupy.empty(n, dtype=X.dtype)
    fn("tilted_loss_d1")((_blocks(n),), (BLOCK_THREADS,), (z, yy, cupy.int64(n), ell, d1))
    return th, fn, ell, d1


def _ridge(fn: Any, g: Any, theta: Any, l2: float, out: Any) -> None:
    """One launch: ``g += l2 theta`` and ``out[0] += l2 / 2 |theta|^2``."""
    import cupy

    d = int(theta.shape[0])
    fn("tilted_ridge")(
        (1,), (FINISH_THREADS,), (g, theta, cupy.int32(d), theta.dtype.type(l2), out)
    )


def value_and_gradient(
    X: Any, y: Any, theta: Any, tree: DeviceTree, tilts: Any, loss: str, l2: float = 0.0
) -> tuple[Any, Any] | None:
    """Value (0-d) and gradient of the hierarchical tilted risk of ``loss`` (a name in
    :data:`~.source.C_LOSSES`) plus ``l2/2 |theta|^2``, or None when a loss is not
    finite. ``4 + 4 D`` launches for ``D`` levels (one more with ``l2``), one read."""
    import cupy

    th, fn, ell, d1 = _losses(X, y, theta, loss)
    out, coef = tree_eval(ell, tree, tilts, weights=True, d1=d1)
    grad = cupy.matmul(coef, X)
    if l2:
        _ridge(fn, grad, th, l2, out)
    if out[1:2].get()[0] != 0:  # the one read
        return None
    return out[0], grad


def value(
    X: Any, y: Any, theta: Any, tree: DeviceTree, tilts: Any, loss: str, l2: float = 0.0
) -> Any:
    """Value (0-d) of the hierarchical tilted risk of ``loss`` plus ``l2/2 |theta|^2``, or
    None when a loss is not finite: the losses (one launch after ``X theta``), the tree
    without weights, one launch for a ridge term, one read."""
    import cupy

    th, fn, ell, _ = _losses(X, y, theta, loss)
    out, _ = tree_eval(ell, tree, tilts)
    if l2:
        _ridge(fn, cupy.empty(th.shape[0], dtype=th.dtype), th, l2, out)
    if out[1:2].get()[0] != 0:  # the one read
        return None
    return out[0]


def hvp(
    X: Any,
    y: Any,
    theta: Any,
    v: Any,
    tree: DeviceTree,
    tilts: Any,
    loss: str,
    l2: float = 0.0,
) -> Any:
    """The Hessian-vector product ``H(theta) v`` of the hierarchical tilted risk of
    ``loss`` plus ``l2/2 |theta|^2``, or None when a loss is not finite or a tilt is
    infinite (where the Hessian is not defined).

    The formula of :mod:`tiltlab.objective.engines.generic`: one product of ``X`` with
    ``[theta v]``, one launch for the losses and their derivatives, the tree's weights,
    per level two launches (the weighted sums of the directional derivatives over the
    level's groups, and each sample's step up to its group there), one for the root and
    the coefficients, one product with ``X^T`` and one for a ridge term: ``8 + 6 D``
    launches for ``D`` levels (with the tree's and the zeroed sums'), one read.
    """
    import cupy

    if not all(math.isfinite(float(t)) for t in tilts):
        return None
    n, d = int(X.shape[0]), int(X.shape[1])
    dtype = X.dtype
    T = dtype.type
    th = cupy.ascontiguousarray(theta, dtype=dtype)
    vv = cupy.ascontiguousarray(v, dtype=dtype)
    yy = cupy.ascontiguousarray(y, dtype=dtype)
    zu = cupy.matmul(X, cupy.stack([th, vv], axis=1))  # one pass for both predictors
    fn = partial(source.function, source.vg_source(loss, dtype, d))
    ell, d1, a, hu = (cupy.empty(n, dtype=dtype) for _ in range(4))
    fn("tilted_loss_d12")((_blocks(n),), (BLOCK_THREADS,), (zu, yy, cupy.int64(n), ell, d1, a, hu))
    out, w = tree_eval(ell, tree, tilts, weights=True)
    inner = [float(t) for t in tilts][::-1]  # innermost (the samples' groups) first
    D = tree.depth
    sums = cupy.zeros(2 * (sum(tree.sizes) + 1), dtype=dtype)
    node = cupy.empty(n, dtype=np.int64)
    prev = cupy.empty(n, dtype=dtype)
    acc = cupy.empty(n, dtype=dtype)
    one = cupy.int32(1)
    zero = cupy.int32(0)
    x_items, w_items, mul = a, w, one
    at = 0
    for k in range(D):
        g = tree.sizes[k]
        S, W = sums[at : at + g], sums[at + g : at + 2 * g]
        at += 2 * g
        codes = tree.level_codes(k)
        items = cupy.int64(tree.items[k])
        fn("tilted_level_add2")(
            (_blocks(tree.items[k]),),
            (BLOCK_THREADS,),
            (x_items, w_items, mul, codes, zero, items, S, W),
        )
        fn("tilted_hvp_level")(
            (_blocks(n),),
            (BLOCK_THREADS,),
            (codes, one if k == 0 else zero, a, S, W, T(inner[k]), cupy.int64(n), node,
             prev, acc),
        )  # fmt: skip
        x_items, w_items, mul = S, W, zero
    S_root, W_root = sums[at : at + 1], sums[at + 1 : at + 2]
    fn("tilted_level_add2")(
        (_blocks(tree.sizes[D - 1]),),
        (BLOCK_THREADS,),
        (x_items, w_items, zero, tree.level_codes(D - 1), one, cupy.int64(tree.sizes[D - 1]),
         S_root, W_root),
    )  # fmt: skip
    coef = cupy.empty(n, dtype=dtype)
    fn("tilted_hvp_coef")(
        (_blocks(n),),
        (BLOCK_THREADS,),
        (w, d1, hu, prev, acc, S_root, W_root, T(inner[D]), cupy.int64(n), coef),
    )
    prod = cupy.matmul(coef, X)
    if l2:
        _ridge(fn, prod, vv, l2, cupy.empty(1, dtype=dtype))
    if out[1:2].get()[0] != 0:  # the one read
        return None
    return prod


class HierarchicalCudaEngine:
    """The value and gradient of hierarchical objectives on CuPy (see the module doc):
    predictor losses with C code, C-contiguous float32/float64 ``X``, a one-dimensional
    parameter, any tilts and priors. The fused engine hands such problems here."""

    name = "hierarchical CUDA"

    def applies(self, problem: Any, has_c_code: Any) -> bool:
        try:
            import cupy
        except ImportError:  # pragma: no cover - no CuPy here
            return False
        X = problem.X
        if not problem.is_linear or problem.tree is None or not has_c_code(problem.loss):
            return False
        if not isinstance(X, cupy.ndarray) or X.ndim != 2 or len(problem.shape) != 1:
            return False
        if X.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            return False
        return bool(X.flags.c_contiguous) and 0 < X.shape[1] <= source.MAX_FEATURES

    def value(self, problem: Any, theta: Any, ctx: Any) -> Any:
        return self._call(value, problem, ctx, 1, theta)

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Any) -> Any:
        return self._call(hvp, problem, ctx, 2, theta, v)

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Any) -> Any:
        return self._call(value_and_gradient, problem, ctx, 2, theta)

    @staticmethod
    def _call(fn: Any, problem: Any, ctx: Any, passes: int, *vectors: Any) -> Any:
        """``fn(X, y, *vectors, tree, tilts, loss, l2)``, counted as ``passes`` over ``X``
        (None, uncounted, when ``fn`` declines)."""
        tree = device_tree(problem)
        l2 = float(problem.l2 or 0.0)
        out = fn(problem.X, problem.y, *vectors, tree, problem.tilts, problem.loss.name, l2)
        if out is None:
            return None
        ctx.count(passes)
        return out


HIERARCHICAL_CUDA = HierarchicalCudaEngine()

"""Hierarchical objectives on the device: value, gradient, Hessian-vector products and
linearisations of a predictor loss over a group tree kept on the device
(:class:`~.hierarchy.DeviceTree`, built once per problem and kept in its cache).

:class:`HierarchicalCudaEngine` evaluates the value and gradient of a hierarchical
objective this way: the product ``X theta``, one kernel for the losses and their
derivatives, the tree, one product with ``X^T`` (and one launch for a ridge term), then
one read of the status. Its value alone skips the weights and the product with ``X^T``;
its Hessian-vector product (:func:`hvp`) adds, per level, the weighted means of the
directional derivatives over the groups, and also makes one read. The tree is kept in the
problem's cache. Its linearisation (:func:`linearize`) keeps the
losses, both derivatives and the weights at ``theta``, so that each product of a Newton
step costs ``X v``, the levels' passes and one product with ``X^T``, without a read.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from ..objective.linearization import Linearization
from . import source
from .hierarchy import (
    BLOCK_THREADS,
    FINISH_THREADS,
    DeviceTree,
    _blocks,
    tree_eval,
)

__all__ = [
    "HIERARCHICAL_CUDA",
    "HierarchicalCudaEngine",
    "device_tree",
    "hvp",
    "linearize",
    "value",
    "value_and_gradient",
]


def device_tree(problem: Any) -> DeviceTree:
    """The problem's tree on the device, built at the first call and kept in its cache
    (shared by the copies of the problem with other tilts)."""
    key = ("cuda-tree", np.dtype(problem.dtype).name)
    tree = problem.cache.get(key)
    if tree is None:
        tree = DeviceTree.from_tree(problem.tree, problem.dtype, problem.prior)
        problem.cache[key] = tree
    return tree


def _losses(X: Any, y: Any, theta: Any, loss: Any) -> tuple[Any, Any, Any, Any]:
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
    X: Any, y: Any, theta: Any, tree: DeviceTree, tilts: Any, loss: Any, l2: float = 0.0
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
    X: Any, y: Any, theta: Any, tree: DeviceTree, tilts: Any, loss: Any, l2: float = 0.0
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
    loss: Any,
    l2: float = 0.0,
) -> Any:
    """The Hessian-vector product ``H(theta) v`` of the hierarchical tilted risk of
    ``loss`` plus ``l2/2 |theta|^2``, or None when a loss is not finite or a tilt is
    infinite (where the Hessian is not defined).

    The formula of :mod:`tiltlab.objective.engines.generic`: one product of ``X`` with
    ``[theta v]``, one launch for the losses and their derivatives, the tree's weights,
    then :func:`_products`; ``8 + 6 D`` launches for ``D`` levels (with the tree's and the
    zeroed sums'), one read.
    """
    import cupy

    if not all(math.isfinite(float(t)) for t in tilts):
        return None
    th = cupy.ascontiguousarray(theta, dtype=X.dtype)
    vv = cupy.ascontiguousarray(v, dtype=X.dtype)
    zu = cupy.matmul(X, cupy.stack([th, vv], axis=1))  # one pass for both predictors
    fn, ell, d1, a, hu = _derivatives(X, y, zu, loss)
    out, w = tree_eval(ell, tree, tilts, weights=True)
    prod = _products(fn, X, tree, tilts, w, d1, a, hu, vv, l2)
    if out[1:2].get()[0] != 0:  # the one read
        return None
    return prod


def _derivatives(X: Any, y: Any, zu: Any, loss: Any) -> tuple[Any, ...]:
    """``(kernels, l, d1, a, hu)`` from the predictors ``zu`` (rows ``(z, u)``): the
    losses, their first derivatives, ``a = d1 u`` and ``hu = d2 u``, in one launch."""
    import cupy

    n, d = int(X.shape[0]), int(X.shape[1])
    yy = cupy.ascontiguousarray(y, dtype=X.dtype)
    fn = partial(source.function, source.vg_source(loss, X.dtype, d))
    ell, d1, a, hu = (cupy.empty(n, dtype=X.dtype) for _ in range(4))
    fn("tilted_loss_d12")((_blocks(n),), (BLOCK_THREADS,), (zu, yy, cupy.int64(n), ell, d1, a, hu))
    return fn, ell, d1, a, hu


def _products(
    fn: Any, X: Any, tree: DeviceTree, tilts: Any, w: Any, d1: Any, a: Any, hu: Any, vv: Any,
    l2: float,
) -> Any:  # fmt: skip
    """``H v`` from the samples' weights ``w``, first derivatives ``d1``, directional
    derivatives ``a = d1 u`` and curvatures ``hu = d2 u`` (``u = X v``): per level two
    launches (the weighted sums of ``a`` over the level's groups, and each sample's step
    up to its group there), one for the root and the coefficients, one product with
    ``X^T`` and one launch for a ridge term. No read."""
    import cupy

    n = int(X.shape[0])
    dtype = X.dtype
    T = dtype.type
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
    return prod


def linearize(
    X: Any, y: Any, theta: Any, tree: DeviceTree, tilts: Any, loss: Any, l2: float = 0.0
) -> tuple[Any, Any, Any, Any, Any] | None:
    """``(value, gradient, losses, weights, products)`` at ``theta``, ``products(v)``
    giving ``H(theta) v``; None when a loss is not finite or a tilt is infinite.

    One product ``X theta``, one launch for the losses and both derivatives (those of
    :func:`hvp` at ``u = 1``: ``a = d1`` and ``hu = d2`` exactly), the tree's weights,
    the gradient's product with ``X^T``, one read. Each product then takes ``X v``, two
    elementwise products (``d1 u``, ``d2 u``) and :func:`_products`: no loss, no weight
    and no read again."""
    import cupy

    if not all(math.isfinite(float(t)) for t in tilts):
        return None
    dtype = X.dtype
    th = cupy.ascontiguousarray(theta, dtype=dtype)
    z = cupy.matmul(X, th)
    fn, ell, d1, _, d2 = _derivatives(X, y, cupy.stack([z, cupy.ones_like(z)], axis=1), loss)
    out, w = tree_eval(ell, tree, tilts, weights=True)
    grad = cupy.matmul(w * d1, X)
    if l2:
        _ridge(fn, grad, th, l2, out)
    if out[1:2].get()[0] != 0:  # the one read
        return None

    def products(v: Any) -> Any:
        vv = cupy.ascontiguousarray(v, dtype=dtype)
        u = cupy.matmul(X, vv)
        return _products(fn, X, tree, tilts, w, d1, d1 * u, d2 * u, vv, l2)

    return out[0], grad, ell, w, products


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

    def linearize(self, problem: Any, theta: Any, ctx: Any) -> Any:
        out = self._call(linearize, problem, ctx, 2, theta)
        if out is None:
            return None
        value, grad, ell, w, products = out

        def counted(v: Any) -> Any:
            ctx.count(2)
            return products(v)

        return Linearization(theta, value, grad, ell, w, counted)

    @staticmethod
    def _call(fn: Any, problem: Any, ctx: Any, passes: int, *vectors: Any) -> Any:
        """``fn(X, y, *vectors, tree, tilts, loss, l2)``, counted as ``passes`` over ``X``
        (None, uncounted, when ``fn`` declines)."""
        tree = device_tree(problem)
        l2 = float(problem.l2 or 0.0)
        out = fn(problem.X, problem.y, *vectors, tree, problem.tilts, problem.loss, l2)
        if out is None:
            return None
        ctx.count(passes)
        return out


HIERARCHICAL_CUDA = HierarchicalCudaEngine()

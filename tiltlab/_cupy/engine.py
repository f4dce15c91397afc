"""The fused CUDA engine: value and gradient in one kernel that reads ``X`` once, and a
finish on the device.

``tilted_vg`` (``kernels.cu``): a group of ``L`` lanes (a power of two up to a warp)
loads rows of ``X`` into registers, forms ``z = x . theta`` by a shuffle reduction,
evaluates the loss and its derivative (``tilt.cuh``), folds the sample into the lanes'
tilted states under a shift common to the group (moved, with the group's gradient sums,
whenever a loss passes it) and adds ``exp(t (l - c)) l' x`` to per-lane gradient sums.
The groups of a warp merge their states and gradient sums by shuffles, the warps of a
block theirs in shared memory (in warp order, the same sums at every run), and every block
writes one state (the empty state when it had no row) and one row of gradient sums.
``tilted_vg_finish``, one block, merges the blocks' states, writes the value with the
ridge term and each block's share of the normalised gradient; ``tilted_vg_grad`` then
forms the gradient, the product of those shares with the gradient sums (in a fixed order,
and without the host time of a cuBLAS call on so small a product). An evaluation is three
launches and one read to the host (the value and a status: non-finite losses decline, and the
generic path raises or gives IEEE values).

It serves ``value_and_gradient`` for the losses with C code (:data:`~.source.C_LOSSES`,
exactly their registered classes), sample-level finite non-zero tilts, uniform priors and
C-contiguous float32/float64 ``X`` with up to :data:`~.source.MAX_FEATURES` features on
CuPy arrays. Hierarchical objectives of such losses and data (any tilts and priors) go
to :mod:`.hierarchical_engine` (value, gradient, Hessian-vector products, linearisation)
on the group tree of :mod:`.hierarchy`, uploaded once per problem. Everything else goes
on to the next engines.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..losses import get_loss
from ..objective.engines.base import Context, Engine
from . import source
from .hierarchical_engine import HIERARCHICAL_CUDA

__all__ = ["FUSED_CUDA", "FusedCudaEngine", "has_c_code", "supported", "value_and_gradient"]

#: threads per block of the main kernel
THREADS = 256
#: threads of the finish kernel (``TL_FINISH_THREADS`` in kernels.cu)
FINISH_THREADS = 512
#: warps of a block of the gradient's product (``TL_GRAD_WARPS`` in kernels.cu)
GRAD_WARPS = 32


def has_c_code(loss: Any) -> bool:
    """Whether ``loss`` is one whose C code is in ``tilt.cuh``: a registered loss with a
    ``tl_loss_<name>`` function, of exactly its registered class (a subclass or another
    loss of the same name may compute something else)."""
    name = getattr(loss, "name", None)
    if name not in source.C_LOSSES:
        return False
    return type(loss) is type(get_loss(name))


def supported(X: Any, t: float, shape: tuple) -> bool:
    """Whether the fused kernel serves a value and gradient with data ``X`` (a CuPy
    array), tilt ``t`` and parameter ``shape`` (the engine checks the loss, the prior and
    the tilt tree)."""
    try:
        import cupy
    except ImportError:  # pragma: no cover - no CuPy here
        return False
    if not isinstance(X, cupy.ndarray) or X.ndim != 2:
        return False
    if t == 0.0 or not math.isfinite(t):
        return False
    if X.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return False
    if not X.flags.c_contiguous:
        return False
    return 0 < X.shape[1] <= source.MAX_FEATURES and len(shape) == 1


def _grid(src: str, n: int, L: int) -> int:
    """Blocks for one resident wave (occupancy from the kernel's register count)."""
    sms = source.multiprocessors()
    regs = source.registers(src, "tilted_vg")
    per_sm = max(1, min(2048 // THREADS, 65536 // (regs * THREADS), 32))
    return max(1, min(sms * per_sm, -(-n * L // THREADS)))


def tiny_sqrt(dtype: Any) -> float:
    """The mean-regime threshold of the tilted reduction for ``dtype``."""
    return math.sqrt(float(np.finfo(dtype).tiny))


def value_and_gradient(
    X: Any, y: Any, theta: Any, t: float, loss: Any, l2: float = 0.0
) -> tuple[Any, Any] | None:
    """Value (0-d) and gradient of the tilted risk of ``loss`` (a loss with C code, or its
    name: see :func:`.source.vg_source`) plus ``l2/2 |theta|^2``
    (see :func:`supported`), or None for non-finite losses. Three launches, one read."""
    import cupy

    n, d = int(X.shape[0]), int(X.shape[1])
    dtype = X.dtype
    src = source.vg_source(loss, dtype, d)
    kern, fin = source.function(src, "tilted_vg"), source.function(src, "tilted_vg_finish")
    gk = source.function(src, "tilted_vg_grad")
    L = source.launch_shape(d)[0]  # lanes per row group
    blocks = _grid(src, n, L)
    n_states = blocks  # the states written: one per block
    st = cupy.empty((n_states, 7), dtype=dtype)
    acc = cupy.empty((n_states + 1, d), dtype=dtype)  # the last row: theta (ridge term)
    f = cupy.empty(n_states + 1, dtype=dtype)
    out = cupy.empty(2, dtype=dtype)
    th = cupy.ascontiguousarray(theta, dtype=dtype)
    yy = cupy.ascontiguousarray(y, dtype=dtype)
    T = dtype.type
    kern((blocks,), (THREADS,), (X, yy, th, cupy.int64(n), cupy.int32(d), T(t), st, acc))
    fin(
        (1,),
        (FINISH_THREADS,),
        (
            st,
            cupy.int64(n_states),
            T(t),
            T(tiny_sqrt(dtype)),
            th,
            cupy.int32(d),
            T(l2),
            f,
            acc[n_states],
            out,
        ),
    )
    grad = cupy.empty(d, dtype=dtype)
    gk((-(-d // 32),), (32 * GRAD_WARPS,), (f, acc, cupy.int64(n_states + 1), cupy.int32(d), grad))
    status = out.get()[1]  # the one read: the value rides along for the caller
    if status != 0:
        return None
    return out[0], grad


class FusedCudaEngine(Engine):
    """One CUDA kernel per value and gradient, finished on the device."""

    name = "fused CUDA"

    def applies(self, problem: Any) -> bool:
        if problem.groups is not None:
            return HIERARCHICAL_CUDA.applies(problem, has_c_code)
        if not problem.is_linear:
            return False
        if problem.weights is not None or not has_c_code(problem.loss):
            return False
        return supported(problem.X, problem.tilts[0], problem.shape)

    def value(self, problem: Any, theta: Any, ctx: Context) -> Any:
        # a hierarchy's value on the device tree; a flat value is one tilted_risk of the
        # losses (the generic path's, already one pass and one read on CuPy)
        if not ctx.fused or problem.groups is None:
            return None
        return HIERARCHICAL_CUDA.value(problem, theta, ctx)

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        if not ctx.fused or problem.groups is None:
            return None
        return HIERARCHICAL_CUDA.hvp(problem, theta, v, ctx)

    def linearize(self, problem: Any, theta: Any, ctx: Context) -> Any:
        # a hierarchy's linearisation on the device tree; a flat one is the generic
        # path's (its weights are one tilted_weights, already one pass on CuPy)
        if not ctx.fused or problem.groups is None:
            return None
        return HIERARCHICAL_CUDA.linearize(problem, theta, ctx)

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        if not ctx.fused:
            return None
        if problem.groups is not None:
            return HIERARCHICAL_CUDA.value_and_gradient(problem, theta, ctx)
        out = value_and_gradient(
            problem.X,
            problem.y,
            theta,
            problem.tilts[0],
            problem.loss,
            float(problem.l2 or 0.0),
        )
        if out is None:
            return None
        ctx.count(1)
        return out


FUSED_CUDA = FusedCudaEngine()

"""The Dask chunk route of the fused CPU kernels: a NumPy chunk's tilted state in one pass.

Registered in :data:`tiltlab.distributed.CHUNK_ROUTES` for NumPy chunks (see
:mod:`tiltlab.distributed._chunk_engine` for the route's place in an evaluation). One
fused pass over the chunk's rows (:meth:`FusedProblem.block_states`): the kernels split
the chunk into row blocks of their own and return one tilted state per block
(:class:`KernelStates`: shift, extremes, mass, ``s``, ``q``, ``lsum``) with the block's
unnormalised gradient (or the pieces of a Hessian-vector product); those block states are
merged by :meth:`KernelStates.merged` (the accumulator's exact merge,
:meth:`~tiltlab.accumulator.GroupState.collapse`, vectorised over the blocks), so that
the chunk's state is the accumulator's state of the chunk up to rounding. Value, gradient
and Hessian-vector products; the scalar losses the kernels know and the multinomial loss.
For a hierarchy, :func:`numpy_group_state` gives the chunk's state per innermost group
with per-group sums (:meth:`FusedProblem.group_states`, one pass; the same losses). The
data of a chunk are validated and bound once per worker process (a small cache keyed by
the chunk arrays), not at every evaluation.

A kernel that a worker process has neither compiled nor found in the cache is not
compiled in the task that needs it (seconds of compiling in every worker at once): as for
the eager objectives (:mod:`tiltlab._cpu_kernels.warmup`), one background process
compiles it into the cache while the chunks take the generic route, and they take the
kernel from the first evaluation after it is ready (the two routes agree to rounding).
With ``TILTLAB_FUSED=wait`` a task compiles what it needs on its first call.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from .._compat import to_numpy
from ..distributed import DECLINE, ChunkRoute
from ._launch import KernelsUnavailable
from ._prepare import LOSS_CODES
from .fused import FusedProblem, use_fused

__all__ = [
    "MAX_GROUP_SUM_ENTRIES",
    "NUMPY_CHUNKS",
    "numpy_group_state",
    "numpy_groups_apply",
    "numpy_route_applies",
    "numpy_state",
]

#: bound chunks kept per worker process (a persisted chunk is the same object at every
#: evaluation; a few dozen cover the chunks a worker holds in the benchmarks)
_BOUND_MAX = 256
_BOUND: OrderedDict = OrderedDict()
_LOCK = threading.Lock()
#: held around a kernel call while numba's threading layer may not take concurrent
#: launches (its ``workqueue`` layer, or before the first parallel kernel has run)
_KERNEL_LOCK = threading.Lock()


def _kernel_guard() -> Any:
    """A lock for a kernel call where numba's threading layer cannot be entered by two
    threads at once (a Dask worker with several threads), else a no-op context."""
    import contextlib

    import numba

    try:
        safe = numba.threading_layer() != "workqueue"
    except ValueError:  # no parallel kernel has run in this process yet
        safe = False
    return contextlib.nullcontext() if safe else _KERNEL_LOCK


def numpy_route_applies(loss: Any, n: int, d: int, k: int) -> bool:
    """Whether NumPy chunks of an ``n x d`` problem (``k`` outputs) take the fused kernels:
    the loss is one the kernels know and the problem passes the fused engine's size policy
    (:func:`~tiltlab._cpu_kernels.use_fused`, which also needs numba)."""
    name = getattr(loss, "name", None)
    return name in LOSS_CODES and use_fused(n, d, k)


def _loss_params(loss: Any) -> dict | None:
    params = loss.parameters() if hasattr(loss, "parameters") else {}
    return dict(params) or None


def _bound(Xb: np.ndarray, yb: Any, pb: Any, loss: Any) -> Any:
    """The chunk's data validated and bound for the kernels (cached per chunk arrays), or
    None when the kernels do not take them (labels, dtype, an all-zero prior...)."""
    key = (id(Xb), id(yb), id(pb), loss.name, tuple(sorted((_loss_params(loss) or {}).items())))
    with _LOCK:
        hit = _BOUND.get(key)
        if hit is not None:
            refs, fp = hit
            if all(r() is a for r, a in zip(refs, (Xb, yb, pb), strict=True)):
                _BOUND.move_to_end(key)
                return fp
    try:
        fp = FusedProblem(loss.name, Xb, yb, pb, loss_params=_loss_params(loss))
    except (TypeError, ValueError):
        fp = None
    try:
        refs = tuple((lambda: None) if a is None else weakref.ref(a) for a in (Xb, yb, pb))
    except TypeError:  # an array type without weak references: not cached
        return fp
    with _LOCK:
        _BOUND[key] = (refs, fp)
        while len(_BOUND) > _BOUND_MAX:
            _BOUND.popitem(last=False)
    return fp


def numpy_state(
    Xb: Any, yb: Any, pb: Any, theta: Any, V: Any, loss: Any, t: float, mode: str
) -> Any:
    """NumPy chunk: the fused kernels' block states merged into one state (see the module
    doc); :data:`DECLINE` for a dense Hessian, a loss or data the kernels do not take, a
    chunk without prior mass, and non-finite losses."""
    if mode not in ("value", "grad", "hvp") or not isinstance(Xb, np.ndarray):
        return DECLINE
    if int(Xb.shape[0]) == 0:
        return DECLINE
    fp = _bound(Xb, yb, pb, loss)
    if fp is None or not fp.prepared("hvp" if mode == "hvp" else "value_and_gradient"):
        return DECLINE
    try:
        with _kernel_guard():
            states = fp.block_states(
                np.asarray(to_numpy(theta)),
                t,
                gradient=mode == "grad",
                hvp_vector=np.asarray(to_numpy(V)) if mode == "hvp" else None,
            )
    except (TypeError, ValueError, KernelsUnavailable):
        return DECLINE
    if states is None or not np.any(states.present):
        return DECLINE  # non-finite losses: the generic route decides what they give
    return states.merged()


#: most entries of one per-group sum of a NumPy chunk (``n_groups x d``, times the classes
#: ``K`` of the multinomial loss; float64) for the fused grouped route; beyond it
#: hierarchies keep the generic two sweeps
MAX_GROUP_SUM_ENTRIES = 1 << 21


def numpy_groups_apply(loss: Any, n: int, d: int, n_groups: int, k: int = 1) -> bool:
    """Whether NumPy chunks of a hierarchical ``n x d`` problem (``k`` outputs: the classes
    of the multinomial loss) with ``n_groups`` innermost groups take the fused grouped
    kernel (:meth:`FusedProblem.group_states`): a loss the kernels
    know, the fused engine's size policy, and ``n_groups x d x k`` sums of at most
    :data:`MAX_GROUP_SUM_ENTRIES` entries."""
    k = max(int(k), 1)
    return n_groups * d * k <= MAX_GROUP_SUM_ENTRIES and numpy_route_applies(loss, n, d, k)


def numpy_group_state(
    Xb: Any,
    yb: Any,
    pb: Any,
    cb: Any,
    theta: Any,
    V: Any,
    loss: Any,
    tau: float,
    n_groups: int,
    mode: str,
) -> Any:
    """NumPy chunk of a hierarchy: the :class:`GroupState` of its innermost groups with the
    per-group sums of ``mode`` (those of
    :func:`~tiltlab.distributed._groups_stream.chunk_group_sums`), from one fused pass of
    the grouped kernel; :data:`DECLINE` for a loss or data the kernels do not take, a
    chunk without rows or prior mass, and non-finite losses."""
    if mode not in ("value", "grad", "hvp") or not isinstance(Xb, np.ndarray):
        return DECLINE
    if int(Xb.shape[0]) == 0:
        return DECLINE
    fp = _bound(Xb, yb, pb, loss)
    if fp is None or not fp.prepared("group_states"):
        return DECLINE
    try:  # one thread walks the rows (no threading layer: no guard)
        states = fp.group_states(
            np.asarray(to_numpy(theta)),
            tau,
            np.asarray(to_numpy(cb)),
            int(n_groups),
            gradient=mode == "grad",
            hvp_vector=np.asarray(to_numpy(V)) if mode == "hvp" else None,
        )
    except (TypeError, ValueError, KernelsUnavailable):
        return DECLINE
    if states is None:
        return DECLINE  # non-finite losses: the generic route decides what they give
    return states.group_state()


#: the route registered for NumPy chunks
NUMPY_CHUNKS = ChunkRoute(
    applies=numpy_route_applies,
    state=numpy_state,
    groups_apply=numpy_groups_apply,
    group_state=numpy_group_state,
)

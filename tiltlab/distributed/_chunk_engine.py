"""A chunk's tilted state from the compiled engines (the fast route of a Dask chunk).

A task of a sample-level Dask evaluation turns one row chunk into a
:class:`~tiltlab.accumulator.TiltState` (its extremes, mass, normaliser and the weighted
sums of the mode); the states then merge exactly in the tree of
:mod:`tiltlab.distributed._objective`. :func:`chunk_state` forms that state with a
compiled engine when one serves the chunk, and returns :data:`DECLINE` otherwise (the
caller then takes the generic array-API route of :mod:`tiltlab.distributed._states`,
which is also the reference the fast routes are tested against). The route is chosen by
the chunk's array library:

* **NumPy chunks**: the fused CPU kernels (:mod:`tiltlab._cpu_kernels`, numba) in one pass
  over the chunk's rows, through their public face only
  (:meth:`~tiltlab._cpu_kernels.FusedProblem.block_states`). The kernels split the chunk
  into row blocks of their own and return one tilted state per block
  (:class:`~tiltlab._cpu_kernels.KernelStates`: shift, extremes, mass, ``s``, ``q``,
  ``lsum``) with the block's unnormalised gradient (or the pieces of a Hessian-vector
  product); those block states are merged here by
  :meth:`~tiltlab.accumulator.GroupState.collapse` (the accumulator's exact merge,
  vectorised over the blocks), so that the chunk's state is the accumulator's state of
  the chunk up to rounding. Value, gradient and Hessian-vector products; the scalar
  losses the kernels know and the multinomial loss. For a hierarchy,
  :func:`numpy_group_state` gives the chunk's state per innermost group with per-group
  sums (:meth:`~tiltlab._cpu_kernels.FusedProblem.group_states`, one pass; the same
  losses), which merges group by group with the other chunks' (the one-sweep graph of
  :mod:`tiltlab.distributed._groups`). The data of a chunk are validated and bound once
  per worker process (a small cache keyed by the chunk arrays), not at every evaluation.
* **other libraries** (CuPy): the engine registered for the library in
  :data:`tiltlab.objective.engines.ENGINES` (the fused CUDA kernel for CuPy), asked for
  the value and gradient of the chunk alone. A chunk's tilted risk ``R`` and gradient
  ``g`` are an exact state of its samples: ``sum_i p_i exp(t (l_i - R)) = sum_i p_i``, so
  the state with shift ``R``, normaliser ``s`` equal to the chunk's prior mass ``m`` and
  sum ``m g`` merges with the others by the same rule (at ``t = 0``: the mean ``R`` with
  ``lsum = 0``). Value and gradient only (a Hessian-vector product needs a sum the
  engines do not return), and only where the engine accepts the chunk (an engine that
  declines, or returns None, leaves the chunk to the generic route).

Non-finite losses are always left to the generic route, which decides what they give.

A kernel that a worker process has neither compiled nor found in the cache is not
compiled in the task that needs it (seconds of compiling in every worker at once): as for
the eager objectives (:mod:`tiltlab._cpu_kernels._warm`), one background process compiles
it into the cache while the chunks take the generic route, and they take the kernel from
the first evaluation after it is ready (the two routes agree to rounding). With
``TILTLAB_FUSED=wait`` a task compiles what it needs on its first call.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from .._compat import device, library_namespace, to_numpy
from .._dispatch import Dispatch, library_of
from ..accumulator import GroupState, TiltState

__all__ = [
    "DECLINE",
    "STATE_ROUTES",
    "chunk_state",
    "MAX_GROUP_SUM_ENTRIES",
    "numpy_state",
    "numpy_group_state",
    "numpy_groups_apply",
    "engine_state",
    "numpy_route_applies",
]

#: what a route returns when it does not serve a chunk (the generic route then does)
DECLINE = "decline"

#: chunk-state routes by array library (``route(Xb, yb, pb, theta, V, loss, t, mode)``);
#: a library without an entry goes to its registered objective engine (:func:`engine_state`)
STATE_ROUTES = Dispatch("chunk state route")

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


def chunk_state(
    Xb: Any, yb: Any, pb: Any, theta: Any, V: Any, loss: Any, t: float, mode: str
) -> Any:
    """The chunk's :class:`~tiltlab.accumulator.TiltState` (NumPy fields) from a compiled
    engine, :data:`~tiltlab.distributed._states.EMPTY`-free; :data:`DECLINE` when no
    compiled route serves the chunk (or its losses are not finite)."""
    route = STATE_ROUTES.lookup(library_of(Xb))
    if route is None:
        route = engine_state
    return route(Xb, yb, pb, theta, V, loss, t, mode)


# ---------------------------------------------------------------------------------------
# NumPy chunks: the fused CPU kernels


def numpy_route_applies(loss: Any, n: int, d: int, k: int) -> bool:
    """Whether NumPy chunks of an ``n x d`` problem (``k`` outputs) take the fused kernels:
    the loss is one the kernels know and the problem passes the fused engine's size policy
    (:func:`tiltlab._cpu_kernels.use_fused`, which also needs numba)."""
    from .. import _cpu_kernels

    name = getattr(loss, "name", None)
    return name in _cpu_kernels.LOSS_CODES and _cpu_kernels.use_fused(n, d, k)


def _loss_params(loss: Any) -> dict | None:
    params = loss.parameters() if hasattr(loss, "parameters") else {}
    return dict(params) or None


def _bound(Xb: np.ndarray, yb: Any, pb: Any, loss: Any) -> Any:
    """The chunk's data validated and bound for the kernels (cached per chunk arrays), or
    None when the kernels do not take them (labels, dtype, an all-zero prior...)."""
    from .. import _cpu_kernels

    key = (id(Xb), id(yb), id(pb), loss.name, tuple(sorted((_loss_params(loss) or {}).items())))
    with _LOCK:
        hit = _BOUND.get(key)
        if hit is not None:
            refs, fp = hit
            if all(r() is a for r, a in zip(refs, (Xb, yb, pb), strict=True)):
                _BOUND.move_to_end(key)
                return fp
    try:
        fp = _cpu_kernels.FusedProblem(loss.name, Xb, yb, pb, loss_params=_loss_params(loss))
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
    from .. import _cpu_kernels

    try:
        with _kernel_guard():
            states = fp.block_states(
                np.asarray(to_numpy(theta)),
                t,
                gradient=mode == "grad",
                hvp_vector=np.asarray(to_numpy(V)) if mode == "hvp" else None,
            )
    except (TypeError, ValueError, _cpu_kernels.KernelsUnavailable):
        return DECLINE
    if states is None or not np.any(states.present):
        return DECLINE  # non-finite losses: the generic route decides what they give
    st = _group_state(states).collapse()
    if st.t == 0.0:  # the mean's state has no small-tilt sum (as the accumulator's own)
        st = _replace_q(st, None)
    return st


def _group_state(states: Any) -> GroupState:
    """The :class:`GroupState` of the kernels' :class:`~tiltlab._cpu_kernels.KernelStates`
    (one entry per block or group; the small-tilt sum is absent at ``t = 0``, as in the
    accumulator's own states)."""
    t = float(states.t)
    return GroupState(
        t=t, hi=states.hi, lo=states.lo, mass=states.mass, s=states.s,
        q=None if t == 0.0 else states.q, lsum=states.lsum, sums=tuple(states.sums),
    )  # fmt: skip


def _replace_q(st: TiltState, q: Any) -> TiltState:
    from dataclasses import replace

    return replace(st, q=q)


#: most entries of one per-group sum of a NumPy chunk (``n_groups x d``, times the classes
#: ``K`` of the multinomial loss; float64) for the fused grouped route; beyond it
#: hierarchies keep the generic two sweeps
MAX_GROUP_SUM_ENTRIES = 1 << 21


def numpy_groups_apply(loss: Any, n: int, d: int, n_groups: int, k: int = 1) -> bool:
    """Whether NumPy chunks of a hierarchical ``n x d`` problem (``k`` outputs: the classes
    of the multinomial loss) with ``n_groups`` innermost groups take the fused grouped
    kernel (:meth:`~tiltlab._cpu_kernels.FusedProblem.group_states`): a loss the kernels
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
    from .. import _cpu_kernels

    try:  # one thread walks the rows (no threading layer: no guard)
        states = fp.group_states(
            np.asarray(to_numpy(theta)),
            tau,
            np.asarray(to_numpy(cb)),
            int(n_groups),
            gradient=mode == "grad",
            hvp_vector=np.asarray(to_numpy(V)) if mode == "hvp" else None,
        )
    except (TypeError, ValueError, _cpu_kernels.KernelsUnavailable):
        return DECLINE
    if states is None:
        return DECLINE  # non-finite losses: the generic route decides what they give
    return _group_state(states)


STATE_ROUTES.register("numpy", numpy_state)


# ---------------------------------------------------------------------------------------
# other libraries: the objective engine registered for the chunk's library


def _no_count(k: float) -> None:
    return None


def _no_update(problem: Any) -> None:
    return None


def engine_state(
    Xb: Any, yb: Any, pb: Any, theta: Any, V: Any, loss: Any, t: float, mode: str
) -> Any:
    """The state of a chunk from the engine registered for its library (see the module
    doc): :data:`DECLINE` when there is none, for modes other than value and gradient, or
    when the engine declines the chunk."""
    if mode not in ("value", "grad"):
        return DECLINE
    from ..objective.engines import ENGINES, Context
    from ..objective.problem import TiltedProblem

    xp = library_namespace(Xb)
    engine = ENGINES.dispatch(xp)
    n, d = int(Xb.shape[0]), int(Xb.shape[1])
    if engine is None or n == 0:
        return DECLINE
    theta = np.asarray(to_numpy(theta))
    dev = device(Xb)
    mass = float(n)
    prior = None
    if pb is not None:
        mass = float(np.sum(np.asarray(to_numpy(pb), dtype=np.float64)))
        if not mass > 0:
            return DECLINE
        prior = pb / xp.asarray(mass, dtype=pb.dtype, device=dev)  # normalised, as prepared
    # the chunk's own problem: the prior slice as weights and as the prepared (normalised)
    # prior, so that an engine which does not take prior weights declines the chunk
    problem = TiltedProblem(
        loss=loss,
        X=Xb,
        y=yb,
        xp=xp,
        tilts=(float(t),),
        weights=pb,
        prior=prior,
        n_samples=n,
        n_features=d,
        shape=tuple(theta.shape),
        dtype=Xb.dtype,
        device=dev,
    )
    if not engine.applies(problem):
        return DECLINE
    th = xp.asarray(theta, dtype=Xb.dtype, device=dev)
    ctx = Context(count=_no_count, update=_no_update)
    value = engine.value(problem, th, ctx) if mode == "value" else None
    grad = None
    if value is None:  # engines that only give both (the fused CUDA kernel)
        out = engine.value_and_gradient(problem, th, ctx)
        if out is None:
            return DECLINE
        value, grad = out
        grad = grad if mode == "grad" else None
    R = float(np.asarray(to_numpy(value), dtype=np.float64))
    if not np.isfinite(R):
        return DECLINE
    sums = () if grad is None else (np.asarray(to_numpy(grad), dtype=np.float64) * mass,)
    m = np.float64(mass)
    return TiltState(
        t=float(t),
        hi=R,
        lo=R,
        mass=m,
        s=m,
        q=None if t == 0.0 else np.float64(0.0),
        lsum=np.float64(0.0),
        sums=sums,
    )

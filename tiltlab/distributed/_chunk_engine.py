"""A chunk's tilted state from the compiled engines (the fast route of a Dask chunk).

A task of a sample-level Dask evaluation turns one row chunk into a
:class:`~tiltlab.accumulator.TiltState` (its extremes, mass, normaliser and the weighted
sums of the mode); the states then merge exactly in the tree of
:mod:`tiltlab.distributed._objective`. :func:`chunk_state` forms that state with a
compiled engine when one serves the chunk, and returns :data:`DECLINE` otherwise (the
caller then takes the generic array-API route of :mod:`tiltlab.distributed._states`,
which is also the reference the fast routes are tested against). The route is chosen by
the chunk's array library:

* a library with a :class:`ChunkRoute` registered in :data:`CHUNK_ROUTES` takes it. The
  compiled CPU kernels register theirs for **NumPy chunks** (``tiltlab/_backends.py``
  names them): one fused pass over the chunk's rows gives one tilted state per row block
  of the kernels' own, merged into the chunk's state by the accumulator's exact merge
  (:meth:`~tiltlab.accumulator.GroupState.collapse`), with the gradient (or the pieces
  of a Hessian-vector product); for a hierarchy, the chunk's state per innermost group
  with per-group sums (:func:`numpy_group_state`), which merges group by group with the
  other chunks' (the one-sweep graph of :mod:`tiltlab.distributed._groups`).
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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import device, library_namespace, to_numpy
from .._dispatch import Dispatch, library_of
from ..accumulator import TiltState

__all__ = [
    "CHUNK_ROUTES",
    "DECLINE",
    "ChunkRoute",
    "chunk_state",
    "engine_state",
    "numpy_group_state",
    "numpy_groups_apply",
    "numpy_route_applies",
]

#: what a route returns when it does not serve a chunk (the generic route then does)
DECLINE = "decline"


@dataclass(frozen=True)
class ChunkRoute:
    """The compiled route of the chunks of one array library.

    Parameters
    ----------
    applies : callable
        ``applies(loss, n, d, k) -> bool``: whether the chunks of a sample-level ``n x d``
        problem (``k`` outputs) take the route (asked on the client, before the graph).
    state : callable
        ``state(Xb, yb, pb, theta, V, loss, t, mode)``: the chunk's
        :class:`~tiltlab.accumulator.TiltState`, or :data:`DECLINE`.
    groups_apply : callable
        ``groups_apply(loss, n, d, n_groups, k) -> bool``: the same question for a
        hierarchy with ``n_groups`` innermost groups.
    group_state : callable
        ``group_state(Xb, yb, pb, cb, theta, V, loss, tau, n_groups, mode)``: the chunk's
        :class:`~tiltlab.accumulator.GroupState` over its innermost groups (codes ``cb``)
        with the per-group sums of ``mode``, or :data:`DECLINE`.
    """

    applies: Callable[..., bool]
    state: Callable[..., Any]
    groups_apply: Callable[..., bool]
    group_state: Callable[..., Any]


#: compiled chunk routes by array library (:class:`ChunkRoute`); a library without one goes
#: to its registered objective engine (``engine_state``)
CHUNK_ROUTES = Dispatch("dask chunk routes")


def chunk_state(
    Xb: Any, yb: Any, pb: Any, theta: Any, V: Any, loss: Any, t: float, mode: str
) -> Any:
    """The chunk's :class:`~tiltlab.accumulator.TiltState` (NumPy fields) from a compiled
    engine, :data:`~tiltlab.distributed._states.EMPTY`-free; :data:`DECLINE` when no
    compiled route serves the chunk (or its losses are not finite)."""
    route = CHUNK_ROUTES.lookup(library_of(Xb))
    if route is None:
        return engine_state(Xb, yb, pb, theta, V, loss, t, mode)
    return route.state(Xb, yb, pb, theta, V, loss, t, mode)


# ---------------------------------------------------------------------------------------
# NumPy chunks: the route registered for them (the fused CPU kernels)


def numpy_route_applies(loss: Any, n: int, d: int, k: int) -> bool:
    """Whether NumPy chunks of an ``n x d`` problem (``k`` outputs) take the compiled route
    registered for NumPy (:attr:`ChunkRoute.applies`); False without one."""
    route = CHUNK_ROUTES.lookup("numpy")
    return route is not None and bool(route.applies(loss, n, d, k))


def numpy_groups_apply(loss: Any, n: int, d: int, n_groups: int, k: int = 1) -> bool:
    """Whether NumPy chunks of a hierarchical ``n x d`` problem (``k`` outputs) with
    ``n_groups`` innermost groups take the compiled route registered for NumPy
    (:attr:`ChunkRoute.groups_apply`); False without one."""
    route = CHUNK_ROUTES.lookup("numpy")
    return route is not None and bool(route.groups_apply(loss, n, d, n_groups, k))


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
    """NumPy chunk of a hierarchy: the :class:`~tiltlab.accumulator.GroupState` of its
    innermost groups with the per-group sums of ``mode`` (those of
    :func:`~tiltlab.distributed._groups_stream.chunk_group_sums`) from the compiled route
    registered for NumPy (:attr:`ChunkRoute.group_state`); :data:`DECLINE` without one."""
    route = CHUNK_ROUTES.lookup("numpy")
    if route is None:
        return DECLINE
    return route.group_state(Xb, yb, pb, cb, theta, V, loss, tau, n_groups, mode)


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

"""Tilted objectives on Dask arrays: one task graph per evaluation.

For a linear-predictor loss on Dask data, each evaluation (value, value and gradient,
Hessian-vector product, dense Hessian) is one graph (:func:`evaluation`).
Sample-level tilt: a task per row chunk computes the chunk's tilted accumulator state
(:mod:`tiltlab.accumulator`, with the chunk's weighted sums ``X_b^T c``), the states merge
in a tree, and one last task finishes them (:func:`finish`: the value, the gradient or
product, the ridge term). Hierarchy: the graph sweeps the chunks twice, group states first
and the products ``X_b^T c`` second, with the upper levels finished in between inside the
graph (:mod:`tiltlab.distributed._groups`). Only the value and the ``d``-vector reach the
client.

Two faces run the same graph: the objective's own methods (the Dask engine) return lazy
Dask arrays whose graph is the whole evaluation (:func:`lazy_results`: nothing runs at call
time; ``dask.compute(value, gradient)`` is one graph), and :func:`evaluate` (what the
client-driven solvers call) computes it at once and returns NumPy arrays.

The data are rechunked once to whole rows and, when they fit in the workers' memory,
persisted once (:func:`distribute`); every later graph refers to the persisted chunks.
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import is_dask_namespace, to_numpy
from ..accumulator import finalize_risk, normalized_sums
from ..objective.engines import ENGINES, Context, Engine
from ..objective.problem import TiltedProblem
from ._groups import group_pieces
from ._states import (
    FAN_IN,
    aligned,
    chunk_sample_state,
    merge_states,
    reduce_to,
    tree_reduce,
)

__all__ = [
    "DASK_ENGINE",
    "DaskEngine",
    "DaskPlan",
    "FAN_IN",
    "distribute",
    "evaluate",
    "evaluation",
    "finish",
    "finish_item",
    "in_memory",
    "lazy_hessian",
    "lazy_results",
    "problem_of",
    "supported",
    "tree_reduce",
]

@dataclass
class DaskPlan:
    """Row-chunked (and possibly persisted) data of one objective, with per-chunk keys."""

    X: Any
    y: Any
    p: Any
    codes: Any  # innermost-group codes (hierarchies) or None
    blocks: list  # per chunk: (X_b, y_b, p_b, codes_b) as Delayed (or None)
    persisted: bool
    n_groups: int

    def __reduce__(self):
        # persisted chunks belong to one client session: a pickled objective re-plans
        return (_dropped_plan, ())


def _dropped_plan() -> None:
    return None


def problem_of(objective: Any) -> TiltedProblem:
    """The problem description of an objective (or the problem itself)."""
    if isinstance(objective, TiltedProblem):
        return objective
    problem = getattr(objective, "problem", None)
    if not isinstance(problem, TiltedProblem):
        raise TypeError(
            f"`objective` must be a tiltlab.TiltedObjective, got {type(objective).__name__}"
        )
    return problem


def _memory_budget() -> float:
    """Bytes the data may take when persisted: half the cluster's (or machine's) memory."""
    try:
        from distributed import default_client

        client = default_client()
        workers = client.scheduler_info().get("workers", {})
        total = sum(float(w.get("memory_limit") or 0) for w in workers.values())
        if total > 0:
            return 0.5 * total
    except (ImportError, ValueError):
        pass
    try:
        return 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 0.0


def _like_rows(a: Any, chunks: tuple) -> Any:
    """``a`` (a Dask array, or None) with its first axis chunked as ``chunks``."""
    if a is None:
        return None
    import dask.array as da

    if not isinstance(a, da.Array):
        return da.from_array(np.asarray(to_numpy(a)), chunks=(chunks,) + a.shape[1:])
    want = (chunks,) + tuple((s,) for s in a.shape[1:])
    return a if a.chunks == want else a.rechunk(want)


def distribute(objective: Any, *, persist: bool | str = "auto") -> DaskPlan:
    """Prepare a Dask objective's data for one-graph evaluations (done once, cached).

    ``X`` is rechunked to whole rows (one chunk along the features), ``y``, the prior
    and the group codes follow its row chunks. With ``persist=True`` (or ``"auto"`` when
    the data take at most half the workers' total memory) they are persisted: the data
    then stay on the workers and every evaluation only ships ``theta``.

    Parameters
    ----------
    objective : TiltedObjective or TiltedProblem
        An objective (or its problem) whose ``X`` is a Dask array.
    persist : bool or "auto", default "auto"
        Whether to persist the row chunks on the workers: ``True`` always, ``False``
        never (every evaluation then computes the data from their source), ``"auto"``
        when they take at most half the workers' total memory (half the machine's
        memory without a client).

    Returns
    -------
    DaskPlan
        The row-chunked data, the per-chunk pieces that the evaluations' graphs read, and
        whether they were persisted. The plan is cached on the problem: a second call
        returns it, whatever ``persist`` says.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.distributed import distribute
    >>> X = da.from_array(np.eye(4), chunks=2)
    >>> obj = tl.TiltedObjective("squared", X, da.ones(4, chunks=2), t=1.0)
    >>> plan = distribute(obj, persist=False)
    >>> len(plan.blocks), plan.X.chunks[1]
    (2, (4,))
    """
    problem = problem_of(objective)
    plan = problem.cache.get("dask_plan")
    if plan is not None:
        return plan
    X = problem.X
    X = X.rechunk({1: -1}) if len(X.chunks[1]) > 1 else X
    rows = X.chunks[0]
    y = _like_rows(problem.y, rows)
    p = _like_rows(problem.prior, rows)
    codes, G = None, 1
    if problem.tree is not None:
        codes = _like_rows(problem.tree.levels[0].codes, rows)
        G = problem.tree.levels[0].n_groups
    parts = [a for a in (X, y, p, codes) if a is not None]
    nbytes = sum(float(a.nbytes) for a in parts)
    do = persist is True or (persist == "auto" and nbytes <= _memory_budget())

    def blocks_of(a: Any) -> list:
        if a is None:
            return [None] * len(rows)
        d = a.to_delayed()
        return [d[i] if d.ndim == 1 else d[i, 0] for i in range(len(rows))]

    arrays = [X, y, p, codes]
    if do:
        # chunks arriving in messages may be misaligned: realign once, on the workers
        arrays = [None if a is None else a.map_blocks(aligned, dtype=a.dtype) for a in arrays]
        blocks, arrays = _persist_together(arrays, [blocks_of(a) for a in arrays], rows)
    else:
        blocks = list(zip(*[blocks_of(a) for a in arrays], strict=True))
    X, y, p, codes = arrays
    plan = DaskPlan(X=X, y=y, p=p, codes=codes, blocks=blocks, persisted=do, n_groups=G)
    problem.cache["dask_plan"] = plan
    return plan


def _pack(*pieces: Any) -> tuple:
    return pieces


def _persist_together(arrays: list, columns: list, rows: tuple) -> tuple[list, list]:
    """Persist the row chunks of ``X``, ``y``, the prior and the codes so that the pieces
    of one row chunk live on one worker (a task reading chunk ``i`` then fetches nothing).

    Each chunk's pieces are packed by one task (placed where the chunk of ``X`` is) and
    persisted as items of that pack. Returns the per-chunk Delayed pieces and the arrays
    rebuilt from them.
    """
    import operator

    import dask
    import dask.array as da
    from dask import delayed

    pack = delayed(_pack, pure=False)
    get = delayed(operator.getitem, pure=False)
    pieces = []
    for chunk in zip(*columns, strict=True):
        pk = pack(*chunk)
        pieces.append([None if b is None else get(pk, k) for k, b in enumerate(chunk)])
    flat = iter(dask.persist(*[b for row in pieces for b in row if b is not None]))
    blocks = [tuple(None if b is None else next(flat) for b in row) for row in pieces]
    out = []
    for k, a in enumerate(arrays):
        if a is None:
            out.append(None)
            continue
        out.append(da.concatenate([
            da.from_delayed(blocks[i][k], shape=(rows[i],) + tuple(a.shape[1:]), dtype=a.dtype)
            for i in range(len(rows))
        ], axis=0))
    return blocks, out


def supported(objective: Any) -> bool:
    """Whether the one-graph Dask path applies (linear loss, Dask data, finite inner tilt)."""
    problem = problem_of(objective)
    if not is_dask_namespace(problem.xp) or not problem.is_linear or not problem.ready:
        return False
    return bool(np.isfinite(problem.tilts[-1]))


def in_memory(a: Any) -> Any:
    """The NumPy value of a Dask array whose graph is only data held in memory (what
    ``dask.array.from_array`` of a NumPy array builds: one literal block per key), else
    ``a`` unchanged. Nothing is computed.

    A parameter given that way travels inside the tasks of an evaluation; as a key of its
    own it would be one more dependency, fetched by every worker before its chunks can
    start (a round trip between workers per evaluation).

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> from tiltlab.distributed._objective import in_memory
    >>> in_memory(da.from_array(np.arange(5.0), chunks=2))
    array([0., 1., 2., 3., 4.])
    >>> type(in_memory(da.ones(3) + 1)).__name__  # a computation: left to the graph
    'Array'
    """
    import dask.array as da

    if not isinstance(a, da.Array) or any(math.isnan(c) for c in a.shape):
        return a
    graph = a.__dask_graph__()
    if len(getattr(graph, "layers", ())) != 1:
        return a

    def block(key: Any) -> Any:
        v = graph.get(key)
        v = getattr(v, "value", v) if type(v).__name__ == "DataNode" else v
        if not isinstance(v, np.ndarray):
            raise LookupError
        return v

    def nested(keys: Any) -> Any:
        return [nested(k) for k in keys] if isinstance(keys, list) else block(keys)

    try:
        keys = a.__dask_keys__()
        if len(graph) != a.npartitions:
            return a
        from dask.array.core import concatenate3

        out = np.asarray(concatenate3(nested(keys)), dtype=a.dtype)
    except LookupError:
        return a
    return out if out.shape == a.shape else a


def evaluation(objective: Any, theta: Any, V: Any, mode: str) -> Any:
    """The whole of one evaluation as one Delayed value (nothing is computed here).

    ``theta`` and ``V`` (None outside ``"hvp"``) are NumPy or Dask arrays of the
    objective's ``shape``. The graph holds the per-chunk tasks, their tree reduction and
    the finishing on the host (:func:`finish`, ridge term included), so that computing it
    is one graph: its value is NumPy ``(value,)`` for ``"value"`` and ``(value, out)``
    otherwise (see :func:`evaluate`). A pass over the data is counted on ``objective``
    (when it is an objective, not a bare problem) when the graph is built.
    """
    from dask import delayed

    _check_evaluation(problem_of(objective), theta, V, mode)
    spec, theta, V, parts = _evaluation_parts(objective, theta, V, mode)
    return delayed(finish, pure=False)(spec, theta, V, *parts)


def _check_evaluation(problem: TiltedProblem, theta: Any, V: Any, mode: str) -> None:
    """Raise for a ``mode`` that :func:`evaluation` does not know or cannot give here, or
    ``theta`` / ``V`` not of the objective's shape (no data are read)."""
    modes = ("value", "grad", "hvp", "hess")
    if mode not in modes:
        raise ValueError(f"`mode` must be one of {modes}, got {mode!r}")
    shape = tuple(problem.shape)
    if mode == "hess" and (len(shape) != 1 or problem.tree is not None):
        raise ValueError(
            "mode 'hess' evaluates the dense Hessian of a sample-level objective with a 1-d "
            "parameter in one pass; use the objective's hessian() (one Hessian-vector "
            "product per column) for this one"
        )
    if mode in ("hvp", "hess") and not all(math.isfinite(float(t)) for t in problem.tilts):
        raise ValueError("the Hessian is not defined at an infinite tilt")
    if mode == "hvp" and V is None:
        raise ValueError("`V` (the direction) is required for mode 'hvp'")
    for name, a in (("theta", theta), ("V", V)):
        if a is not None and tuple(np.shape(a)) != shape:
            raise ValueError(f"`{name}` must have shape {shape}, got {tuple(np.shape(a))}")


def compiled_chunks(problem: TiltedProblem) -> bool:
    """Whether the chunks of a sample-level evaluation may take a compiled engine: NumPy
    chunks when the fused CPU kernels serve the loss and the problem's size
    (:func:`~tiltlab.distributed._chunk_engine.numpy_route_applies`), chunks of another
    library always (the engine registered for it decides, on the worker)."""
    from ._chunk_engine import numpy_route_applies

    meta = getattr(problem.X, "_meta", None)
    if meta is not None and not isinstance(meta, np.ndarray):
        return True
    k = problem.shape[1] if problem.shape is not None and len(problem.shape) == 2 else 1
    return numpy_route_applies(problem.loss, problem.n_samples or 0, problem.n_features or 0,
                               k)


def _fused_setting(objective: Any) -> bool:
    return bool(getattr(objective, "fused", True))


def _evaluation_parts(objective: Any, theta: Any, V: Any, mode: str,
                      fused: bool | None = None) -> tuple:
    """What the finishing task of an evaluation takes: ``(spec, theta, V, parts)``, the
    parts Delayed (per-chunk states reduced to at most :data:`FAN_IN`, or the pieces of a
    hierarchy's graph that its last step combines, see
    :func:`~tiltlab.distributed._groups.group_pieces`); counts the pass. ``fused`` (default:
    the objective's ``fused`` setting) lets compiled engines form the chunk states."""
    from dask import delayed

    if fused is None:
        fused = _fused_setting(objective)
    problem = problem_of(objective)
    plan = distribute(problem)
    theta, V = in_memory(theta), in_memory(V)
    if plan.codes is None:
        tau = float(problem.tilts[-1])
        fast = fused and compiled_chunks(problem)
        fn = delayed(chunk_sample_state, pure=False)
        parts = [fn(Xb, yb, pb, theta, V, problem.loss, tau, mode, fast)
                 for Xb, yb, pb, _ in plan.blocks]
        parts = reduce_to(parts, merge_states)  # the last merge is the finishing task's
        combine = None
    else:
        combine, parts = group_pieces(plan, problem, theta, V, mode, fused)
    spec = (mode, combine, float(problem.l2), np.dtype(problem.dtype).str)
    if not isinstance(objective, TiltedProblem):
        objective.n_passes += 1
    return spec, theta, V, parts


def finish(spec: tuple, theta: Any, V: Any, *parts: Any) -> tuple:
    """The last task of an evaluation: the results of the chunks turned into NumPy
    ``(value,)`` or ``(value, out)`` with the ridge term. ``spec`` is ``(mode, combine,
    l2, dtype)``: ``combine`` None for a sample-level objective (``parts`` are chunk
    states, merged here), else the last step of a hierarchy's graph, which gives ``(value,
    sum of products)`` from ``parts``. Non-finite losses (at a trial point) give ``value =
    inf`` and a NaN ``out``."""
    mode, combine, l2, dtype = spec
    dtype = np.dtype(dtype)
    theta = np.asarray(to_numpy(theta))
    V = None if V is None else np.asarray(to_numpy(V))
    hierarchical = combine is not None
    state = combine(*parts) if hierarchical else merge_states(*parts)
    if state is None:
        value, out = np.asarray(math.inf, dtype=dtype), np.full(theta.shape, np.nan, dtype=dtype)
        if mode == "hess":
            out = np.full((theta.size, theta.size), np.nan, dtype=dtype)
        return (value,) if mode == "value" else (value, out)
    if hierarchical:
        value, out = state  # the hierarchy's value and sum of products
        out = None if mode == "value" else np.reshape(out, theta.shape)
    else:
        value, out = _finish_sample(state, mode, dtype)
    if l2:
        value = value + 0.5 * l2 * float(np.sum(theta.astype(np.float64) ** 2))
    value = np.asarray(value, dtype=dtype)
    if mode == "value":
        return (value,)
    if l2:
        if mode == "grad":
            out = out + l2 * theta
        elif mode == "hvp":
            out = out + l2 * V
        else:
            out = out + l2 * np.eye(out.shape[0], dtype=out.dtype)
    return value, np.asarray(out, dtype=dtype)


def evaluate(objective: Any, theta: Any, V: Any, mode: str) -> tuple:
    """One evaluation on the cluster: one graph (one ``dask.compute``), NumPy results.

    ``theta`` (and ``V``) are NumPy (or Dask) arrays of the objective's ``shape``. Returns
    NumPy ``(value,)`` for ``"value"``, ``(value, gradient)`` for ``"grad"``, ``(value,
    Hv)`` for ``"hvp"`` and ``(value, H)`` for ``"hess"`` (flat ``p x p``); the ridge term
    is included. A trial point with overflowing losses gives ``value = inf``.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.distributed import evaluate
    >>> X = da.from_array(np.eye(4), chunks=2)
    >>> obj = tl.TiltedObjective("squared", X, da.ones(4, chunks=2), t=1.0)
    >>> value, grad = evaluate(obj, np.zeros(4), None, "grad")
    >>> type(grad).__name__, grad.shape
    ('ndarray', (4,))
    """
    import dask

    (out,) = dask.compute(evaluation(objective, theta, V, mode))
    return out


def _finish_sample(state: Any, mode: str, dtype: Any) -> tuple:
    t = state.t
    if t == 0.0:
        value = float(state.shift + state.lsum / state.mass)  # lsum is relative to the shift
    else:
        value = float(finalize_risk(state, np, dtype))
    if mode == "value":
        return value, None
    parts = normalized_sums(state)
    if mode == "grad":
        return value, parts[0]
    if mode == "hvp":
        A, G, av = parts
        return value, (A - t * G * av if t != 0.0 else A)
    A, g = parts  # "hess"
    H = A - t * np.outer(g, g) if t != 0.0 else A
    return value, 0.5 * (H + H.T)


def finish_item(index: int, spec: tuple, theta: Any, V: Any, *parts: Any) -> Any:
    """Item ``index`` of :func:`finish` (the value, or the gradient / product / Hessian):
    the task that makes one block of a lazy result."""
    return finish(spec, theta, V, *parts)[index]


def lazy_results(objective: Any, theta: Any, V: Any, mode: str, shape: tuple,
                 fused: bool | None = None) -> tuple:
    """Lazy Dask arrays of one evaluation: ``(value,)`` or ``(value, out)`` with ``out`` of
    ``shape``. Computed together (``dask.compute(value, out)``) they are one graph; each
    computed on its own runs the evaluation again.

    The block of each array is made by its own finishing task (:func:`finish_item`),
    straight from the reduced chunk results: no task in between to split a pair.
    """
    import dask.array as da
    from dask import delayed

    problem = problem_of(objective)
    dtype = np.dtype(problem.dtype)
    spec, theta, V, parts = _evaluation_parts(objective, theta, V, mode, fused)
    token = uuid.uuid4().hex
    shapes = [()] if mode == "value" else [(), tuple(shape)]
    fn = delayed(finish_item, pure=False)
    keys = [(f"tilted-{i}-{token}",) + (0,) * len(sh) for i, sh in enumerate(shapes)]
    graph: dict = {}
    for i, key in enumerate(keys):
        graph.update(fn(i, spec, theta, V, *parts, dask_key_name=key).__dask_graph__())
    return tuple(
        da.Array(graph, key[0], chunks=tuple((n,) for n in sh), dtype=dtype)
        for key, sh in zip(keys, shapes, strict=True)
    )


def lazy_hessian(objective: Any, theta: Any, fused: bool | None = None) -> tuple:
    """The dense Hessian as a lazy ``(p, p)`` Dask array, and the evaluations in its graph.

    One evaluation for a sample-level scalar-predictor objective; otherwise one
    Hessian-vector product per column, all in the one graph of the result.
    """
    import dask.array as da

    problem = problem_of(objective)
    shape = tuple(problem.shape)
    p = math.prod(shape)
    if len(shape) == 1 and not problem.is_hierarchical:
        return lazy_results(objective, theta, None, "hess", (p, p))[1], 1
    eye = np.eye(p, dtype=np.dtype(problem.dtype))
    cols = [
        da.reshape(
            lazy_results(objective, theta, np.reshape(e, shape), "hvp", shape, fused)[1], (p,)
        )
        for e in eye
    ]
    H = da.stack(cols, axis=1)
    return 0.5 * (H + H.T), p


class DaskEngine(Engine):
    """One task graph per evaluation of a predictor-loss problem on Dask data.

    Results are lazy Dask arrays whose graph is the whole evaluation (see
    :func:`lazy_results`): nothing runs at call time, and computing a value and its
    gradient together is one graph.
    """

    name = "Dask one-graph"

    def applies(self, problem: Any) -> bool:
        return supported(problem)

    def _run(self, problem: Any, theta: Any, V: Any, mode: str, shape: Any, ctx: Context):
        out = lazy_results(problem, theta, V, mode, shape, ctx.fused)
        ctx.count(1)
        return out

    def value(self, problem: Any, theta: Any, ctx: Context) -> Any:
        return self._run(problem, theta, None, "value", None, ctx)[0]

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        return self._run(problem, theta, None, "grad", theta.shape, ctx)

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        return self._run(problem, theta, v, "hvp", v.shape, ctx)[1]

    def hessian(self, problem: Any, theta: Any, ctx: Context) -> Any:
        H, evaluations = lazy_hessian(problem, theta, ctx.fused)
        ctx.count(evaluations)
        return H


DASK_ENGINE = DaskEngine()
ENGINES.register("dask", DASK_ENGINE)

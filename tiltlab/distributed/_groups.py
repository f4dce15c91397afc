"""Hierarchical objectives on Dask: two sweeps over the chunks inside one task graph.

The gradient of a hierarchical objective weights each sample by the product of its tilted
weight within its innermost group and of that group's weight in the hierarchy above it;
neither is known before every chunk has been seen. One evaluation is therefore one graph
(one ``compute``, one round trip) with two sweeps:

1. per chunk, ``z = X_b theta`` (and ``X_b v`` for a Hessian product), the losses and their
   derivatives, and the group form of the tilted accumulator state (per innermost group:
   extremes, mass, normaliser; for a product also ``sum pe a``): ``O(G)`` numbers. The
   losses and derivatives stay in the worker process that read the chunk (a small store
   keyed by the evaluation: a task result of their own would cost one more task per
   chunk to split them from the state that travels);
2. the chunk states merge in a tree; one task finishes the upper levels of the hierarchy on
   the ``G`` group risks (:func:`tiltlab.risk.hierarchy_eval`) and turns them into one
   factor per group (its weight over its normaliser);
3. per chunk again, on the worker holding it: the per-sample coefficient (tilted weight
   times factor times loss derivative) and one product ``X_b^T c``; the ``d``-vectors sum in
   a tree.

Each sweep is one BLAS product per chunk, as on NumPy; only the group states (``O(G)``)
and the ``d``-vectors travel between workers, and the client receives the value and the
gradient (or Hessian product) only. This is for persisted chunks; data read from their
source at each evaluation take one sweep (:mod:`tiltlab.distributed._groups_stream`), so
that no loaded chunk waits for a second one. NumPy chunks that the fused CPU kernels
serve take that one sweep too, each chunk's group states and per-group sums formed by one
compiled pass (:func:`~tiltlab.distributed._chunk_engine.numpy_group_state`).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import numpy as np

from .._compat import device, to_numpy
from ..objective.blocks import block_rows, hvp_coefficients
from ..risk import GroupTree, hierarchy_eval
from ..segments import Segments, expand, segment_sum
from ._groups_stream import chunk_group_sums, finish_group_sums, kappa
from ._states import (
    EMPTY,
    SUB_BLOCK_BYTES,
    _derivs,
    _group_state_or_none,
    _ns,
    _params,
    aligned,
    group_risks,
    merge_states,
    reduce_to,
)

__all__ = [
    "add_parts",
    "finish_products",
    "fused_groups",
    "group_graph",
    "group_pieces",
    "group_products",
    "group_root",
    "group_sweep",
    "kappa",
]


def _row_slices(n: int, Xb: Any, xp: Any) -> list[tuple[int, int]]:
    """Cache-sized row ranges of a chunk (one range on a GPU)."""
    from .._compat import is_cupy_namespace

    if is_cupy_namespace(xp):
        return [(0, n)]
    B = block_rows(n, int(Xb.shape[1]), Xb.dtype, xp, device(Xb), target_bytes=SUB_BLOCK_BYTES)
    return [(r0, min(n, r0 + B)) for r0 in range(0, n, B)]


def _chunk_derivs(
    loss: Any, Xb: Any, yb: Any, th: Any, v: Any, mode: str, xp: Any, rows: list
) -> dict:
    """The loss pieces of a whole chunk, formed over cache-sized row ranges (the loss's
    temporaries then stay in cache) and joined."""
    if len(rows) == 1:
        return _derivs(loss, Xb, yb, th, v, mode, xp)
    pieces = [_derivs(loss, Xb[r0:r1, ...], yb[r0:r1, ...], th, v, mode, xp) for r0, r1 in rows]
    out = {"multi": pieces[0]["multi"]}
    for key in pieces[0]:
        if key != "multi":
            out[key] = xp.concat([p[key] for p in pieces], axis=0)
    return out


#: the second sweep's pieces per worker process, by (evaluation token, chunk index): they
#: stay where the chunk was read (a task result would need a task of its own to split it
#: from the state that travels); entries of the last ``_KEEP_TOKENS`` evaluations are kept
_KEPT: dict = {}
_TOKENS: list = []
_KEEP_TOKENS = 4
_LOCK = threading.Lock()


def _stash(token: str, index: int, kept: Any) -> None:
    with _LOCK:
        if token not in _TOKENS:
            _TOKENS.append(token)
            while len(_TOKENS) > _KEEP_TOKENS:
                old = _TOKENS.pop(0)
                for key in [k for k in _KEPT if k[0] == old]:
                    del _KEPT[key]
        _KEPT[(token, index)] = kept


def _unstash(token: str, index: int) -> Any:
    with _LOCK:
        return _KEPT.pop((token, index), None)


def _sweep(
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
) -> tuple:
    """``(state, kept)`` of one chunk (see :func:`group_sweep`)."""
    Xb, yb, pb = aligned(Xb), aligned(yb), aligned(pb)
    n = int(Xb.shape[0])
    if n == 0:
        return EMPTY, None
    xp = _ns(Xb)
    th, v = _params(theta, V, Xb, xp)
    seg = Segments.from_codes(to_numpy(cb), n_groups)
    rows = _row_slices(n, Xb, xp)
    D = _chunk_derivs(loss, Xb, yb, th, v, mode, xp, rows)
    weights: list = []

    def sums(pe):  # keep the unnormalised weights at the chunk's own shifts
        weights.append(pe)
        return (segment_sum(pe * D["a"], seg, xp),) if mode == "hvp" else ()

    state = _group_state_or_none(D["ell"], pb, seg, tau, xp, None if mode == "value" else sums)
    if state is None or mode == "value":
        return state, None
    return state, (seg, rows, D, weights[0], state.shift, state.present)


def group_sweep(
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
    token: str,
    index: int,
) -> Any:
    """First sweep over one chunk: its group state.

    The chunk's :class:`~tiltlab.accumulator.GroupState` over the innermost groups (None
    for non-finite losses, :data:`~tiltlab.distributed._states.EMPTY` for a chunk without
    rows); with ``mode="hvp"`` it carries ``sum pe a`` per group (``a = l' . u``). What
    the second sweep needs (the partition, the row ranges, the loss derivatives and the
    weights) is kept in the worker process under ``(token, index)`` (``token=None``:
    not kept); :func:`group_products` takes it from there, or forms it again.
    """
    state, kept = _sweep(Xb, yb, pb, cb, theta, V, loss, tau, n_groups, mode)
    if token is not None and kept is not None:
        _stash(token, index, kept)
    return state


def group_root(upper: GroupTree, tilts: tuple, mode: str, dtype: str, *states: Any) -> Any:
    """The chunk states merged and turned into the value and one factor per innermost
    group.

    Returns None for non-finite losses, else a dict: ``value`` (the hierarchical risk),
    ``f`` (``W_g / s_g``: the group's weight over its normaliser, 0 for a group without
    prior mass), ``shift`` (the merged shift of each group, to which the second sweep
    moves the first sweep's weights) and, for ``"hvp"``, ``fk`` (``f`` times
    :func:`kappa`).
    """
    state = merge_states(*states)
    if state is None:
        return None
    if isinstance(state, str):  # pragma: no cover - the objective has samples
        raise ValueError("no chunk has samples")
    dt = np.dtype(dtype)
    R = group_risks(state, dt).astype(np.float64)
    M = state.mass / np.sum(state.mass)
    risk, W = hierarchy_eval(R, M, upper, list(tilts[:-1]), np)
    W = np.asarray(W, dtype=np.float64)
    on = state.present
    s = np.where(on, state.s, 1.0)
    f = np.where(on, W / s, 0.0)
    out = {
        "value": float(risk),
        "f": f,
        "shift": np.asarray(state.shift, dtype=np.float64),
        "t": float(state.t),
    }
    if mode == "hvp":
        abar = np.where(on, state.sums[0] / s, 0.0)
        out["fk"] = f * kappa(upper, tilts, W, abar)
    return out


def _on_chunk(values: np.ndarray, seg: Segments, like: Any, xp: Any) -> Any:
    """Per-group host values expanded to the chunk's samples (its namespace and dtype)."""
    return expand(xp.asarray(values, dtype=like.dtype, device=device(like)), seg, xp)


def group_products(
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
    token: str,
    index: int,
    root: Any,
) -> Any:
    """Second sweep over one chunk: ``X_b^T c`` with each sample's final coefficient.

    ``root`` is the result of :func:`group_root`; the loss pieces come from
    :func:`group_sweep` on the same worker (formed again if the task runs elsewhere). The
    coefficient is ``c_i = f_g pe_i l'_i`` for a gradient and ``f_g c_i + fk_g g_i`` for a
    Hessian product (:func:`~tiltlab.objective.blocks.hvp_coefficients`), with
    ``pe_i = p_i exp(t (l_i - shift_g))`` the sample's weight within its group at the
    merged shift (the first sweep's weights, moved from the chunk's shifts by one factor
    per group: no exponential of the losses again). Returns a NumPy array (None when the
    losses were not finite, :data:`~tiltlab.distributed._states.EMPTY` for a chunk
    without rows).
    """
    kept = None if token is None else _unstash(token, index)  # taken in every case
    if root is None:
        return None
    if int(Xb.shape[0]) == 0:
        return EMPTY
    if kept is None:
        _, kept = _sweep(Xb, yb, pb, cb, theta, V, loss, tau, n_groups, mode)
    seg, rows, D, pe_chunk, shift, present = kept
    xp = _ns(Xb)
    ell = D["ell"]
    t = root["t"]
    multi = D["multi"]
    # pe_chunk holds p exp(t (l - shift_chunk)); the chunk's shift moves to the merged one
    # by a factor per group, exp(t (shift_chunk - shift)) <= 1
    with np.errstate(over="ignore", invalid="ignore"):
        move = np.where(present, np.exp(t * (shift - root["shift"])), 0.0) if t else 1.0
    f = _on_chunk(root["f"] * move, seg, ell, xp)
    fk = _on_chunk(root["fk"] * move, seg, ell, xp) if mode == "hvp" else None
    out = None
    for r0, r1 in rows:  # cache-sized row ranges: the temporaries stay in cache
        sl = slice(r0, r1)
        pe = pe_chunk[sl]
        d1 = D["d1"][sl, ...]
        if mode == "grad":
            w = pe * f[sl]
            coef = w[:, None] * d1 if multi else w * d1
        else:
            d2, u, a, hz = (
                None if D.get(k) is None else D[k][sl, ...] for k in ("d2", "u", "a", "hz")
            )
            cc, gc = hvp_coefficients(pe, d1, d2, u, a, hz if multi else None, t)
            f1, k1 = f[sl], fk[sl]
            coef = (f1[:, None] * cc + k1[:, None] * gc) if multi else (f1 * cc + k1 * gc)
        part = Xb[sl, ...].T @ coef
        out = part if out is None else out + part
    return np.asarray(to_numpy(out))


def add_parts(*parts: Any) -> Any:
    """Sum of per-chunk products; None (non-finite losses) absorbs, EMPTY is neutral."""
    if any(p is None for p in parts):
        return None
    parts = tuple(p for p in parts if not isinstance(p, str))
    if not parts:
        return EMPTY
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def finish_products(root: Any, *parts: Any) -> Any:
    """``(value, sum of the products)``, or None for non-finite losses (what the client
    receives)."""
    total = add_parts(*parts) if parts else 0.0
    if root is None or total is None:
        return None
    return root["value"], total


def group_graph(plan: Any, problem: Any, theta: Any, V: Any, mode: str, fused: bool = False) -> Any:
    """The Delayed result of one hierarchical evaluation (see the module docstring):
    ``(value, sum of products)``, or None for non-finite losses."""
    from dask import delayed

    combine, pieces = group_pieces(plan, problem, theta, V, mode, fused)
    return delayed(combine, pure=False)(*pieces)


def fused_groups(problem: Any, plan: Any) -> bool:
    """Whether the chunks of a hierarchical evaluation may take the fused grouped kernel
    (NumPy chunks, see :func:`~tiltlab.distributed._chunk_engine.numpy_groups_apply`)."""
    from ._chunk_engine import numpy_groups_apply

    meta = getattr(problem.X, "_meta", None)
    if meta is not None and not isinstance(meta, np.ndarray):
        return False
    shape = tuple(getattr(problem, "shape", None) or ())
    return numpy_groups_apply(
        problem.loss,
        problem.n_samples or 0,
        problem.n_features or 0,
        plan.n_groups,
        shape[1] if len(shape) == 2 else 1,
    )


def group_pieces(
    plan: Any, problem: Any, theta: Any, V: Any, mode: str, fused: bool = False
) -> tuple:
    """``(combine, pieces)``: the graph of one hierarchical evaluation but its last task,
    which is ``combine(*pieces)`` (left to the task that consumes the result, so that the
    evaluation's finishing takes no step of its own).

    With ``fused`` and NumPy chunks the kernels serve (:func:`fused_groups`), one sweep:
    each chunk's group state with its per-group sums from one compiled pass over its rows
    (:func:`~tiltlab.distributed._groups_stream.chunk_group_sums`), merged group by group,
    the upper levels finished in the last task; otherwise two sweeps over persisted chunks
    (the module doc), one sweep of array-API code over chunks read from their source."""
    from dask import delayed

    tau = float(problem.tilts[-1])
    tree = problem.tree
    upper = GroupTree(n_samples=plan.n_groups, levels=tuple(tree.levels[1:]), sample_layouts=())
    dtype = np.dtype(problem.dtype).str
    fast = bool(fused) and fused_groups(problem, plan)
    if fast or not plan.persisted:  # one sweep
        fn = delayed(chunk_group_sums, pure=False)
        states = reduce_to(
            [
                fn(Xb, yb, pb, cb, theta, V, problem.loss, tau, plan.n_groups, mode, fast)
                for Xb, yb, pb, cb in plan.blocks
            ],
            merge_states,
        )
        return finish_group_sums, [upper, tuple(problem.tilts), mode, dtype, *states]
    token = uuid.uuid4().hex
    args = [
        (Xb, yb, pb, cb, theta, V, problem.loss, tau, plan.n_groups, mode, token, i)
        for i, (Xb, yb, pb, cb) in enumerate(plan.blocks)
    ]
    sweep = delayed(group_sweep, pure=False)
    states = reduce_to([sweep(*a) for a in args], merge_states)
    root = delayed(group_root, pure=False)(upper, tuple(problem.tilts), mode, dtype, *states)
    if mode == "value":
        return finish_products, [root]
    prod = delayed(group_products, pure=False)
    parts = [prod(*a, root) for a in args]
    return finish_products, [root, *reduce_to(parts, add_parts)]

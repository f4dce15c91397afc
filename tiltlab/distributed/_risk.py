"""``tilted_risk`` and ``hierarchical_risk`` of Dask losses as one lazy reduction."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import is_array_api_obj, is_dask_namespace, namespace_of, to_numpy
from ..accumulator import finalize_risk
from ..risk import GroupTree, build_tree, hierarchy_eval, prepare_tilts
from ._states import (
    chunk_label_state,
    chunk_loss_states,
    chunk_row_states,
    group_risks,
    merge_label_states,
    merge_state_lists,
    tree_reduce,
)

__all__ = ["dask_tilted_risk", "dask_hierarchical_risk", "dask_tilted_weights"]

_UNKNOWN = (
    "`{name}` has unknown chunk sizes: call compute_chunk_sizes() on it first (a Dask "
    "array filtered by a boolean mask has them)"
)


def _unknown_sizes(a: Any) -> bool:
    return any(math.isnan(float(s)) for s in getattr(a, "shape", ()))


def _require_sizes(**arrays: Any) -> None:
    for name, a in arrays.items():
        if a is not None and _unknown_sizes(a):
            raise ValueError(_UNKNOWN.format(name=name))


def dask_tilted_weights(losses: Any, t: Any, *, axis: int, weights: Any,
                        check_finite: bool) -> Any:
    """Lazy tilted weights of 1-d Dask losses at one host tilt (None: the generic path).

    ``w_i = p_i exp(t (l_i - R)) / sum_j p_j exp(t (l_j - R))`` with ``R`` the lazy tilted
    risk: one reduction, then elementwise work. Every exponent is at most ``log(1 / p_i)``,
    and the common factor that the rounding of ``R`` puts on every ``exp`` cancels in the
    normalisation. No sample count is needed (unknown chunk sizes are fine without
    ``weights``).
    """
    import dask.array as da

    if weights is not None:
        _require_sizes(losses=losses, weights=weights)
    tv = _host_tilt(t)
    if (
        tv is None
        or not check_finite
        or getattr(losses, "ndim", 0) != 1
        or axis not in (0, -1)
        or not isinstance(losses, da.Array)
        or np.dtype(losses.dtype).kind not in "fiub"
        or losses.shape[0] == 0
    ):
        return None
    dtype = _result_dtype(losses)
    work = _work_dtype(losses)  # 16-bit: in float32
    tv = _in_precision(tv, work)
    R = dask_tilted_risk(losses, tv, axis=axis, weights=weights, keepdims=False,
                         check_finite=check_finite)
    if R is None:
        return None
    l = losses.astype(work)
    R = R.astype(work)
    p = None if weights is None else _weights_like(weights, losses)
    if math.isinf(tv):
        e = da.where(l == R, 1.0, 0.0).astype(work) + R * 0  # NaN risk: NaN weights
    else:
        # halved before subtracting: finite for spreads beyond the float maximum
        u = ((l * 0.5 - R * 0.5) * tv) * 2.0
        if p is not None:
            u = da.where(p > 0, u, -np.inf)
        e = da.exp(u)
    if p is not None:
        e = e * p
    total = e.sum()
    return (e / da.where(total > 0, total, 1.0) + R * 0).astype(dtype)


def _host_tilt(t: Any) -> float | None:
    """A real host tilt, or None (the generic path then validates ``t`` and raises)."""
    if isinstance(t, (bool, str, bytes)) or t is None:
        return None
    if is_array_api_obj(t):
        if is_dask_namespace(namespace_of(t=t)):
            return None
        a = to_numpy(t)
        if a.ndim != 0:
            return None
        t = a
    try:
        v = float(t)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _result_dtype(losses: Any) -> np.dtype:
    dt = np.dtype(losses.dtype)
    return dt if dt.kind == "f" else np.dtype(np.float64)


def _work_dtype(losses: Any) -> np.dtype:
    """The dtype the chunk states of ``losses`` accumulate in: float32 for float32 and
    16-bit losses, float64 otherwise."""
    dt = _result_dtype(losses)
    return np.dtype(np.float32) if dt.itemsize <= 4 else dt


def _in_precision(t: float, work: Any) -> float:
    """The tilt ``t`` as the dtype ``work`` holds it, as on the eager backends: in float32,
    a tilt beyond its range is ``+-inf`` (the risk is then the extreme loss) and one below
    it 0."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.asarray(t, dtype=np.float64).astype(work))


def _weights_like(weights: Any, losses: Any) -> Any:
    """1-d prior ``weights`` as a lazy Dask array chunked as the samples of ``losses``, in
    the dtype their states accumulate in and scaled by :func:`_scaled_down`."""
    import dask.array as da

    if weights is None:
        return None
    w = weights if isinstance(weights, da.Array) else da.from_array(np.asarray(to_numpy(weights)))
    _require_sizes(weights=w)
    if w.ndim != 1 or w.shape[0] != losses.shape[0]:
        raise ValueError(
            f"`weights` has length {w.shape[0] if w.ndim == 1 else tuple(w.shape)} but "
            f"`losses` has {losses.shape[0]} samples along `axis`"
        )
    return _scaled_down(w.rechunk((losses.chunks[0],)).astype(_work_dtype(losses)))


def _scaled_down(w: Any) -> Any:
    """Prior weights ``w`` (a 1-d Dask array of floats) whose largest reaches
    ``2**(maxexp / 2)`` of their dtype, or lies below 1, times the power of two that
    brings it into ``[1, 2)``: one factor for all chunks, so that no chunk's total and no
    merged total overflows, and no product of a weight with a tilted factor falls below
    the normal range where that of the normalised prior (as the eager backends take it)
    does not.

    The factor is a lazy reduction of the graph (nothing runs at call time) and exact
    (subnormal weights too). The risks and weights are those of ``w`` (every sum of the
    states is linear in the prior and the finish takes their ratios; scaling by a power of
    two commutes with rounding) except where a product with a scaled weight falls below
    the normal range. Weights whose largest lies in ``[1, 2**(maxexp / 2))`` (their total
    over fewer than ``2**63`` samples is finite), and weights that are not all finite (the
    chunks raise on them) or all zero are kept bit for bit.
    """
    import dask.array as da

    largest = w.max()
    huge = largest >= 2.0 ** (np.finfo(w.dtype).maxexp // 2)
    scale = da.isfinite(largest) & (largest > 0) & (huge | (largest < 1))
    # largest = m 2**k with 0.5 <= m < 1: times 2**(1 - k) it lies in [1, 2); 1 = 0.5 * 2
    _, k = da.frexp(da.where(scale, largest, 1))
    return da.ldexp(w, 1 - k)


def _blocks(a: Any) -> list:
    return [None] * 0 if a is None else list(a.to_delayed().reshape(-1))


def _host_tilts(t: Any) -> tuple[list, bool] | None:
    """``(tilts, grid)``: one host tilt, or a 1-d host grid of real non-NaN tilts; None
    for anything else (a Dask tilt, NaN: the generic path validates and raises)."""
    tv = _host_tilt(t)
    if tv is not None:
        return [tv], False
    if isinstance(t, (bool, str, bytes)) or t is None:
        return None
    if is_array_api_obj(t):
        if is_dask_namespace(namespace_of(t=t)):
            return None
        t = to_numpy(t)
    try:
        a = np.asarray(t)
    except (TypeError, ValueError):
        return None
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "fiu" or np.any(np.isnan(a)):
        return None
    return [float(v) for v in a], True


def dask_tilted_risk(losses: Any, t: Any, *, axis: int, weights: Any, keepdims: bool,
                     check_finite: bool) -> Any:
    """Lazy tilted risk of Dask losses at host tilts (None: use the generic path).

    The graph: per chunk a :class:`~tiltlab.accumulator.TiltState` for each tilt (a grid
    of tilts shares the chunk's read), a tree of merges, and a finaliser; computing the
    result runs it once, and nothing is computed at call time. Losses of two or more
    dimensions reduce along ``axis`` with one group state per row of each chunk, merged
    along the sample axis. NaN or infinite losses raise ``ValueError`` when the result is
    computed. A Dask tilt (0-d, or 1-d: a grid) of 1-d losses is read by the graph's tasks:
    its value, and its NaN check, are part of the same graph. ``check_finite=False``, Dask
    tilts of N-d losses and full-shape weights of N-d losses take the generic path (also
    lazy where it can be). Tilts are rounded to the dtype the states accumulate in
    (float32 for float32 and 16-bit losses), as on the eager backends: a tilt beyond
    float32's range gives the largest (smallest) loss of float32 losses.
    """
    import dask.array as da

    if not isinstance(losses, da.Array):
        return None
    tilts = _host_tilts(t)
    ndim = getattr(losses, "ndim", 0)
    if tilts is None and ndim == 1 and _dask_tilt_ok(t):
        tilts = (None, t.ndim == 1)
    if _unknown_sizes(losses) and (tilts is None or weights is not None or ndim != 1):
        _require_sizes(losses=losses)
    if (
        tilts is None
        or not check_finite
        or ndim == 0
        or np.dtype(losses.dtype).kind not in "fiub"
        or not -ndim <= axis < ndim
        or (ndim > 1 and weights is not None and getattr(weights, "ndim", 1) != 1)
        or (not _unknown_sizes(losses) and math.prod(losses.shape) == 0)  # generic: raises
    ):
        return None
    ts, grid = tilts
    ax = axis % ndim
    if ts is not None:
        ts = [_in_precision(tv, _work_dtype(losses)) for tv in ts]
    if ts is None:  # a Dask tilt: read and validated inside the graph
        out = _risk_graph_dask_tilt(losses, t, weights, grid)
    elif ndim == 1:
        out = _risk_graph(losses, ts, weights)
    else:
        out = _rows_risk_graph(losses, ax, ts, weights)
    if not grid and ts is not None:
        out = out[0]
    if keepdims:
        out = da.expand_dims(out, axis=ax + (1 if grid else 0))
    return out


def _risk_graph(losses: Any, ts: list, weights: Any) -> Any:
    """Risks of 1-d Dask losses at the host tilts ``ts``: a 1-d Dask array (one graph)."""
    import dask.array as da
    from dask import delayed

    w = _weights_like(weights, losses)
    dtype = _result_dtype(losses)
    n = float(losses.shape[0])
    # at t = 0 unit weights of 1 / n keep the sum of losses near the float maximum finite
    unit = 1.0 / n if w is None and math.isfinite(n) else None
    states_t = [tv if math.isfinite(tv) else 0.0 for tv in ts]
    fn = delayed(chunk_loss_states, pure=False)
    wb = _blocks(w) or [None] * len(losses.chunks[0])
    parts = [fn(lb, pb, states_t, unit, True)
             for lb, pb in zip(_blocks(losses), wb, strict=True)]
    root = delayed(_finish_risks, pure=False)(tree_reduce(parts, merge_state_lists), ts,
                                              dtype.str, w is not None)
    return da.from_delayed(root, shape=(len(ts),), dtype=dtype)


def _dask_tilt_ok(t: Any) -> bool:
    """A Dask tilt the lazy graph takes: real, 0-d or 1-d of known non-zero length (its
    values, NaN included, are checked when the graph runs)."""
    import dask.array as da

    return (
        isinstance(t, da.Array)
        and t.ndim in (0, 1)
        and not _unknown_sizes(t)
        and (t.ndim == 0 or t.shape[0] > 0)
        and np.dtype(t.dtype).kind in "fiu"
    )


def _tilt_values(tv: Any, work: str) -> list:
    """The values of a Dask tilt inside the graph, in the dtype ``work`` the states
    accumulate in; NaN raises as on the eager path."""
    a = np.asarray(tv, dtype=np.float64).reshape(-1)
    if np.any(np.isnan(a)):
        raise ValueError("`t` must not be NaN")
    return [_in_precision(v, work) for v in a]


def _tilt_states(lb: Any, pb: Any, tv: Any, unit: float | None, work: str) -> list:
    """:func:`chunk_loss_states` at the tilts of a Dask tilt (given as its value)."""
    ts = _tilt_values(tv, work)
    return chunk_loss_states(lb, pb, [t if math.isfinite(t) else 0.0 for t in ts], unit, True)


def _finish_tilt_risks(states: Any, tv: Any, dtype: str, grid: bool, work: str,
                       weighted: bool) -> np.ndarray:
    out = _finish_risks(states, _tilt_values(tv, work), dtype, weighted)
    return out if grid else out[0]


def _risk_graph_dask_tilt(losses: Any, t: Any, weights: Any, grid: bool) -> Any:
    """:func:`_risk_graph` for a Dask tilt (0-d, or 1-d: a grid): the tilt is one more
    input of every chunk's task, so the finiteness checks of the losses and the tilt's
    own check run in the one graph of the result, never at call time."""
    import dask.array as da
    from dask import delayed

    w = _weights_like(weights, losses)
    dtype = _result_dtype(losses)
    n = float(losses.shape[0])
    unit = 1.0 / n if w is None and math.isfinite(n) else None
    work = _work_dtype(losses).str
    tv = t.rechunk(-1).to_delayed().reshape(-1)[0] if t.ndim == 1 else t.to_delayed().item()
    fn = delayed(_tilt_states, pure=False)
    wb = _blocks(w) or [None] * len(losses.chunks[0])
    parts = [fn(lb, pb, tv, unit, work) for lb, pb in zip(_blocks(losses), wb, strict=True)]
    root = delayed(_finish_tilt_risks, pure=False)(
        tree_reduce(parts, merge_state_lists), tv, dtype.str, grid, work, w is not None
    )
    return da.from_delayed(root, shape=(int(t.shape[0]),) if grid else (), dtype=dtype)


def _rows_risk_graph(losses: Any, ax: int, ts: list, weights: Any) -> Any:
    """Risks of N-d Dask losses along ``ax``: shape ``(len(ts),) + batch`` (one graph)."""
    import dask.array as da
    from dask import delayed

    l = da.moveaxis(losses, ax, -1) if ax != losses.ndim - 1 else losses
    batch = tuple(int(b) for b in l.shape[:-1])
    N = int(l.shape[-1])
    m = int(np.prod(batch))
    l2 = l.reshape((m, N)) if len(batch) != 1 else l
    w = None
    if weights is not None:
        w = _weights_like(weights, l2[0])
    dtype = _result_dtype(losses)
    unit = 1.0 / N if w is None else None
    states_t = [tv if math.isfinite(tv) else 0.0 for tv in ts]
    fn = delayed(chunk_row_states, pure=False)
    blocks = l2.to_delayed()
    wb = _blocks(w) or [None] * blocks.shape[1]
    rows = []
    for i, mb in enumerate(l2.chunks[0]):
        parts = [fn(blocks[i, j], wb[j], states_t, unit) for j in range(blocks.shape[1])]
        root = delayed(_finish_row_risks, pure=False)(
            tree_reduce(parts, merge_state_lists), ts, dtype.str)
        rows.append(da.from_delayed(root, shape=(len(ts), mb), dtype=dtype))
    out = da.concatenate(rows, axis=1)
    return out.reshape((len(ts),) + batch) if len(batch) != 1 else out


def _finish_risks(states: Any, ts: list, dtype: str, weighted: bool) -> np.ndarray:
    """The risks at the tilts ``ts`` from their merged states; ``weighted``: whether a
    prior was given (a state without prior mass then means all-zero weights, else no
    sample)."""
    return np.stack([_finish_risk(st, t, dtype, weighted)
                     for st, t in zip(states, ts, strict=True)])


def _finish_row_risks(states: Any, ts: list, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    out = []
    for st, t in zip(states, ts, strict=True):
        _check_state(st)
        if not np.all(st.mass > 0):
            raise ValueError("`weights` must not be all zero")
        if math.isinf(t):
            out.append(np.asarray(st.hi if t > 0 else st.lo, dtype=dt))
        else:
            out.append(np.asarray(st.risk(np, dt), dtype=dt))
    return np.stack(out)


def _finish_risk(state: Any, t: float, dtype: str, weighted: bool) -> np.ndarray:
    dt = np.dtype(dtype)
    if state is None:  # non-finite losses, check_finite=False
        return np.asarray(math.nan, dtype=dt)
    _check_state(state, weighted)
    if math.isinf(t):
        return np.asarray(state.hi if t > 0 else state.lo, dtype=dt)
    if t == 0.0:  # a MeanState
        return np.asarray(state.risk(np, dt), dtype=dt)
    return np.asarray(finalize_risk(state, np, dt), dtype=dt)


def _check_state(state: Any, weighted: bool = True) -> None:
    if isinstance(state, str):  # "empty": every chunk had no sample or zero prior mass
        if not weighted:  # losses of unknown size (none at call time) without samples
            raise ValueError("`losses` must not be empty (it has no samples)")
        raise ValueError("`weights` must not be all zero")


def _dask_codes(groups: Any) -> Any:
    """``groups`` when it is one 1-d Dask array of integer labels (the fully lazy case),
    else None."""
    import dask.array as da

    if isinstance(groups, da.Array) and groups.ndim == 1 and np.dtype(groups.dtype).kind in "iu":
        return groups
    return None


def _paired(codes: Any, losses: Any) -> Any:
    """Dask labels chunked as ``losses`` (the same number of chunks where sizes are
    unknown: each chunk's lengths are then checked when it runs)."""
    if _unknown_sizes(losses) or _unknown_sizes(codes):
        if codes.numblocks != losses.numblocks:
            raise ValueError(
                f"`groups` has {codes.numblocks[0]} chunks and `losses` "
                f"{losses.numblocks[0]} while their chunk sizes are unknown: give both the "
                "same chunks (or call compute_chunk_sizes() on them)"
            )
        return codes
    if codes.shape[0] != losses.shape[0]:
        raise ValueError(
            f"`groups` must be a 1-d label array of length {losses.shape[0]} (one label per "
            f"sample), got shape {tuple(codes.shape)}"
        )
    return codes.rechunk((losses.chunks[0],))


def dask_hierarchical_risk(losses: Any, groups: Any, tilts: Any, *, weights: Any,
                           check_finite: bool) -> Any:
    """Lazy hierarchical risk of 1-d Dask losses (None: use the generic path).

    No ``compute`` runs at call time when the labels of the innermost level are integers:
    a NumPy array (any depth of hierarchy: the group tree is built on the client), or one
    1-d Dask array of integer labels of any range (a single grouping level: each chunk
    finds its own labels, the states merge over the union of the labels, and a group is a
    label that occurs). Dask labels of another dtype, or several levels of Dask labels,
    are computed once at call time to build the tree on the client (the upper levels need
    the nesting of the labels). The graph carries one state per group per chunk; the
    innermost tilt may be +-inf and ``check_finite=False`` gives NaN for non-finite losses.
    The tilts are rounded as :func:`dask_tilted_risk` rounds them.
    """
    import dask.array as da
    from dask import delayed

    if (
        getattr(losses, "ndim", 0) != 1
        or not isinstance(losses, da.Array)
        or np.dtype(losses.dtype).kind not in "fiub"
    ):
        return None
    codes = _dask_codes(groups)
    if codes is None or weights is not None:
        _require_sizes(losses=losses)
    if not _unknown_sizes(losses) and losses.shape[0] == 0:
        return None
    n = float(losses.shape[0])
    if codes is not None:
        codes = _paired(codes, losses)
        ts = prepare_tilts(tilts, 1)
        upper = None  # one grouping level: the groups are known when the graph runs
    else:
        tree = build_tree(groups, int(n))
        ts = prepare_tilts(tilts, tree.depth)
        codes = da.from_array(tree.levels[0].codes, chunks=(losses.chunks[0],))
        upper = GroupTree(n_samples=tree.levels[0].n_groups, levels=tuple(tree.levels[1:]),
                          sample_layouts=())
    ts = [_in_precision(v, _work_dtype(losses)) for v in ts]
    w = _weights_like(weights, losses)
    dtype = _result_dtype(losses)
    tau = float(ts[-1])
    # at t = 0 unit weights of 1 / n keep the sum of huge losses finite
    unit = 1.0 / n if w is None and math.isfinite(n) else None
    fn = delayed(chunk_label_state, pure=False)
    wb = _blocks(w) or [None] * len(losses.chunks[0])
    parts = [
        fn(lb, pb, cb, tau if math.isfinite(tau) else 0.0, unit, check_finite)
        for lb, pb, cb in zip(_blocks(losses), wb, _blocks(codes), strict=True)
    ]
    root = delayed(_finish_hier, pure=False)(
        tree_reduce(parts, merge_label_states), upper, list(ts), dtype.str
    )
    return da.from_delayed(root, shape=(), dtype=dtype)


def _finish_hier(part: Any, upper: GroupTree | None, ts: list, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if part is None:  # non-finite losses, check_finite=False
        return np.asarray(math.nan, dtype=dt)
    if isinstance(part, str):
        raise ValueError("`losses` has no samples")
    _, state, counts = part
    keep = counts > 0
    if not np.all(keep):  # pragma: no cover - merged labels always occur
        raise AssertionError("a merged label without samples")
    if not np.all(state.mass > 0):
        raise ValueError(
            "`weights` give a group zero total weight (an empty group); every group needs "
            "at least one sample with positive weight"
        )
    tau = ts[-1]
    if math.isinf(tau):
        R = np.asarray(state.hi if tau > 0 else state.lo, dtype=np.float64)
    else:
        R = group_risks(state, dt).astype(np.float64)
    M = state.mass / np.sum(state.mass)
    if upper is None:
        upper = GroupTree(n_samples=int(R.shape[0]), levels=(), sample_layouts=())
    risk, _ = hierarchy_eval(R, M, upper, ts[:-1], np, weights=False)
    return np.asarray(risk, dtype=dt)

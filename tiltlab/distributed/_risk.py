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
    chunk_loss_state,
    group_risks,
    merge_label_states,
    merge_states,
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
    R = dask_tilted_risk(losses, tv, axis=axis, weights=weights, keepdims=False,
                         check_finite=check_finite)
    if R is None:
        return None
    dtype = _result_dtype(losses)
    work = np.dtype(np.float32) if dtype.itemsize == 2 else dtype  # 16-bit: in float32
    l = losses.astype(work)
    R = R.astype(work)
    p = None if weights is None else _weights_like(weights, losses).astype(work)
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


def _weights_like(weights: Any, losses: Any) -> Any:
    import dask.array as da

    if weights is None:
        return None
    w = weights if isinstance(weights, da.Array) else da.from_array(np.asarray(to_numpy(weights)))
    if w.ndim != 1 or w.shape[0] != losses.shape[0]:
        raise ValueError(
            f"`weights` has length {w.shape[0] if w.ndim == 1 else tuple(w.shape)} but "
            f"`losses` has {losses.shape[0]} samples along `axis`"
        )
    return w.rechunk((losses.chunks[0],))


def _blocks(a: Any) -> list:
    return [None] * 0 if a is None else list(a.to_delayed().reshape(-1))


def dask_tilted_risk(losses: Any, t: Any, *, axis: int, weights: Any, keepdims: bool,
                     check_finite: bool) -> Any:
    """Lazy tilted risk of 1-d Dask losses at one host tilt (None: use the generic path).

    The graph: per chunk a :class:`~tiltlab.accumulator.TiltState`, a tree of merges, and a
    finaliser; computing the result runs it once. NaN or infinite losses raise
    ``ValueError`` when the result is computed (NaN with ``check_finite=False``).
    """
    import dask.array as da
    from dask import delayed

    tv = _host_tilt(t)
    if _unknown_sizes(losses) and (tv is None or weights is not None or keepdims
                                   or getattr(losses, "ndim", 0) != 1):
        _require_sizes(losses=losses)
    if (
        tv is None
        or not check_finite
        or keepdims
        or getattr(losses, "ndim", 0) != 1
        or axis not in (0, -1)
        or not isinstance(losses, da.Array)
        or np.dtype(losses.dtype).kind not in "fiub"
        or losses.shape[0] == 0
    ):
        return None
    w = _weights_like(weights, losses)
    dtype = _result_dtype(losses)
    n = float(losses.shape[0])
    # at t = 0 unit weights of 1 / n keep the sum of losses near the float maximum finite
    unit = 1.0 / n if w is None and math.isfinite(n) else None
    t_state = tv if math.isfinite(tv) else 0.0
    fn = delayed(chunk_loss_state, pure=False)
    wb = _blocks(w) or [None] * len(losses.chunks[0])
    parts = [fn(lb, pb, t_state, unit, check_finite)
             for lb, pb in zip(_blocks(losses), wb, strict=True)]
    root = delayed(_finish_risk, pure=False)(tree_reduce(parts, merge_states), tv, dtype.str)
    return da.from_delayed(root, shape=(), dtype=dtype)


def _finish_risk(state: Any, t: float, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if state is None:  # non-finite losses, check_finite=False
        return np.asarray(math.nan, dtype=dt)
    _check_state(state)
    if math.isinf(t):
        return np.asarray(state.hi if t > 0 else state.lo, dtype=dt)
    return np.asarray(finalize_risk(state, np, dt), dtype=dt)


def _check_state(state: Any) -> None:
    if isinstance(state, str):  # "empty": every chunk had zero prior mass
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

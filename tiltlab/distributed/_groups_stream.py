"""Hierarchical objectives on Dask data read from their source at each evaluation.

When the chunks are not persisted (data beyond the workers' memory), the two sweeps of
:mod:`tiltlab.distributed._groups` would hold every loaded chunk until the second sweep.
This module evaluates such data in one sweep instead: each chunk's state carries, per
innermost group, the weighted sums ``sum pe c x`` themselves (``G x d`` numbers per chunk,
formed by segment sums: slower per row than a BLAS product, but each chunk is read once
and freed), merged group by group; the upper levels finish in the same graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import to_numpy
from ..objective.blocks import hvp_coefficients
from ..risk import GroupTree, hierarchy_eval
from ..segments import Segments, segment_sum
from ._states import (
    _derivs,
    _group_state_or_none,
    _ns,
    _params,
    _sub_blocks,
    aligned,
    group_risks,
    merge_states,
)

__all__ = ["chunk_group_sums", "finish_group_sums", "kappa"]


def _group_xt(Xb: Any, coef: Any, seg: Segments, xp: Any) -> Any:
    """Per-group ``sum_{i in g} coef_i x_i``: shape (G, d), or (G, d, K) for 2-d ``coef``."""
    if coef.ndim == 1:
        return xp.permute_dims(segment_sum(Xb.T * coef[None, :], seg, xp), (1, 0))
    vals = Xb.T[:, None, :] * xp.permute_dims(coef, (1, 0))[None, :, :]
    return xp.permute_dims(segment_sum(vals, seg, xp), (2, 0, 1))


def chunk_group_sums(
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
    fused: bool = False,
) -> Any:
    """One chunk's :class:`~tiltlab.accumulator.GroupState` with per-group weighted sums
    (None: non-finite losses), merged over cache-sized sub-blocks.

    Sums per group: ``"grad"``: ``X^T (pe l')``; ``"hvp"``: ``X^T (pe (l'' u + tau l'
    a))``, ``X^T (pe l')`` and ``sum pe a`` (``a = l' u``); ``"value"``: none. With
    ``fused``, a NumPy chunk is first offered to the fused grouped kernel
    (:func:`~tiltlab.distributed._chunk_engine.numpy_group_state`: one compiled pass over
    its rows); what it declines takes the array-API route here.
    """
    if fused:
        from ._chunk_engine import DECLINE, numpy_group_state

        st = numpy_group_state(
            aligned(Xb), aligned(yb), aligned(pb), cb, theta, V, loss, tau, n_groups, mode
        )
        if st is not DECLINE:
            return st
    return merge_states(
        *[
            _block_group_sums(X1, y1, p1, c1, theta, V, loss, tau, n_groups, mode)
            for X1, y1, p1, c1 in _sub_blocks(Xb, yb, pb, cb)
        ]
    )


def _block_group_sums(Xb, yb, pb, cb, theta, V, loss, tau, n_groups, mode):
    xp = _ns(Xb)
    th, v = _params(theta, V, Xb, xp)
    seg = Segments.from_codes(to_numpy(cb), n_groups)
    D = _derivs(loss, Xb, yb, th, v, mode, xp)
    multi = D["multi"]
    sums = None
    if mode == "grad":
        d1 = D["d1"]

        def sums(pe):
            return (_group_xt(Xb, pe[:, None] * d1 if multi else pe * d1, seg, xp),)
    elif mode == "hvp":
        d1, d2, u, a = D["d1"], D["d2"], D["u"], D["a"]

        def sums(pe):
            c, gcoef = hvp_coefficients(pe, d1, d2, u, a, D["hz"] if multi else None, tau)
            return (
                _group_xt(Xb, c, seg, xp),
                _group_xt(Xb, gcoef, seg, xp),
                segment_sum(pe * a, seg, xp),
            )

    return _group_state_or_none(D["ell"], pb, seg, tau, xp, sums)


def kappa(upper: GroupTree, tilts: tuple, W: np.ndarray, abar: np.ndarray) -> np.ndarray:
    """Per-group coefficient of the group gradient in a hierarchical Hessian product.

    ``upper`` holds the levels above the innermost groups and ``tilts`` all tilts,
    outermost first. With ``s_1 = abar`` (each innermost group's weighted mean of
    ``a = l' . u``) and ``s_k`` the ``W``-weighted mean of ``abar`` over each node of
    level ``k`` (the root last), ``kappa_g = -t_1 s_1(g) + sum_{k >= 2} t_k (s_{k-1} -
    s_k)(ancestors of g)``.
    """
    ts = tuple(tilts)[::-1]  # innermost first: t_1 (samples in groups), ...
    out = -ts[0] * abar
    prev = abar  # s_{k-1} per innermost group
    codes = np.arange(W.shape[0])  # innermost group -> node of the current level
    for k in range(1, len(ts)):
        if k <= len(upper.levels):  # a grouping level: node means
            lev = upper.levels[k - 1]
            codes = lev.codes[codes]
            num = np.bincount(codes, weights=W * abar, minlength=lev.n_groups)
            den = np.bincount(codes, weights=W, minlength=lev.n_groups)
            with np.errstate(invalid="ignore", divide="ignore"):
                node = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
            cur = node[codes]
        else:  # the root
            cur = np.full_like(abar, float(np.sum(W * abar)))
        if ts[k] != 0.0:
            out = out + ts[k] * (prev - cur)
        prev = cur
    return out


def finish_group_sums(upper: GroupTree, tilts: tuple, mode: str, dtype: str, *states: Any) -> Any:
    """``(value, gradient or Hv)`` from the chunk states (None: non-finite losses)."""
    state = merge_states(*states)
    if state is None:
        return None
    dt = np.dtype(dtype)
    R = group_risks(state, dt).astype(np.float64)
    M = state.mass / np.sum(state.mass)
    risk, W = hierarchy_eval(R, M, upper, list(tilts[:-1]), np)
    W = np.asarray(W, dtype=np.float64)
    if mode == "value":
        return float(risk), None
    on = state.present
    s = np.where(on, state.s, 1.0)
    parts = [
        np.where(
            np.reshape(on, on.shape + (1,) * (v.ndim - 1)),
            v / np.reshape(s, s.shape + (1,) * (v.ndim - 1)),
            0.0,
        )
        for v in state.sums
    ]
    if mode == "grad":
        return float(risk), np.tensordot(W, parts[0], axes=1)
    A, G, abar = parts
    Wk = W * kappa(upper, tilts, W, abar)
    return float(risk), np.tensordot(W, A, axes=1) + np.tensordot(Wk, G, axes=1)

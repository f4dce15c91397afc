"""The labelled route of one-level hierarchies on NumPy: group codes straight to group
risks, the top level and each sample's weight (one shared shift, one pass for the group
normalisers, one gather), and the scalar risk and weights of the top level.

Used by :mod:`tiltlab.risk.hierarchy` where it applies (NumPy 1-d losses, one grouping
level, the uniform prior, finite tilts); the tree of group states serves the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._compat import device
from ..accumulator import (
    TiltState,
    block_state,
    finalize_risk,
    label_codes,
    labelled_level,
    labelled_risk,
    pooled_risk,
    shifted_exponent,
    spread_overflows,
)
from ..segments import use_kernels
from .fast_path import _quiet
from .inputs import narrow, prepare_losses, prepare_tilts, widen_half
from .kernels import _inplace_exp, risk_kernel, weights_kernel

# the package re-exports ``risk_weights_scalar``; the routes and ``tilts_in_precision`` are for
# tiltlab.risk.hierarchy
__all__ = ["risk_weights_scalar"]


def tilts_in_precision(ts: Sequence[float], like: Any, xp: Any) -> list[float]:
    """The host tilts ``ts`` as the precision of the losses ``like`` holds them.

    Every other risk function rounds its tilt to the losses' precision first; so does
    each level of a hierarchy. In float32 a tilt beyond its range becomes +-inf (the
    largest or smallest value, as for an infinite tilt) and one below its smallest
    subnormal 0 (the mean); wider dtypes hold a Python float as it is.

    Parameters
    ----------
    ts : sequence of float
        The tilts, outermost first.
    like : array
        The losses (after any widening of 16-bit losses to float32).
    xp : namespace
        Their array namespace.

    Returns
    -------
    list of float
        The rounded tilts, in the same order.
    """
    if xp.finfo(like.dtype).bits != 32:
        return [float(v) for v in ts]
    with np.errstate(over="ignore", under="ignore"):
        return [float(np.float32(v)) for v in ts]


def risk_weights_scalar(
    l: Any,
    p: Any,
    t: float,
    xp: Any,
    *,
    weights: bool = True,
    extremes: tuple[float, float] | None = None,
):
    """Risk (and weights) along the last axis for one host-side tilt ``t``.

    One-dimensional losses at a finite non-zero tilt go through the tilted accumulator
    (one exponential per loss, one synchronisation, at most two temporaries of ``l``'s
    size); everything else through the vectorised kernels. For eager backends.
    ``extremes`` passes ``(max, min)`` of ``l`` over the support of ``p`` already read.
    """
    t = float(t)
    if l.ndim != 1 or t == 0.0 or not math.isfinite(t):
        tt = xp.asarray(t, dtype=l.dtype, device=device(l))
        r = risk_kernel(l, p, tt, xp)
        return (r, weights_kernel(l, p, tt, xp)) if weights else (r, None)
    st = block_state(l, p, t, xp, extremes=extremes)
    r = finalize_risk(st, xp, l.dtype)
    if not weights:
        return r, None
    return r, _weights_from_state(l, p, st, xp)


def _weights_from_state(l: Any, p: Any, st: TiltState, xp: Any) -> Any:
    """Tilted weights of 1-d losses given their merged state (shift and normaliser)."""
    huge = spread_overflows(st.hi, st.lo, l.dtype, xp)
    u = shifted_exponent(l, st.shift, st.t, p, xp, huge)
    e = _inplace_exp(u, xp)
    if p is not None:
        e = e * p
    return e / st.s


#: one-hot sums and gathers (two small matrix-vector products) below this many entries
#: of the ``N x G`` indicator, for inputs too short for the compiled kernels
ONEHOT_ENTRIES = 1 << 18


def _labelled_plan(tree: Any) -> tuple:
    """``(codes, n_groups, counts, onehot)`` of a one-level tree for
    :func:`~tiltlab.accumulator.labelled_level`, computed once per tree."""
    lev = tree.levels[0]
    plan = lev._cache.get("labelled-plan")
    if plan is None:
        n, G = tree.n_samples, lev.n_groups
        counts = lev.counts.astype(np.float64)
        onehot = None
        if not use_kernels(n) and n * G <= ONEHOT_ENTRIES:
            onehot = np.zeros((n, G))
            onehot[np.arange(n), lev.codes] = 1.0
        plan = lev._cache["labelled-plan"] = (lev.codes, G, counts, onehot)
    return plan


def _sorted_members(tree: Any):
    """A callable giving ``(order, starts)`` of the tree's samples by group: sorted once,
    on the second evaluation that needs it (a tree evaluated once is not sorted)."""
    lev = tree.levels[0]

    def members():
        got = lev._cache.get("members-sorted")
        if got is None:
            seen = lev._cache.get("members-asked", 0) + 1
            lev._cache["members-asked"] = seen
            if seen < 2:
                return None
            order = np.argsort(lev.codes, kind="stable")
            starts = np.zeros(lev.n_groups, dtype=np.int64)
            np.cumsum(lev.counts[:-1], out=starts[1:])
            got = lev._cache["members-sorted"] = (order, starts)
        return got

    return members


def labelled_eval(l: Any, tree: Any, ts: Sequence[float], xp: Any, want: bool):
    """``(risk, weights)`` of a one-level hierarchy of NumPy 1-d losses under the uniform
    prior by the labelled route, or None where it does not apply (an infinite tilt, or
    :func:`~tiltlab.accumulator.labelled_level` declines)."""
    t_top, tau = float(ts[0]), float(ts[1])
    if not (math.isfinite(t_top) and math.isfinite(tau)):
        return None
    codes, G, counts, onehot = _labelled_plan(tree)
    level = labelled_level(
        l, tau, codes, G, counts, weights=want, onehot=onehot, members=_sorted_members(tree)
    )
    if level is None:
        return None
    return _top_of_level(level, t_top, tree.n_samples, xp, want)


def _top_of_level(level: Any, t: float, n: int, xp: Any, want: bool):
    """``(risk, weights)`` from a labelled level: the tilted risk of its group risks
    with their masses at tilt ``t`` (and each sample's weight)."""
    R = level.risk
    if not want:
        risk = pooled_risk(R, t, level.mass)
        if risk is not None:
            return risk, None
    top = (level.mass / n).astype(R.dtype, copy=False)
    if t == 0.0:  # the mass-weighted mean of the group risks; the weights are the masses
        risk = np.asarray(np.sum((level.mass / n) * R), dtype=R.dtype)  # no overflow
        return risk, (level.weights(top) if want else None)
    # every group present has mass: the extremes of its risks are those of the support
    ext = (float(R.max()), float(R.min()))
    risk, W = risk_weights_scalar(R, top, t, xp, weights=want, extremes=ext)
    return risk, (level.weights(W) if want else None)


def labelled_two_levels_risk(losses: Any, groups: Any, tilts: Any, xp: Any) -> Any:
    """The risk of one grouping level of large NumPy 1-d losses with integer labels and
    the uniform prior, without building the group tree: the labels serve as group codes,
    one compiled pass counts and sums every group
    (:func:`~tiltlab.accumulator.labelled_risk`), and
    :func:`~tiltlab.accumulator.pooled_risk` gives the top level. None where that route
    does not apply (the general route then validates and evaluates)."""
    labels = groups  # NumPy integer labels only: other labels are validated once, later
    if not isinstance(labels, np.ndarray) or labels.dtype.kind not in "iu":
        return None
    l, half = widen_half(prepare_losses(losses, xp, False), xp)
    if l.ndim != 1 or labels.shape != l.shape or not use_kernels(l.shape[0]):
        return None
    ts = tilts_in_precision(prepare_tilts(tilts, 1), l, xp)
    if not math.isfinite(ts[1]):
        return None
    with _quiet(xp):
        out = labelled_risk(l, ts[1], labels)
        if out is None:
            return None
        R, counts = out
        risk = pooled_risk(R, ts[0], counts) if math.isfinite(ts[0]) else None
        if risk is None:
            counts /= l.shape[0]
            top = counts.astype(l.dtype, copy=False)
            risk = risk_weights_scalar(R, top, ts[0], xp, weights=False)[0]
    return narrow(risk, half, xp)


def labelled_two_levels_weights(losses: Any, groups: Any, tilts: Any, xp: Any) -> Any:
    """The weights of one grouping level of large NumPy 1-d losses with integer labels
    under the uniform prior, without building the group tree (the labels serve as group
    codes: :func:`~tiltlab.accumulator.labelled_level`), or None where that route does
    not apply."""
    labels = groups
    if not isinstance(labels, np.ndarray):
        return None
    l, half = widen_half(prepare_losses(losses, xp, False), xp)
    if l.ndim != 1 or labels.shape != l.shape:
        return None
    coded = label_codes(labels, int(l.shape[0]))
    if coded is None:
        return None
    ts = tilts_in_precision(prepare_tilts(tilts, 1), l, xp)
    if not (math.isfinite(ts[0]) and math.isfinite(ts[1])):
        return None
    with _quiet(xp):
        level = labelled_level(l, ts[1], *coded, weights=True, weights_only=ts[0])
        if level is None:
            return None
        _, w = _top_of_level(level, ts[0], int(l.shape[0]), xp, True)
    return narrow(w, half, xp)

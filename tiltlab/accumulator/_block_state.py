"""The state of one block of samples (or of every group of a partition at once): the
constructors behind :meth:`tiltlab.accumulator.TiltState.from_block`."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from .._compat import device, tiny_sqrt
from ..segments import expand, segment_max, segment_min, segment_sum
from ._support import _extremes, _host, _nonfinite, _scaled_gap, spread_overflows
from .packed import normaliser_term

__all__ = ["shifted_exponent"]


def shifted_exponent(l: Any, c: Any, t: float, p: Any, xp: Any, huge: bool) -> Any:
    """``t (l - c)`` (a fresh array), zero off the support, halved first when the
    spread overflows in the losses' dtype (``huge``: :func:`spread_overflows`)."""
    if huge:
        u = (l * 0.5 - c * 0.5) * t
        u = u * 2.0
    else:
        u = l - c
        u *= t  # a fresh array: scale in place
    if p is not None:
        u = xp.where(p > 0, u, xp.zeros_like(u))
    return u


def _sample_block(cls, l, t, p, sums, xp, extremes, tiny, unit):
    if l.shape[0] == 0:  # no samples: the merge's identity
        return cls.empty(t, xp=xp, dtype=l.dtype, device=device(l))
    hi, lo = _extremes(l, p, xp) if extremes is None else extremes
    if hi == -math.inf and lo == math.inf:  # no sample on the prior's support (unused)
        return cls.empty(t, xp=xp, dtype=l.dtype, device=device(l))
    if not (math.isfinite(hi) and math.isfinite(lo)):
        raise _nonfinite()
    if tiny is None:
        tiny = tiny_sqrt(l.dtype, xp)
    c = hi if t > 0 else lo
    if t == 0.0:
        return _mean_block(cls, l, p, sums, xp, hi, lo, unit, None, c)
    mass = _mass(l, p, xp)
    if math.isinf(t):
        return _extreme_block(cls, l, c, p, sums, xp, t, hi, lo, mass, None)
    scale = _scaled_gap(abs(t), hi, lo)
    u = shifted_exponent(l, c, t, p, xp, spread_overflows(hi, lo, l.dtype, xp))
    near = scale <= 1.0
    e = normaliser_term(u, near, xp, overwrite=True)
    if near:
        q = xp.sum(e) if p is None else xp.sum(p * e)
        s = mass + q
        if sums is not None:
            e = e + 1.0  # exp(u) >= exp(-1): no cancellation
    else:
        q = None
        s = None
    del u
    pe = e if p is None else p * e
    if s is None:
        s = xp.sum(pe)
    lsum = None
    if scale < tiny:
        lsum = xp.sum(l - c) if p is None else xp.sum(p * (l - c))
    extra = tuple(sums(pe)) if sums is not None else ()
    return cls(t=t, hi=hi, lo=lo, mass=mass, s=s, q=q, lsum=lsum, sums=extra)


def _mean_block(cls, l, p, sums, xp, hi, lo, unit, seg, c):
    """The state at ``t = 0``: no exponentials, the weights are the prior. With unit
    weights of size ``unit`` the differences are scaled before they are summed, so that
    the sum of many losses near the float maximum stays finite. Where the spread
    overflows the losses' dtype the differences are halved, weighted and summed, and the
    sum doubled (exact: scaling by 2 commutes with rounding), so that ``lsum`` is finite
    whenever the weighted sum of the differences is (a prior or ``unit`` of mass at most
    1, as the hierarchy's levels pass)."""
    dev = device(l)
    if seg is not None:
        c = expand(xp.asarray(c, dtype=l.dtype, device=dev), seg, xp)
    huge = spread_overflows(hi, lo, l.dtype, xp)
    d = l * 0.5 - c * 0.5 if huge else l - c
    if p is not None:
        d = p * xp.where(p > 0, d, xp.zeros_like(d))
        pe = p
    elif unit is not None:
        d = d * unit
        pe = xp.full_like(l, unit) if sums is not None else None
    else:
        pe = xp.ones_like(l) if sums is not None else None
    if seg is None:
        lsum = xp.sum(d)
        mass = (
            _mass(l, p, xp)
            if p is not None
            else xp.asarray(
                float(l.shape[0]) * (1.0 if unit is None else unit), dtype=l.dtype, device=dev
            )
        )
    else:
        lsum = segment_sum(d, seg, xp)
        if p is not None:
            mass = segment_sum(p, seg, xp)
        else:
            counts = seg.counts * (1.0 if unit is None else unit)
            mass = xp.asarray(
                np.array(np.broadcast_to(counts, tuple(lsum.shape))), dtype=l.dtype, device=dev
            )
    if huge:
        with np.errstate(over="ignore"):  # a sum beyond the float maximum: inf, as unhalved
            lsum = lsum * 2.0
    extra = tuple(sums(pe)) if sums is not None else ()
    return cls(t=0.0, hi=hi, lo=lo, mass=mass, s=mass, q=None, lsum=lsum, sums=extra)


def _extreme_block(cls, l, c, p, sums, xp, t, hi, lo, mass, seg):
    """The state at ``t = +-inf``: the weights are the prior restricted to the losses equal to
    the extreme ``c`` (per group with ``seg``: ``c`` expanded to the samples)."""
    hit = l == c
    if p is not None:
        hit = hit & (p > 0)
    one = xp.ones_like(l) if p is None else p
    pe = xp.where(hit, one, xp.zeros_like(l))
    s = xp.sum(pe) if seg is None else segment_sum(pe, seg, xp)
    extra = tuple(sums(pe)) if sums is not None else ()
    return cls(t=t, hi=hi, lo=lo, mass=mass, s=s, q=None, lsum=None, sums=extra)


def _mass(l: Any, p: Any, xp: Any) -> Any:
    if p is None:
        return xp.asarray(float(l.shape[0]), dtype=l.dtype, device=device(l))
    return xp.sum(p)


def _group_block(cls, l, t, p, sums, seg, xp, tiny, unit):
    dev = device(l)
    on = None if p is None else p > 0
    with np.errstate(invalid="ignore"):  # NaN losses are reported below
        if on is None:
            hi_d, lo_d = segment_max(l, seg, xp), segment_min(l, seg, xp)
        else:
            ninf = xp.asarray(-math.inf, dtype=l.dtype, device=dev)
            pinf = xp.asarray(math.inf, dtype=l.dtype, device=dev)
            hi_d = segment_max(xp.where(on, l, ninf), seg, xp)
            lo_d = segment_min(xp.where(on, l, pinf), seg, xp)
    hi, lo = _host(hi_d).astype(np.float64), _host(lo_d).astype(np.float64)
    present = hi >= lo
    if np.any(np.isnan(hi) | np.isnan(lo)) or not (
        np.all(np.isfinite(hi[present])) and np.all(np.isfinite(lo[present]))
    ):
        raise _nonfinite()
    st = cls(t=t, hi=hi, lo=lo, mass=None, s=None, q=None, lsum=None, sums=())
    if t == 0.0:
        return _mean_block(cls, l, p, sums, xp, hi, lo, unit, seg, st.shift)
    if tiny is None:
        tiny = tiny_sqrt(l.dtype, xp)
    c = expand(xp.asarray(st.shift, dtype=l.dtype, device=dev), seg, xp)
    w = p
    if w is None:
        mass = xp.asarray(
            np.array(np.broadcast_to(seg.counts, hi.shape), dtype=np.float64),
            dtype=l.dtype,
            device=dev,
        )
    else:
        mass = segment_sum(w, seg, xp)
    if math.isinf(t):
        return _extreme_block(cls, l, c, w, sums, xp, t, hi, lo, mass, seg)
    scale = st.scale
    lsum = None
    if not np.any((scale > 0.0) & (scale < tiny)):
        if np.any(scale < tiny):  # only zero spreads (and empty groups): every sum is 0
            lsum = xp.zeros_like(mass)
    else:
        d = l - c
        lsum = segment_sum(d if w is None else w * xp.where(on, d, xp.zeros_like(d)), seg, xp)
    small = scale <= 1.0
    u = shifted_exponent(l, c, t, w, xp, spread_overflows(hi, lo, l.dtype, xp))
    n_small = int(np.sum(small))
    q = None
    if n_small == small.size:
        e1 = normaliser_term(u, True, xp, overwrite=True)
        q = segment_sum(e1 if w is None else w * e1, seg, xp)
        s = mass + q
        e = e1 + 1.0 if sums is not None else None  # exp(u) >= exp(-1): no cancellation
    elif n_small == 0:
        e = normaliser_term(u, False, xp, overwrite=True)
        s = None
    else:
        e1 = normaliser_term(u, True, xp)
        q = segment_sum(e1 if w is None else w * e1, seg, xp)
        e = normaliser_term(u, False, xp, overwrite=True)
        s = None
    del u
    pe = None
    if s is None or sums is not None:
        pe = e if w is None else w * e
    if s is None:
        s = segment_sum(pe, seg, xp)
    extra = tuple(sums(pe)) if sums is not None else ()
    return replace(st, mass=mass, s=s, q=q, lsum=lsum, sums=extra)

"""The tilted reduction's rule: the state, its blocks, its merge and its finalisation
(see :mod:`tiltlab.accumulator`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._compat import apply_inplace, device, tiny_sqrt
from ..segments import Segments, expand, segment_max, segment_min, segment_sum
from ._support import (
    _cast,
    _col,
    _dev,
    _extremes,
    _host,
    _nonfinite,
    _ns,
    _scaled_gap,
    _select,
)

__all__ = [
    "TiltState",
    "GroupState",
    "needed_sums",
    "finish_risk",
    "series_threshold",
    "risk_of_exponents",
    "shifted_exponent",
]


# ---------------------------------------------------------------------------------------
# the state


@dataclass(frozen=True)
class TiltState:
    """Tilted log-sum-exp state of a set of samples (or of ``G`` groups) for one tilt.

    Build it with :meth:`from_block`, combine with :meth:`merge`, read it with
    :meth:`risk` and :meth:`normalized_sums` (or :meth:`finalize` for both).

    Attributes
    ----------
    t : float
        The tilt (finite; ``0`` gives the prior-weighted mean).
    hi, lo : float or ndarray
        Largest and smallest loss over the support (host values; per group for a
        group state, ``-inf``/``+inf`` for groups without samples).
    mass : array
        Sum of the prior weights (the sample count for uniform priors).
    s : array
        ``sum p_i exp(t (l_i - c))`` with ``c = shift``.
    q : array or None
        ``sum p_i expm1(t (l_i - c))`` while ``|t| (hi - lo) <= 1``, else None (for a group
        state: an array whose entries count only where that group's spread allows).
    lsum : array or None
        ``sum p_i (l_i - shift)`` at ``t = 0`` and while ``|t| (hi - lo)`` is below
        ``sqrt(tiny)``, else None (relative to the shift, so that losses near the float
        maximum cannot overflow it).
    sums : tuple of arrays
        ``sum p_i exp(t (l_i - c)) v_i`` for the per-sample arrays requested.

    Examples
    --------
    >>> import numpy as np
    >>> a = TiltState.from_block(np.array([0.0, 1.0]), 1.0)
    >>> b = TiltState.from_block(np.array([4.0]), 1.0)
    >>> r = a.merge(b).risk()
    >>> bool(np.isclose(r, np.log(np.mean(np.exp([0.0, 1.0, 4.0])))))
    True
    """

    t: float
    hi: Any
    lo: Any
    mass: Any
    s: Any
    q: Any
    lsum: Any
    sums: tuple

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_block(
        cls,
        losses: Any,
        t: float,
        prior: Any = None,
        *,
        sums: Callable[[Any], tuple] | None = None,
        segments: Segments | None = None,
        xp: Any = None,
        extremes: tuple[float, float] | None = None,
        tiny: float | None = None,
        unit: float | None = None,
    ) -> TiltState:
        """The state of one block of samples.

        Parameters
        ----------
        losses : array
            1-d losses of the block (the last axis holds the items of ``segments``, which
            allows leading batch axes for a group state).
        t : float
            The tilt (finite).
        prior : array, optional
            Non-negative prior weights of the block (None: unit weights, ``mass`` is then
            the sample count). Normalisation happens once, in :meth:`risk`.
        sums : callable, optional
            Maps the block's unnormalised weights ``p_i exp(u_i)`` to a tuple of weighted
            sums (per group for a group state, the group axis first).
        segments : Segments, optional
            Reduce per group of this partition of the block's samples.
        xp : namespace, optional
            The namespace of ``losses`` (inferred by default).
        extremes : (float, float), optional
            ``(hi, lo)`` already read for these losses (sample level).
        tiny : float, optional
            The mean-regime threshold (default: ``sqrt`` of the smallest normal number of
            the losses' dtype).
        unit : float, optional
            At ``t = 0``, the weight of each sample when ``prior`` is None (default 1).
            A small unit (``1 / N``) keeps the sum of huge losses from overflowing.

        Returns
        -------
        TiltState

        Raises
        ------
        NonFiniteLosses
            NaN or infinite losses on the support (a ``ValueError`` naming ``losses``).

        Examples
        --------
        >>> import numpy as np
        >>> st = TiltState.from_block(np.array([1.0, 3.0]), 0.0)
        >>> float(st.risk())
        2.0
        """
        xp = _ns(losses) if xp is None else xp
        t = float(t)
        if segments is not None:
            return _group_block(GroupState, losses, t, prior, sums, segments, xp, tiny, unit)
        return _sample_block(cls, losses, t, prior, sums, xp, extremes, tiny, unit)

    # -- views ---------------------------------------------------------------------

    @property
    def is_groups(self) -> bool:
        """Whether this state holds one entry per group (its extremes are arrays)."""
        return isinstance(self.hi, np.ndarray)

    @property
    def present(self) -> Any:
        """Which groups have samples (always True for a sample-level state)."""
        return self.hi >= self.lo

    @property
    def shift(self) -> Any:
        """The loss the exponentials are taken relative to (max for t > 0, else min)."""
        c = self.hi if self.t > 0 else self.lo
        if self.is_groups:
            return np.where(self.present, c, 0.0)
        return c

    @property
    def spread(self) -> Any:
        """``hi - lo``: the range of the losses summarised (per group with segments)."""
        return self.hi - self.lo

    @property
    def scale(self) -> Any:
        """``|t| (hi - lo)``, the quantity that picks the regime (0 for empty groups)."""
        g = _scaled_gap(abs(self.t), self.hi, self.lo)
        if self.is_groups:
            return np.where(self.present, g, 0.0)
        return g

    @property
    def has_q(self) -> Any:
        """Where ``q`` holds the small-tilt sum (host bool, or mask over groups)."""
        if self.q is None:
            return False
        return self.scale <= 1.0

    # -- the merge -----------------------------------------------------------------

    def merge(self, other: TiltState) -> TiltState:
        """Merge with the state of another set of samples (exact up to rounding;
        associative). Both states must have one tilt and one layout."""
        a, b = self, other
        if a.t != b.t:
            raise ValueError(f"cannot merge states of two tilts ({a.t} and {b.t})")
        t = a.t
        groups = a.is_groups
        if groups:
            hi, lo = np.maximum(a.hi, b.hi), np.minimum(a.lo, b.lo)
        else:
            hi, lo = max(a.hi, b.hi), min(a.lo, b.lo)
        merged = type(a)(t=t, hi=hi, lo=lo, mass=None, s=None, q=None, lsum=None, sums=())
        c = merged.shift
        ra, ema, da = _rescale(t, a, c)
        rb, emb, db = _rescale(t, b, c)
        like = a.s
        ra_d, rb_d = _dev(ra, like), _dev(rb, like)
        s = a.s * ra_d + b.s * rb_d
        q = None
        if a.q is not None and b.q is not None and (groups or merged.scale <= 1.0):
            q = a.mass * _dev(ema, like) + a.q * ra_d + b.mass * _dev(emb, like) + b.q * rb_d
        lsum = None
        if a.lsum is not None and b.lsum is not None:
            lsum = a.lsum + a.mass * _dev(da, like) + b.lsum + b.mass * _dev(db, like)
        sums = tuple(
            x * _col(ra_d, x, groups) + y * _col(rb_d, y, groups)
            for x, y in zip(a.sums, b.sums, strict=True)
        )
        return replace(merged, mass=a.mass + b.mass, s=s, q=q, lsum=lsum, sums=sums)

    # -- finalisation --------------------------------------------------------------

    def risk(self, xp: Any = None, dtype: Any = None) -> Any:
        """The tilted risk of the merged samples (per group for a group state).

        ``dtype`` (default: that of ``s``) sets the mean-regime threshold and the result's
        dtype. Groups without samples give NaN.
        """
        xp = _ns(self.s) if xp is None else xp
        dtype = self.s.dtype if dtype is None else dtype
        c = _dev(self.shift, self.s)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.t == 0.0:
                return _cast(c + self.lsum / self.mass, xp, dtype)
            scale = self.scale
            tiny = tiny_sqrt(dtype, xp)
            if not self.is_groups:
                if scale < tiny and self.lsum is not None:
                    r = c + self.lsum / self.mass
                elif self.q is not None:
                    r = _add_scaled(c, xp.log1p(self.q / self.mass), self.t, xp)
                else:
                    r = _add_scaled(c, xp.log(self.s / self.mass), self.t, xp)
                return _cast(r, xp, dtype)
            r = _add_scaled(c, xp.log(self.s / self.mass), self.t, xp)
            if self.q is not None and np.any(scale <= 1.0):
                r_q = _add_scaled(c, xp.log1p(self.q / self.mass), self.t, xp)
                r = _select(scale <= 1.0, r_q, r, r)
            if self.lsum is not None and np.any(scale < tiny):
                r = _select(scale < tiny, c + self.lsum / self.mass, r, r)
            return _cast(r, xp, dtype)

    def normalized_sums(self) -> tuple:
        """The requested sums divided by the normaliser: ``sum_i w_i v_i`` with tilted
        weights (per group for a group state, the group axis first)."""
        if not self.is_groups:
            return tuple(x / self.s for x in self.sums)
        return tuple(x / _col(self.s, x, True) for x in self.sums)

    def finalize(self, xp: Any = None, dtype: Any = None) -> tuple[Any, tuple]:
        """``(risk, normalized sums)``: see :meth:`risk` and :meth:`normalized_sums`."""
        return self.risk(xp, dtype), self.normalized_sums()

    def to_host(self) -> TiltState:
        """The same state with NumPy arrays (what a worker sends to its client)."""

        def h(a):
            return None if a is None else _host(a)

        return replace(self, mass=h(self.mass), s=h(self.s), q=h(self.q), lsum=h(self.lsum),
                       sums=tuple(h(v) for v in self.sums))


class GroupState(TiltState):
    """The group form of :class:`TiltState` (what :meth:`TiltState.from_block` returns when
    given ``segments``): the same fields, rule and merge, one entry per group.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import Segments
    >>> seg = Segments.from_codes([0, 0, 1])
    >>> st = TiltState.from_block(np.array([1.0, 3.0, 5.0]), 0.0, segments=seg)
    >>> st.risk().tolist()
    [2.0, 5.0]
    """

    def collapse(self) -> TiltState:
        """The sample-level state of all groups together (the merge of every group).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.segments import Segments
        >>> l = np.array([1.0, 3.0, 5.0])
        >>> st = TiltState.from_block(l, 2.0, segments=Segments.from_codes([0, 0, 1]))
        >>> bool(np.isclose(st.collapse().risk(), TiltState.from_block(l, 2.0).risk()))
        True
        """
        on = self.present
        if not np.any(on):
            raise ValueError("no group has samples")
        t = self.t
        hi, lo = float(np.max(self.hi[on])), float(np.min(self.lo[on]))
        out = TiltState(t=t, hi=hi, lo=lo, mass=None, s=None, q=None, lsum=None, sums=())
        r, em, d = _rescale(t, self, out.shift)
        xp = _ns(self.s)
        like = self.s
        r_d = _dev(r, like)
        s = xp.sum(self.s * r_d, axis=-1)
        mass = xp.sum(self.mass, axis=-1)
        q = None
        if self.q is not None and out.scale <= 1.0:
            q = xp.sum(self.mass * _dev(em, like) + self.q * r_d, axis=-1)
        lsum = None
        if self.lsum is not None:
            lsum = xp.sum(self.lsum + self.mass * _dev(d, like), axis=-1)
        sums = tuple(xp.tensordot(r_d, v, axes=1) for v in self.sums)
        return replace(out, mass=mass, s=s, q=q, lsum=lsum, sums=sums)


def _add_scaled(c: Any, logz: Any, t: Any, xp: Any) -> Any:
    """``c + logz / t``; where ``logz / t`` overflows (a tiny tilt and a spread near the
    float maximum) but the risk, which lies between the extremes, does not, the sum is
    taken in halves (exact: scaling by 2 commutes with rounding)."""
    r = c + logz / t
    half = (c * 0.5 + (logz * 0.5) / t) * 2.0
    return xp.where(xp.isfinite(r), r, half)


def needed_sums(t: float, hi: float, lo: float, tiny: float) -> tuple[bool, bool]:
    """``(q, lsum)``: whether the rule needs ``sum p expm1(u)`` (else ``sum p exp(u)``)
    and ``sum p (l - shift)`` for losses spanning ``[lo, hi]`` at tilt ``t`` (for drivers
    that form the sums themselves, such as device kernels).

    Examples
    --------
    >>> needed_sums(1e-3, 2.0, 0.0, 1e-154)
    (True, False)
    >>> needed_sums(0.0, 2.0, 0.0, 1e-154)
    (False, True)
    """
    if t == 0.0:
        return False, True
    scale = _scaled_gap(abs(t), hi, lo)
    return scale <= 1.0, scale < tiny


def _rescale(t: float, st: TiltState, c: Any) -> tuple[Any, Any, Any]:
    """Host factors moving ``st`` to the shift ``c``: ``exp(u)``, ``expm1(u)`` and the shift
    difference, with ``u = t (st.shift - c) <= 0`` (zero for empty groups)."""
    if not st.is_groups:
        u = _scaled_gap(t, st.shift, c)
        return math.exp(u), math.expm1(u), st.shift - c
    on = st.present
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.where(on, _scaled_gap(t, st.shift, c), 0.0)
        d = np.where(on, st.shift - c, 0.0)
    return np.where(on, np.exp(u), 0.0), np.where(on, np.expm1(u), 0.0), d


# ---------------------------------------------------------------------------------------
# block construction


def shifted_exponent(l: Any, c: Any, t: float, p: Any, xp: Any, huge: bool) -> Any:
    """``t (l - c)`` (a fresh array), zero off the support, halved first when the
    spread overflows."""
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
    hi, lo = _extremes(l, p, xp) if extremes is None else extremes
    if not (math.isfinite(hi) and math.isfinite(lo)):
        raise _nonfinite()
    if tiny is None:
        tiny = tiny_sqrt(l.dtype, xp)
    c = hi if t > 0 else lo
    if t == 0.0:
        return _mean_block(cls, l, p, sums, xp, hi, lo, unit, None, c)
    mass = _mass(l, p, xp)
    scale = _scaled_gap(abs(t), hi, lo)
    u = shifted_exponent(l, c, t, p, xp, math.isinf(hi - lo))
    if scale <= 1.0:
        e = apply_inplace(xp.expm1, u, xp)
        q = xp.sum(e) if p is None else xp.sum(p * e)
        s = mass + q
        if sums is not None:
            e = e + 1.0  # exp(u) >= exp(-1): no cancellation
    else:
        q = None
        e = apply_inplace(xp.exp, u, xp)
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
    the sum of many losses near the float maximum stays finite."""
    dev = device(l)
    if seg is not None:
        c = expand(xp.asarray(c, dtype=l.dtype, device=dev), seg, xp)
    d = l - c
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
        mass = _mass(l, p, xp) if p is not None else xp.asarray(
            float(l.shape[0]) * (1.0 if unit is None else unit), dtype=l.dtype, device=dev)
    else:
        lsum = segment_sum(d, seg, xp)
        if p is not None:
            mass = segment_sum(p, seg, xp)
        else:
            counts = seg.counts * (1.0 if unit is None else unit)
            mass = xp.asarray(np.array(np.broadcast_to(counts, tuple(lsum.shape))),
                              dtype=l.dtype, device=dev)
    extra = tuple(sums(pe)) if sums is not None else ()
    return cls(t=0.0, hi=hi, lo=lo, mass=mass, s=mass, q=None, lsum=lsum, sums=extra)


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
        mass = xp.asarray(np.array(np.broadcast_to(seg.counts, hi.shape), dtype=np.float64),
                          dtype=l.dtype, device=dev)
    else:
        mass = segment_sum(w, seg, xp)
    scale = st.scale
    lsum = None
    if not np.any((scale > 0.0) & (scale < tiny)):
        if np.any(scale < tiny):  # only zero spreads (and empty groups): every sum is 0
            lsum = xp.zeros_like(mass)
    else:
        d = l - c
        lsum = segment_sum(d if w is None else w * xp.where(on, d, xp.zeros_like(d)), seg, xp)
    small = scale <= 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        huge = bool(np.any(present & np.isinf(hi - lo)))
    u = shifted_exponent(l, c, t, w, xp, huge)
    n_small = int(np.sum(small))
    q = None
    if n_small == small.size:
        e1 = apply_inplace(xp.expm1, u, xp)
        q = segment_sum(e1 if w is None else w * e1, seg, xp)
        s = mass + q
        e = e1 + 1.0 if sums is not None else None  # exp(u) >= exp(-1): no cancellation
    elif n_small == 0:
        e = apply_inplace(xp.exp, u, xp)
        s = None
    else:
        e1 = xp.expm1(u)
        q = segment_sum(e1 if w is None else w * e1, seg, xp)
        e = apply_inplace(xp.exp, u, xp)
        s = None
    del u
    pe = None
    if s is None or sums is not None:
        pe = e if w is None else w * e
    if s is None:
        s = segment_sum(pe, seg, xp)
    extra = tuple(sums(pe)) if sums is not None else ()
    return replace(st, mass=mass, s=s, q=q, lsum=lsum, sums=extra)


# ---------------------------------------------------------------------------------------
# the rule for arrays of states (no host reads): vectorised kernels and autograd


def series_threshold(dtype: Any, xp: Any) -> float:
    """``|t| (hi - lo)`` below which the cumulant series ``mean + t k2 / 2 + t^2 k3 / 6``
    is exact to rounding (its next term is ``(|t| spread)^3 spread / 24``).

    Examples
    --------
    >>> import numpy as np
    >>> round(series_threshold(np.float64, np), 7)
    1.75e-05
    """
    return float((24.0 * float(xp.finfo(dtype).eps)) ** (1.0 / 3.0))


def finish_risk(t: Any, c: Any, scale: Any, q: Any, s: Any, mean: Any, xp: Any, *,
                tiny: float, series: tuple | None = None) -> Any:
    """The tilted risk from normalised sums, chosen element by element on device.

    ``t`` (finite, non-zero placeholders where the caller substitutes its own limits),
    ``c`` the shift, ``scale = |t| (hi - lo)``, ``q = sum p expm1(u)`` and
    ``s = sum p exp(u)`` with a prior summing to one, ``mean`` the prior-weighted mean.
    ``series = (t_exact, k2, k3, near)`` switches on the cumulant series where ``near``
    (``|t_exact| (hi - lo)`` below :func:`series_threshold`; ``t_exact`` may be 0 and
    carries autograd), so that the derivative in ``t`` is right at and near zero.

    Examples
    --------
    >>> import numpy as np
    >>> l, t = np.array([0.0, 1.0]), 0.5
    >>> u = t * (l - 1.0)
    >>> r = finish_risk(t, 1.0, 0.5, np.mean(np.expm1(u)), np.mean(np.exp(u)), 0.5, np,
    ...                 tiny=1e-154)
    >>> bool(np.isclose(r, np.log(np.mean(np.exp(t * l))) / t))
    True
    """
    small = scale <= 1
    logz = xp.where(small, xp.log1p(xp.where(small, q, xp.zeros_like(q))),
                    xp.log(xp.where(small, xp.ones_like(s), s)))
    r = _add_scaled(c, logz, t, xp)
    r = xp.where(scale < tiny, mean + xp.zeros_like(r), r)
    if series is not None:
        t_exact, k2, k3, near = series
        r_series = mean + t_exact * (k2 * 0.5 + t_exact * (k3 / 6.0))
        r = xp.where(near, r_series, r)
    return r


def risk_of_exponents(u: Any, p: Any, c: Any, scale: Any, mean: Any, t: Any, xp: Any, *,
                      tiny: float, series: tuple | None = None) -> Any:
    """The tilted risk along the last axis from the shifted exponents ``u = t (l - c)``
    (``<= 0``) and a normalised prior ``p`` (None: uniform): the two normalisers of
    :func:`finish_risk`, formed in one place.

    Examples
    --------
    >>> import numpy as np
    >>> l, t = np.array([0.0, 1.0]), 2.0
    >>> r = risk_of_exponents(t * (l - 1.0), None, 1.0, 2.0, 0.5, t, np, tiny=1e-154)
    >>> bool(np.isclose(r, np.log(np.mean(np.exp(t * l))) / t))
    True
    """

    def wmean(a):
        return xp.mean(a, axis=-1) if p is None else xp.sum(p * a, axis=-1)

    q = wmean(xp.expm1(u))
    z = wmean(xp.exp(u))
    return finish_risk(t, c, scale, q, z, mean, xp, tiny=tiny, series=series)



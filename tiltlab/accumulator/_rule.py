"""The tilted reduction's rule: the state, its merge and its finalisation (the states of
blocks are built in :mod:`._blocks`; see :mod:`tiltlab.accumulator`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._compat import device, tiny_sqrt
from ..segments import Segments
from ._block_state import _group_block, _sample_block, shifted_exponent
from ._support import (
    _add_scaled,
    _cast,
    _col,
    _dev,
    _host,
    _ns,
    _scaled_gap,
    _select,
    spread_overflows,
)
from .packed import exponent_terms, log_normaliser, moved_sums

__all__ = [
    "TiltState",
    "GroupState",
    "needed_sums",
    "shifted_exponent",
]


# ---------------------------------------------------------------------------------------
# the state


@dataclass(frozen=True)
class TiltState:
    """Tilted log-sum-exp state of a set of samples (or of ``G`` groups) for one tilt.

    Build it with :meth:`from_block`, combine with :meth:`merge`, read it with
    :meth:`risk` and :meth:`normalized_sums` (or :meth:`finalize` for both).

    :meth:`empty` is the state of no samples, the identity of the merge.

    Attributes
    ----------
    t : float
        The tilt: ``0`` gives the prior-weighted mean, ``+inf`` (``-inf``) the largest
        (smallest) loss, whose weights are the prior restricted to the tied extremes.
    hi, lo : float or ndarray
        Largest and smallest loss over the support (host values; per group for a
        group state, ``-inf``/``+inf`` for groups without samples).
    mass : array
        Sum of the prior weights (the sample count for uniform priors).
    s : array
        ``sum p_i exp(t (l_i - c))`` with ``c = shift`` (at ``t = +-inf``: the prior mass of
        the losses equal to the shift).
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
            The tilt (``+-inf`` included: the limit, see the class).
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
            :meth:`empty` for a block without samples or without prior mass.

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

    @classmethod
    def empty(
        cls,
        t: float,
        *,
        n_groups: int | None = None,
        xp: Any = None,
        dtype: Any = None,
        device: Any = None,
    ) -> TiltState:
        """The state of no samples: the identity of :meth:`merge`.

        ``merge(empty, s)`` and ``merge(s, empty)`` are ``s``; its extremes are
        ``-inf``/``+inf``, its mass and normaliser 0 and its risk NaN. With ``n_groups``
        it is a :class:`GroupState` with that many groups, none of which has samples.
        ``xp``, ``dtype`` and ``device`` place its zero mass and normaliser (default:
        NumPy float64).

        Examples
        --------
        >>> import numpy as np
        >>> e = TiltState.empty(2.0)
        >>> st = TiltState.from_block(np.array([1.0, 3.0]), 2.0)
        >>> float(e.merge(st).risk()) == float(st.risk()), e.is_empty
        (True, True)
        """
        t = float(t)
        if math.isnan(t):
            raise ValueError("`t` must not be NaN")
        xp = np if xp is None else xp
        dtype = xp.float64 if dtype is None else dtype
        if n_groups is None:
            zero = xp.asarray(0.0, dtype=dtype, device=device)
            return cls(
                t=t, hi=-math.inf, lo=math.inf, mass=zero, s=zero, q=None, lsum=None, sums=()
            )
        zeros = xp.zeros((int(n_groups),), dtype=dtype, device=device)
        hi, lo = np.full(int(n_groups), -np.inf), np.full(int(n_groups), np.inf)
        return GroupState(t=t, hi=hi, lo=lo, mass=zeros, s=zeros, q=None, lsum=None, sums=())

    # -- views ---------------------------------------------------------------------

    @property
    def is_groups(self) -> bool:
        """Whether this state holds one entry per group (its extremes are arrays)."""
        return isinstance(self.hi, np.ndarray)

    @property
    def is_empty(self) -> bool:
        """Whether the state holds no sample (no group with samples, for a group state)."""
        return not bool(np.any(self.present))

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
        if a.is_groups != b.is_groups or np.shape(a.hi) != np.shape(b.hi):
            raise ValueError(
                "cannot merge states of two layouts (samples, or another number of groups)"
            )
        # the identity: an empty state carries no sums, and its -inf shift must not reach
        # the arithmetic below (-inf * 0)
        if b.is_empty:
            return a
        if a.is_empty:
            return b
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
        with_q = a.q is not None and b.q is not None and (groups or merged.scale <= 1.0)
        with_lsum = a.lsum is not None and b.lsum is not None
        # a spread beyond the float maximum: the shift differences are taken in halves
        halved = with_lsum and spread_overflows(hi, lo, like.dtype, _ns(like))
        plain = with_lsum and not halved
        ema_d, emb_d = (_dev(ema, like), _dev(emb, like)) if with_q else (None, None)
        da_d, db_d = (_dev(da, like), _dev(db, like)) if plain else (None, None)
        qa, qb = (a.q, b.q) if with_q else (None, None)
        la, lb = (a.lsum, b.lsum) if plain else (None, None)
        sa, qa, la = moved_sums(ra_d, ema_d, da_d, a.mass, a.s, qa, la)
        sb, qb, lb = moved_sums(rb_d, emb_d, db_d, b.mass, b.s, qb, lb)
        if halved:
            la, lb = _moved_lsum_halved(a, c, like), _moved_lsum_halved(b, c, like)
        s = sa + sb
        q = qa + qb if with_q else None
        lsum = la + lb if with_lsum else None
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
        if not self.is_groups and self.is_empty:
            return _cast(xp.asarray(math.nan, dtype=self.s.dtype, device=device(self.s)), xp, dtype)
        c = _dev(self.shift, self.s)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if math.isinf(self.t):  # the extreme itself (NaN for empty groups: 0 * (0/0))
                return _cast(c + 0.0 * (self.s / self.mass), xp, dtype)
            if self.t == 0.0:
                return _cast(c + self.lsum / self.mass, xp, dtype)
            scale = self.scale
            tiny = tiny_sqrt(dtype, xp)
            if not self.is_groups:
                if scale < tiny and self.lsum is not None:
                    r = c + self.lsum / self.mass
                else:
                    near = self.q is not None
                    q = self.q / self.mass if near else None
                    logz = log_normaliser(q, None if near else self.s / self.mass, near, xp)
                    r = _add_scaled(c, logz, self.t, xp)
                return _cast(r, xp, dtype)
            r = _add_scaled(c, log_normaliser(None, self.s / self.mass, False, xp), self.t, xp)
            if self.q is not None and np.any(scale <= 1.0):
                logz = log_normaliser(self.q / self.mass, None, True, xp)
                r_q = _add_scaled(c, logz, self.t, xp)
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

        return replace(
            self,
            mass=h(self.mass),
            s=h(self.s),
            q=h(self.q),
            lsum=h(self.lsum),
            sums=tuple(h(v) for v in self.sums),
        )


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
        with_q, with_lsum = self.q is not None and out.scale <= 1.0, self.lsum is not None
        halved = with_lsum and spread_overflows(hi, lo, like.dtype, xp)
        moved = _moved(self, r_d, em, d, like, with_q, with_lsum and not halved)
        if halved:  # a spread beyond the float maximum: the shift differences in halves
            moved = (moved[0], moved[1], _moved_lsum_halved(self, out.shift, like))
        s, q, lsum = (None if x is None else xp.sum(x, axis=-1) for x in moved)
        mass = xp.sum(self.mass, axis=-1)
        # a sum, not a BLAS product: a threaded BLAS would wake its pool at every merge of
        # the compiled kernels' chunks, and its spinning threads would hold a core
        sums = tuple(
            xp.sum(xp.reshape(r_d, (-1,) + (1,) * (v.ndim - 1)) * v, axis=0) for v in self.sums
        )
        return replace(out, mass=mass, s=s, q=q, lsum=lsum, sums=sums)


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


def _moved(
    st: TiltState, r_d: Any, em: Any, d: Any, like: Any, with_q: bool, with_lsum: bool
) -> tuple[Any, Any, Any]:
    """``(s, q, lsum)`` of ``st`` moved by the factors of :func:`_rescale` (``r_d`` already
    an operand for ``like``); ``q``, ``lsum`` None where not kept."""
    return moved_sums(
        r_d,
        _dev(em, like) if with_q else None,
        _dev(d, like) if with_lsum else None,
        st.mass,
        st.s,
        st.q if with_q else None,
        st.lsum if with_lsum else None,
    )


def _moved_lsum_halved(st: TiltState, c: Any, like: Any) -> Any:
    """``lsum + mass (shift - c)`` of ``st`` (per group for a group state) formed in
    halves, for a merged spread that overflows the dtype of ``like``: ``shift - c`` may
    overflow where the moved sum does not (doubling the halved sum is exact)."""
    shift = st.shift
    if st.is_groups:
        with np.errstate(invalid="ignore"):
            gap = np.where(st.present, shift * 0.5 - c * 0.5, 0.0)
    else:
        gap = shift * 0.5 - c * 0.5
    with np.errstate(over="ignore"):  # beyond the float maximum: inf, as unhalved
        return (st.lsum * 0.5 + st.mass * _dev(gap, like)) * 2.0


def _rescale(t: float, st: TiltState, c: Any) -> tuple[Any, Any, Any]:
    """Host factors moving ``st`` to the shift ``c``: ``exp(u)``, ``expm1(u)`` and the shift
    difference, with ``u = t (st.shift - c) <= 0`` (zero for empty groups). At ``t = +-inf``
    the factor is 1 for a state whose shift is the extreme and 0 otherwise (its limit)."""
    shift = st.shift
    if not st.is_groups:
        if math.isinf(t):
            f = 1.0 if shift == c else 0.0
            return f, f - 1.0, shift - c
        f, fm = exponent_terms(_scaled_gap(t, shift, c), math, squares=False)
        return f, fm, shift - c
    on = st.present
    if math.isinf(t):
        f = np.where(on & (shift == c), 1.0, 0.0)
        with np.errstate(invalid="ignore"):
            return f, f - 1.0, np.where(on, shift - c, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.where(on, _scaled_gap(t, shift, c), 0.0)
        d = np.where(on, shift - c, 0.0)
    f, fm = exponent_terms(u, np, squares=False)
    return np.where(on, f, 0.0), np.where(on, fm, 0.0), d

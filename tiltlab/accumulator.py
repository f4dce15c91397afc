"""The tilted accumulator: a streaming, exactly mergeable log-sum-exp state.

For one finite, non-zero tilt ``t`` a block of samples with losses ``l_i`` and prior
weights ``p_i`` is summarised by

* ``hi``, ``lo``: the largest and smallest loss over the block's support (``p_i > 0``),
  and the *shift* ``c`` (``hi`` for ``t > 0``, ``lo`` for ``t < 0``), so that every
  ``u_i = t (l_i - c)`` is ``<= 0`` and no exponential overflows;
* ``mass = sum p_i`` and ``s = sum p_i exp(u_i)``;
* ``q = sum p_i expm1(u_i)``, kept while ``|t| (hi - lo) <= 1``: near ``t = 0`` the risk
  ``c + log1p(q / mass) / t`` keeps full relative precision where ``log(s) / t`` would
  amplify the rounding of ``s`` by ``1 / |t|``;
* ``lsum = sum p_i (l_i - c)``, kept while ``|t| (hi - lo)`` is below the square root of the
  smallest normal number (there the risk is the mean to rounding);
* any number of *sums* ``sum_i p_i exp(u_i) v_i`` of per-sample arrays ``v_i`` (the pieces
  of a gradient or a Hessian-vector product), which are rescaled exactly like ``s``.

Two states merge exactly: the state with the smaller shift is rescaled by
``r = exp(t (c_small - c_big)) <= 1`` (the online-normaliser idea), and ``q`` by
``mass expm1(t (c_small - c_big)) + q r``, a sum of terms of one sign, so no cancellation
creeps in however the samples are split into blocks. The merge is associative up to
rounding, which makes the state the reduction of a one-pass objective, of a tree reduction
over chunks (Dask) and of a GPU kernel's per-block partials.

Shifts, extremes and the regime flags live on the host (Python floats): a block costs one
device synchronisation, in which its extremes are read and checked for NaN and infinity.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ._compat import apply_inplace, device, is_cupy_namespace, tiny_sqrt, to_numpy

__all__ = [
    "NonFiniteLosses",
    "TiltState",
    "block_state",
    "merge",
    "merge_all",
    "finalize_risk",
    "normalized_sums",
]


class NonFiniteLosses(ValueError):
    """Raised by :func:`block_state` when a block holds NaN or infinite losses."""


@dataclass(frozen=True)
class TiltState:
    """Tilted log-sum-exp state of a set of samples for one finite non-zero tilt.

    Attributes
    ----------
    t : float
        The tilt (finite, non-zero).
    hi, lo : float
        Largest and smallest loss over the support.
    mass : array (0-d)
        Sum of the prior weights (the sample count for uniform priors).
    s : array (0-d)
        ``sum p_i exp(t (l_i - c))`` with ``c = shift``.
    q : array (0-d) or None
        ``sum p_i expm1(t (l_i - c))`` while ``|t| (hi - lo) <= 1``, else None.
    lsum : array (0-d) or None
        ``sum p_i (l_i - shift)`` while ``|t| (hi - lo)`` is below ``sqrt(tiny)``, else
        None (relative to the shift, so that losses near the float maximum cannot
        overflow it).
    sums : tuple of arrays
        ``sum p_i exp(t (l_i - c)) v_i`` for the per-sample arrays requested.
    """

    t: float
    hi: float
    lo: float
    mass: Any
    s: Any
    q: Any
    lsum: Any
    sums: tuple

    @property
    def shift(self) -> float:
        """The loss the exponentials are taken relative to (max for t > 0, min for t < 0)."""
        return self.hi if self.t > 0 else self.lo

    @property
    def spread(self) -> float:
        return self.hi - self.lo


def _extremes(l: Any, p: Any, xp: Any) -> tuple[float, float]:
    """(max, min) of ``l`` over the support of ``p``, read in one synchronisation."""
    if p is None and is_cupy_namespace(xp):
        from . import _cupy_kernels

        return _cupy_kernels.extremes(l)
    if p is None:
        both = xp.stack([xp.max(l), -xp.min(l)])
    else:
        on = p > 0
        ninf = xp.asarray(-math.inf, dtype=l.dtype, device=device(l))
        both = xp.stack([xp.max(xp.where(on, l, ninf)), xp.max(xp.where(on, -l, ninf))])
    hi, mlo = (float(v) for v in to_numpy(both))
    return hi, -mlo


def block_state(
    l: Any,
    p: Any,
    t: float,
    xp: Any,
    *,
    sums: Callable[[Any], tuple] | None = None,
    tiny: float | None = None,
    extremes: tuple[float, float] | None = None,
) -> TiltState:
    """The state of one block of samples (1-d losses ``l``; prior ``p`` or None).

    ``p=None`` means unit weights (``mass`` is then the sample count); normalisation
    happens once, in :func:`finalize_risk` and :func:`normalized_sums`. ``sums`` maps the
    block's unnormalised weights ``p_i exp(u_i)`` to a tuple of weighted sums.
    ``extremes`` passes ``(hi, lo)`` already read for these losses (a grid of tilts).

    Raises ``ValueError`` (naming ``losses``) when the block holds NaN or infinite losses
    on its support.
    """
    t = float(t)
    hi, lo = _extremes(l, p, xp) if extremes is None else extremes
    if not (math.isfinite(hi) and math.isfinite(lo)):
        raise NonFiniteLosses(
            "`losses` contains NaN or infinite values; pass finite values (or "
            "check_finite=False to skip this check)"
        )
    if tiny is None:
        tiny = tiny_sqrt(l.dtype, xp)
    spread = hi - lo
    c = hi if t > 0 else lo
    u = l - c
    if p is not None:
        # zero-weight samples may lie outside [lo, hi]: keep their exponent at zero
        u = xp.where(p > 0, u, xp.zeros_like(u))
    u *= t  # a fresh array: scale in place
    scale = abs(t) * spread
    mass = _mass(l, p, xp)
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
    return TiltState(t=t, hi=hi, lo=lo, mass=mass, s=s, q=q, lsum=lsum, sums=extra)


def _mass(l: Any, p: Any, xp: Any) -> Any:
    if p is None:
        return xp.asarray(float(l.shape[0]), dtype=l.dtype, device=device(l))
    return xp.sum(p)


def merge(a: TiltState, b: TiltState, *, tiny: float | None = None) -> TiltState:
    """Merge two states of the same tilt (exact up to rounding; associative)."""
    if a.t != b.t:
        raise ValueError(f"cannot merge states of two tilts ({a.t} and {b.t})")
    t = a.t
    hi, lo = max(a.hi, b.hi), min(a.lo, b.lo)
    c = hi if t > 0 else lo
    ua, ub = t * (a.shift - c), t * (b.shift - c)  # both <= 0
    ra, rb = math.exp(ua), math.exp(ub)
    s = a.s * ra + b.s * rb
    q = None
    if abs(t) * (hi - lo) <= 1.0 and a.q is not None and b.q is not None:
        q = a.mass * math.expm1(ua) + a.q * ra + b.mass * math.expm1(ub) + b.q * rb
    lsum = None
    if a.lsum is not None and b.lsum is not None:
        lsum = a.lsum + a.mass * (a.shift - c) + b.lsum + b.mass * (b.shift - c)
    sums = tuple(x * ra + y * rb for x, y in zip(a.sums, b.sums, strict=True))
    return TiltState(t=t, hi=hi, lo=lo, mass=a.mass + b.mass, s=s, q=q, lsum=lsum, sums=sums)


def merge_all(states: list[TiltState]) -> TiltState:
    """Merge a list of states pairwise (a balanced tree, as a cluster would)."""
    if not states:
        raise ValueError("no states to merge")
    while len(states) > 1:
        nxt = [merge(states[i], states[i + 1]) for i in range(0, len(states) - 1, 2)]
        if len(states) % 2:
            nxt.append(states[-1])
        states = nxt
    return states[0]


def finalize_risk(state: TiltState, xp: Any, dtype: Any) -> Any:
    """The tilted risk of the merged samples (a 0-d array of ``dtype``)."""
    t = state.t
    scale = abs(t) * state.spread
    if scale < tiny_sqrt(dtype, xp) and state.lsum is not None:
        return state.shift + state.lsum / state.mass
    if state.q is not None:
        return state.shift + xp.log1p(state.q / state.mass) / t
    return state.shift + xp.log(state.s / state.mass) / t


def normalized_sums(state: TiltState) -> tuple:
    """The requested sums divided by the normaliser: ``sum_i w_i v_i`` with tilted weights."""
    return tuple(x / state.s for x in state.sums)


def with_sums(state: TiltState, sums: tuple) -> TiltState:
    """A copy of ``state`` carrying other sums (for callers that post-process them)."""
    return replace(state, sums=tuple(sums))

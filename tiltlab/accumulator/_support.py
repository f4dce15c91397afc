"""Host-side helpers of the tilted reduction: extremes read in one synchronisation,
host/device operands, and spreads that may exceed the float maximum."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import device, namespace_of, to_numpy
from .._dispatch import Dispatch

__all__: list[str] = []

#: fast ``(max, min)`` of 1-d losses for array libraries that have one (CuPy registers)
EXTREMES = Dispatch("extremes")


class NonFiniteLosses(ValueError):
    """Raised by :func:`block_state` when a block holds NaN or infinite losses."""


def _host(a: Any) -> np.ndarray:
    return np.asarray(to_numpy(a))


def _half_diff(a: Any, b: Any) -> Any:
    """``(a - b) / 2`` without overflow for finite ``a``, ``b`` of any size."""
    return a * 0.5 - b * 0.5


def _scaled_gap(t: float, a: Any, b: Any) -> Any:
    """``t (a - b)`` for host values, finite even when ``a - b`` overflows."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        with np.errstate(over="ignore", invalid="ignore"):
            return (t * _half_diff(a, b)) * 2.0
    d = a - b
    if math.isinf(d):
        return (t * _half_diff(a, b)) * 2.0
    return t * d


def spread_overflows(hi: Any, lo: Any, dtype: Any, xp: Any) -> bool:
    """Whether ``hi - lo`` (host extremes, floats or arrays of them) exceeds the float
    maximum of ``dtype``, the losses' own: then ``l - c`` overflows in that dtype and the
    shifted exponents are formed in halves. The spread is taken in float64, which holds
    that of float32 (or narrower) losses; empty groups (``hi < lo``) never overflow."""
    big = float(xp.finfo(dtype).max)
    if type(hi) is float and type(lo) is float:
        return hi - lo > big  # Python floats: an overflow is inf, without a warning
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.any(np.subtract(hi, lo, dtype=np.float64) > big))


def _select(cond: Any, a: Any, b: Any, like: Any) -> Any:
    """``a`` where ``cond`` else ``b``: a host bool picks, a host mask goes to the device."""
    if isinstance(cond, (bool, np.bool_)):
        return a if cond else b
    xp = _ns(like)
    return xp.where(_dev(cond, like), a, b)


def _ns(a: Any) -> Any:
    return np if isinstance(a, (np.ndarray, np.generic)) else namespace_of(a=a)


def _dev(x: Any, like: Any) -> Any:
    """A host value as an operand for arrays like ``like`` (Python floats pass through)."""
    if isinstance(x, (float, int, bool)):
        return x
    if isinstance(like, (np.ndarray, np.generic)):
        return x if x.dtype == bool else np.asarray(x, dtype=like.dtype)
    xp = _ns(like)
    if x.dtype == bool:
        return xp.asarray(x, device=device(like))
    return xp.asarray(x, dtype=like.dtype, device=device(like))


def _cast(r: Any, xp: Any, dtype: Any) -> Any:
    return r if r.dtype == dtype else xp.astype(r, dtype)


def _col(r: Any, like: Any, groups: bool) -> Any:
    """Per-group factors shaped to broadcast against a per-group sum (group axis first)."""
    if not groups or not hasattr(r, "shape"):
        return r
    extra = len(like.shape) - len(r.shape)
    if extra <= 0:
        return r
    return _ns(r).reshape(r, tuple(r.shape) + (1,) * extra)


def _extremes(l: Any, p: Any, xp: Any) -> tuple[float, float]:
    """(max, min) of ``l`` over the support of ``p``, read in one synchronisation."""
    if p is None:
        fast = EXTREMES.dispatch(xp)
        if fast is not None:
            return fast(l)
    if p is None:
        both = xp.stack([xp.max(l), -xp.min(l)])
    else:
        on = p > 0
        ninf = xp.asarray(-math.inf, dtype=l.dtype, device=device(l))
        both = xp.stack([xp.max(xp.where(on, l, ninf)), xp.max(xp.where(on, -l, ninf))])
    hi, mlo = (float(v) for v in to_numpy(both))
    return hi, -mlo


def _nonfinite() -> NonFiniteLosses:
    return NonFiniteLosses(
        "`losses` contains NaN or infinite values; pass finite values (or "
        "check_finite=False to skip this check)"
    )


def _add_scaled(c: Any, logz: Any, t: Any, xp: Any) -> Any:
    """``c + logz / t``; where ``logz / t`` overflows (a tiny tilt and a spread near the
    float maximum) but the risk, which lies between the extremes, does not, the sum is
    taken in halves (exact: scaling by 2 commutes with rounding)."""
    r = c + logz / t
    half = (c * 0.5 + (logz * 0.5) / t) * 2.0
    return xp.where(xp.isfinite(r), r, half)

"""Input preparation for tilted risks: losses, tilts and prior weights.

:func:`prepare_losses` (a floating array with the sample axis moved last),
:func:`prepare_tilt` (one tilt or a grid of them), :func:`prepare_prior` (normalised prior
weights) and :func:`prepare_tilts` (the per-level host tilts of a hierarchy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._compat import (
    array_result,
    as_float_array,
    as_parameter,
    check_finite,
    device,
    is_array_api_obj,
    real_number,
    to_numpy,
)

__all__ = ["prepare_losses", "prepare_tilt", "prepare_prior", "prepare_tilts"]


# ---------------------------------------------------------------------------
# input handling


def prepare_losses(losses: Any, xp: Any, check: bool) -> Any:
    arr = as_float_array(losses, xp, name="losses")
    if arr.ndim == 0:
        raise ValueError("`losses` must have at least one dimension (got a scalar)")
    if any(s == 0 for s in arr.shape):
        raise ValueError(f"`losses` must not be empty (shape {tuple(arr.shape)})")
    if check:
        check_finite(arr, xp, name="losses", skip="check_finite=False")
    return arr


def widen_half(l: Any, xp: Any) -> tuple[Any, Any]:
    """16-bit losses (float16, bfloat16) as float32, and the dtype to return (else None).

    Sums of many half-precision terms lose every digit (and NumPy cannot hold bfloat16),
    so risks and weights of such losses are accumulated in float32 and rounded once.
    """
    try:
        bits = xp.finfo(l.dtype).bits
    except (TypeError, ValueError):  # pragma: no cover - non-float dtypes were promoted
        return l, None
    if bits > 16:
        return l, None
    return xp.astype(l, xp.float32), l.dtype


def narrow(r: Any, dtype: Any, xp: Any) -> Any:
    """``r`` rounded to ``dtype`` (the losses' 16-bit dtype) when given; a NumPy scalar
    comes back as a 0-d array (the result of every public risk function goes through here)."""
    return array_result(r if dtype is None else xp.astype(r, dtype))


def prepare_tilt(t: Any, xp: Any, like: Any) -> tuple[Any, bool]:
    """Tilt(s) as an array of ``like``'s dtype/device; returns (t, is_grid).

    Tilts are parameters, not data: a Python number, a NumPy scalar or array, or an
    array of any other library is converted to ``like``'s namespace; only strings,
    booleans, complex values, NaN and more than one dimension are rejected.
    """
    tt = as_parameter(t, xp, like, name="t", allow_nan=False)
    return tt, tt.ndim == 1


def prepare_prior(weights: Any, l: Any, xp: Any, axis: int | None = None) -> Any:
    """Normalised prior weights broadcast to the shape of ``l`` (axis moved last).

    ``axis`` is the sample axis of the caller's ``losses`` before it was moved last:
    full-shape weights (of the losses' original shape) have their sample axis there
    too and are moved the same way. 1-d weights always index the samples.
    """
    if weights is None:
        return None
    p = as_float_array(weights, xp, name="weights", dev=device(l))
    if p.dtype != l.dtype:
        p = xp.astype(p, l.dtype)
    if p.ndim == 0:
        raise ValueError(
            "`weights` must be 1-d with one entry per sample or have the shape of `losses`; "
            "got a scalar"
        )
    if p.ndim == 1:
        if p.shape[0] != l.shape[-1]:
            raise ValueError(
                f"`weights` has length {p.shape[0]} but `losses` has {l.shape[-1]} samples "
                "along `axis`"
            )
    else:
        ax = l.ndim - 1 if axis is None else axis
        expected = list(l.shape[:-1])
        expected.insert(ax, l.shape[-1])
        if p.ndim != l.ndim or tuple(p.shape) != tuple(expected):
            raise ValueError(
                "`weights` must be 1-d with one entry per sample or have the shape of "
                f"`losses` {tuple(expected)}; got {tuple(p.shape)}"
            )
        if ax != l.ndim - 1:
            p = xp.moveaxis(p, ax, -1)
    check_finite(p, xp, name="weights")
    if not bool(xp.all(p >= 0)):
        raise ValueError("`weights` must be non-negative")
    with np.errstate(over="ignore"):  # a total that overflows is scaled down below
        total = xp.sum(p, axis=-1, keepdims=True)
        if not bool(xp.all((total > 0) & (total < xp.inf))):  # one read, as for zero alone
            if not bool(xp.all(total > 0)):
                raise ValueError("`weights` must not be all zero")
            p = _scaled_down(p, xp)  # finite weights whose total overflows
            total = xp.sum(p, axis=-1, keepdims=True)
    return p / total


def _scaled_down(p: Any, xp: Any) -> Any:
    """Finite non-negative weights ``p`` times a power of two (per row of the last axis)
    that brings their largest below 2, so that their total cannot overflow. Exact, and
    the normalised weights are those of ``p`` bit for bit (scaling by a power of two
    commutes with rounding) unless a scaled weight falls below the normal range, where
    its normalised weight lies too. Rows whose largest weight is below 2 are kept as they
    are. No host read."""
    largest = xp.max(p, axis=-1, keepdims=True)
    one = xp.ones_like(largest)
    e = xp.floor(xp.log2(xp.where(largest > 1, largest, one)))  # 0 where it is below 2
    return p * xp.pow(2 * one, -e)  # 2**-e >= 2**-1024: a subnormal at worst, exact


def prepare_tilts(tilts: Any, n_levels: int) -> list[float]:
    """``n_levels + 1`` host tilts (outermost first) from a sequence or 1-d array."""
    need = f"`tilts` must be a sequence of {n_levels + 1} real numbers (outermost first)"
    if isinstance(tilts, (str, bytes)) or tilts is None:
        raise TypeError(f"{need}, got {tilts!r}")
    if is_array_api_obj(tilts):
        arr = to_numpy(tilts)
        if arr.ndim != 1:
            raise ValueError(f"{need}, got an array of shape {arr.shape}")
        tilts = list(arr)
    if not isinstance(tilts, Sequence):
        raise TypeError(f"{need}, got {type(tilts).__name__}")
    if len(tilts) != n_levels + 1:
        raise ValueError(
            f"`tilts` must have {n_levels + 1} entries (one per grouping level plus the "
            f"sample level, outermost first), got {len(tilts)}"
        )
    return [real_number(v, f"tilts[{k}]") for k, v in enumerate(tilts)]

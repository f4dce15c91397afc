"""Validation of array contents: finite values, non-negative prior weights."""

from __future__ import annotations

from typing import Any


def _all_true(cond: Any) -> bool:
    """Evaluate a 0-d boolean array eagerly (computes Dask graphs)."""
    return bool(cond)


def check_finite(x: Any, xp: Any, *, name: str, skip: str | None = None) -> None:
    """Raise ``ValueError`` naming ``name`` if ``x`` holds NaN or infinity.

    ``skip`` names the caller's argument that turns the check off (for instance
    ``"check_finite=False"``); the message suggests it only when it is given, so that
    the advice is always one the caller accepts.
    """
    if not _all_true(xp.all(xp.isfinite(x))):
        nan = _all_true(xp.any(xp.isnan(x)))
        what = "NaN" if nan else "infinite"
        hint = f" (or {skip} to skip this check)" if skip else ""
        raise ValueError(f"`{name}` contains {what} values; pass finite values{hint}")


def check_nonneg_weights(p: Any, xp: Any, *, name: str, axis: int = -1) -> None:
    """Prior weights must be finite, non-negative and not all zero along ``axis``."""
    check_finite(p, xp, name=name)
    if not _all_true(xp.all(p >= 0)):
        raise ValueError(f"`{name}` must be non-negative")
    if not _all_true(xp.all(xp.sum(p, axis=axis) > 0)):
        raise ValueError(f"`{name}` must not be all zero")

"""The argument checks of the minibatch estimators (host side, eager).

:class:`~tiltlab.minibatch.MinibatchTilt` and :class:`tiltlab.torch.TiltedLoss` take the
same arguments (tilts or schedules of them, ``lam``, the estimator, an ``ess`` fraction)
and check them here, so that both raise the same errors, naming the argument.

Examples
--------
>>> from tiltlab.minibatch.checks import check_lam, resolve
>>> check_lam(0.5), resolve(lambda step: 0.1 * step, 3, "t")
(0.5, 0.30000000000000004)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from .._compat import as_array, device, is_array_api_obj, namespace_of

__all__ = [
    "ESTIMATORS",
    "check_tilt_spec",
    "tilt_value",
    "check_lam",
    "check_positive_int",
    "check_estimator",
    "check_losses",
    "check_groups",
    "resolve",
    "check_ess",
    "check_mlmc_data_size",
]

#: the estimators of the minibatch losses
ESTIMATORS = ("running", "mlmc", "variational")


def check_tilt_spec(value: Any, name: str) -> Any:
    """A tilt is a real number (+-inf allowed) or a callable of the step."""
    if callable(value):
        return value
    return tilt_value(value, name)


def tilt_value(value: Any, name: str) -> float:
    """A real number (not a bool, not NaN) as a Python float."""
    if type(value) is float and value == value:  # the common case, checked first
        return value
    if is_array_api_obj(value) and getattr(value, "ndim", None) == 0:
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"`{name}` must be a real number or a callable of the step, got {type(value).__name__}"
        )
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"`{name}` must not be NaN")
    return value


def check_lam(lam: Any) -> float:
    """The memory ``lam`` of the running estimator: a real number in ``(0, 1]``."""
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real):
        raise TypeError(f"`lam` must be a real number in (0, 1], got {type(lam).__name__}")
    if not 0.0 < float(lam) <= 1.0:
        raise ValueError(f"`lam` must lie in (0, 1], got {lam!r}")
    return float(lam)


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """An integer (not a bool) of at least ``minimum``; the errors name ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"`{name}` must be at least {minimum}, got {value!r}")
    return int(value)


def check_estimator(estimator: Any) -> str:
    """One of :data:`ESTIMATORS`."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"`estimator` must be one of {ESTIMATORS}, got {estimator!r}")
    return estimator


def check_losses(losses: Any, check_finite: bool) -> tuple[Any, Any]:
    """``(xp, losses)``: a one-dimensional, non-empty, real array of losses."""
    if not is_array_api_obj(losses):
        raise TypeError(
            f"`losses` must be an array (NumPy, CuPy, PyTorch, ...), got {type(losses).__name__}"
        )
    xp = namespace_of(losses=losses)
    if losses.ndim != 1:
        raise ValueError(
            f"`losses` must be one-dimensional (one loss per sample), got shape "
            f"{tuple(losses.shape)}; use reduction='none' in the criterion"
        )
    if losses.shape[0] == 0:
        raise ValueError("`losses` is empty")
    if not xp.isdtype(losses.dtype, "real floating"):
        raise TypeError(f"`losses` must hold real floating values, got {losses.dtype}")
    if check_finite and not bool(xp.all(xp.isfinite(losses))):
        what = "NaN" if bool(xp.any(xp.isnan(losses))) else "infinite"
        raise ValueError(f"`losses` contains {what} values; every loss must be finite")
    return xp, losses


def check_groups(groups: Any, n: int, n_groups: int, xp: Any, like: Any) -> Any:
    """Integer labels in ``[0, n_groups)``, one per loss, as an array of ``xp``."""
    if groups is None:
        raise ValueError("`groups` is required with `tilts` (one label per loss)")
    if is_array_api_obj(groups):
        g = as_array(groups, xp, name="groups")
    else:
        host = np.asarray(groups)
        if host.dtype.kind not in "iu":
            raise TypeError(f"`groups` must hold integer labels, got dtype {host.dtype}")
        g = xp.asarray(host, device=device(like))
    if g.ndim != 1 or g.shape[0] != n:
        raise ValueError(
            f"`groups` must have one label per loss (shape ({n},)), got shape {tuple(g.shape)}"
        )
    if not xp.isdtype(g.dtype, "integral"):
        raise TypeError(f"`groups` must hold integer labels, got dtype {g.dtype}")
    if device(g) != device(like):
        raise ValueError("`groups` and `losses` live on different devices")
    if not bool(xp.all((g >= 0) & (g < n_groups))):
        raise ValueError(f"`groups` labels must lie in [0, n_groups) = [0, {n_groups})")
    return g


def resolve(spec: Any, step: int, name: str) -> float:
    """The tilt of this step: the number itself, or the schedule's value at ``step``."""
    if isinstance(spec, Callable):  # type: ignore[arg-type]
        return tilt_value(spec(step), f"{name}(step={step})")
    return spec


def check_ess(value: Any) -> Any:
    """An effective-sample-size fraction in (0, 1], or a schedule (a callable)."""
    if callable(value):
        return value
    value = tilt_value(value, "ess")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"`ess` must lie in (0, 1], got {value!r}")
    return value


def check_mlmc_data_size(n_samples: int, base_batch_size: int, max_level: int) -> None:
    """``n_samples`` of the multilevel estimator must exceed its largest batch.

    A batch of ``n_samples`` losses gets the exact full-data weights. Were the largest
    batch, ``base_batch_size * 2**max_level``, the whole data set, the batches of the
    largest level would get those instead of their level correction, and the estimator's
    mean would no longer be the plug-in at the largest batch; were it larger, that level
    could not be drawn at all.
    """
    largest = base_batch_size * 2**max_level
    if n_samples <= largest:
        raise ValueError(
            f"`n_samples` = {n_samples} must exceed the largest batch, `base_batch_size` * "
            f"2**`max_level` = {largest}: a batch of `n_samples` gets the exact weights, not "
            "the level correction the estimator's mean needs (when the largest batch is the "
            "whole data set, leave `n_samples` out: the mean is then the full-data plug-in)"
        )

"""Argument parsing: user input (arrays of any library, Python numbers and sequences) as
arrays of one namespace, and parameters (tilts, thresholds, penalties) as numbers."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .namespaces import (
    _backend_name,
    _device,
    array_namespace,
    default_float,
    float_dtype,
    is_array_api_obj,
    to_device,
    to_numpy,
)
from .validation import _all_true


def as_array(x: Any, xp: Any, *, name: str, dtype: Any = None, dev: Any = None) -> Any:
    """Convert ``x`` (an array of ``xp``, or a Python scalar/sequence) to an ``xp`` array."""
    if is_array_api_obj(x):
        if array_namespace(x) is not xp:
            raise TypeError(
                f"`{name}` comes from a different array library ({_backend_name(x)}) than "
                "the other inputs; convert it first"
            )
        if dtype is not None and x.dtype != dtype:
            x = xp.astype(x, dtype)
        return x
    _reject_non_numeric(x, name)
    try:
        if dev is None:
            return xp.asarray(x, dtype=dtype)
        return xp.asarray(x, dtype=dtype, device=dev)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` could not be converted to an array: {exc}") from exc


def _reject_non_numeric(x: Any, name: str) -> None:
    """Python input that NumPy would read as text or objects is not numeric data.

    ``np.asarray(["1", "2"]).astype(float)`` quietly parses strings; tiltlab refuses
    them (and ``None`` entries) with a ``TypeError`` naming the argument.
    """
    if isinstance(x, (str, bytes)):
        raise TypeError(f"`{name}` must be numeric, got the string {x!r}")
    if isinstance(x, (list, tuple)):
        try:
            kind = np.asarray(x).dtype.kind
        except (TypeError, ValueError, RuntimeError):
            return  # ragged or exotic: the namespace's asarray reports it
        if kind in "USO":
            what = {"U": "strings", "S": "bytes", "O": "non-numeric entries"}[kind]
            raise TypeError(f"`{name}` must be numeric, got {what}")


def as_float_array(x: Any, xp: Any, *, name: str, dev: Any = None) -> Any:
    """``x`` as a floating array of ``xp`` (integers and booleans promoted)."""
    if not is_array_api_obj(x):
        x = as_array(x, xp, name=name, dev=dev)
        if not (xp.isdtype(x.dtype, "real floating")):
            if xp.isdtype(x.dtype, "complex floating"):
                raise TypeError(f"`{name}`: complex values are not supported")
            x = xp.astype(x, default_float(xp, _device(x)))
        return x
    else:
        x = as_array(x, xp, name=name)
    try:
        dt = float_dtype(x, xp)
    except TypeError as exc:
        raise TypeError(f"`{name}`: {exc}") from None
    if x.dtype != dt:
        x = xp.astype(x, dt)
    return x


def scalar(value: float, like: Any, xp: Any) -> Any:
    """A 0-d array holding ``value`` with the dtype and device of ``like``."""
    return xp.asarray(value, dtype=like.dtype, device=_device(like))


def normalize_axis(axis: int, ndim: int, *, name: str = "axis") -> int:
    """Normalise a possibly negative axis, raising a clear error when out of range."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"`{name}` must be an integer, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"`{name}`={axis} is out of range for an array of {ndim} dimension(s)")
    return int(axis) % ndim


def seq_of_arrays(x: Any) -> bool:
    """True if ``x`` is a (non-array) sequence whose items are arrays or sequences."""
    if is_array_api_obj(x) or isinstance(x, (str, bytes)):
        return False
    if not isinstance(x, Sequence):
        return False
    return len(x) > 0 and all(
        is_array_api_obj(e) or (isinstance(e, Sequence) and not isinstance(e, (str, bytes)))
        for e in x
    )


# ---------------------------------------------------------------------------
# parameters (tilts, thresholds, penalties): numbers from any library


def _reject_text(value: Any, name: str, what: str) -> None:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"`{name}` must be {what}, got the string {value!r}")
    if isinstance(value, bool) or value is None:
        raise TypeError(f"`{name}` must be {what}, got {value!r}")


def host_real(value: Any, name: str, what: str) -> np.ndarray:
    """``value`` (a number, a sequence of numbers, or an array of any library) on the host.

    Only real numbers pass: strings (also inside sequences), booleans, ``None``, complex
    and object values raise ``TypeError`` naming ``name``.
    """
    _reject_text(value, name, what)
    try:
        arr = to_numpy(value) if is_array_api_obj(value) else np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"`{name}` must be {what}: {exc}") from None
    if arr.dtype.kind not in "iuf":
        kind = {"U": "strings", "S": "bytes", "b": "booleans", "c": "complex values"}.get(
            arr.dtype.kind, f"values of dtype {arr.dtype}"
        )
        raise TypeError(f"`{name}` must be {what}, got {kind}")
    return arr


def real_number(value: Any, name: str) -> float:
    """A real number (Python, NumPy or a size-one array of any library) as a float.

    Strings, booleans, ``None`` and complex values raise ``TypeError`` naming ``name``;
    ``inf`` passes and NaN raises ``ValueError`` (callers add their own range checks).

    Examples
    --------
    >>> real_number(2, "t"), real_number(np.float32(0.5), "t")
    (2.0, 0.5)
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
    else:
        arr = host_real(value, name, "a real number")
        if arr.size != 1 or arr.ndim > 1:
            raise TypeError(f"`{name}` must be a real number, got an array of shape {arr.shape}")
        v = float(arr.reshape(()))
    if math.isnan(v):
        raise ValueError(f"`{name}` must not be NaN")
    return v


def as_parameter(value: Any, xp: Any, like: Any, *, name: str, allow_nan: bool = True) -> Any:
    """A scalar or 1-d parameter (tilts, thresholds) in the dtype/device of ``like``.

    Parameters are not data: a NumPy scalar or array, a Python number or list, or an
    array of any other supported library is converted to ``xp``. Arrays already of
    ``xp`` are kept as they are (only cast and moved), so autograd through them works.
    Strings, booleans, ``None`` and complex values raise ``TypeError``; more than one
    dimension or an empty array raises ``ValueError``, and so does NaN unless
    ``allow_nan``. Host values are checked on the host, so only a parameter that is
    already an array of ``xp`` costs a device synchronisation.
    """
    what = "a real number or a 1-d array of real numbers"
    dev = _device(like)
    same = False
    if is_array_api_obj(value):
        try:
            same = array_namespace(value) is xp
        except TypeError:
            same = False
    if same:
        if not xp.isdtype(value.dtype, ("real floating", "integral")):
            raise TypeError(f"`{name}` must be {what}, got dtype {value.dtype}")
        arr = value if value.dtype == like.dtype else xp.astype(value, like.dtype)
        if _device(arr) != dev:
            arr = to_device(arr, dev)
        if not allow_nan and _all_true(xp.any(xp.isnan(arr))):
            raise ValueError(f"`{name}` must not be NaN")
    else:
        host = host_real(value, name, what).astype(np.float64)
        if not allow_nan and np.any(np.isnan(host)):
            raise ValueError(f"`{name}` must not be NaN")
        arr = xp.asarray(host, dtype=like.dtype, device=dev)
    if arr.ndim > 1:
        raise ValueError(f"`{name}` must be a scalar or a 1-d array, got shape {tuple(arr.shape)}")
    if arr.ndim == 1 and arr.shape[0] == 0:
        raise ValueError(f"`{name}` must not be an empty array")
    return arr


def host_labels(labels: Any, *, name: str) -> np.ndarray:
    """Group labels on the host, rejecting ``None``, NaN and unsortable labels."""
    if labels is None:
        raise TypeError(f"`{name}` must be an array of labels, got None")
    a = to_numpy(labels) if is_array_api_obj(labels) else np.asarray(labels)
    if a.dtype.kind == "O":
        flat = a.reshape(-1)
        if any(v is None for v in flat):
            raise ValueError(f"`{name}` contains None labels; give every sample a label")
        try:
            np.unique(flat)
        except TypeError as exc:
            raise TypeError(f"`{name}` labels must be mutually sortable: {exc}") from None
        if any(isinstance(v, float) and math.isnan(v) for v in flat):
            raise ValueError(f"`{name}` contains NaN labels")
    elif a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        raise ValueError(f"`{name}` contains NaN or infinite labels")
    elif a.dtype.kind == "c":
        raise TypeError(f"`{name}`: complex labels are not supported")
    return a

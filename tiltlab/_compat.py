"""The one place that talks to array-api-compat.

Every public function of tiltlab resolves its array namespace, device and
floating dtype through the helpers here, so that NumPy, CuPy, PyTorch,
array-api-strict and Dask inputs are handled in one way and a result always
lives in the namespace, dtype and device of its input.
"""

from __future__ import annotations

import importlib
import math
import numbers
import types
from collections.abc import Sequence
from typing import Any

import array_api_compat
import numpy as np
from array_api_compat import device as _device
from array_api_compat import (
    is_array_api_obj,
    is_cupy_namespace,
    is_dask_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
)
from array_api_compat import size as _size

__all__ = [
    "array_namespace",
    "namespace_of",
    "device",
    "size",
    "to_numpy",
    "default_float",
    "float_dtype",
    "as_float_array",
    "as_array",
    "check_finite",
    "check_nonneg_weights",
    "real_number",
    "as_parameter",
    "host_labels",
    "host_real",
    "PicklableNamespace",
    "scalar",
    "is_lazy",
    "materialize",
    "is_numpy_namespace",
    "is_cupy_namespace",
    "is_torch_namespace",
    "is_dask_namespace",
    "is_array_api_obj",
    "apply_inplace",
]

device = _device
size = _size


def _backend_name(x: Any) -> str:
    mod = type(x).__module__.split(".")[0]
    return mod


def namespace_of(**named: Any) -> Any:
    """Return the array namespace shared by the named arrays.

    Non-array arguments (Python scalars, lists, ``None``) are ignored. Arrays
    from two different libraries raise a ``TypeError`` naming both arguments.
    With no array at all, NumPy's namespace is returned.
    """
    arrays = {k: v for k, v in named.items() if v is not None and is_array_api_obj(v)}
    if not arrays:
        return array_api_compat.array_namespace(np.empty(0))
    first_name, first = next(iter(arrays.items()))
    xp = array_api_compat.array_namespace(first)
    for name, arr in arrays.items():
        try:
            other = array_api_compat.array_namespace(arr)
        except TypeError as exc:  # pragma: no cover - defensive
            raise TypeError(f"`{name}`: unsupported array type {type(arr).__name__}") from exc
        if other is not xp:
            raise TypeError(
                f"`{first_name}` and `{name}` come from two different array libraries "
                f"({_backend_name(first)} and {_backend_name(arr)}); convert them to one "
                "library first"
            )
    # arrays of one library on two devices
    dev = _device(first)
    for name, arr in arrays.items():
        if _device(arr) != dev:
            raise ValueError(
                f"`{first_name}` and `{name}` live on different devices ({dev} and "
                f"{_device(arr)}); move them to one device first"
            )
    return xp


def array_namespace(*arrays: Any, xp: Any = None) -> Any:
    """Namespace of ``arrays`` (positional), or ``xp`` when given."""
    if xp is not None:
        return xp
    return namespace_of(**{f"argument {i}": a for i, a in enumerate(arrays)})


def materialize(*arrays: Any) -> tuple:
    """Evaluate lazy (Dask) arrays and keep the results in memory; others pass through.

    Iterative solvers call this on each iterate so that a lazy graph does not grow with
    the iteration count (every host read would otherwise recompute the whole history).
    """
    if arrays and any(type(a).__module__.startswith("dask") for a in arrays):
        import dask

        return tuple(dask.persist(*arrays))
    return arrays


def is_lazy(xp: Any) -> bool:
    """True for namespaces whose arrays are evaluated lazily (Dask, JAX)."""
    return is_dask_namespace(xp) or is_jax_namespace(xp)


def default_float(xp: Any, dev: Any = None) -> Any:
    """The namespace's default real floating dtype (float32 for PyTorch by default)."""
    try:
        info = xp.__array_namespace_info__()
        return info.default_dtypes(device=dev)["real floating"]
    except Exception:  # pragma: no cover - namespaces predating the inspection API
        return xp.float64


def float_dtype(x: Any, xp: Any) -> Any:
    """The floating dtype a computation on ``x`` runs in.

    Real floating inputs keep their dtype; integer and boolean inputs are
    promoted to the namespace's default floating dtype. Complex raises.
    """
    dt = x.dtype
    if xp.isdtype(dt, "real floating"):
        return dt
    if xp.isdtype(dt, "complex floating"):
        raise TypeError("complex values are not supported")
    if xp.isdtype(dt, ("integral", "bool")):
        return default_float(xp, _device(x))
    raise TypeError(f"unsupported dtype {dt}")  # pragma: no cover


def as_array(x: Any, xp: Any, *, name: str, dtype: Any = None, dev: Any = None) -> Any:
    """Convert ``x`` (an array of ``xp``, or a Python scalar/sequence) to an ``xp`` array."""
    if is_array_api_obj(x):
        if array_api_compat.array_namespace(x) is not xp:
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


def to_numpy(x: Any) -> np.ndarray:
    """Copy any supported array (or sequence) to a NumPy array on the host."""
    if isinstance(x, np.ndarray):
        return x
    if not is_array_api_obj(x):
        return np.asarray(x)
    xp = array_api_compat.array_namespace(x)
    if is_numpy_namespace(xp):
        return np.asarray(x)
    if is_cupy_namespace(xp):
        return x.get()
    if is_torch_namespace(xp):
        return x.detach().cpu().numpy()
    if is_dask_namespace(xp):
        return np.asarray(x.compute())
    try:
        return np.from_dlpack(x)
    except Exception:
        return np.asarray(x)


def normalize_axis(axis: int, ndim: int, *, name: str = "axis") -> int:
    """Normalise a possibly negative axis, raising a clear error when out of range."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"`{name}` must be an integer, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"`{name}`={axis} is out of range for an array of {ndim} dimension(s)")
    return int(axis) % ndim


def apply_inplace(fn: Any, x: Any, xp: Any) -> Any:
    """``fn(x)`` written over ``x`` where the library supports ``out=`` (NumPy, CuPy,
    PyTorch), else a new array. ``x`` must be a temporary the caller owns; a tensor that
    requires grad is not overwritten (autograd records no ``out=`` operations)."""
    if (is_numpy_namespace(xp) or is_cupy_namespace(xp) or is_torch_namespace(xp)) and not (
        getattr(x, "requires_grad", False)
    ):
        return fn(x, out=x)
    return fn(x)


def tiny_sqrt(dtype: Any, xp: Any) -> float:
    """Square root of the smallest normal number of ``dtype``."""
    return math.sqrt(float(xp.finfo(dtype).smallest_normal))


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
            same = array_api_compat.array_namespace(value) is xp
        except TypeError:
            same = False
    if same:
        if not xp.isdtype(value.dtype, ("real floating", "integral")):
            raise TypeError(f"`{name}` must be {what}, got dtype {value.dtype}")
        arr = value if value.dtype == like.dtype else xp.astype(value, like.dtype)
        if _device(arr) != dev:
            arr = array_api_compat.to_device(arr, dev)
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


# ---------------------------------------------------------------------------
# pickling objects that hold an array namespace


class _ModuleRef:
    """Stand-in for a module in a pickled state: its import name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self) -> tuple:
        return (_ModuleRef, (self.name,))


class PicklableNamespace:
    """Mixin: pickle (and deep-copy) objects whose attributes hold array namespaces.

    Namespaces are modules (``array_api_compat.numpy``, ``array_api_strict``, ...),
    which do not pickle; they are stored by import name and imported again on
    unpickling, so the object works with :mod:`pickle`, :func:`copy.deepcopy`,
    joblib, multiprocessing and Dask distributed.
    """

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key, value in state.items():
            if isinstance(value, types.ModuleType):
                state[key] = _ModuleRef(value.__name__)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        for key, value in state.items():
            if isinstance(value, _ModuleRef):
                state[key] = importlib.import_module(value.name)
        self.__dict__.update(state)

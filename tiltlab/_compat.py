"""The one place that talks to array-api-compat.

Every public function of tiltlab resolves its array namespace, device and
floating dtype through the helpers here, so that NumPy, CuPy, PyTorch,
array-api-strict and Dask inputs are handled in one way and a result always
lives in the namespace, dtype and device of its input.
"""

from __future__ import annotations

import math
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
    "scalar",
    "is_lazy",
    "materialize",
    "is_numpy_namespace",
    "is_cupy_namespace",
    "is_torch_namespace",
    "is_dask_namespace",
    "is_array_api_obj",
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
    try:
        if dev is None:
            return xp.asarray(x, dtype=dtype)
        return xp.asarray(x, dtype=dtype, device=dev)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` could not be converted to an array: {exc}") from exc


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


def check_finite(x: Any, xp: Any, *, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` if ``x`` holds NaN or infinity."""
    if not _all_true(xp.all(xp.isfinite(x))):
        nan = _all_true(xp.any(xp.isnan(x)))
        what = "NaN" if nan else "infinite"
        raise ValueError(
            f"`{name}` contains {what} values; pass finite values (or check_finite=False "
            "to skip this check)"
        )


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

"""Array namespaces and devices: which library an array belongs to, and what it can do.

This is the one module of tiltlab that imports ``array_api_compat``; everything else asks
the helpers here (or in the sibling modules of :mod:`tiltlab._compat`).
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np
from array_api_compat import device as _device
from array_api_compat import (
    is_array_api_obj as _is_array_api_obj,
)
from array_api_compat import (
    is_cupy_namespace,
    is_dask_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
)
from array_api_compat import size as _size


def device(x: Any, /) -> Any:
    """The device of an array (array-api-compat's ``device``; a torch tensor's own
    ``device``, answered by its type: see :func:`is_array_api_obj`)."""
    if type(x).__module__.startswith("torch"):
        import torch

        if isinstance(x, torch.Tensor):
            return x.device
    return _device(x)


size = _size
to_device = array_api_compat.to_device


def is_array_api_obj(x: Any) -> bool:
    """Whether ``x`` is an array of a library array-api-compat knows (its
    ``is_array_api_obj``), with NumPy arrays and torch tensors recognised by their type
    first.

    array-api-compat's own tests look each library up in ``sys.modules``. Traced by
    ``torch.compile``, that look-up failed inside dynamo ("dictionary changed size during
    iteration") once modules had been imported after an earlier compilation (Dask's or
    CuPy's, for instance), so the common types are answered without it."""
    if isinstance(x, np.ndarray):
        return True
    if type(x).__module__.startswith("torch"):
        import torch

        if isinstance(x, torch.Tensor):
            return True
    return _is_array_api_obj(x)


def _backend_name(x: Any) -> str:
    mod = type(x).__module__.split(".")[0]
    return mod


def library_namespace(x: Any) -> Any:
    """The array namespace of one array (``TypeError`` for anything that is not one)."""
    return _torch_namespace((x,)) or array_api_compat.array_namespace(x)


_SCALARS = (bool, int, float, complex, list, tuple)


def _torch_namespace(values: Any) -> Any:
    """array-api-compat's torch namespace when every value given is a torch tensor on one
    device or a Python number or sequence (at least one tensor), else None: torch inputs
    answered by their type (see :func:`is_array_api_obj` for why)."""
    tensors = []
    for v in values:
        if v is None or isinstance(v, _SCALARS):
            continue
        if not type(v).__module__.startswith("torch"):
            return None
        tensors.append(v)
    if not tensors:
        return None
    import torch

    if not all(isinstance(v, torch.Tensor) for v in tensors):
        return None
    dev = tensors[0].device
    if any(v.device != dev for v in tensors):
        return None  # the general path names the arguments
    import array_api_compat.torch as xp

    return xp


def namespace_of(**named: Any) -> Any:
    """Return the array namespace shared by the named arrays.

    Non-array arguments (Python scalars, lists, ``None``) are ignored. Arrays
    from two different libraries raise a ``TypeError`` naming both arguments.
    With no array at all, NumPy's namespace is returned.
    """
    xp = _torch_namespace(named.values())
    if xp is not None:
        return xp
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


def on_accelerator(xp: Any, dev: Any) -> bool:
    """True when arrays of ``xp`` on ``dev`` live on a GPU (CuPy, PyTorch on CUDA...):
    their kernels run in parallel blocks of their own, so host-side blocking only costs."""
    if is_cupy_namespace(xp):
        return True
    return is_torch_namespace(xp) and getattr(dev, "type", "cpu") != "cpu"


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


def writes_in_place(xp: Any) -> bool:
    """True when the library's elementwise functions write into ``out=`` (NumPy, CuPy,
    PyTorch); array-api-strict and Dask arrays are not written in place."""
    return is_numpy_namespace(xp) or is_cupy_namespace(xp) or is_torch_namespace(xp)


def apply_inplace(fn: Any, x: Any, xp: Any) -> Any:
    """``fn(x)`` written over ``x`` where the library supports ``out=`` (NumPy, CuPy,
    PyTorch), else a new array. ``x`` must be a temporary the caller owns; a tensor that
    requires grad is not overwritten (autograd records no ``out=`` operations)."""
    if writes_in_place(xp) and not getattr(x, "requires_grad", False):
        return fn(x, out=x)
    return fn(x)


def tiny_sqrt(dtype: Any, xp: Any) -> float:
    """Square root of the smallest normal number of ``dtype``."""
    return math.sqrt(float(xp.finfo(dtype).smallest_normal))


def array_result(x: Any) -> Any:
    """A NumPy scalar as the 0-d array the array API returns; anything else unchanged.

    NumPy's reductions return scalars (``np.float64``) where every other library returns
    a 0-d array; public functions pass their results through this so that a NumPy input
    always gives NumPy arrays (of any dimension), as the other libraries do.

    Examples
    --------
    >>> import numpy as np
    >>> type(array_result(np.float64(1.5))).__name__, array_result(np.float64(1.5)).shape
    ('ndarray', ())
    >>> array_result(3.0)
    3.0
    """
    return np.asarray(x) if isinstance(x, np.generic) else x

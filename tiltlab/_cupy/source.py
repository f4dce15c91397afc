"""The CUDA sources of the CuPy backend and their builds.

The scalar functions (each loss's value and derivatives at one point, generated from the
table of :mod:`tiltlab.losses.table`, the tilted state, its empty element, merge and
finish) are C in ``tilt.cuh``, a header that compiles both
as host C (the tests call it through ctypes) and in the kernels; the kernels are in
``kernels.cu``. A build is the header and the kernels after a few ``#define`` lines (the
element type, the loss and its parameter, the launch shape), compiled by NVRTC through
CuPy.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

__all__ = [
    "C_LOSSES",
    "MAX_FEATURES",
    "device_code_digest",
    "function",
    "header",
    "kernels",
    "launch_shape",
    "loss_key",
    "module",
    "multiprocessors",
    "reduction_source",
    "registers",
    "vg_source",
]

#: the most features the fused value-and-gradient kernel takes
MAX_FEATURES = 1024

#: NVRTC options of every build
OPTIONS = ("--std=c++14",)


@cache
def header() -> str:
    """The text of ``tilt.cuh``."""
    return resources.files(__package__).joinpath("tilt.cuh").read_text(encoding="utf-8")


@cache
def kernels() -> str:
    """The text of ``kernels.cu``."""
    return resources.files(__package__).joinpath("kernels.cu").read_text(encoding="utf-8")


def device_code_digest() -> str:
    """A short digest of the device code (``tilt.cuh`` and ``kernels.cu``): GPU reports
    record it, so that a page can tell whether the kernels changed after a measurement."""
    text = header() + "\0" + kernels()
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _c_losses() -> tuple[str, ...]:
    return tuple(re.findall(r"^TL_HD void tl_loss_(\w+)\(", header(), flags=re.MULTILINE))


#: the losses that have C code in ``tilt.cuh`` (``tl_loss_<name>``), in its order
C_LOSSES: tuple[str, ...] = _c_losses()


#: ``TL_FLOAT`` of the element types, by NumPy dtype character and by name
_CTYPES = {"f": 1, "d": 0, "float32": 1, "float": 1, "float64": 0, "double": 0}


def _ctype(dtype: Any) -> int:
    """1 for float32, 0 for float64 (``TL_FLOAT``); looked up by the dtype's character,
    not its ``name``, which NumPy builds anew at each access (about 3 us of host time a
    call on the development CPU)."""
    key = dtype.char if isinstance(dtype, np.dtype) else dtype
    if isinstance(key, str) and key in _CTYPES:
        return _CTYPES[key]
    try:
        if dtype is None:  # np.dtype(None) would be float64
            raise TypeError
        return _CTYPES[np.dtype(dtype).char]
    except (TypeError, KeyError):
        raise ValueError(f"`dtype`: float32 or float64, not {dtype!r}") from None


def launch_shape(d: int) -> tuple[int, int, int]:
    """Lanes per row group ``L`` (a power of two up to a warp), features per lane, and
    rows in flight per lane group (memory parallelism; lane i < rows does row i's scalar
    work, so rows <= L) for ``d`` features."""
    L = 1
    while L < min(d, 32):
        L *= 2
    if 2 < L < 32 or (L == 32 and d <= 32):
        # a short row (up to 32 features): two features a lane on half the lanes, so that
        # every lane keeps twice the loads in flight and a row's dot product takes one
        # shuffle fewer (the Speed page gives the measured effect)
        L //= 2
    npl = -(-d // L)
    rows = max(1, min(8, 16 // npl, L))
    return L, npl, rows


def _build(defines: dict[str, Any]) -> str:
    return _built(tuple(defines.items()))


@cache
def _built(defines: tuple[tuple[str, Any], ...]) -> str:
    """The source for these defines, built once: the same string object at every call,
    so that its hash (the key of :func:`module`'s cache) is computed once too (building
    and hashing the 40 kB text anew took about 35 us of host time a call on the
    development CPU)."""
    lines = "".join(f"#define {k} {v}\n" for k, v in defines)
    return f"{lines}{header()}\n{kernels()}"


def loss_key(loss: Any) -> tuple[str, float]:
    """``(name, parameter)`` of ``loss``: a loss object (its one scalar parameter, Huber's
    ``delta`` or the pinball ``quantile``, else 0) or a loss name (parameter 0)."""
    if isinstance(loss, str):
        return loss, 0.0
    params = loss.parameters() if hasattr(loss, "parameters") else {}
    return loss.name, float(next(iter(params.values()), 0.0))


def vg_source(loss: Any, dtype: Any, d: int) -> str:
    """The source of the value-and-gradient kernels (``tilted_vg``, ``tilted_vg_finish``)
    for ``loss`` (a loss object or a name in :data:`C_LOSSES`; the parameter of an object
    becomes ``TL_PARAM``), ``dtype`` and ``d`` features."""
    name, param = loss_key(loss)
    if name not in C_LOSSES:
        raise ValueError(f"`loss`: no C code for {name!r} (have {', '.join(C_LOSSES)})")
    if not 0 < d <= MAX_FEATURES:
        raise ValueError(f"`d`: between 1 and {MAX_FEATURES}, not {d}")
    L, npl, rows = launch_shape(d)
    defines = {"TL_FLOAT": _ctype(dtype), "TL_LOSS": f"tl_loss_{name}"}
    if param:
        defines["TL_PARAM"] = repr(param)  # the shortest decimal that reads back exactly
    return _build({**defines, "L": L, "NPL": npl, "R": rows})


def reduction_source(dtype: Any) -> str:
    """The source of the reductions (``tilted_extremes_blocks``, ``tilted_sums_blocks``,
    ``tilted_state_finish``, ``tilted_weights_apply`` and the levels' kernels of the
    hierarchies) for ``dtype``."""
    return _build({"TL_FLOAT": _ctype(dtype)})


#: the per-process cache: each source's compiled module and its kernels (by name), and
#: the multiprocessor count of each device; one dict, so that a test can reset it at once
_MODULES: dict = {}


def _entry(source: str) -> tuple[Any, dict]:
    hit = _MODULES.get(source)
    if hit is None:
        import cupy

        hit = (cupy.RawModule(code=source, options=OPTIONS), {})
        _MODULES[source] = hit
    return hit


def module(source: str) -> Any:
    """The compiled ``cupy.RawModule`` of ``source`` (cached by source text)."""
    return _entry(source)[0]


def function(source: str, name: str) -> Any:
    """The kernel ``name`` of ``source``'s module, looked up once per process."""
    mod, kernels = _entry(source)
    fn = kernels.get(name)
    if fn is None:
        fn = kernels[name] = mod.get_function(name)
    return fn


def registers(source: str, name: str) -> int:
    """Registers per thread of the kernel ``name`` (read from the driver once)."""
    kernels = _entry(source)[1]
    regs = kernels.get((name, "regs"))
    if regs is None:
        regs = kernels[(name, "regs")] = max(1, int(function(source, name).num_regs))
    return regs


def multiprocessors() -> int:
    """Multiprocessors of the current device, asked once per device (CuPy's
    ``Device.attributes`` reads every attribute of the device at each access)."""
    import cupy

    dev = cupy.cuda.Device()
    key = ("multiprocessors", int(getattr(dev, "id", 0)))
    sms = _MODULES.get(key)
    if sms is None:
        sms = _MODULES[key] = int(dev.attributes["MultiProcessorCount"])
    return sms

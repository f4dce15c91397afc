"""The CUDA sources of the CuPy backend and their builds.

The scalar functions (each loss's value and derivatives at one point, the tilted state,
its empty element, merge and finish) are C in ``tilt.cuh``, a header that compiles both
as host C (the tests call it through ctypes) and in the kernels; the kernels are in
``kernels.cu``. A build is the header and the kernels after a few ``#define`` lines (the
element type, the loss, the launch shape), compiled by NVRTC through CuPy.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "C_LOSSES",
    "MAX_FEATURES",
    "header",
    "kernels",
    "launch_shape",
    "reduction_source",
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


def _c_losses() -> tuple[str, ...]:
    return tuple(re.findall(r"^TL_HD void tl_loss_(\w+)\(", header(), flags=re.MULTILINE))


#: the losses that have C code in ``tilt.cuh`` (``tl_loss_<name>``), in its order
C_LOSSES: tuple[str, ...] = _c_losses()


def _ctype(dtype: Any) -> int:
    """1 for float32, 0 for float64 (``TL_FLOAT``)."""
    name = getattr(dtype, "name", str(dtype))
    if name in ("float32", "float"):
        return 1
    if name in ("float64", "double"):
        return 0
    raise ValueError(f"`dtype`: float32 or float64, not {dtype!r}")


def launch_shape(d: int) -> tuple[int, int, int]:
    """Lanes per row group ``L`` (a power of two up to a warp), features per lane, and
    rows in flight per lane group (memory parallelism; lane i < rows does row i's scalar
    work, so rows <= L) for ``d`` features."""
    L = 1
    while L < min(d, 32):
        L *= 2
    npl = -(-d // L)
    rows = max(1, min(8, 16 // npl, L))
    return L, npl, rows


def _build(defines: dict[str, Any]) -> str:
    lines = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return f"{lines}{header()}\n{kernels()}"


def vg_source(loss: str, dtype: Any, d: int) -> str:
    """The source of the value-and-gradient kernels (``tilted_vg``, ``tilted_vg_finish``)
    for ``loss`` (a name in :data:`C_LOSSES`), ``dtype`` and ``d`` features."""
    if loss not in C_LOSSES:
        raise ValueError(f"`loss`: no C code for {loss!r} (have {', '.join(C_LOSSES)})")
    if not 0 < d <= MAX_FEATURES:
        raise ValueError(f"`d`: between 1 and {MAX_FEATURES}, not {d}")
    L, npl, rows = launch_shape(d)
    return _build(
        {"TL_FLOAT": _ctype(dtype), "TL_LOSS": f"tl_loss_{loss}", "L": L, "NPL": npl, "R": rows}
    )


def reduction_source(dtype: Any) -> str:
    """The source of the reductions (``tilted_state_blocks``, ``tilted_state_finish``,
    ``tilted_weights_apply``) for ``dtype``."""
    return _build({"TL_FLOAT": _ctype(dtype)})


_MODULES: dict = {}


def module(source: str) -> Any:
    """The compiled ``cupy.RawModule`` of ``source`` (cached by source text)."""
    mod = _MODULES.get(source)
    if mod is None:
        import cupy

        mod = cupy.RawModule(code=source, options=OPTIONS)
        _MODULES[source] = mod
    return mod

"""Every CUDA kernel variant compiles (NVRTC to PTX, no GPU or driver needed): each loss
with C code, float and double, each feature-count bucket of the launch shape, the finish
and the reductions; and a misspelt intrinsic is rejected with its line. Skipped where
NVRTC is not installed (the ``nvidia-cuda-nvrtc`` wheel, through CuPy's binding)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from tiltlab._cupy import source
from tiltlab.losses import get_loss

ARCH = "-arch=compute_90"
#: CuPy adds ``-ftz=true`` to every NVRTC build (float32 subnormals flushed to zero), so the
#: kernels are compiled here with it too, as the device runs them
CUPY_OPTIONS = ("-ftz=true",)


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # ImportError, or the library missing at run time
        pytest.skip(f"NVRTC not available: {exc}")
    return nvrtc


def compile_ptx(code: str, name: str = "tiltlab.cu") -> tuple[str | None, str]:
    """``(ptx, log)``: the PTX, or None and NVRTC's log."""
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(code, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [ARCH, *source.OPTIONS, *CUPY_OPTIONS])
        except nvrtc.NVRTCError:
            return None, nvrtc.getProgramLog(prog)
        ptx = nvrtc.getPTX(prog)
        return (ptx.decode() if isinstance(ptx, bytes) else ptx), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _buckets() -> list[int]:
    """One feature count per distinct launch shape over 1..MAX_FEATURES."""
    seen, out = set(), []
    for d in range(1, source.MAX_FEATURES + 1):
        shape = source.launch_shape(d)
        if shape not in seen:
            seen.add(shape)
            out.append(d)
    return out


#: every loss x dtype x feature bucket with ``TILTLAB_FULL_MATRIX=1`` (the GPU check
#: script sets it); otherwise every bucket for one loss and element type, and the
#: smallest and largest bucket for the others (the buckets change only the launch macros,
#: the losses and element types only the spliced functions), which keeps CI short
FULL_MATRIX = os.environ.get("TILTLAB_FULL_MATRIX") == "1"
BUCKETS = _buckets()
VARIANTS = [
    (loss, dtype, d)
    for loss in source.C_LOSSES
    for dtype in ("float32", "float64")
    for d in BUCKETS
    if FULL_MATRIX
    or (loss, dtype) == (source.C_LOSSES[0], "float64")
    or d in (BUCKETS[0], BUCKETS[-1])
]


def test_the_buckets_cover_the_launch_shapes():
    shapes = {source.launch_shape(d) for d in range(1, source.MAX_FEATURES + 1)}
    assert len(_buckets()) == len(shapes) and all(L <= 32 for L, _, _ in shapes)
    # what the kernel relies on: L a power of two that divides a warp, npl the fewest
    # features a lane that hold all d, and no more rows in flight than lanes (lane i < rows does
    # row i's scalar work)
    for d in range(1, source.MAX_FEATURES + 1):
        L, npl, rows = source.launch_shape(d)
        assert L & (L - 1) == 0 and 32 % L == 0, d
        assert (npl - 1) * L < d <= npl * L, d
        assert 1 <= rows <= L, d


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "dtype", "d"), VARIANTS)
def test_value_and_gradient_kernels_compile(loss, dtype, d):
    # the registered loss (its default parameter, where it has one, defines TL_PARAM)
    ptx, log = compile_ptx(source.vg_source(get_loss(loss), dtype, d))
    assert ptx is not None, log
    for kernel in (
        "tilted_vg",
        "tilted_vg_finish",
        "tilted_vg_grad",
        "tilted_loss_d1",
        "tilted_sums_blocks",
    ):
        assert f".entry {kernel}" in ptx
    # float kernels keep to single precision (no double arithmetic slips in)
    if dtype == "float32":
        assert not re.search(r"\b(add|mul|fma\.rn)\.f64\b", ptx), "double arithmetic in float"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reduction_kernels_compile(dtype):
    ptx, log = compile_ptx(source.reduction_source(dtype))
    assert ptx is not None, log
    for kernel in (
        "tilted_extremes_blocks",
        "tilted_sums_blocks",
        "tilted_state_finish",
        "tilted_weights_apply",
        "tilted_level_count",
        "tilted_level_parent",
        "tilted_level_nested",
        "tilted_tree_init",
        "tilted_level_extremes",
        "tilted_level_sums",
        "tilted_level_finish",
        "tilted_tree_top",
        "tilted_level_weights",
        "tilted_ridge",
    ):
        assert f".entry {kernel}" in ptx
    assert ".entry tilted_vg" not in ptx  # without a loss, no value-and-gradient kernel
    assert ".entry tilted_loss_d1" not in ptx
    if dtype == "float32":  # the float reductions keep to single precision
        assert not re.search(r"\b(add|mul|fma\.rn)\.f64\b", ptx), "double arithmetic in float"
    # the hierarchy's levels gather their groups in shared memory with shared atomics
    fp = "f32" if dtype == "float32" else "f64"
    key = "s32" if dtype == "float32" else "s64"
    for op in (f"add.{fp}", f"max.{key}", f"min.{key}"):
        assert f"atom.shared.{op}" in ptx, op


def test_a_misspelt_intrinsic_is_rejected_with_its_line():
    code = source.vg_source("squared", "float32", 16)
    assert "__shfl_xor_sync(mask, v, off, L)" in code
    bad = code.replace("__shfl_xor_sync(mask, v, off, L)", "__shfl_xor_synk(mask, v, off, L)")
    line = bad.splitlines().index(next(s for s in bad.splitlines() if "__shfl_xor_synk" in s)) + 1
    ptx, log = compile_ptx(bad, "bad.cu")
    assert ptx is None
    assert "__shfl_xor_synk" in log and f"bad.cu({line})" in log, log


@pytest.mark.parametrize("dtype", ["float16", "int32", np.int64, None, "not a dtype"])
def test_sources_refuse_other_element_types_by_name(dtype):
    with pytest.raises(ValueError, match="`dtype`: float32 or float64"):
        source.reduction_source(dtype)


@pytest.mark.parametrize(
    ("dtype", "flag"),
    [(np.float32, 1), ("float32", 1), (np.dtype("float32"), 1), (np.float64, 0), ("float64", 0)],
)
def test_sources_take_the_element_type_in_any_spelling(dtype, flag):
    assert source.reduction_source(dtype).startswith(f"#define TL_FLOAT {flag}\n")

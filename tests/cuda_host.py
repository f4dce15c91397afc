"""Host builds of the CUDA scalar functions (``tiltlab/_cupy/tilt.cuh``) for the tests.

The header is compiled as C with the host compiler (``TL_HD`` empty, so that every
function is exported) once per element type, and called through ctypes. The kernels
themselves run on the CPU through :func:`emulated` (``tests/cuda_emu.h``), not through a
Python copy of their sequence of calls.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from tiltlab._cupy import source

FIELDS = ("c", "hi", "lo", "s", "q", "lsum", "mass")


def compiler() -> str | None:
    for cc in ("cc", "gcc", "clang"):
        path = shutil.which(cc)
        if path:
            return path
    return None


class HostC:
    """The functions of ``tilt.cuh`` for one element type, through ctypes."""

    def __init__(self, lib: ctypes.CDLL, dtype: type) -> None:
        self.lib, self.dtype = lib, np.dtype(dtype)
        real = ctypes.c_float if self.dtype == np.float32 else ctypes.c_double
        self.real = real

        class State(ctypes.Structure):
            _fields_ = [(f, real) for f in FIELDS]

        self.State = State
        P = ctypes.POINTER(real)
        for name in source.C_LOSSES:
            fn = getattr(lib, f"tl_loss_{name}")
            fn.argtypes, fn.restype = [real, real, real, P, P, P], None
        sig = {
            "tl_empty": ([], State),
            "tl_is_empty": ([ctypes.POINTER(State)], ctypes.c_int),
            "tl_gap": ([real, real, real], real),
            "tl_move": ([ctypes.POINTER(State), real, real], real),
            "tl_add": ([ctypes.POINTER(State), real, real], real),
            "tl_push": ([ctypes.POINTER(State), real, real, P], real),
            "tl_push_w": ([ctypes.POINTER(State), real, real, real, P], real),
            "tl_merge": ([State, State, real, P, P], State),
            "tl_state_finite": ([ctypes.POINTER(State)], ctypes.c_int),
            "tl_risk": ([State, real, real], real),
            "tl_share": ([State, State, real], real),
        }
        for name, (args, res) in sig.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        self.tiny = math.sqrt(float(np.finfo(self.dtype).tiny))

    # losses
    def loss(self, name: str, z: float, y: float, param: float = 0.0) -> tuple[float, float, float]:
        """Value, first and second derivative (``param``: the loss's parameter)."""
        out = [self.real() for _ in range(3)]
        getattr(self.lib, f"tl_loss_{name}")(z, y, param, *(ctypes.byref(o) for o in out))
        return tuple(o.value for o in out)

    # states
    def state(self, **fields) -> ctypes.Structure:
        return self.State(*(fields[f] for f in FIELDS))

    def empty(self):
        return self.lib.tl_empty()

    def push(self, st, l: float, t: float) -> tuple[float, float]:
        r = self.real()
        e = self.lib.tl_push(ctypes.byref(st), l, t, ctypes.byref(r))
        return e, r.value

    def push_w(self, st, l: float, p: float, t: float) -> float:
        r = self.real()
        return self.lib.tl_push_w(ctypes.byref(st), l, p, t, ctypes.byref(r))

    def move(self, st, c: float, t: float) -> float:
        return self.lib.tl_move(ctypes.byref(st), c, t)

    def add(self, st, l: float, t: float) -> float:
        return self.lib.tl_add(ctypes.byref(st), l, t)

    def merge(self, a, b, t: float):
        fa, fb = self.real(), self.real()
        m = self.lib.tl_merge(a, b, t, ctypes.byref(fa), ctypes.byref(fb))
        return m, fa.value, fb.value

    def risk(self, st, t: float) -> float:
        return self.lib.tl_risk(st, t, self.tiny)

    def share(self, g, whole, t: float) -> float:
        return self.lib.tl_share(g, whole, t)

    def finite(self, st) -> bool:
        return bool(self.lib.tl_state_finite(ctypes.byref(st)))

    def is_empty(self, st) -> bool:
        return bool(self.lib.tl_is_empty(ctypes.byref(st)))

    def of(self, losses, t: float):
        st = self.empty()
        for v in losses:
            self.push(st, float(v), t)
        return st

    @staticmethod
    def row(st) -> tuple[float, ...]:
        return tuple(getattr(st, f) for f in FIELDS)


@cache
def _library(flt: int) -> ctypes.CDLL | None:
    cc = compiler()
    if cc is None:
        return None
    text = source.header()
    key = hashlib.sha256(f"{flt}\n{text}".encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"tiltlab-tilt-{key}-{flt}.so"
    if not out.exists():
        work = Path(tempfile.mkdtemp())
        (work / "tilt.cuh").write_text(text, encoding="utf-8")
        (work / "host.c").write_text('#include "tilt.cuh"\n', encoding="utf-8")
        tmp = work / "tilt.so"
        cmd = [
            cc,
            "-std=c99",
            "-O2",
            "-fPIC",
            "-shared",
            "-ffp-contract=off",
            "-Wall",
            "-DTL_HD=",
            f"-DTL_FLOAT={flt}",
            str(work / "host.c"),
            "-o",
            str(tmp),
            "-lm",
        ]
        subprocess.run(cmd, check=True, capture_output=True)
        shutil.move(str(tmp), out)
    return ctypes.CDLL(str(out))


def host(dtype) -> HostC:
    """The host build for ``dtype`` (the test is skipped without a C compiler)."""
    lib = _library(1 if np.dtype(dtype) == np.float32 else 0)
    if lib is None:
        pytest.skip("no C compiler")
    return HostC(lib, dtype)


# ---------------------------------------------------------------------------------------
# the kernels themselves on the CPU (tests/cuda_emu.h: threads as OS threads)

_KERNEL = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')


def _params(text: str) -> list[tuple[str, str]]:
    """``(type, name)`` of each parameter of a kernel signature."""
    out = []
    for p in text.split(","):
        words = p.replace("*", " * ").split()
        name = words[-1]
        words = [w for w in words[:-1] if w not in ("const", "__restrict__")]
        out.append((" ".join(words), name))
    return out


def kernel_signatures(code: str) -> dict[str, list[tuple[str, str]]]:
    """The kernels ``code`` compiles (those of the loss section only with a loss)."""
    if "#define TL_LOSS" not in code:
        start = code.index("#ifdef TL_LOSS")
        code = code[:start] + code[code.index("#endif /* TL_LOSS */", start) :]
    return {m.group(1): _params(m.group(2)) for m in _KERNEL.finditer(code)}


def host_has_fma() -> bool:
    """Whether this CPU runs x86 fused multiply-add instructions (LLVM's host features,
    through llvmlite; the build with ``-mfma`` needs them)."""
    try:
        from llvmlite import binding
    except ImportError:
        return False
    return bool(binding.get_host_cpu_features().get("fma", False))


@cache
def emulated(code: str, contract: bool = False) -> ctypes.CDLL | None:
    """The kernels of ``code`` (a source the backend hands to NVRTC) built as host C++
    over ``cuda_emu.h``, each launchable as ``emu_<kernel>(grid, block, *args)``.

    With ``contract`` the compiler fuses products and sums into multiply-adds, as NVRTC
    does by default (``--fmad=true``; a fused product is not rounded, so an overflow to
    infinity inside it is not seen); the default build rounds every operation."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return None
    emu = (Path(__file__).parent / "cuda_emu.h").read_text(encoding="utf-8")
    wrappers = []
    for name, params in kernel_signatures(code).items():
        decl = ", ".join(f"{t} {n}" for t, n in params)
        call = ", ".join(n for _, n in params)
        wrappers.append(
            f'extern "C" void emu_{name}(int grid, int block, {decl}) '
            f"{{ emu_launch(grid, block, [&] {{ {name}({call}); }}); }}"
        )
    text = f"{emu}\n{code}\n" + "\n".join(wrappers) + "\n"
    flags = ["-O2", "-ffp-contract=fast", "-mfma"] if contract else ["-O1", "-ffp-contract=off"]
    key = hashlib.sha256((" ".join(flags) + "\n" + text).encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"tiltlab-emu-{key}.so"
    if not out.exists():
        work = Path(tempfile.mkdtemp())
        (work / "k.cpp").write_text(text, encoding="utf-8")
        tmp = work / "k.so"
        cmd = [
            cxx,
            "-std=c++20",
            *flags,
            "-fPIC",
            "-shared",
            "-pthread",
            str(work / "k.cpp"),
            "-o",
            str(tmp),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(res.stderr[-4000:])
        shutil.move(str(tmp), out)
    return ctypes.CDLL(str(out))


def run_emulated(
    code: str, name: str, grid: int, block: int, args: list, contract: bool = False
) -> None:
    """Launch kernel ``name`` of ``code`` on the CPU; ``args`` are NumPy arrays (device
    buffers) and NumPy scalars, as a CuPy launch takes them. ``contract``: the build with
    fused multiply-adds (:func:`emulated`)."""
    lib = emulated(code, contract)
    if lib is None:
        pytest.skip("no C++ compiler")
    params = kernel_signatures(code)[name]
    assert len(params) == len(args), (name, len(params), len(args))
    flt = "#define TL_FLOAT 1" in code
    real = ctypes.c_float if flt else ctypes.c_double
    conv = []
    for (typ, pname), a in zip(params, args, strict=True):
        if typ.endswith("*"):
            assert isinstance(a, np.ndarray) and a.flags.c_contiguous, pname
            if typ == "T *":
                assert a.dtype == (np.float32 if flt else np.float64), pname
            elif typ == "tl_key *":
                assert a.dtype == (np.int32 if flt else np.int64), pname
            else:
                want = {"long long *": np.int64, "unsigned long long *": np.uint64}[typ]
                assert a.dtype == want, (pname, a.dtype)
            conv.append(ctypes.c_void_p(a.ctypes.data))
        elif typ == "long long":
            assert isinstance(a, np.int64), pname
            conv.append(ctypes.c_longlong(int(a)))
        elif typ == "int":
            assert isinstance(a, np.int32), pname
            conv.append(ctypes.c_int(int(a)))
        else:
            assert typ == "T" and isinstance(a, np.float32 if flt else np.float64), (pname, a)
            conv.append(real(float(a)))
    getattr(lib, f"emu_{name}")(ctypes.c_int(grid), ctypes.c_int(block), *conv)

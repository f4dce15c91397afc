"""A recording stand-in for CuPy (no GPU): device arrays over NumPy buffers, every host
read (``.get()``, ``float()``, ``.item()``, ``bool()``, ``cupy.asnumpy``, implicit
conversions), every upload (``cupy.asarray`` of host data) and every launch (kernels,
copies, ``matmul``) recorded; kernels optionally executed on the CPU."""

from __future__ import annotations

import types
from types import SimpleNamespace

import numpy as np


class Recorder:
    def __init__(self) -> None:
        self.reads: list[str] = []
        self.launches: list[str] = []
        self.uploads: list[tuple] = []


class FakeArray:
    """A device array: its data stay on the 'device' (NumPy here) unless read."""

    def __init__(self, data: np.ndarray, rec: Recorder) -> None:
        self._a, self._rec = data, rec

    shape = property(lambda self: self._a.shape)
    ndim = property(lambda self: self._a.ndim)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    flags = property(lambda self: SimpleNamespace(c_contiguous=self._a.flags.c_contiguous))

    def __getitem__(self, key):  # a view: no launch
        return FakeArray(self._a[key], self._rec)

    def min(self):
        self._rec.launches.append("min")
        return FakeArray(np.asarray(self._a.min()), self._rec)

    def max(self):
        self._rec.launches.append("max")
        return FakeArray(np.asarray(self._a.max()), self._rec)

    def reshape(self, *shape):
        return FakeArray(self._a.reshape(*shape), self._rec)

    def __sub__(self, other):
        self._rec.launches.append("subtract")
        return FakeArray(self._a - other, self._rec)

    def __mul__(self, other):  # one elementwise launch (CuPy arrays only, as in the kernels)
        self._rec.launches.append("multiply")
        return FakeArray(self._a * other._a, self._rec)

    def get(self):
        self._rec.reads.append("get")
        return self._a.copy()

    def item(self):
        self._rec.reads.append("item")
        return self._a.item()

    def __float__(self):
        self._rec.reads.append("float")
        return float(self._a)

    def __bool__(self):
        self._rec.reads.append("bool")
        return bool(self._a)

    def __array__(self, *args, **kwargs):  # any implicit conversion is a read
        self._rec.reads.append("array")
        return self._a


def fake_cupy(rec: Recorder, run=None, sms: int = 132) -> types.ModuleType:
    """A stand-in for the ``cupy`` module that records launches and host reads; ``run``
    (``run(code, name, grid, block, args)``), when given, executes each kernel launch on
    the arrays' NumPy buffers."""
    cp = types.ModuleType("cupy")
    cp.ndarray = FakeArray
    cp.float32, cp.float64, cp.int32, cp.int64 = np.float32, np.float64, np.int32, np.int64

    def empty(shape, dtype=np.float64):
        return FakeArray(np.zeros(shape, dtype=dtype), rec)

    def ascontiguousarray(a, dtype=None):
        if a._a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
            return a
        rec.launches.append("copy")
        return FakeArray(np.ascontiguousarray(a._a, dtype=dtype), rec)

    def matmul(a, b):
        rec.launches.append("matmul")
        return FakeArray(a._a @ b._a, rec)

    def asnumpy(a):
        rec.reads.append("asnumpy")
        return a._a.copy()

    class Kernel:
        num_regs = 40

        def __init__(self, code, name):
            self.code, self.name = code, name

        def __call__(self, grid, block, args):
            assert all(not isinstance(a, np.ndarray) for a in args)  # no host arrays
            rec.launches.append(self.name)
            if run is not None:
                bufs = [a._a if isinstance(a, FakeArray) else a for a in args]
                run(self.code, self.name, int(grid[0]), int(block[0]), bufs)

    class RawModule:
        def __init__(self, code, options=()):
            assert "#define TL_FLOAT" in code and "tl_merge" in code
            self.code = code

        def get_function(self, name):
            return Kernel(self.code, name)

    def elementwise(fn, name):
        def op(a):
            rec.launches.append(name)
            return FakeArray(np.asarray(fn(a._a)), rec)

        return op

    for name in ("isfinite", "isnan", "all", "any"):
        setattr(cp, name, elementwise(getattr(np, name), name))

    def full(shape, value, dtype=np.float64):
        rec.launches.append("full")
        return FakeArray(np.full(shape, value, dtype=dtype), rec)

    def zeros(shape, dtype=np.float64):
        rec.launches.append("zeros")
        return FakeArray(np.zeros(shape, dtype=dtype), rec)

    def stack(arrays, axis=0):
        rec.launches.append("stack")
        return FakeArray(np.stack([a._a for a in arrays], axis=axis), rec)

    def asarray(a, dtype=None):
        if isinstance(a, FakeArray):  # already on the device
            if dtype is None or np.dtype(dtype) == a.dtype:
                return a
            rec.launches.append("copy")
            return FakeArray(a._a.astype(dtype), rec)
        host = np.array(a, dtype=dtype, copy=True)
        rec.uploads.append(host.shape)
        return FakeArray(host, rec)

    def unique(a, return_inverse=False):
        # CuPy reads the number of distinct values to size its result
        rec.launches.append("unique")
        rec.reads.append("unique")
        u, inverse = np.unique(a._a, return_inverse=True)
        u = FakeArray(u, rec)
        return (u, FakeArray(inverse.reshape(-1), rec)) if return_inverse else u

    cp.full, cp.zeros, cp.stack, cp.asarray = full, zeros, stack, asarray
    cp.ones_like = lambda a: full(a.shape, 1, dtype=a.dtype)
    cp.unique = unique
    cp.uint64 = np.uint64
    cp.empty = empty
    cp.empty_like = lambda a: empty(a.shape, a.dtype)
    cp.ascontiguousarray = ascontiguousarray
    cp.matmul = matmul
    cp.asnumpy = asnumpy
    cp.RawModule = RawModule
    cp.cuda = SimpleNamespace(
        Device=lambda: SimpleNamespace(id=0, attributes={"MultiProcessorCount": sms})
    )
    return cp

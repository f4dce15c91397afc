"""Host reads and kernel launches per CuPy evaluation, counted on the CPU with a
recording stand-in for CuPy (no GPU): the fused value and gradient, ``tilted_risk`` and
``tilted_weights`` each make at most one device-to-host read and a fixed number of
launches, whatever the data size."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from tiltlab._cupy import engine as cuda_engine
from tiltlab._cupy import reductions, source
from tiltlab.losses import get_loss
from tiltlab.objective.engines import Context


class Recorder:
    def __init__(self) -> None:
        self.reads: list[str] = []
        self.launches: list[str] = []


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

    def reshape(self, *shape):
        return FakeArray(self._a.reshape(*shape), self._rec)

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


def fake_cupy(rec: Recorder) -> types.ModuleType:
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

        def __init__(self, name):
            self.name = name

        def __call__(self, grid, block, args):
            assert all(not isinstance(a, np.ndarray) for a in args)  # no host arrays
            rec.launches.append(self.name)

    class RawModule:
        def __init__(self, code, options=()):
            assert "#define TL_FLOAT" in code and "tl_merge" in code

        def get_function(self, name):
            return Kernel(name)

    cp.empty = empty
    cp.empty_like = lambda a: empty(a.shape, a.dtype)
    cp.ascontiguousarray = ascontiguousarray
    cp.matmul = matmul
    cp.asnumpy = asnumpy
    cp.RawModule = RawModule
    cp.cuda = SimpleNamespace(
        Device=lambda: SimpleNamespace(attributes={"MultiProcessorCount": 132})
    )
    return cp


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(r))
    monkeypatch.setattr(source, "_MODULES", {})
    return r


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "d"), [(10, 1), (100_000, 16), (5003, 128), (64, 1024)])
@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_value_and_gradient_budget(rec, dtype, n, d, l2):
    cp = sys.modules["cupy"]
    X = FakeArray(np.zeros((n, d), dtype), rec)
    y = FakeArray(np.zeros(n, dtype), rec)
    theta = FakeArray(np.zeros(d, dtype), rec)
    problem = SimpleNamespace(
        is_linear=True,
        groups=None,
        weights=None,
        loss=get_loss("logistic"),
        X=X,
        y=y,
        tilts=[2.0],
        shape=(d,),
        l2=l2,
        xp=cp,
    )
    assert cuda_engine.FUSED_CUDA.applies(problem)
    ctx = Context(count=lambda k: None, update=lambda p: None)
    out = cuda_engine.FUSED_CUDA.value_and_gradient(problem, theta, ctx)
    assert out is not None
    value, grad = out
    assert isinstance(value, FakeArray) and value.shape == ()
    assert isinstance(grad, FakeArray) and grad.shape == (d,)
    assert len(rec.reads) <= 1, rec.reads
    assert rec.launches == ["tilted_vg", "tilted_vg_finish", "matmul"], rec.launches


def test_value_and_gradient_declines_on_a_bad_status(rec, monkeypatch):
    # the status (written by the finish kernel) says a loss was not finite: decline
    cp = sys.modules["cupy"]
    orig = cp.empty

    def empty(shape, dtype=np.float64):
        a = orig(shape, dtype)
        if shape == 2:
            a._a[1] = 1.0
        return a

    monkeypatch.setattr(cp, "empty", empty)
    X = FakeArray(np.zeros((10, 3)), rec)
    z = FakeArray(np.zeros(10), rec)
    out = cuda_engine.value_and_gradient(X, z, FakeArray(np.zeros(3), rec), 1.0, "squared")
    assert out is None and len(rec.reads) == 1


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("n", [1, 1000, 10**6])
def test_risk_and_weights_budget(rec, check, n):
    l = FakeArray(np.zeros(n, np.float32), rec)
    r = reductions.tilted_risk(l, 2.0, check_finite=check)
    assert isinstance(r, FakeArray) and r.shape == ()
    assert rec.launches == ["tilted_state_blocks", "tilted_state_finish"]
    assert len(rec.reads) == (1 if check else 0), rec.reads
    rec.launches.clear()
    rec.reads.clear()
    w = reductions.tilted_weights(l, -0.5, check_finite=check)
    assert isinstance(w, FakeArray) and w.shape == (n,)
    assert rec.launches == ["tilted_state_blocks", "tilted_state_finish", "tilted_weights_apply"]
    assert len(rec.reads) == (1 if check else 0), rec.reads


def test_risk_declines_what_it_does_not_serve(rec):
    l = FakeArray(np.zeros(10), rec)
    assert reductions.tilted_risk(l, 0.0) is None  # the exact mean: the generic path
    assert reductions.tilted_risk(l, float("inf")) is None
    assert reductions.tilted_risk(l, 1.0, weights=l) is None
    assert reductions.tilted_risk(FakeArray(np.zeros((2, 5)), rec), 1.0) is None
    assert reductions.tilted_weights(FakeArray(np.zeros(0), rec), 1.0) is None
    assert reductions.tilted_risk(np.zeros(10), 1.0) is None  # not a device array
    assert rec.launches == [] and rec.reads == []

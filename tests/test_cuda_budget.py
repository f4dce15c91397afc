"""Host reads and kernel launches per CuPy evaluation, counted on the CPU with a
recording stand-in for CuPy (no GPU): the fused value and gradient, ``tilted_risk`` and
``tilted_weights`` each make at most one device-to-host read and a fixed number of
launches, whatever the data size."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from cuda_fake import FakeArray, Recorder, fake_cupy

from tiltlab._cupy import engine as cuda_engine
from tiltlab._cupy import reductions, source
from tiltlab.losses import get_loss
from tiltlab.objective.engines import Context


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
    assert rec.launches == ["tilted_vg", "tilted_vg_finish", "tilted_vg_grad"], rec.launches


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
    assert rec.launches == ["tilted_extremes_blocks", "tilted_sums_blocks", "tilted_state_finish"]
    assert len(rec.reads) == (1 if check else 0), rec.reads
    rec.launches.clear()
    rec.reads.clear()
    w = reductions.tilted_weights(l, -0.5, check_finite=check)
    assert isinstance(w, FakeArray) and w.shape == (n,)
    assert rec.launches == [
        "tilted_extremes_blocks",
        "tilted_sums_blocks",
        "tilted_state_finish",
        "tilted_weights_apply",
    ]
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


def test_the_cupy_backend_is_registered_lazily_in_one_module():
    # import tiltlab loads no CuPy code; the first CuPy lookup of any table loads the one
    # backend package, which fills every table
    import subprocess

    code = (
        "import sys, tiltlab\n"
        "from tiltlab.accumulator import EXTREMES\n"
        "from tiltlab.objective.engines import ENGINES\n"
        "from tiltlab.risk._dispatch import TILTED_RISK, TILTED_WEIGHTS\n"
        "assert 'tiltlab._cupy' not in sys.modules and 'cupy' not in sys.modules\n"
        "impl = TILTED_RISK.lookup('cupy')\n"
        "import tiltlab._cupy as b\n"
        "assert impl is b.reductions.tilted_risk\n"
        "assert TILTED_WEIGHTS.lookup('cupy') is b.reductions.tilted_weights\n"
        "assert EXTREMES.lookup('cupy') is b.reductions.extremes\n"
        "assert ENGINES.lookup('cupy') is b.engine.FUSED_CUDA\n"
        "from tiltlab.risk._dispatch import HIERARCHICAL_RISK\n"
        "assert HIERARCHICAL_RISK.lookup('cupy') is b.reductions.hierarchical_risk\n"
        "from tiltlab.risk._dispatch import HIERARCHICAL_WEIGHTS\n"
        "assert HIERARCHICAL_WEIGHTS.lookup('cupy') is b.reductions.hierarchical_weights\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_launch_sizes_match_the_kernels():
    # the kernels size their shared memory by these macros; the launches must agree
    import re

    text = source.kernels()

    def macro(name):
        return int(re.search(rf"#\s*define {name} (\d+)", text).group(1))

    assert macro("TL_FINISH_THREADS") == cuda_engine.FINISH_THREADS == reductions.FINISH_THREADS
    assert macro("TL_BLOCK_THREADS") == reductions.BLOCK_THREADS
    assert cuda_engine.THREADS % 32 == 0  # whole warps: the epilogue writes one state each


def _hierarchical_problem(rec, n, d, labels, tilts, l2, prior=None, cache=None):
    from tiltlab.risk import build_tree

    dtype = np.float32
    return SimpleNamespace(
        is_linear=True,
        groups=labels,
        tree=build_tree(labels, n),
        weights=prior,
        prior=None if prior is None else FakeArray(prior.astype(dtype), rec),
        loss=get_loss("logistic"),
        X=FakeArray(np.zeros((n, d), dtype), rec),
        y=FakeArray(np.zeros(n, dtype), rec),
        tilts=tuple(tilts),
        shape=(d,),
        l2=l2,
        dtype=np.dtype(dtype),
        cache={} if cache is None else cache,
    )


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("l2", [0.0, 0.5])
@pytest.mark.parametrize("with_prior", [False, True])
def test_hierarchical_value_and_gradient_budget(rec, depth, l2, with_prior):
    # the group tree goes to the device once (codes and masses: two uploads; with a
    # prior, one read of it); every evaluation is then a fixed list of launches and one
    # read, uploads nothing, whatever the number of samples and groups
    n, d = 10_000, 8
    labels = [np.arange(n) % 1000 // 10**k for k in range(depth)][::-1]
    prior = np.full(n, 1.0 / n) if with_prior else None
    tilts = [1.0, -2.0, 0.5, 3.0][: depth + 1]
    problem = _hierarchical_problem(rec, n, d, labels, tilts, l2, prior)
    assert cuda_engine.FUSED_CUDA.applies(problem)
    ctx = Context(count=lambda k: None, update=lambda p: None)
    theta = FakeArray(np.zeros(d, np.float32), rec)
    per_level = ["tilted_level_extremes", "tilted_level_sums", "tilted_level_finish"]
    want = (
        ["matmul", "tilted_loss_d1", "tilted_tree_init"]
        + per_level * (depth - 1)
        + per_level[:2]
        + ["tilted_tree_top"]
        + ["tilted_level_weights"] * depth
        + ["matmul"]
        + (["tilted_ridge"] if l2 else [])
    )
    for call in range(3):
        out = cuda_engine.FUSED_CUDA.value_and_gradient(problem, theta, ctx)
        assert out is not None
        value, grad = out
        assert value.shape == () and grad.shape == (d,)
        assert rec.launches == want, rec.launches
        build_read = 1 if with_prior and call == 0 else 0
        assert len(rec.reads) == 1 + build_read, rec.reads
        assert len(rec.uploads) == (2 if call == 0 else 0), rec.uploads
        rec.launches.clear()
        rec.reads.clear()
        rec.uploads.clear()
    # another tilt shares the problem's cache (the data and the tree): nothing uploaded
    other = _hierarchical_problem(rec, n, d, labels, [0.0] * (depth + 1), l2, cache=problem.cache)
    other.tree = problem.tree
    assert cuda_engine.FUSED_CUDA.value_and_gradient(other, theta, ctx) is not None
    assert rec.uploads == [] and len(rec.reads) == 1


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("l2", [0.0, 0.5])
def test_hierarchical_value_and_hvp_budget(rec, depth, l2):
    # the value alone: no weights, no product with X^T; the Hessian-vector product: one
    # product with [theta v], the weights, two launches per level, one product with X^T;
    # each one read, no upload after the tree's
    n, d = 10_000, 8
    labels = [np.arange(n) % 1000 // 10**k for k in range(depth)][::-1]
    tilts = [1.0, -2.0, 0.5, 3.0][: depth + 1]
    problem = _hierarchical_problem(rec, n, d, labels, tilts, l2)
    ctx = Context(count=lambda k: None, update=lambda p: None)
    theta = FakeArray(np.zeros(d, np.float32), rec)
    v = FakeArray(np.ones(d, np.float32), rec)
    per_level = ["tilted_level_extremes", "tilted_level_sums", "tilted_level_finish"]
    tree = ["tilted_tree_init"] + per_level * (depth - 1) + per_level[:2] + ["tilted_tree_top"]
    ridge = ["tilted_ridge"] if l2 else []
    want_value = ["matmul", "tilted_loss_d1"] + tree + ridge
    want_hvp = (
        ["stack", "matmul", "tilted_loss_d12"]
        + tree
        + ["tilted_level_weights"] * depth
        + ["zeros"]
        + ["tilted_level_add2", "tilted_hvp_level"] * depth
        + ["tilted_level_add2", "tilted_hvp_coef", "matmul"]
        + ridge
    )
    for call in range(2):
        value = cuda_engine.FUSED_CUDA.value(problem, theta, ctx)
        assert value is not None and value.shape == ()
        assert rec.launches == want_value, rec.launches
        assert len(rec.reads) == 1, rec.reads
        assert len(rec.uploads) == (2 if call == 0 else 0), rec.uploads
        rec.launches.clear()
        rec.reads.clear()
        rec.uploads.clear()
        prod = cuda_engine.FUSED_CUDA.hvp(problem, theta, v, ctx)
        assert prod is not None and prod.shape == (d,)
        assert rec.launches == want_hvp, rec.launches
        assert len(rec.reads) == 1 and rec.uploads == [], (rec.reads, rec.uploads)
        rec.launches.clear()
        rec.reads.clear()
    # an infinite tilt: no Hessian; the engine declines before any launch
    inf = _hierarchical_problem(rec, n, d, labels, [math.inf] + tilts[1:], l2)
    assert cuda_engine.FUSED_CUDA.hvp(inf, theta, v, ctx) is None
    assert rec.launches == [] and rec.reads == []


def test_hierarchical_engine_declines_what_it_does_not_serve(rec):
    labels = [np.arange(100) % 4]
    p = _hierarchical_problem(rec, 100, 3, labels, (1.0, 1.0), 0.0)
    assert cuda_engine.FUSED_CUDA.applies(p)
    for change in (
        {"loss": get_loss("multinomial")},
        {"X": FakeArray(np.zeros((100, 3), np.float16), rec)},
        {"X": FakeArray(np.zeros((100, 3), np.float32).T.copy().T, rec)},
        {"X": np.zeros((100, 3), np.float32)},
        {"shape": (3, 2)},
    ):
        q = SimpleNamespace(**{**vars(p), **change})
        assert not cuda_engine.FUSED_CUDA.applies(q), change
    ctx = Context(count=lambda k: None, update=lambda p: None, fused=False)
    zero = FakeArray(np.zeros(3), rec)
    assert cuda_engine.FUSED_CUDA.value_and_gradient(p, zero, ctx) is None
    assert cuda_engine.FUSED_CUDA.value(p, zero, ctx) is None
    assert cuda_engine.FUSED_CUDA.hvp(p, zero, zero, ctx) is None
    assert rec.launches == [] and rec.uploads == []


def test_driver_lookups_happen_once_per_process(rec, monkeypatch):
    # the kernels, their register counts and the device's multiprocessor count are
    # asked of the driver on the first evaluation only (CuPy's Device.attributes reads
    # every attribute of the device at each access); later evaluations only launch
    cp = sys.modules["cupy"]
    asked = []
    make_device = cp.cuda.Device
    monkeypatch.setattr(cp.cuda, "Device", lambda: asked.append("device") or make_device())
    lookup = cp.RawModule.get_function
    monkeypatch.setattr(
        cp.RawModule, "get_function", lambda self, name: asked.append(name) or lookup(self, name)
    )
    X = FakeArray(np.ones((50, 3), np.float32), rec)
    y = FakeArray(np.zeros(50, np.float32), rec)
    theta = FakeArray(np.zeros(3, np.float32), rec)
    losses = FakeArray(np.linspace(0.0, 1.0, 50).astype(np.float32), rec)
    for _ in range(2):
        del asked[:]
        assert cuda_engine.value_and_gradient(X, y, theta, 2.0, "logistic") is not None
        reductions.tilted_weights(losses, 0.5)
    assert asked == ["device"], asked  # the second round: the current device's id only

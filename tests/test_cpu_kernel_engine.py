"""The fused CPU engine within the objective's engine chain: what it hands on to the next
engine (data it cannot serve, numba that does not import or compile, the switch), checked
against the generic path and an independent NumPy reference."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.special as sps

from tiltlab import TiltedObjective
from tiltlab import _cpu_kernels as ck
from tiltlab.objective.engines import engines_for

N, D = 4096, 64  # 2^18 entries of X: large enough for the fused engine


def _data(loss, dtype, seed=0, n=N):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, D)).astype(dtype)
    theta = (0.1 * rng.standard_normal(D)).astype(dtype)
    if loss == "logistic":
        y = (rng.random(n) < 0.4).astype(dtype)
    else:
        y = (X.astype(np.float64) @ theta + rng.standard_normal(n)).astype(dtype)
    return X, y, theta


def _reference(loss, X, y, theta, t):
    """Tilted risk and gradient in float64 from the definitions (scipy's logsumexp)."""
    X, y, theta = (a.astype(np.float64) for a in (X, y, theta))
    z = X @ theta
    if loss == "logistic":
        ell, d1 = np.logaddexp(0.0, z) - y * z, sps.expit(z) - y
    else:
        ell, d1 = (z - y) ** 2, 2 * (z - y)
    if t == 0.0:
        return ell.mean(), X.T @ d1 / len(y)
    w = sps.softmax(t * ell)
    return sps.logsumexp(t * ell, b=1 / len(y)) / t, X.T @ (w * d1)


def _generic(loss, X, y, t, theta):
    obj = TiltedObjective(loss, X, y, t=t)
    obj.fused = False
    return obj.value_and_gradient(theta)


def _check(loss, X, y, t, theta, got, rtol):
    value, grad = got
    ref_value, ref_grad = _reference(loss, X, y, theta, t)
    np.testing.assert_allclose(float(value), ref_value, rtol=rtol)
    np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=rtol * np.abs(ref_grad).max())


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("t", [0.0, 1.5, -2.0])
def test_float16_data_is_handed_on_to_the_generic_path(loss, t):
    X, y, theta = _data(loss, np.float16)
    obj = TiltedObjective(loss, X, y, t=t)
    assert all(e.name != "fused CPU" for e in engines_for(obj.problem))
    value, grad = obj.value_and_gradient(theta)  # raised TypeError on float16 data
    assert value.dtype == np.float16 and grad.dtype == np.float16
    ref_value, ref_grad = _generic(loss, X, y, t, theta)
    assert float(value) == float(ref_value)
    np.testing.assert_array_equal(grad, ref_grad)
    _check(loss, X, y, t, theta, (value, grad), rtol=2e-2)  # float16 arithmetic
    np.testing.assert_array_equal(
        obj.hvp(theta, theta), TiltedObjective(loss, X, y, t=t).hvp(theta, theta)
    )


def test_data_the_kernels_reject_is_handed_on(monkeypatch):
    """Whatever the kernels' own checks refuse goes to the next engine, not to the user."""
    monkeypatch.setenv(ck.SWITCH, "wait")
    X, y, theta = _data("squared", np.float64)

    def refuse(*args, **kwargs):
        raise TypeError("`X`: not for these kernels")

    monkeypatch.setattr(ck.engine, "FusedProblem", refuse)
    obj = TiltedObjective("squared", X, y, t=1.0)
    assert engines_for(obj.problem)[0].name == "fused CPU"
    got = obj.value_and_gradient(theta)
    ref = _generic("squared", X, y, 1.0, theta)
    assert float(got[0]) == float(ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_the_environment_switch_turns_the_engine_off(monkeypatch, value):
    X, y, theta = _data("squared", np.float32)
    monkeypatch.setenv(ck.SWITCH, value)
    assert not ck.available() and ck.switched_off()
    obj = TiltedObjective("squared", X, y, t=1.5)
    assert all(e.name != "fused CPU" for e in engines_for(obj.problem))
    got = obj.value_and_gradient(theta)
    _check("squared", X, y, 1.5, theta, got, rtol=1e-4)
    monkeypatch.setenv(ck.SWITCH, "1")
    assert not ck.switched_off()


def test_with_the_switch_off_numba_is_never_imported():
    code = (
        "import sys, numpy as np, tiltlab\n"
        "X = np.random.default_rng(0).standard_normal((4096, 64)); y = X[:, 0]\n"
        "obj = tiltlab.TiltedObjective('squared', X, y, t=1.0)\n"
        "obj.value_and_gradient(np.zeros(64)); obj.hvp(np.zeros(64), np.ones(64))\n"
        "print('numba' in sys.modules)"
    )
    env = dict(os.environ, **{ck.SWITCH: "0"})
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"


class _BrokenNumba(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An installed numba whose import fails (say, a mismatched llvmlite)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "numba" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError("simulated: numba does not import")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_numba_that_does_not_import_falls_back(monkeypatch, dtype):
    monkeypatch.setenv(ck.SWITCH, "wait")  # the engine calls the kernels at once
    monkeypatch.setattr(ck._launch, "_BROKEN", [])
    monkeypatch.delitem(sys.modules, "numba", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenNumba(), *sys.meta_path])
    assert ck.available()  # installed, as far as the policy can tell
    X, y, theta = _data("logistic", dtype)
    obj = TiltedObjective("logistic", X, y, t=2.0)
    with pytest.warns(RuntimeWarning, match="TILTLAB_FUSED=0"):
        got = obj.value_and_gradient(theta)
    _check("logistic", X, y, 2.0, theta, got, rtol=1e-10 if dtype == np.float64 else 1e-4)
    assert not ck.available()  # not tried again in this process
    again = TiltedObjective("logistic", X, y, t=2.0)
    assert all(e.name != "fused CPU" for e in engines_for(again.problem))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_kernel_that_does_not_compile_falls_back(monkeypatch, dtype):
    numba = pytest.importorskip("numba")
    monkeypatch.setenv(ck.SWITCH, "wait")
    monkeypatch.setattr(ck._launch, "_BROKEN", [])
    calls = []

    def fails(*args):
        calls.append(1)
        raise numba.core.errors.TypingError("simulated: cannot compile")

    kernels = SimpleNamespace(
        STATE_COLS=9, vg_scalar=fails, hvp_scalar=fails, vg_multi=fails, hvp_multi=fails
    )
    monkeypatch.setattr(ck.fused, "_kernels", lambda: kernels)
    X, y, theta = _data("squared", dtype)
    obj = TiltedObjective("squared", X, y, t=-1.0)
    with pytest.warns(RuntimeWarning, match="cannot compile"):
        got = obj.value_and_gradient(theta)
    tried = len(calls)  # once per thread that ran a share of the chunks
    assert tried >= 1
    _check("squared", X, y, -1.0, theta, got, rtol=1e-10 if dtype == np.float64 else 1e-4)
    ref = _generic("squared", X, y, -1.0, theta)
    np.testing.assert_allclose(got[1], ref[1], rtol=0, atol=0)
    hv = obj.hvp(theta, theta)  # declined without another try
    assert len(calls) == tried
    np.testing.assert_array_equal(hv, TiltedObjective("squared", X, y, t=-1.0).hvp(theta, theta))


def test_other_errors_of_a_kernel_are_not_hidden(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv(ck.SWITCH, "wait")
    monkeypatch.setattr(ck._launch, "_BROKEN", [])

    def fails(*args):
        raise MemoryError("simulated")

    kernels = SimpleNamespace(STATE_COLS=9, vg_scalar=fails)
    monkeypatch.setattr(ck.fused, "_kernels", lambda: kernels)
    X, y, theta = _data("squared", np.float64)
    with pytest.raises(MemoryError):
        TiltedObjective("squared", X, y, t=1.0).value_and_gradient(theta)
    assert ck.available()


_BACKGROUND = """
import sys
import numpy as np
import tiltlab
from tiltlab._cpu_kernels import warmup as _warm

rng = np.random.default_rng(0)
X = rng.standard_normal((4096, 64)).astype(np.float32)
y = X[:, 0] + rng.standard_normal(4096).astype(np.float32)
theta = np.full(64, 0.01, dtype=np.float32)
ref = tiltlab.TiltedObjective("squared", X, y, t=1.0)
ref.fused = False
r = ref.value_and_gradient(theta)
first = tiltlab.TiltedObjective("squared", X, y, t=1.0)
f = first.value_and_gradient(theta)
print(float(f[0]) == float(r[0]) and bool(np.all(f[1] == r[1])))  # served by NumPy
print("numba" in sys.modules)  # and numba not even imported
print(_warm.wait("vg_scalar-float32", 1200))
second = tiltlab.TiltedObjective("squared", X, y, t=1.0)
s = second.value_and_gradient(theta)
from tiltlab._cpu_kernels import _scalar

stats = _scalar.vg_scalar.stats
print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))  # loaded, not compiled
print(float(abs(s[0] - r[0]) / abs(r[0])), float(np.abs(s[1] - r[1]).max() / np.abs(r[1]).max()))
g = first.value_and_gradient(theta)  # the first objective keeps its engine
print(float(g[0]) == float(r[0]) and bool(np.all(g[1] == r[1])))
"""


@pytest.mark.slow
def test_a_missing_kernel_is_compiled_in_the_background(tmp_path):
    """With an empty cache the first problem is served by NumPy while another process
    compiles the kernel into the cache; a later problem loads it from there."""
    pytest.importorskip("numba")
    env = {k: v for k, v in os.environ.items() if k != ck.SWITCH}
    env.update(NUMBA_CACHE_DIR=str(tmp_path), NUMBA_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _BACKGROUND], capture_output=True, text=True, check=True, env=env
    )
    lines = out.stdout.split()
    assert lines[:3] == ["True", "False", "True"], out.stdout
    assert int(lines[3]) >= 1 and int(lines[4]) == 0, out.stdout
    assert float(lines[5]) < 1e-5 and float(lines[6]) < 1e-4, out.stdout
    assert lines[7] == "True", out.stdout
    assert any(tmp_path.rglob("vg_scalar-float32.ready"))


@pytest.mark.slow
def test_the_background_process_compiles_the_grouped_kernels(tmp_path):
    """``python -m tiltlab._cpu_kernels KEY`` compiles the grouped kernels (which
    Dask hierarchies use) into the cache and marks them ready, as it does the others."""
    pytest.importorskip("numba")
    env = {k: v for k, v in os.environ.items() if k != ck.SWITCH}
    env.update(NUMBA_CACHE_DIR=str(tmp_path), NUMBA_NUM_THREADS="1")
    for name in ("group_scalar-float32", "group_multi-float64"):
        subprocess.run(
            [sys.executable, "-m", "tiltlab._cpu_kernels", name],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        assert any(tmp_path.rglob(f"{name}.ready")), name
        assert not any(tmp_path.rglob(f"{name}.compiling")), name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_any_number_of_threads_gives_the_same_bits(monkeypatch, dtype):
    """Threads take contiguous ranges of the row chunks (which depend on the rows only):
    1 to 7 threads over 9 chunks give identical results, and those match the reference."""
    pytest.importorskip("numba")
    X, y, theta = _data("logistic", dtype, seed=3, n=4700)  # 9 chunks of 522-523 rows
    assert ck.default_chunks(len(y)) == 9
    outs = []
    for n in (1, 2, 3, 4, 7):
        monkeypatch.setattr(ck._launch, "threads", lambda n=n: n)
        value, grad = ck.fused_value_and_gradient("logistic", X, y, theta, 3.0)
        hv = ck.fused_hvp("logistic", X, y, theta, theta, 3.0)
        outs.append((value, grad, hv))
    for other in outs[1:]:
        for a, b in zip(outs[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    _check("logistic", X, y, 3.0, theta, outs[0][:2], rtol=1e-10 if dtype == np.float64 else 1e-4)


def test_one_process_compiles_a_kernel_at_a_time(tmp_path, monkeypatch):
    """The processes of a pool share the cache: the second asking for a kernel waits for
    the first one's compilation; a lock left by a process that died is taken over."""
    from tiltlab._cpu_kernels import _cache
    from tiltlab._cpu_kernels import warmup as _warm

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    _cache.cache_folder().mkdir(parents=True)
    assert _warm._claim("vg_scalar-float64")
    assert not _warm._claim("vg_scalar-float64")  # another process compiles it
    assert _warm._claim("hvp_scalar-float64")
    lock = _cache.cache_folder() / ("vg_scalar-float64" + _warm.LOCK_SUFFIX)
    old = lock.stat().st_mtime - 2 * _warm.LOCK_SECONDS
    os.utime(lock, (old, old))
    assert _warm._claim("vg_scalar-float64")  # stale: taken over
    _warm._release("vg_scalar-float64")
    assert not lock.exists()

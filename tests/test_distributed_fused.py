"""Dask chunks evaluated by compiled engines (tiltlab.distributed._chunk_engine).

NumPy chunks of a sample-level Dask objective take the fused CPU kernels (one pass per
chunk giving its tilted state and sums); chunks of another library take the objective
engine registered for it. References are independent of the route under test: the eager
NumPy objective on the generic array-API engine (``fused = False``: another algorithm, no
chunk states), closed forms in float64 with SciPy's ``logsumexp``, and the Dask objective
with the route off. The route's use is checked by counting its calls.
"""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
special = pytest.importorskip("scipy.special")

from tiltlab._cpu_kernels import LOSS_CODES, available  # noqa: E402
from tiltlab.distributed import _chunk_engine as ce  # noqa: E402

needs_numba = pytest.mark.skipif(not available(), reason="the fused kernels need numba")

#: 4096 x 64: the fused engine's size policy serves it; uneven chunks with an empty one
N, D = 4096, 64
CHUNKS = (1500, 0, 1296, 1300)


def _data(loss, dtype, seed=0, n=N, d=D):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    if loss == "multinomial":
        y = rng.integers(0, 3, size=n)
        shape = (d, 3)
    elif loss in ("logistic", "hinge", "squared_hinge"):
        y = (rng.uniform(size=n) < 0.5).astype(dtype)
        shape = (d,)
    else:
        y = rng.standard_normal(n).astype(dtype)
        shape = (d,)
    th = (0.1 * rng.standard_normal(shape)).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    return X, y, th, v


def _dask(a):
    return da.from_array(a, chunks=(CHUNKS,) + a.shape[1:])


@pytest.fixture
def route_calls(monkeypatch):
    """Counts the chunks the NumPy route serves (it declines by returning DECLINE)."""
    calls = {"served": 0, "asked": 0}
    inner = ce.numpy_state

    def counting(*args):
        calls["asked"] += 1
        out = inner(*args)
        calls["served"] += out is not ce.DECLINE
        return out

    monkeypatch.setitem(ce.STATE_ROUTES._impls, "numpy", counting)
    return calls


def _tol(dtype):
    # float64: sums of a few thousand terms; float32: the kernels' float32 losses and
    # weights (about one rounding each) against float64 references of the same data
    return 1e-12 if dtype == np.float64 else 2e-5


def _close(got, want, dtype, scale=None):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.abs(want).max() if scale is None else scale
    assert np.abs(got - want).max() <= _tol(dtype) * max(scale, 1e-30)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("loss", sorted(LOSS_CODES))
@pytest.mark.parametrize("t", [0.0, 1e-9, 0.7, -3.0])
def test_fused_chunks_match_the_numpy_objective(loss, dtype, t, route_calls):
    X, y, th, v = _data(loss, dtype)
    ref = tl.TiltedObjective(loss, X, y, t=t, l2=1e-2)
    ref.fused = False  # the generic array-API engine: no compiled code, no chunk states
    obj = tl.TiltedObjective(loss, _dask(X), _dask(y), t=t, l2=1e-2)
    f, g = dask.compute(*obj.value_and_gradient(th))
    hv, val = dask.compute(obj.hvp(th, v), obj.value(th))
    assert route_calls["served"] == 3 * 3  # three non-empty chunks, three evaluations
    assert g.dtype == dtype and hv.dtype == dtype and g.shape == th.shape
    f0, g0 = ref.value_and_gradient(th)
    _close(f, f0, dtype)
    _close(val, f0, dtype)
    _close(g, g0, dtype)
    _close(hv, ref.hvp(th, v), dtype)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", [0.0, 2.0, -1.5])
def test_fused_chunks_closed_form_with_prior_weights(dtype, t, route_calls):
    """Logistic value and gradient against the closed form (float64 logsumexp) with prior
    weights, one chunk of all-zero weights and a ridge term."""
    X, y, th, _ = _data("logistic", dtype, seed=3)
    w = np.random.default_rng(4).uniform(0.2, 2.0, size=N)
    w[1500:2796] = 0.0  # the third chunk has no prior mass (the generic route's EMPTY)
    obj = tl.TiltedObjective("logistic", _dask(X), _dask(y), t=t, weights=_dask(w), l2=0.1)
    f, g = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["served"] == 2 and route_calls["asked"] == 4  # empty, no mass: declined
    Xf, yf, tf = X.astype(np.float64), y.astype(np.float64), th.astype(np.float64)
    z = Xf @ tf
    ell = np.logaddexp(0.0, z) - yf * z
    d1 = special.expit(z) - yf
    p = w / w.sum()
    if t == 0.0:
        R, wt = float(np.sum(p * ell)), p
    else:
        lse = special.logsumexp(t * ell, b=p)
        R = float(lse / t)
        wt = p * np.exp(t * ell - lse)
    R += 0.05 * float(np.sum(tf * tf))
    grad = Xf.T @ (wt * d1) + 0.1 * tf
    _close(f, R, dtype)
    _close(g, grad, dtype)


@needs_numba
def test_fused_setting_off_takes_the_generic_route(route_calls):
    X, y, th, v = _data("huber", np.float64, seed=5)
    obj = tl.TiltedObjective("huber", _dask(X), _dask(y), t=1.3)
    obj.fused = False
    f, g = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["asked"] == 0
    obj.fused = True
    f1, g1 = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["served"] == 3
    _close(f1, f, np.float64)
    _close(g1, g, np.float64)


@needs_numba
def test_non_finite_losses_and_small_problems_go_to_the_generic_route(route_calls):
    X, y, th, _ = _data("squared", np.float64, seed=6)
    obj = tl.TiltedObjective("squared", _dask(X), _dask(y), t=2.0)
    from tiltlab.distributed import ClientObjective

    with np.errstate(over="ignore", invalid="ignore"):
        value = ClientObjective(obj).value(np.full(D, 1e160))  # overflowing losses
    assert route_calls["asked"] == 4 and route_calls["served"] == 0
    assert value == np.inf
    small = tl.TiltedObjective(
        "squared",
        da.from_array(X[:100, :4], chunks=(50, 4)),
        da.from_array(y[:100], chunks=50),
        t=2.0,
    )
    ref = tl.TiltedObjective("squared", X[:100, :4], y[:100], t=2.0)
    f, g = dask.compute(*small.value_and_gradient(np.zeros(4)))
    assert route_calls["asked"] == 4  # below the fused engine's size policy: not asked
    f0, g0 = ref.value_and_gradient(np.zeros(4))
    _close(f, f0, np.float64)
    _close(g, g0, np.float64)


@needs_numba
def test_bound_chunks_are_cached_and_validated_once(monkeypatch):
    """A chunk's data are bound once per worker process; labels the kernels do not take
    (non-binary targets of the logistic loss) are declined, not refused."""
    from tiltlab import _cpu_kernels

    X, y, th, _ = _data("logistic", np.float64, seed=7, n=3000)
    made = []
    real = _cpu_kernels.FusedProblem

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_cpu_kernels, "FusedProblem", counting)
    monkeypatch.setattr(ce, "_BOUND", type(ce._BOUND)())
    loss = tl.losses.get_loss("logistic")
    for _ in range(3):
        st = ce.numpy_state(X, y, None, th, None, loss, 1.0, "grad")
    assert len(made) == 1 and st is not ce.DECLINE
    y_bad = y.copy()
    y_bad[0] = 0.5
    assert ce.numpy_state(X, y_bad, None, th, None, loss, 1.0, "grad") is ce.DECLINE
    assert ce.numpy_state(X, y, None, th, None, loss, 1.0, "hess") is ce.DECLINE

"""Dask chunks evaluated by compiled engines (tiltlab.distributed._chunk_engine).

NumPy chunks of a sample-level Dask objective take the fused CPU kernels (one pass per
chunk giving its tilted state and sums); chunks of another library take the objective
engine registered for it. References are independent of the route under test: the eager
NumPy objective on the generic array-API engine (``fused = False``: another algorithm, no
chunk states), closed forms in float64 with SciPy's ``logsumexp``, and the Dask objective
with the route off. The route's use is checked by counting its calls.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
special = pytest.importorskip("scipy.special")

from tiltlab._cpu_kernels import LOSS_CODES, available  # noqa: E402
from tiltlab._cpu_kernels import dask_chunks as nc  # noqa: E402
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
    elif loss == "poisson":  # counts, zeros included
        y = rng.poisson(1.0, size=n).astype(dtype)
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
    route = ce.CHUNK_ROUTES.lookup("numpy")
    inner = route.state

    def counting(*args):
        calls["asked"] += 1
        out = inner(*args)
        calls["served"] += out is not ce.DECLINE
        return out

    monkeypatch.setitem(ce.CHUNK_ROUTES._impls, "numpy", replace(route, state=counting))
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


@pytest.fixture
def background(monkeypatch):
    """The default compile mode with a recording stand-in for the background process: the
    kernels named in ``ready`` count as cached, ``started`` lists the compilations asked
    for (none is run)."""
    from tiltlab._cpu_kernels import warmup as _warm

    rec = {"ready": set(), "started": []}
    monkeypatch.setenv(_warm.SWITCH, "")
    monkeypatch.setattr(_warm, "ready", lambda name: name in rec["ready"])

    def start(name):
        rec["started"].append(name)
        return True

    monkeypatch.setattr(_warm, "start", start)
    return rec


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_chunks_wait_for_a_kernel_compiled_in_the_background(dtype, route_calls, background):
    """A kernel neither compiled nor cached is not compiled in the task: the chunks take the
    generic route while a background process is asked to compile it, then the kernel from
    the first evaluation after it is ready; both routes agree with the generic engine."""
    X, y, th, v = _data("logistic", dtype, seed=11)
    obj = tl.TiltedObjective("logistic", _dask(X), _dask(y), t=0.8)
    f, g = dask.compute(*obj.value_and_gradient(th))
    hv = obj.hvp(th, v).compute()
    assert route_calls["served"] == 0 and route_calls["asked"] > 0
    vg, hk = f"vg_scalar-{np.dtype(dtype).name}", f"hvp_scalar-{np.dtype(dtype).name}"
    assert set(background["started"]) == {vg, hk}
    background["ready"] |= {vg, hk}
    f1, g1 = dask.compute(*obj.value_and_gradient(th))
    hv1 = obj.hvp(th, v).compute()
    assert route_calls["served"] == 6  # three chunks with rows, twice
    ref = tl.TiltedObjective("logistic", X, y, t=0.8)
    ref.fused = False
    fr, gr = ref.value_and_gradient(th)
    for got in (f, f1):
        _close(got, fr, dtype)
    for got in (g, g1):
        _close(got, gr, dtype)
    _close(hv1, hv, dtype, scale=np.abs(hv).max())


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
    X, y, th, _ = _data("logistic", np.float64, seed=7, n=3000)
    made = []
    real = nc.FusedProblem

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nc, "FusedProblem", counting)
    monkeypatch.setattr(nc, "_BOUND", type(nc._BOUND)())
    loss = tl.losses.get_loss("logistic")
    for _ in range(3):
        st = nc.numpy_state(X, y, None, th, None, loss, 1.0, "grad")
    assert len(made) == 1 and st is not ce.DECLINE
    y_bad = y.copy()
    y_bad[0] = 0.5
    assert nc.numpy_state(X, y_bad, None, th, None, loss, 1.0, "grad") is ce.DECLINE
    assert nc.numpy_state(X, y, None, th, None, loss, 1.0, "hess") is ce.DECLINE


# ---------------------------------------------------------------------------------------
# chunks of other libraries: the objective engine registered for the chunk's library


class _StandIn:
    """A stand-in for a library's fused engine (the CUDA kernel for CuPy): serves the
    value and gradient of problems without prior weights with the generic array-API
    engine, and records what it was asked."""

    name = "stand-in"

    def __init__(self, accept_weights=False, decline=False):
        self.calls = []
        self.accept_weights = accept_weights
        self.decline = decline

    def applies(self, problem):
        return problem.weights is None or self.accept_weights

    def value(self, problem, theta, ctx):
        return None  # as the CUDA engine: value and gradient together only

    def value_and_gradient(self, problem, theta, ctx):
        from tiltlab.objective.engines.generic import GENERIC

        self.calls.append((type(problem.X).__module__, problem.n_samples, problem.l2))
        if self.decline:
            return None
        with np.errstate(invalid="ignore"):  # the generic kernel's where() on strict arrays
            return GENERIC.value_and_gradient(problem, theta, ctx)

    def hvp(self, problem, theta, v, ctx):
        raise AssertionError("a Hessian-vector product needs sums the engines do not return")


@pytest.mark.parametrize("t", [0.0, 1e-9, 0.8, -2.5])
@pytest.mark.parametrize("weighted", [False, True])
def test_chunks_of_another_library_take_its_engine(monkeypatch, t, weighted):
    """array-api-strict chunks (a library without a state route): each chunk's state
    comes from the engine registered for the library; merged in a tree and finished as on
    Dask, they give the NumPy objective's value and gradient."""
    xps = pytest.importorskip("array_api_strict")
    from tiltlab.distributed._objective import finish
    from tiltlab.distributed._states import chunk_sample_state, merge_states
    from tiltlab.objective.engines import ENGINES

    engine = _StandIn(accept_weights=True)
    monkeypatch.setitem(ENGINES._impls, "array_api_strict", engine)
    X, y, th, _ = _data("logistic", np.float64, seed=11, n=900, d=5)
    w = np.random.default_rng(12).uniform(0.5, 2.0, size=900) if weighted else None
    loss = tl.losses.get_loss("logistic")
    bounds = [(0, 300), (300, 310), (310, 900)]
    states = []
    for r0, r1 in bounds:
        Xb, yb = xps.asarray(X[r0:r1]), xps.asarray(y[r0:r1])
        pb = None if w is None else xps.asarray(w[r0:r1])
        states.append(chunk_sample_state(Xb, yb, pb, th, None, loss, t, "grad", True))
    assert [c[1] for c in engine.calls] == [300, 10, 900 - 310]
    assert all(c[0] == "array_api_strict._array_object" and c[2] == 0.0 for c in engine.calls)
    f, g = finish(("grad", None, 0.0, "<f8"), th, None, merge_states(*states))
    ref = tl.TiltedObjective("logistic", X, y, t=t, weights=w)
    ref.fused = False
    f0, g0 = ref.value_and_gradient(th)
    _close(f, f0, np.float64)
    _close(g, g0, np.float64)


def test_engine_route_declines_go_to_the_generic_route(monkeypatch):
    xps = pytest.importorskip("array_api_strict")
    from tiltlab.distributed._states import chunk_sample_state
    from tiltlab.objective.engines import ENGINES

    X, y, th, v = _data("squared", np.float64, seed=13, n=200, d=4)
    loss = tl.losses.get_loss("squared")
    Xb, yb, pb = xps.asarray(X), xps.asarray(y), xps.asarray(np.ones(200))
    ref = chunk_sample_state(X, y, None, th, None, loss, 1.5, "grad", False)  # generic
    for engine, args in [
        (_StandIn(decline=True), (None, "grad")),  # the engine returns None
        (_StandIn(), (pb, "grad")),  # prior weights: the engine does not apply
        (_StandIn(), (None, "hvp")),  # a mode the engines cannot give as a state
    ]:
        monkeypatch.setitem(ENGINES._impls, "array_api_strict", engine)
        p, mode = args
        st = chunk_sample_state(Xb, yb, p, th, v if mode == "hvp" else None, loss, 1.5, mode, True)
        assert len(engine.calls) == (1 if engine.decline else 0)
        assert float(st.risk()) == pytest.approx(float(ref.risk()), rel=1e-14)


def test_engine_route_in_the_one_graph(monkeypatch):
    """A Dask objective whose chunks' library has no state route but a registered engine
    (NumPy here, its state route removed and a stand-in engine registered): each chunk is
    one engine call inside the one graph of an evaluation."""
    from _dask_runs import SchedulerRuns

    from tiltlab.objective.engines import ENGINES


    engine = _StandIn()
    ce.CHUNK_ROUTES.lookup("numpy")  # registered (imported) first, then taken out
    monkeypatch.delitem(ce.CHUNK_ROUTES._impls, "numpy")
    monkeypatch.setattr(ce, "numpy_route_applies", lambda *args: True)  # small problem
    monkeypatch.setitem(ENGINES._impls, "numpy", engine)
    X, y, th, _ = _data("logistic", np.float64, seed=14, n=1200, d=6)
    obj = tl.TiltedObjective(
        "logistic", da.from_array(X, chunks=(400, 6)), da.from_array(y, chunks=400), t=-1.0
    )
    from tiltlab.distributed import distribute

    distribute(obj)  # rechunk and persist once (a run of its own)
    with SchedulerRuns() as c:
        f, g = obj.value_and_gradient(th)
        assert c.n == 0
        f, g = dask.compute(f, g)
        assert c.n == 1
    assert [k[1] for k in engine.calls] == [400, 400, 400]
    monkeypatch.setitem(ENGINES._impls, "numpy", None)
    ref = tl.TiltedObjective("logistic", X, y, t=-1.0)
    ref.fused = False
    f0, g0 = ref.value_and_gradient(th)
    _close(f, f0, np.float64)
    _close(g, g0, np.float64)

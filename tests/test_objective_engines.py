"""The objective as a facade over engines: linearisation, the engine table, the objective
protocol, pickles of earlier versions, parameters from NumPy, non-finite parameters and
losses."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import tiltlab as tl
from tiltlab.losses import CallableLoss
from tiltlab.objective.engines import ENGINES, Engine, engines_for
from tiltlab.objective.protocol import Objective, check_objective
from tiltlab.testing import assert_close

DATA = Path(__file__).parent / "data"


def _data(name: str, n: int = 30, d: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    if name == "multinomial":
        return X, rng.integers(0, 3, n), rng.standard_normal((d, 3)) * 0.3
    theta = rng.standard_normal(d) * 0.5
    y = X @ theta + rng.standard_normal(n)
    if name == "logistic":
        y = (y > 0).astype(float)
    return X, y, theta


def _to(xp, a):
    return xp.asarray(np.asarray(a))


def _fd_hvp(obj, theta: np.ndarray, v: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of the gradient along ``v`` (NumPy objective)."""
    gp = np.asarray(obj.gradient(theta + h * v))
    gm = np.asarray(obj.gradient(theta - h * v))
    return (gp - gm) / (2 * h)


CASES = [
    ("squared", {"t": -1.5}),
    ("logistic", {"t": 2.0, "l2": 0.1}),
    ("multinomial", {"t": 0.7}),
    ("squared", {"groups": np.arange(30) % 3, "tilts": (1.0, -0.5)}),
    ("huber", {"t": 0.0}),
]


@pytest.mark.parametrize("name, kw", CASES)
def test_linearize_against_hvp_and_finite_differences(xp, name, kw):
    X, y, theta = _data(name)
    kwx = {k: (_to(xp, v) if k == "groups" else v) for k, v in kw.items()}
    obj = tl.TiltedObjective(name, _to(xp, X), _to(xp, y), **kwx)
    ref = tl.TiltedObjective(name, X, y, **kw)
    v = np.random.default_rng(5).standard_normal(theta.shape)
    lin = obj.linearize(_to(xp, theta))
    val, grad = ref.value_and_gradient(theta)
    assert_close(lin.value, val, xp=xp, rtol=1e-12)
    assert_close(lin.gradient, grad, xp=xp, rtol=1e-11)
    hv = lin.hvp(_to(xp, v))
    assert_close(hv, np.asarray(ref.hvp(theta, v)), xp=xp, rtol=1e-10)
    np.testing.assert_allclose(
        tl._compat.to_numpy(hv), _fd_hvp(ref, theta, v), rtol=1e-5, atol=1e-7
    )
    # flat parameters keep their shape
    flat = lin.hvp(_to(xp, v.reshape(-1)))
    assert tuple(flat.shape) == (v.size,)


def test_linearize_reuses_losses_and_weights():
    X, y, theta = _data("logistic", n=200)
    obj = tl.TiltedObjective("logistic", X, y, t=-2.0)
    calls = {"n": 0}
    loss = obj.loss
    derivatives = loss.derivatives

    def counting(*a, **k):
        calls["n"] += 1
        return derivatives(*a, **k)

    loss.derivatives = counting  # instance attribute: counts loss evaluations
    lin = obj.linearize(theta)
    assert calls["n"] == 1 and obj.n_passes == 2  # X theta, X^T (w l')
    for _ in range(5):
        lin.hvp(np.ones(4))
    assert calls["n"] == 1  # no loss (and no weight) evaluated again
    assert obj.n_passes == 2 + 5 * 2  # X v, X^T R per product
    assert lin.losses.shape == (200,) and abs(float(np.sum(lin.weights)) - 1) < 1e-12


def test_linearize_callable_loss():
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((25, 3)), rng.standard_normal(25)

    def fun(th, X, y):
        return (X @ th - y) ** 4

    def grad(th, X, y):
        return (4 * (X @ th - y) ** 3)[:, None] * X

    def hess(th, X, y):
        return (12 * (X @ th - y) ** 2)[:, None, None] * X[:, :, None] * X[:, None, :]

    obj = tl.TiltedObjective(CallableLoss(fun, grad, hess), X, y, t=0.3, l2=0.2)
    th, v = rng.standard_normal(3) * 0.1, rng.standard_normal(3)
    lin = obj.linearize(th)
    np.testing.assert_allclose(lin.hvp(v), obj.hvp(th, v), rtol=1e-12)
    np.testing.assert_allclose(lin.hvp(v), _fd_hvp(obj, th, v), rtol=1e-6)
    assert obj.shape == (3,)  # learned at the first evaluation


def test_engine_chain_and_registration():
    X, y, theta = _data("squared")
    obj = tl.TiltedObjective("squared", X, y, t=1.0)
    names = [e.name for e in engines_for(obj.problem)]
    assert names == ["one-pass", "generic"]
    hier = tl.TiltedObjective("squared", X, y, groups=np.arange(30) % 2, tilts=(1.0, 1.0))
    assert [e.name for e in engines_for(hier.problem)] == ["generic"]
    assert {"cupy", "dask"} <= set(ENGINES.registered())

    class Halving(Engine):  # a new engine is one registration
        name = "test"

        def value(self, problem, theta, ctx):
            ctx.count(1)
            return 0.5 * float(problem.X[0, 0])

    import array_api_strict as xps

    try:
        ENGINES.register("array_api_strict", Halving())
        sobj = tl.TiltedObjective("squared", xps.asarray(X), xps.asarray(y), t=1.0)
        assert sobj.value(xps.asarray(theta)) == 0.5 * X[0, 0]
        assert sobj.n_passes == 1
        # what the engine declines goes on to the next one
        g = sobj.gradient(xps.asarray(theta))
        np.testing.assert_allclose(np.asarray(g), obj.gradient(theta), rtol=1e-12)
    finally:
        ENGINES._impls.pop("array_api_strict", None)


def test_objective_protocol_one_check():
    from tiltlab.estimators._objective import MaskedRidgeObjective

    X, y, theta = _data("squared")
    obj = tl.TiltedObjective("squared", X, y, t=1.0)
    masked = MaskedRidgeObjective(obj, 0.5, np.array([1.0, 1.0, 1.0, 0.0]))
    for o in (obj, masked):
        assert isinstance(o, Objective)
        assert check_objective(o) is o
    with pytest.raises(TypeError, match=r"`validation` must be a tiltlab.TiltedObjective.*no "):
        check_objective(object(), "validation")
    with pytest.raises(TypeError, match="`objective` must be a tiltlab.TiltedObjective"):
        check_objective(masked, tilted=True)
    # the masked objective's linearisation keeps its ridge term (the intercept spared)
    v = np.arange(1.0, 5.0)
    lin = masked.linearize(theta)
    np.testing.assert_allclose(lin.hvp(v), masked.hvp(theta, v), rtol=1e-12)
    np.testing.assert_allclose(lin.gradient, masked.gradient(theta), rtol=1e-12)
    np.testing.assert_allclose(lin.value, masked.value(theta), rtol=1e-12)


def test_client_objective_satisfies_protocol():
    pytest.importorskip("dask")
    import dask.array as da

    from tiltlab.distributed import ClientObjective

    X, y, theta = _data("squared")
    obj = tl.TiltedObjective(
        "squared", da.from_array(X, chunks=10), da.from_array(y, chunks=10), t=-1.0
    )
    client = ClientObjective(obj)
    assert isinstance(client, Objective)
    ref = tl.TiltedObjective("squared", X, y, t=-1.0)
    lin = client.linearize(theta)
    np.testing.assert_allclose(lin.hvp(np.ones(4)), ref.hvp(theta, np.ones(4)), rtol=1e-10)


def test_dask_objective_takes_numpy_parameters():
    pytest.importorskip("dask")
    import dask.array as da

    X, y, theta = _data("squared")
    ref = tl.TiltedObjective("squared", X, y, t=-1.0, l2=0.1)
    for groups in (None, np.arange(30) % 3):
        kw = {"t": -1.0} if groups is None else {"groups": groups, "tilts": (1.0, -1.0)}
        dobj = tl.TiltedObjective(
            "squared", da.from_array(X, chunks=10), da.from_array(y, chunks=10), l2=0.1, **kw
        )
        nref = ref if groups is None else tl.TiltedObjective("squared", X, y, l2=0.1, **kw)
        np.testing.assert_allclose(dobj.value(theta).compute(), nref.value(theta), rtol=1e-12)
        _, g = dobj.value_and_gradient(theta)
        np.testing.assert_allclose(g.compute(), nref.gradient(theta), rtol=1e-12)
        hv = dobj.hvp(theta, np.ones(4))
        np.testing.assert_allclose(np.asarray(hv), nref.hvp(theta, np.ones(4)), rtol=1e-10)
        np.testing.assert_allclose(np.asarray(dobj.hessian(theta)), nref.hessian(theta), rtol=1e-10)
        np.testing.assert_allclose(np.asarray(dobj.weights(theta)), nref.weights(theta), rtol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_theta_is_an_error(xp, bad):
    X, y, theta = _data("squared")
    obj = tl.TiltedObjective("squared", _to(xp, X), _to(xp, y), t=1.0)
    th = theta.copy()
    th[1] = bad
    for call in (
        obj.value,
        obj.gradient,
        obj.weights,
        obj.losses,
        obj.hessian,
        obj.linearize,
        lambda t: obj.hvp(t, np.ones(4)),
    ):
        with pytest.raises(ValueError, match="`theta` contains NaN or infinite"):
            call(th)
    if not xp.__name__.endswith("dask.array"):  # lazy parameters: checked when computed
        with pytest.raises(ValueError, match="`theta` contains NaN or infinite"):
            obj.value(_to(xp, th))
    with pytest.raises(ValueError, match="`v` contains NaN or infinite"):
        obj.hvp(theta, th)


@pytest.mark.parametrize("t", [0.0, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["squared", "logistic", "multinomial"])
@pytest.mark.parametrize("fused", [True, False])
def test_non_finite_theta_is_an_error_where_the_tilt_reads_no_extremes(xp, name, t, fused):
    # at t = 0 (the mean) and t = +-inf (the extremes) no reduction rejects non-finite
    # losses by itself: the parameter is checked all the same, at every tilt
    X, y, theta = _data(name)
    obj = tl.TiltedObjective(name, _to(xp, X), _to(xp, y), t=t)
    obj.fused = fused
    th = np.array(theta, copy=True)
    th.flat[1] = np.nan
    calls = [obj.value, obj.gradient, obj.value_and_gradient, obj.weights, obj.losses]
    if t == 0:
        v = np.ones(theta.shape)
        calls += [obj.hessian, obj.linearize, lambda a: obj.hvp(a, v)]
    native = _to(xp, th)
    for call in calls:
        with pytest.raises(ValueError, match="`theta` contains NaN or infinite"):
            call(th)
        if not xp.__name__.endswith("dask.array"):  # lazy parameters: checked when computed
            with pytest.raises(ValueError, match="`theta` contains NaN or infinite"):
                call(native)
    with pytest.raises(ValueError, match="`theta0` contains NaN or infinite"):
        tl.minimize(tl.TiltedObjective(name, X, y, t=t), th)


def test_callable_loss_returning_nan_is_an_error():
    X = np.eye(3)

    def fun(th, X, y):
        return np.log(X @ th)  # NaN for negative predictors

    def grad(th, X, y):
        return X / (X @ th)[:, None]

    obj = tl.TiltedObjective(CallableLoss(fun, grad, name="logpred"), X, np.zeros(3), t=1.0)
    assert np.isfinite(obj.value(np.ones(3)))
    with np.errstate(invalid="ignore"):
        for call in (obj.value, obj.value_and_gradient, obj.weights):
            with pytest.raises(ValueError, match="logpred `loss` returned NaN at `theta`"):
                call(np.array([1.0, -1.0, 1.0]))


def test_pickles_of_the_flat_layout_load():
    # written by the objective before it was split into a problem and engines
    with open(DATA / "objectives_v0.pkl", "rb") as fh:
        stored = pickle.load(fh)
    theta = np.full(3, 0.3)
    for key, (blob, want) in stored.items():
        obj = pickle.loads(blob)
        assert isinstance(obj, tl.TiltedObjective)
        np.testing.assert_allclose(float(obj.value(theta)), want["value"], rtol=1e-14)
        np.testing.assert_allclose(obj.gradient(theta), want["grad"], rtol=1e-13)
        # and a fresh objective on the same data agrees
        kw = (
            {"t": obj.t}
            if not obj.is_hierarchical
            else {"groups": obj.problem.groups, "tilts": obj.tilts}
        )
        fresh = tl.TiltedObjective(
            obj.loss, obj.X, obj.y, weights=obj.problem.weights, l2=obj.l2, **kw
        )
        np.testing.assert_allclose(fresh.value(theta), want["value"], rtol=1e-14)
        again = pickle.loads(pickle.dumps(obj))
        np.testing.assert_allclose(again.gradient(theta), want["grad"], rtol=1e-13)
        assert key in ("sample", "weighted", "hierarchical")


def test_block_policy():
    import array_api_compat.numpy as npx

    from tiltlab.objective.blocks import BLOCK_BYTES, block_rows

    assert block_rows(10**7, 100, npx.float64, npx, "cpu") == BLOCK_BYTES // 800
    assert block_rows(10**7, 100, npx.float32, npx, "cpu") == BLOCK_BYTES // 400
    assert block_rows(100, 10**6, npx.float64, npx, "cpu") == 100  # at least 256, at most n
    assert block_rows(10**6, 10**6, npx.float64, npx, "cpu") == 256
    X, y, _ = _data("squared")
    obj = tl.TiltedObjective("squared", X, y)
    assert obj.block_rows == 30

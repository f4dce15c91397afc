"""tiltlab on Dask at the edges of its inputs.

References are independent of the code under test: the tilted risk in 50-digit mpmath,
the eager NumPy objective and solvers, and the definition of ``nfev``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
mp = pytest.importorskip("mpmath")

from _dask_runs import SchedulerRuns  # noqa: E402

from tiltlab.distributed import (  # noqa: E402
    ClientObjective,
    distribute,
    evaluate,
    objective_call,
)


@pytest.fixture(autouse=True)
def _synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def _risk_mp(l, p, t):
    """The tilted risk of losses ``l`` under prior ``p`` in 50-digit arithmetic."""
    with mp.workdps(50):
        p = [mp.mpf(float(x)) for x in p]
        total = mp.fsum(p)
        t = mp.mpf(t)
        z = mp.fsum(pi / total * mp.exp(t * mp.mpf(float(li))) for li, pi in zip(l, p, strict=True))
        return float(mp.log(z) / t)


def _weights_mp(l, p, t):
    with mp.workdps(50):
        t = mp.mpf(t)
        e = [mp.mpf(float(pi)) * mp.exp(t * mp.mpf(float(li)))
             for li, pi in zip(l, p, strict=True)]
        total = mp.fsum(e)
        return np.array([float(x / total) for x in e])


# ---------------------------------------------------------------------------------------
# prior weights far below the normal range


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tiny_prior_weights(dtype):
    # subnormal weights (float64's smallest, float32's 1e-40 range): the risk and weights
    # are those of the normalised prior; products with the raw weights underflowed
    tiny = 5e-324 if dtype == np.float64 else 1e-40
    l = np.arange(1.0, 7.0).astype(dtype)
    w = np.full(6, tiny, dtype=dtype)
    w[0] *= 2
    L, W = da.from_array(l, chunks=2), da.from_array(w, chunks=2)
    eps = np.finfo(dtype).eps
    want = _risk_mp(l, w, 1.0)  # the weights as the dtype holds them
    got = tl.tilted_risk(L, 1.0, weights=W).compute()
    assert got.dtype == dtype
    # condition of log-sum-exp in the losses: 1 (relative to max |l| = 6)
    assert abs(float(got) - want) <= 8 * eps * 6.0
    wt = np.asarray(tl.tilted_weights(L, 1.0, weights=W).compute())
    assert wt.dtype == dtype
    np.testing.assert_allclose(wt, _weights_mp(l, w, 1.0), rtol=16 * eps, atol=0)
    g = np.array([0, 0, 1, 1, 2, 2])
    hier = tl.hierarchical_risk(L, da.from_array(g, chunks=2), (1.0, 2.0), weights=W).compute()
    R = [_risk_mp(l[g == k], w[g == k], 2.0) for k in range(3)]
    P = [float(w[g == k].astype(np.float64).sum()) for k in range(3)]
    assert abs(float(hier) - _risk_mp(R, P, 1.0)) <= 16 * eps * 6.0


# ---------------------------------------------------------------------------------------
# empty losses of unknown size


def test_empty_losses_of_unknown_size_name_losses():
    L = da.from_array(np.arange(6.0), chunks=2)
    empty = L[L > 100.0]  # unknown chunk sizes, no sample
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_risk(empty, 1.0).compute()
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_risk(empty, [0.0, math.inf]).compute()
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_weights(empty, 0.5).compute()
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_risk(empty, da.asarray(2.0)).compute()
    # zero prior mass still names the weights
    with pytest.raises(ValueError, match="`weights` must not be all zero"):
        tl.tilted_risk(L, 1.0, weights=da.zeros(6, chunks=2)).compute()


# ---------------------------------------------------------------------------------------
# the dense Hessian of a hierarchy in the client-driven solvers



def _hessian_pair(loss, kw):
    rng = np.random.default_rng(0)
    n, d = 24, 3
    X = rng.standard_normal((n, d))
    y = X @ np.array([1.0, -1.0, 0.5]) + 0.3 * rng.standard_normal(n)
    if loss == "multinomial":
        y = rng.integers(0, 3, n)
    kw = {k: (rng.integers(0, 3, n) if v == "g" else v) for k, v in kw.items()}
    ref = tl.TiltedObjective(loss, X, y, **kw)
    obj = tl.TiltedObjective(loss, da.from_array(X, chunks=(7, d)), da.from_array(y, chunks=7),
                             **kw)
    distribute(obj)
    return ref, obj


HESSIAN_CASES = [
    ("squared", {"groups": "g", "tilts": (1.0, 0.5)}),
    ("multinomial", {"t": 1.0, "l2": 1e-1}),
]


@pytest.mark.parametrize(("loss", "kw"), HESSIAN_CASES)
def test_client_dense_hessian_one_graph(loss, kw):
    # a dense Hessian without a one-pass form (hierarchy, matrix parameter): one
    # evaluation, one graph, the eager Hessian
    ref, obj = _hessian_pair(loss, kw)
    th = 0.1 * np.random.default_rng(1).standard_normal(ref.shape)
    client = ClientObjective(obj)
    with SchedulerRuns() as c:
        H = client.hessian(th)
    assert c.n == 1 and client.n_evals == 1
    assert H.dtype == np.float64
    np.testing.assert_allclose(H, ref.hessian(th), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "kw"), HESSIAN_CASES)
def test_newton_dense_hessian_nfev(loss, kw):
    # nfev counts a dense Hessian once (OptimizeResult's definition, as the eager run
    # counts it), and the Dask run makes one graph per evaluation
    ref, obj = _hessian_pair(loss, kw)
    want = tl.minimize(ref, method="newton", hessian="dense", tol=1e-10)
    with SchedulerRuns() as c:
        res = tl.minimize(obj, method="newton", hessian="dense", tol=1e-10)
    assert res.success and want.success
    assert res.nit == want.nit and res.nfev == want.nfev
    assert c.n == res.nfev
    np.testing.assert_allclose(np.asarray(res.x), want.x, rtol=1e-8, atol=1e-10)


# ---------------------------------------------------------------------------------------
# argument checks of evaluate


def test_evaluate_checks_its_arguments():
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((8, 2)), rng.standard_normal(8)
    g = np.array([0, 1] * 4)
    obj = tl.TiltedObjective("squared", da.from_array(X, chunks=(3, 2)),
                             da.from_array(y, chunks=3), t=1.0)
    hier = tl.TiltedObjective("squared", da.from_array(X, chunks=(3, 2)),
                              da.from_array(y, chunks=3), groups=g, tilts=(1.0, 2.0))
    th = np.array([0.2, -0.1])
    with pytest.raises(ValueError, match="`mode`"):
        evaluate(obj, th, None, "gradient")
    with pytest.raises(ValueError, match="`V`"):
        evaluate(obj, th, None, "hvp")
    with pytest.raises(ValueError, match="`theta` must have shape"):
        evaluate(obj, np.zeros(3), None, "value")
    with pytest.raises(ValueError, match="`V` must have shape"):
        evaluate(obj, th, np.zeros(3), "hvp")
    with pytest.raises(ValueError, match="'hess'"):
        evaluate(hier, th, None, "hess")
    # what it takes: the eager objective's value and products
    ref = tl.TiltedObjective("squared", X, y, t=1.0)
    value, hv = evaluate(obj, th, np.array([1.0, 0.0]), "hvp")
    np.testing.assert_allclose(value, ref.value(th), rtol=1e-13)
    np.testing.assert_allclose(hv, ref.hvp(th, np.array([1.0, 0.0])), rtol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_minimize_rejects_nonfinite_theta0(bad):
    # as the eager run does: a ValueError, not a run that reports a non-finite objective
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((8, 2)), rng.standard_normal(8)
    theta0 = np.array([bad, 0.0])
    with pytest.raises(ValueError, match="NaN or infinite"):
        tl.minimize(tl.TiltedObjective("squared", X, y, t=1.0), theta0)
    obj = tl.TiltedObjective("squared", da.from_array(X, chunks=(3, 2)),
                             da.from_array(y, chunks=3), t=1.0)
    with pytest.raises(ValueError, match="`theta0` contains NaN or infinite"):
        tl.minimize(obj, theta0)


@pytest.mark.parametrize("t", [1.0, [0.0, 2.0]])
def test_empty_batch_of_nd_losses(t):
    # as on the eager path: losses of no element are empty, whatever axis holds the samples
    for shape, axis in (((0, 5), 1), ((3, 0), 0), ((2, 0, 4), -1)):
        with pytest.raises(ValueError, match="`losses` must not be empty"):
            tl.tilted_risk(np.zeros(shape), t, axis=axis)
        with pytest.raises(ValueError, match="`losses` must not be empty"):
            tl.tilted_risk(da.zeros(shape, chunks=2), t, axis=axis).compute()


def test_weights_of_unknown_size_named():
    L = da.from_array(np.arange(6.0), chunks=2)
    W = da.ones(6, chunks=2)
    W = W[W > 0]  # unknown chunk sizes
    g = da.from_array(np.array([0, 1] * 3), chunks=2)
    with pytest.raises(ValueError, match="`weights` has unknown chunk sizes"):
        tl.tilted_risk(L, 1.0, weights=W)
    with pytest.raises(ValueError, match="`weights` has unknown chunk sizes"):
        tl.hierarchical_risk(L, g, (1.0, 1.0), weights=W)
    with pytest.raises(ValueError, match="`weights` has unknown chunk sizes"):
        tl.tilted_weights(L, 1.0, weights=W)


@pytest.mark.parametrize("kind", ["hvp", "hess"])
def test_objective_call_curvature_at_infinite_outer_tilt(kind):
    # the Hessian is not defined there: a ValueError as from the objective's methods (the
    # graph gave NaN)
    rng = np.random.default_rng(4)
    X, y = rng.standard_normal((9, 2)), rng.standard_normal(9)
    kw = {"groups": np.arange(9) % 3, "tilts": (math.inf, 1.0)}
    th, v = np.array([0.3, -0.2]), np.array([1.0, 0.0])
    with pytest.raises(ValueError, match="infinite tilt"):
        tl.TiltedObjective("squared", X, y, **kw).hvp(th, v)
    obj = tl.TiltedObjective("squared", da.from_array(X, chunks=(4, 2)),
                             da.from_array(y, chunks=4), **kw)
    with pytest.raises(ValueError, match="infinite tilt"):
        objective_call(obj, kind, th, v if kind == "hvp" else None)
    if kind == "hvp":
        with pytest.raises(ValueError, match="infinite tilt"):
            evaluate(obj, th, v, kind)

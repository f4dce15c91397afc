"""tiltlab on Dask: one graph per evaluation, client-driven solvers, a real LocalCluster.

References are independent of the code under test: the eager NumPy objective and solvers
(a different evaluation order: blocks of rows in one process instead of per-chunk states
merged in a tree), central finite differences, and the closed-form tilted risk.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

from _dask_runs import SchedulerRuns  # noqa: E402

from tiltlab.accumulator import merge_all  # noqa: E402
from tiltlab.distributed import ClientObjective, distribute  # noqa: E402
from tiltlab.distributed._states import (  # noqa: E402
    chunk_loss_group_state,
    group_risks,
    merge_states,
)


def _problem(n=1200, d=4, seed=0, loss="squared"):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    z = X @ rng.normal(size=d)
    if loss == "logistic":
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(float)
    else:
        y = z + rng.standard_t(2, size=n)
    g = rng.integers(0, 6, size=n)
    return X, y, g


def _dask(a, rows=250):
    return da.from_array(a, chunks=(rows,) + a.shape[1:])


CASES = [
    ("squared", {"t": -1.0}),
    ("logistic", {"t": 2.0, "l2": 1e-2}),
    ("squared", {"groups": "g", "tilts": (1.0, -2.0)}),
    ("logistic", {"groups": "gg", "tilts": (0.5, 2.0, 0.0), "l2": 1e-2}),
]


def _pair(loss, kw, seed=0):
    X, y, g = _problem(loss=loss, seed=seed)
    kw = dict(kw)
    if kw.get("groups") == "g":
        kw["groups"] = g
    elif kw.get("groups") == "gg":
        kw["groups"] = [g // 3, g]
    w = np.random.default_rng(seed + 1).uniform(0.5, 1.5, size=len(y))
    ref = tl.TiltedObjective(loss, X, y, weights=w, **kw)
    obj = tl.TiltedObjective(loss, _dask(X), _dask(y), weights=_dask(w), **kw)
    return ref, obj


@pytest.mark.parametrize(("loss", "kw"), CASES)
def test_one_graph_per_evaluation_matches_numpy(loss, kw):
    ref, obj = _pair(loss, kw)
    rng = np.random.default_rng(3)
    th, v = 0.3 * rng.normal(size=ref.shape), rng.normal(size=ref.shape)
    distribute(obj)  # rechunk + persist once
    with SchedulerRuns() as c:
        f, g = obj.value_and_gradient(da.from_array(th))
        hv = obj.hvp(da.from_array(th), da.from_array(v))
        val = obj.value(da.from_array(th))
        assert c.n == 0  # lazy: nothing runs at call time
        assert isinstance(g, da.Array) and isinstance(hv, da.Array) and isinstance(f, da.Array)
        f, g = dask.compute(f, g)
        assert c.n == 1  # the value and the gradient: one graph
        hv, val = dask.compute(hv, val)  # two evaluations, one graph
        assert c.n == 2
    f0, g0 = ref.value_and_gradient(th)
    np.testing.assert_allclose(float(f), float(f0), rtol=1e-13)
    np.testing.assert_allclose(float(val), float(f0), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(g), g0, rtol=1e-12, atol=1e-14 * np.abs(g0).max())
    h0 = ref.hvp(th, v)
    np.testing.assert_allclose(np.asarray(hv), h0, rtol=1e-11, atol=1e-13 * np.abs(h0).max())
    # the gradient against central differences of the Dask value (independent of NumPy)
    cl = ClientObjective(obj)
    h = 1e-6
    fd = (float(cl.value(th + h * v)) - float(cl.value(th - h * v))) / (2 * h)
    assert abs(fd - float(np.sum(np.asarray(g) * v))) <= 1e-6 * max(1.0, abs(fd))


def test_dense_hessian_one_graph():
    ref, obj = _pair("logistic", {"t": -1.5, "l2": 0.1})
    th = np.full(ref.shape, 0.2)
    distribute(obj)
    with SchedulerRuns() as c:
        H = obj.hessian(da.from_array(th))
        assert c.n == 0 and isinstance(H, da.Array) and H.shape == (4, 4)
        H = H.compute()
    assert c.n == 1
    np.testing.assert_allclose(np.asarray(H), ref.hessian(th), rtol=1e-11, atol=1e-14)


def test_risks_are_one_lazy_reduction():
    rng = np.random.default_rng(1)
    l = rng.exponential(size=2000)
    w = rng.uniform(size=2000)
    g = rng.integers(0, 7, size=2000)
    ld, wd = da.from_array(l, chunks=300), da.from_array(w, chunks=450)
    for t in (-4.0, 1e-12, 0.0, 3.0, np.inf):
        with SchedulerRuns() as c:
            r = tl.tilted_risk(ld, t, weights=wd)
            assert c.n == 0  # lazy
            got = float(r.compute())
            assert c.n == 1
        p = w / w.sum()
        if np.isinf(t):
            want = l.max()
        elif t == 0:
            want = float(p @ l)
        elif abs(t) > 1e-6:  # closed form, well conditioned here
            want = float(np.log(p @ np.exp(t * l)) / t)
        else:  # cumulant series: mean + t var / 2 (the next term is O(t^2))
            m = float(p @ l)
            want = m + t * float(p @ (l - m) ** 2) / 2
        assert abs(got - want) <= 1e-13 * max(1.0, abs(want))
    with SchedulerRuns() as c:
        r = tl.hierarchical_risk(ld, g, (2.0, -1.0), weights=wd)
        assert c.n == 0
        got = float(r.compute())
        assert c.n == 1
    R = np.array(
        [np.log(np.sum(w[g == k] * np.exp(-l[g == k])) / w[g == k].sum()) / -1.0 for k in range(7)]
    )
    P = np.array([w[g == k].sum() for k in range(7)]) / w.sum()
    assert abs(got - np.log(P @ np.exp(2.0 * R)) / 2.0) <= 1e-13
    bad = da.from_array(np.r_[l[:-1], np.nan], chunks=300)
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        tl.hierarchical_risk(bad, g, (1.0, 1.0)).compute()


@pytest.mark.parametrize(
    ("method", "opts"),
    [
        ("lbfgs", {}),
        ("agd", {}),
        ("gd", {}),
        ("newton", {"hessian": "cg"}),
        ("newton", {"hessian": "dense"}),
    ],
)
def test_client_driven_solvers_threaded(method, opts):
    ref, obj = _pair("logistic", {"t": -1.0, "l2": 1e-2})
    want = tl.minimize(ref, method=method, tol=1e-11, **opts)
    distribute(obj)
    with SchedulerRuns() as c:
        res = tl.minimize(obj, method=method, tol=1e-11, **opts)
    assert res.success, res.message
    assert c.n == res.nfev  # one graph per evaluation, line-search trials included
    assert isinstance(res.x, da.Array) and isinstance(res.jac, da.Array)
    x = np.asarray(res.x)
    np.testing.assert_allclose(x, want.x, rtol=1e-8, atol=1e-8 * np.abs(want.x).max())


def test_stochastic_fetches_rows_only():
    ref, obj = _pair("squared", {"t": -0.5})
    distribute(obj)
    res = tl.minimize(obj, method="stochastic", seed=0, max_iter=100, batch_size=32)
    assert res.success and isinstance(res.x, da.Array)
    back = pickle.loads(pickle.dumps(res))  # results pickle, their Dask arrays included
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(res.x))
    want = tl.minimize(ref, method="stochastic", seed=0, max_iter=100, batch_size=32)
    # the same draws: the same iterates up to rounding
    np.testing.assert_allclose(np.asarray(res.x), want.x, rtol=1e-9, atol=1e-10)


def test_states_and_objects_pickle():
    ref, obj = _pair("squared", {"groups": "g", "tilts": (1.0, -2.0)})
    obj.value(da.from_array(np.zeros(ref.shape)))
    obj2 = pickle.loads(pickle.dumps(obj))
    np.testing.assert_allclose(
        float(obj2.value(da.from_array(np.zeros(ref.shape)))),
        float(ref.value(np.zeros(ref.shape))),
        rtol=1e-13,
    )
    pickle.loads(pickle.dumps(obj.loss))
    rng = np.random.default_rng(0)
    l, c = rng.normal(size=100), rng.integers(0, 3, size=100)
    parts = [
        chunk_loss_group_state(l[i : i + 30], None, c[i : i + 30], 2.0, 3)
        for i in range(0, 100, 30)
    ]
    parts = [pickle.loads(pickle.dumps(s)) for s in parts]
    R = group_risks(merge_states(*parts), np.float64)
    want = [np.log(np.mean(np.exp(2.0 * l[c == k]))) / 2.0 for k in range(3)]
    np.testing.assert_allclose(R, want, rtol=1e-14)
    assert merge_all  # the scalar merge is the accumulator's own


# ---------------------------------------------------------------------------
# a real cluster: two worker processes


@pytest.fixture(scope="module")
def cluster_client():
    distributed = pytest.importorskip("distributed")
    from distributed.diagnostics.plugin import SchedulerPlugin

    class GraphCounter(SchedulerPlugin):
        name = "tiltlab-graph-counter"

        def __init__(self):
            self.n = 0

        def update_graph(self, scheduler, **kwargs):
            self.n += 1

    cluster = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        dashboard_address=":0",
        memory_limit="1GiB",
    )
    client = distributed.Client(cluster)
    counter = GraphCounter()
    cluster.scheduler.add_plugin(counter)
    try:
        yield client, counter
    finally:
        client.close()
        cluster.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("loss", "kw", "method"),
    [
        ("logistic", {"t": -1.0, "l2": 1e-2}, "lbfgs"),
        ("squared", {"groups": "g", "tilts": (1.0, -2.0), "l2": 1e-3}, "newton"),
    ],
)
def test_local_cluster_fit(cluster_client, loss, kw, method):
    distributed = pytest.importorskip("distributed")
    client, counter = cluster_client
    ref, obj = _pair(loss, kw)
    opts = {"hessian": "cg"} if method == "newton" else {}
    want = tl.minimize(ref, method=method, tol=1e-11, **opts)
    plan = distribute(obj)
    assert plan.persisted
    distributed.wait([plan.X, plan.y, plan.p])  # the persist graph has reached the scheduler
    assert len(client.scheduler_info()["workers"]) == 2
    before = counter.n
    res = tl.minimize(obj, method=method, tol=1e-11, **opts)
    assert res.success, res.message
    assert counter.n - before == res.nfev  # exactly one graph per evaluation
    x = np.asarray(res.x)
    np.testing.assert_allclose(x, want.x, rtol=1e-8, atol=1e-8 * np.abs(want.x).max())


# ---------------------------------------------------------------------------------------
# unknown and empty chunks


def _masked(values):
    """A Dask array with unknown chunk sizes (filtered by a boolean mask), and its values."""
    x = da.from_array(values, chunks=4)
    keep = values != values[3]
    return x[x != values[3]], values[keep]


@pytest.mark.parametrize("t", [0.0, 1.0, -2.5, 1e-300, np.inf, -np.inf])
def test_unknown_chunk_sizes_risk_and_weights(t):
    rng = np.random.default_rng(4)
    y, kept = _masked(np.round(rng.exponential(2.0, 19), 3))
    assert np.isnan(y.shape[0])
    r = float(tl.tilted_risk(y, t).compute())
    w = np.asarray(tl.tilted_weights(y, t).compute())
    assert r == pytest.approx(float(tl.tilted_risk(kept, t)), rel=1e-14)
    np.testing.assert_allclose(w, tl.tilted_weights(kept, t), rtol=1e-13, atol=1e-300)
    assert w.sum() == pytest.approx(1.0, rel=1e-13)


def test_unknown_chunk_sizes_clear_errors():
    y, kept = _masked(np.arange(12.0))
    msg = "unknown chunk sizes: call compute_chunk_sizes()"
    # a Dask tilt of 1-d losses is read by the graph: no sizes needed, as for host tilts
    got = float(tl.tilted_risk(y, da.from_array(np.array(1.0))).compute())
    assert got == pytest.approx(float(tl.tilted_risk(kept, 1.0)), rel=1e-14)
    # a host grid of tilts needs no sizes (one state per tilt and chunk)
    got = np.asarray(tl.tilted_risk(y, np.array([1.0, 2.0])).compute())
    np.testing.assert_allclose(got, tl.tilted_risk(kept, np.array([1.0, 2.0])), rtol=1e-14)
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        tl.hierarchical_risk(y, np.arange(11) % 2, (1.0, 2.0))
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        tl.tilted_risk(y, 1.0, weights=da.ones(11, chunks=5))
    # after compute_chunk_sizes() everything works
    y.compute_chunk_sizes()
    got = np.asarray(tl.tilted_risk(y, np.array([1.0, 2.0])).compute())
    np.testing.assert_allclose(got, tl.tilted_risk(kept, np.array([1.0, 2.0])), rtol=1e-14)
    h = float(tl.hierarchical_risk(y, np.arange(11) % 2, (1.0, 2.0)).compute())
    assert h == pytest.approx(float(tl.hierarchical_risk(kept, np.arange(11) % 2, (1.0, 2.0))))


@pytest.mark.parametrize("t", [0.0, 0.7, -3.0, np.inf])
def test_empty_chunks(t):
    values = np.array([0.5, 1.5, 4.0, 2.0, 3.0, 0.25])
    x = da.from_array(values, chunks=((3, 0, 3),))
    assert 0 in x.chunks[0]
    r = float(tl.tilted_risk(x, t).compute())
    assert r == pytest.approx(float(tl.tilted_risk(values, t)), rel=1e-14)
    w = np.asarray(tl.tilted_weights(x, t).compute())
    np.testing.assert_allclose(w, tl.tilted_weights(values, t), rtol=1e-13)
    g = np.array([0, 0, 1, 1, 1, 0])
    if np.isfinite(t):
        h = float(tl.hierarchical_risk(x, g, (t, 1.0)).compute())
        assert h == pytest.approx(float(tl.hierarchical_risk(values, g, (t, 1.0))), rel=1e-13)

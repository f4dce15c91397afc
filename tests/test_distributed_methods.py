"""The methods of a Dask objective: lazy results, one graph when computed together.

``value``, ``value_and_gradient``, ``gradient``, ``hvp`` and ``hessian`` of a
:class:`tiltlab.TiltedObjective` on Dask arrays return lazy Dask arrays whose graph is the
whole evaluation. Graphs are counted by a scheduler plugin on a ``distributed`` cluster
(threads of this process, one cluster for the module) and by a callback of Dask's local
schedulers. References are independent of the code under test: the eager NumPy objective
(one process, blocks of rows, no chunk states) and, for the hierarchy, its definition in
float64 with SciPy's ``logsumexp``.
"""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
special = pytest.importorskip("scipy.special")

from _dask_runs import SchedulerRuns  # noqa: E402

from tiltlab.distributed import ClientObjective, distribute, objective_call  # noqa: E402

TILTS = [0.0, 1e-8, -1e-8, 2.0, -2.0, 50.0, -50.0]

#: uneven row chunks with an empty one; the groups are spread over every chunk
CHUNKS = (200, 0, 350, 350)



@pytest.fixture(scope="module")
def cluster():
    from distributed.diagnostics.plugin import SchedulerPlugin

    class GraphCounter(SchedulerPlugin):
        name = "tiltlab-methods-graph-counter"

        def __init__(self):
            self.n = 0

        def update_graph(self, scheduler, **kwargs):
            self.n += 1

    local = distributed.LocalCluster(
        n_workers=2, processes=False, threads_per_worker=1, dashboard_address=":0"
    )
    client = distributed.Client(local, set_as_default=False)
    counter = GraphCounter()
    local.scheduler.add_plugin(counter)
    try:
        yield client, counter
    finally:
        client.close()
        local.close()


def _data(n=900, d=4, G=6, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))].astype(dtype)
    z = X.astype(np.float64) @ rng.normal(size=d)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(dtype)
    return X, y, rng.integers(0, G, size=n)


def _pair(kind, tau, dtype, client, seed=0):
    """The NumPy reference and the persisted Dask objective (hierarchical or sample level)."""
    X, y, g = _data(seed=seed, dtype=dtype)
    kw = {"groups": g, "tilts": (-1.5, tau)} if kind == "hier" else {"t": tau}
    kw["l2"] = 1e-3
    ref = tl.TiltedObjective("logistic", X, y, **kw)
    Xd = da.from_array(X, chunks=(CHUNKS, X.shape[1]))
    yd = da.from_array(y, chunks=(CHUNKS,))
    obj = tl.TiltedObjective("logistic", Xd, yd, **kw)
    with client.as_current():
        plan = distribute(obj)
        distributed.wait([a for a in (plan.X, plan.y, plan.codes) if a is not None])
    return ref, obj


def _close(got, want, tol):
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("tau", TILTS)
@pytest.mark.parametrize("kind", ["hier", "sample"])
def test_methods_lazy_one_graph_on_the_cluster(cluster, kind, tau, dtype):
    client, counter = cluster
    ref, obj = _pair(kind, tau, dtype, client)
    rng = np.random.default_rng(2)
    th = (0.5 * rng.normal(size=ref.shape)).astype(dtype)
    v = rng.normal(size=ref.shape).astype(dtype)
    tol = 1e-11 if dtype == np.float64 else 2e-4
    with client.as_current():
        before = counter.n
        f, g = obj.value_and_gradient(th)
        hv = obj.hvp(da.from_array(th), v)
        val = obj.value(th)
        assert counter.n == before  # nothing submitted at call time
        assert all(isinstance(a, da.Array) for a in (f, g, hv, val))
        assert (f.shape, g.shape, hv.shape, val.shape) == ((), ref.shape, ref.shape, ())
        assert {a.dtype for a in (f, g, hv, val)} == {np.dtype(dtype)}
        f, g = dask.compute(f, g)
        assert counter.n == before + 1  # the value and the gradient: one graph
        hv, val = dask.compute(hv, val)  # two evaluations in one graph
        assert counter.n == before + 2
    assert f.dtype == g.dtype == hv.dtype == val.dtype == dtype
    f0, g0 = ref.value_and_gradient(th)
    assert abs(float(f) - float(f0)) <= tol * abs(float(f0))
    assert abs(float(val) - float(f0)) <= tol * abs(float(f0))
    _close(g, g0, tol)
    _close(hv, ref.hvp(th, v), 10 * tol)


def _group_risk(lk, tau):
    if abs(tau) < 1e-6:  # the cumulant series: the definition loses eps / |tau| there
        m = lk.mean()
        return m + tau * np.mean((lk - m) ** 2) / 2
    return (special.logsumexp(tau * lk) - np.log(lk.size)) / tau


def _hier_value(theta, X, y, g, t, tau, l2):
    """The one-level hierarchical logistic objective from its definition, in float64."""
    z = X @ theta
    ell = np.logaddexp(0.0, z) - y * z
    labels = np.unique(g)
    R = np.array([_group_risk(ell[g == k], tau) for k in labels])
    P = np.array([np.mean(g == k) for k in labels])
    risk = float(P @ R) if t == 0 else float(special.logsumexp(t * R, b=P) / t)
    return risk + 0.5 * l2 * float(theta @ theta)


@pytest.mark.parametrize("tau", [-50.0, 2.0, 1e-8])
def test_hierarchical_methods_against_the_definition(cluster, tau):
    """Value against the definition and gradient against its central differences."""
    client, _ = cluster
    X, y, g = _data(seed=4)
    _, obj = _pair("hier", tau, np.float64, client, seed=4)
    th = np.array([0.3, -0.4, 0.8, 0.1])
    with client.as_current():
        f, grad = dask.compute(*obj.value_and_gradient(th))
    want = _hier_value(th, X, y, g, -1.5, tau, 1e-3)
    assert abs(float(f) - want) <= 1e-12 * abs(want)
    h = 1e-6
    fd = [
        (_hier_value(th + h * e, X, y, g, -1.5, tau, 1e-3)
         - _hier_value(th - h * e, X, y, g, -1.5, tau, 1e-3)) / (2 * h)
        for e in np.eye(4)
    ]  # fmt: skip
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_each_result_computed_alone_runs_the_evaluation(cluster):
    """Documented: results computed one by one are one evaluation (graph) each, with the
    same numbers as when computed together."""
    client, counter = cluster
    ref, obj = _pair("hier", 2.0, np.float64, client)
    th = np.full(ref.shape, 0.2)
    with client.as_current():
        f, g = obj.value_and_gradient(th)
        before = counter.n
        f1, g1 = f.compute(), g.compute()
        assert counter.n == before + 2
        f2, g2 = dask.compute(f, g)
        assert counter.n == before + 3
        before = counter.n
        grad = obj.gradient(th).compute()  # gradient alone: one graph
        assert counter.n == before + 1
    assert float(f1) == float(f2)
    np.testing.assert_array_equal(g1, g2)
    np.testing.assert_array_equal(grad, g2)
    _close(g2, ref.gradient(th), 1e-11)


def test_client_objective_still_one_graph_per_call(cluster):
    client, counter = cluster
    ref, obj = _pair("hier", -2.0, np.float64, client)
    cl = ClientObjective(obj)
    th, v = np.full(ref.shape, 0.1), np.arange(1.0, 5.0)
    with client.as_current():
        before = counter.n
        f, g = cl.value_and_gradient(th)
        hv = cl.hvp(th, v)
        assert counter.n == before + 2
    assert isinstance(g, np.ndarray) and isinstance(hv, np.ndarray)
    f0, g0 = ref.value_and_gradient(th)
    assert abs(float(f) - float(f0)) <= 1e-12 * abs(float(f0))
    _close(g, g0, 1e-11)
    _close(hv, ref.hvp(th, v), 1e-10)


def test_local_scheduler_and_passes_counted_at_call():
    """Without a cluster: Dask's local scheduler runs one graph per ``dask.compute``; a pass
    over the data is counted when the method is called (when the graph is built)."""
    X, y, g = _data(seed=6)
    kw = {"groups": [g // 3, g], "tilts": (1.0, -2.0, 3.0)}
    ref = tl.TiltedObjective("logistic", X, y, **kw)
    obj = tl.TiltedObjective(
        "logistic",
        da.from_array(X, chunks=(CHUNKS, 4)),
        da.from_array(y, chunks=(CHUNKS,)),
        **kw,
    )
    distribute(obj)
    th = np.full(4, -0.2)
    with SchedulerRuns() as c:
        f, g1 = obj.value_and_gradient(th)
        assert c.n == 0 and obj.n_passes == 1
        H = obj.hessian(th)  # hierarchical: columns of Hessian-vector products
        assert c.n == 0 and obj.n_passes == 5
        f, g1, H = dask.compute(f, g1, H)  # five evaluations, one graph
        assert c.n == 1
    f0, g0 = ref.value_and_gradient(th)
    assert abs(float(f) - float(f0)) <= 1e-12 * abs(float(f0))
    _close(g1, g0, 1e-11)
    _close(H, ref.hessian(th), 1e-10)


def test_sample_level_dense_hessian_and_multinomial_shapes():
    rng = np.random.default_rng(7)
    n, d, K = 700, 3, 3
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    y = rng.integers(0, K, size=n)
    Xd = da.from_array(X, chunks=((300, 0, 400), d))
    yd = da.from_array(y, chunks=((300, 0, 400),))
    for kw in ({"t": -2.0, "l2": 1e-2}, {"groups": y % 2, "tilts": (3.0, 50.0)}):
        ref = tl.TiltedObjective("multinomial", X, y, **kw)
        obj = tl.TiltedObjective("multinomial", Xd, yd, **kw)
        th = 0.3 * rng.normal(size=d * K)  # flat parameters give flat results
        v = rng.normal(size=d * K)
        f, g, hv = obj.value_and_gradient(th) + (obj.hvp(th, v),)
        assert g.shape == hv.shape == (d * K,)
        f, g, hv = dask.compute(f, g, hv)
        f0, g0 = ref.value_and_gradient(th)
        assert abs(float(f) - float(f0)) <= 1e-12 * abs(float(f0))
        _close(g, g0, 1e-11)
        _close(hv, ref.hvp(th, v), 1e-10)
        gc = objective_call(obj, "grad", th)[1]
        hc = objective_call(obj, "hvp", th.reshape(d, K), da.from_array(v.reshape(d, K)))
        assert gc.shape == (d * K,) and hc.shape == (d, K)
        gc, hc = dask.compute(gc, hc)
        _close(gc, g0, 1e-11)
        _close(hc.reshape(-1), ref.hvp(th, v), 1e-10)
    X2 = X[:, :2]
    ref = tl.TiltedObjective("squared", X2, X[:, 2], t=-1.0, l2=0.5)
    obj = tl.TiltedObjective("squared", Xd[:, :2], Xd[:, 2], t=-1.0, l2=0.5)
    th = np.array([0.5, -1.0])
    distribute(obj)  # the first call would persist the data (one graph)
    with SchedulerRuns() as c:
        H = obj.hessian(th)
        assert c.n == 0 and H.shape == (2, 2)
        _close(H.compute(), ref.hessian(th), 1e-11)
        assert c.n == 1


def test_overflowing_trial_point_gives_inf_value():
    """A trial point whose losses overflow: value inf, NaN gradient, in the graph (the
    contract the solvers' line searches rely on)."""
    X, y, g = _data(seed=8)
    for kw in ({"t": 2.0}, {"groups": g, "tilts": (1.0, 2.0)}):
        obj = tl.TiltedObjective(
            "squared", da.from_array(X, chunks=(CHUNKS, 4)), da.from_array(y, chunks=(CHUNKS,)),
            **kw,
        )  # fmt: skip
        with np.errstate(over="ignore", invalid="ignore"):
            f, grad = dask.compute(*obj.value_and_gradient(np.full(4, 1e200)))
        assert np.isposinf(f) and np.all(np.isnan(grad))


def test_objective_call_matches_the_methods():
    X, y, g = _data(seed=9)
    kw = {"groups": g, "tilts": (0.5, -2.0), "l2": 1e-2}
    ref = tl.TiltedObjective("logistic", X, y, **kw)
    obj = tl.TiltedObjective(
        "logistic", da.from_array(X, chunks=(CHUNKS, 4)), da.from_array(y, chunks=(CHUNKS,)),
        **kw,
    )  # fmt: skip
    th, v = np.full(4, 0.3), np.linspace(-1.0, 1.0, 4)
    distribute(obj)
    with SchedulerRuns() as c:
        f, grad = objective_call(obj, "grad", th)
        hv = objective_call(obj, "hvp", th, v)
        val = objective_call(obj, "value", th)
        H = objective_call(obj, "hess", th)  # hierarchical: one hvp per column
        assert c.n == 0
        f, grad, hv, val, H = dask.compute(f, grad, hv, val, H)
        assert c.n == 1
    f0, g0 = ref.value_and_gradient(th)
    assert abs(float(f) - float(f0)) <= 1e-12 * abs(float(f0)) and float(val) == float(f)
    _close(grad, g0, 1e-11)
    _close(hv, ref.hvp(th, v), 1e-10)
    _close(H, ref.hessian(th), 1e-10)
    with pytest.raises(ValueError, match="`kind`"):
        objective_call(obj, "laplacian", th)
    with pytest.raises(ValueError, match="`theta` must have shape"):
        objective_call(obj, "grad", np.zeros(5))


def test_lazy_parameters_chain_in_one_graph(cluster):
    """A parameter that is itself lazy (a gradient step on a lazy gradient) is computed in
    the graph of the evaluation that uses it: two chained evaluations, one graph."""
    client, counter = cluster
    ref, obj = _pair("hier", -2.0, np.float64, client, seed=3)
    th = np.full(ref.shape, 0.1)
    with client.as_current():
        _, g = obj.value_and_gradient(th)
        th1 = da.from_array(th) - 0.5 * g  # a computation, not data: stays in the graph
        v = da.ones(ref.shape, dtype=np.float64) * 2.0
        before = counter.n
        f1, g1 = obj.value_and_gradient(th1)
        hv = obj.hvp(th1, v)
        assert counter.n == before
        f1, g1, hv, step = dask.compute(f1, g1, hv, th1)
        assert counter.n == before + 1
    want_step = th - 0.5 * ref.gradient(th)
    _close(step, want_step, 1e-12)
    f0, g0 = ref.value_and_gradient(want_step)
    assert abs(float(f1) - float(f0)) <= 1e-12 * abs(float(f0))
    _close(g1, g0, 1e-10)
    _close(hv, ref.hvp(want_step, np.full(ref.shape, 2.0)), 1e-10)


def test_in_memory_parameters_are_read_without_computing():
    from tiltlab.distributed._objective import in_memory

    a = np.arange(12.0).reshape(4, 3)
    with SchedulerRuns() as c:
        got = in_memory(da.from_array(a, chunks=(3, 2)))  # four blocks of data
        lazy = da.from_array(a, chunks=2) * 2.0
        assert in_memory(lazy) is lazy
        assert in_memory(a) is a and in_memory(None) is None
        masked = da.from_array(a[:, 0], chunks=2)
        masked = masked[masked > 1.0]  # unknown chunk sizes
        assert in_memory(masked) is masked
    assert c.n == 0
    np.testing.assert_array_equal(got, a)


def test_data_filtered_to_unknown_chunk_sizes_after_compute_chunk_sizes(cluster):
    """Rows kept by a mask (chunks of unknown, then uneven sizes that split the groups):
    the objective takes the data once their chunk sizes are known."""
    client, counter = cluster
    X, y, g = _data(seed=10)
    keep = X[:, 1] > -0.5
    Xd = da.from_array(X, chunks=(150, 4))
    yd = da.from_array(y, chunks=150)
    mask = Xd[:, 1] > -0.5
    Xm, ym = Xd[mask], yd[mask]
    assert np.isnan(Xm.shape[0])
    with client.as_current():
        Xm.compute_chunk_sizes()
        ym.compute_chunk_sizes()
        assert len(set(Xm.chunks[0])) > 1  # uneven chunks
        kw = {"groups": g[keep], "tilts": (2.0, -50.0), "l2": 1e-2}
        obj = tl.TiltedObjective("logistic", Xm, ym, **kw)
        plan = distribute(obj)
        distributed.wait([plan.X, plan.y, plan.codes])
        th = np.array([0.2, -0.1, 0.4, 0.3])
        before = counter.n
        f, grad = obj.value_and_gradient(th)
        f, grad = dask.compute(f, grad)
        assert counter.n == before + 1
    ref = tl.TiltedObjective("logistic", X[keep], y[keep], **kw)
    f0, g0 = ref.value_and_gradient(th)
    assert abs(float(f) - float(f0)) <= 1e-12 * abs(float(f0))
    _close(grad, g0, 1e-11)


@pytest.mark.parametrize("unknown", ["X", "y"])
def test_unknown_chunk_sizes_refused_with_the_remedy(unknown):
    """Before the chunk sizes are known the objective names the argument and the fix
    (it used to report a NaN row count as a mismatch)."""
    X, y, _ = _data(seed=11)
    Xd = da.from_array(X, chunks=(150, 4))
    yd = da.from_array(y, chunks=150)
    mask = Xd[:, 1] > -0.5
    if unknown == "X":
        Xd = Xd[mask]
    else:
        yd = yd[mask]
    with pytest.raises(
        ValueError,
        match=rf"`{unknown}` has an unknown number of rows.*"
        rf"{unknown}\.compute_chunk_sizes",
    ):
        tl.TiltedObjective("logistic", Xd, yd, t=1.0)

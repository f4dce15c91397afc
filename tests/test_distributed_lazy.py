"""Dask: the hierarchical objective in one graph, and lazy risks (no compute at call time).

References are independent of the code under test: closed forms evaluated here in float64
with SciPy's ``logsumexp``, central finite differences of them, the 50-digit references of
``tests/_contract.py``, and the eager NumPy objective and risks (a different evaluation
order: one process, no chunk states).
Laziness is checked by counting the runs of Dask's local schedulers (a callback) and the
graphs a ``distributed`` scheduler receives (a scheduler plugin).
"""

from __future__ import annotations

import numpy as np
import pytest
from _contract import reference_hierarchy, reference_tilted

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
special = pytest.importorskip("scipy.special")

from _dask_runs import SchedulerRuns  # noqa: E402

from tiltlab.distributed import ClientObjective, distribute  # noqa: E402

TILTS = [0.0, 1e-8, -1e-8, 2.0, -2.0, 50.0, -50.0]



def _tol(dtype):
    return 1e-11 if dtype == np.float64 else 2e-4


def _hier_data(n=900, d=4, G=6, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))].astype(dtype)
    z = X.astype(np.float64) @ rng.normal(size=d)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(dtype)
    g = rng.integers(0, G, size=n)  # every chunk holds samples of every group
    return X, y, g


#: uneven chunks with an empty one: groups are split across chunks
CHUNKS = (200, 0, 350, 350)


def _dask_pair(X, y, w=None):
    Xd = da.from_array(X, chunks=(CHUNKS, X.shape[1]))
    yd = da.from_array(y, chunks=(CHUNKS,))
    wd = None if w is None else da.from_array(w, chunks=(CHUNKS,))
    return Xd, yd, wd


# ---------------------------------------------------------------------------------------
# the hierarchical objective


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("tau", TILTS)
def test_hierarchical_objective_matches_numpy(tau, dtype):
    X, y, g = _hier_data(dtype=dtype)
    w = None
    if tau in (2.0, -50.0):  # priors with zeros on some cases
        w = np.random.default_rng(1).uniform(0.0, 2.0, size=len(y)).astype(dtype)
        w[::7] = 0.0
    kw = {"groups": g, "tilts": (-1.5, tau), "l2": 1e-3}
    ref = tl.TiltedObjective("logistic", X, y, weights=w, **kw)
    Xd, yd, wd = _dask_pair(X, y, w)
    obj = tl.TiltedObjective("logistic", Xd, yd, weights=wd, **kw)
    rng = np.random.default_rng(2)
    th = (0.5 * rng.normal(size=ref.shape)).astype(dtype)
    v = rng.normal(size=ref.shape).astype(dtype)
    distribute(obj)
    with SchedulerRuns() as c:
        f, gr = obj.value_and_gradient(da.from_array(th))
        hv = obj.hvp(da.from_array(th), da.from_array(v))
        val = obj.value(da.from_array(th))
        assert c.n == 0  # lazy results
        f, gr = dask.compute(f, gr)
        assert c.n == 1  # one graph: both sweeps, the upper levels and the finishing
        hv, val = dask.compute(hv, val)
        assert c.n == 2
    f0, g0 = ref.value_and_gradient(th)
    h0 = ref.hvp(th, v)
    tol = _tol(dtype)
    assert np.asarray(f).dtype == dtype and np.asarray(gr).dtype == dtype
    assert np.asarray(hv).dtype == dtype
    assert abs(float(f) - float(f0)) <= tol * abs(float(f0))
    assert abs(float(val) - float(f0)) <= tol * abs(float(f0))
    np.testing.assert_allclose(np.asarray(gr), g0, rtol=tol, atol=tol * np.abs(g0).max())
    np.testing.assert_allclose(np.asarray(hv), h0, rtol=10 * tol, atol=10 * tol * np.abs(h0).max())


def _group_risk(lk, tau, m=None):
    """Tilted risk of one group's losses ``lk`` (prior ``m``) in float64: the definition,
    or for ``|tau| < 1e-6`` its cumulant series ``mean + tau var / 2`` (the definition loses
    ``eps / |tau|`` there; the next term is ``O(tau^2)``)."""
    m = np.ones_like(lk) if m is None else m
    if np.isinf(tau):
        return lk[m > 0].max() if tau > 0 else lk[m > 0].min()
    mean = m @ lk / m.sum()
    if abs(tau) < 1e-6:
        return mean + tau * (m @ (lk - mean) ** 2 / m.sum()) / 2
    return (special.logsumexp(tau * lk, b=m) - np.log(m.sum())) / tau


def _closed_form(theta, X, y, g, t, tau):
    """One-level hierarchical logistic risk in float64 from its definition."""
    z = X @ theta
    ell = np.logaddexp(0.0, z) - y * z
    R, P = [], []
    for k in np.unique(g):
        R.append(_group_risk(ell[g == k], tau))
        P.append(np.mean(g == k))
    R, P = np.array(R), np.array(P)
    return float(P @ R) if t == 0 else float(special.logsumexp(t * R, b=P) / t)


@pytest.mark.parametrize(("t", "tau"), [(-1.5, 2.0), (3.0, -50.0), (0.0, 0.0), (2.0, 1e-8)])
def test_hierarchical_objective_closed_form_and_differences(t, tau):
    X, y, g = _hier_data(n=600, seed=3)
    Xd = da.from_array(X, chunks=((150, 0, 250, 200), X.shape[1]))
    yd = da.from_array(y, chunks=((150, 0, 250, 200),))
    cl = ClientObjective(tl.TiltedObjective("logistic", Xd, yd, groups=g, tilts=(t, tau)))
    th = np.array([0.3, -0.4, 0.8, 0.1])
    f, grad = cl.value_and_gradient(th)
    assert abs(float(f) - _closed_form(th, X, y, g, t, tau)) <= 1e-13 * max(1.0, abs(float(f)))
    h = 1e-6
    fd = np.array(
        [
            (_closed_form(th + h * e, X, y, g, t, tau) - _closed_form(th - h * e, X, y, g, t, tau))
            / (2 * h)
            for e in np.eye(4)
        ]
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_hierarchical_multinomial_and_two_levels():
    rng = np.random.default_rng(5)
    n, d, K = 700, 3, 3
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    y = rng.integers(0, K, size=n)
    g = rng.integers(0, 8, size=n)
    kw = {"groups": [g // 3, g], "tilts": (1.0, -2.0, 3.0), "l2": 1e-2}
    ref = tl.TiltedObjective("multinomial", X, y, **kw)
    Xd = da.from_array(X, chunks=((300, 0, 400), d))
    obj = tl.TiltedObjective("multinomial", Xd, da.from_array(y, chunks=((300, 0, 400),)), **kw)
    th, v = 0.3 * rng.normal(size=ref.shape), rng.normal(size=ref.shape)
    f, gr = obj.value_and_gradient(da.from_array(th))
    f0, g0 = ref.value_and_gradient(th)
    assert np.asarray(gr).shape == ref.shape
    np.testing.assert_allclose(float(f), float(f0), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(gr), g0, rtol=1e-11, atol=1e-13)
    hv = obj.hvp(da.from_array(th), da.from_array(v))
    np.testing.assert_allclose(np.asarray(hv), ref.hvp(th, v), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------
# hierarchical_risk: lazy


def _risk_data(n=1000, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.exponential(size=n).astype(dtype), rng.integers(0, 7, size=n)


def _hier_closed_form(l, g, t, tau, p=None):
    l = l.astype(np.float64)
    p = np.ones_like(l) if p is None else p.astype(np.float64)
    R, P = [], []
    for k in np.unique(g):
        m, lk = p[g == k], l[g == k]
        R.append(_group_risk(lk, tau, m))
        P.append(m.sum())
    R, P = np.array(R), np.array(P) / np.sum(P)
    return float(P @ R) if t == 0 else float(special.logsumexp(t * R, b=P) / t)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("codes", ["numpy", "dask", "dask-sparse", "dask-sorted"])
@pytest.mark.parametrize("tau", TILTS + [np.inf, -np.inf])
def test_hierarchical_risk_lazy(tau, codes, dtype):
    l, g = _risk_data(dtype=dtype)
    if codes == "dask-sorted":  # chunks hold different sets of groups, split at their ends
        order = np.argsort(g, kind="stable")
        l, g = l[order], g[order]
    w = np.random.default_rng(9).uniform(0.2, 1.0, size=l.size) if tau in (2.0, np.inf) else None
    labels = g * 1_000_003 - 5 if codes == "dask-sparse" else g  # any integer labels
    gd = labels if codes == "numpy" else da.from_array(labels, chunks=170)
    ld = da.from_array(l, chunks=((100, 0, 250, 650),))
    wd = None if w is None else da.from_array(w, chunks=300)
    with SchedulerRuns() as c:
        r = tl.hierarchical_risk(ld, gd, (1.5, tau), weights=wd)
        assert c.n == 0  # nothing computed at call time
        got = r.compute()
        assert c.n == 1
    assert isinstance(r, da.Array) and r.shape == () and got.dtype == dtype
    want = tl.hierarchical_risk(l, labels, (1.5, tau), weights=w)
    tol = 1e-13 if dtype == np.float64 else 1e-5
    assert abs(float(got) - float(want)) <= tol * max(1.0, abs(float(want)))
    if dtype == np.float64:
        assert abs(float(got) - _hier_closed_form(l, g, 1.5, tau, w)) <= 1e-12


def test_hierarchical_risk_unknown_chunk_sizes_and_errors():
    l, g = _risk_data(n=300, seed=4)
    keep = l > 0.2
    ld, gd = da.from_array(l, chunks=70), da.from_array(g, chunks=70)
    lm, gm = ld[ld > 0.2], gd[ld > 0.2]  # the same mask: the same unknown chunks
    assert np.isnan(lm.shape[0])
    with SchedulerRuns() as c:
        r = tl.hierarchical_risk(lm, gm, (-1.0, 2.0))
        assert c.n == 0
        got = float(r.compute())
    want = _hier_closed_form(l[keep], g[keep], -1.0, 2.0)
    assert abs(got - want) <= 1e-13 * max(1.0, abs(want))
    with pytest.raises(ValueError, match="same chunks"):
        tl.hierarchical_risk(lm, gd.rechunk(100), (-1.0, 2.0))
    r = tl.hierarchical_risk(lm, gd, (-1.0, 2.0))  # as many chunks: checked as they run
    with pytest.raises(ValueError, match=r"has a chunk of \d+ labels where `losses` has"):
        r.compute()
    with pytest.raises(ValueError, match="length 300"):
        tl.hierarchical_risk(ld, gd[:-1], (-1.0, 2.0))
    bad = da.from_array(np.r_[l[:-1], np.nan], chunks=70)
    r = tl.hierarchical_risk(bad, gd, (1.0, 1.0))  # lazy: raises when computed
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        r.compute()
    assert np.isnan(float(tl.hierarchical_risk(bad, gd, (1.0, 1.0), check_finite=False).compute()))
    w = np.ones(300)
    w[g == 3] = 0.0
    with pytest.raises(ValueError, match="zero total weight"):
        tl.hierarchical_risk(ld, gd, (1.0, 1.0), weights=da.from_array(w, chunks=70)).compute()
    # float labels are computed at call time (documented), with the same result
    with SchedulerRuns() as c:
        r = tl.hierarchical_risk(ld, gd.astype(np.float64), (-1.0, 2.0))
        assert c.n == 1
    assert float(r.compute()) == pytest.approx(_hier_closed_form(l, g, -1.0, 2.0), rel=1e-13)


# ---------------------------------------------------------------------------------------
# tilted_risk: lazy, on every shape


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tilted_risk_grid_keepdims_nd_lazy(dtype):
    rng = np.random.default_rng(6)
    grid = np.array(TILTS + [np.inf, -np.inf])
    l = rng.exponential(size=500).astype(dtype)
    p = rng.uniform(0.0, 1.0, size=500)
    ld = da.from_array(l, chunks=((100, 0, 150, 250),))
    L = rng.exponential(size=(3, 4, 60)).astype(dtype)
    Ld = da.from_array(L, chunks=(2, 3, 25))
    eps = float(np.finfo(dtype).eps)
    cases = [
        (lambda: tl.tilted_risk(ld, grid), lambda: tl.tilted_risk(l, grid)),
        (
            lambda: tl.tilted_risk(ld, grid, keepdims=True, weights=da.from_array(p, chunks=90)),
            lambda: tl.tilted_risk(l, grid, keepdims=True, weights=p),
        ),
        (
            lambda: tl.tilted_risk(ld, -2.0, keepdims=True),
            lambda: tl.tilted_risk(l, -2.0, keepdims=True),
        ),
    ]
    for ax in (0, 1, -1):
        w = rng.uniform(0.1, 1.0, size=L.shape[ax])
        cases.append(
            (
                lambda ax=ax, w=w: tl.tilted_risk(
                    Ld, grid, axis=ax, weights=da.from_array(w, chunks=7)
                ),
                lambda ax=ax, w=w: tl.tilted_risk(L, grid, axis=ax, weights=w),
            )
        )
        cases.append(
            (
                lambda ax=ax: tl.tilted_risk(Ld, 50.0, axis=ax, keepdims=True),
                lambda ax=ax: tl.tilted_risk(L, 50.0, axis=ax, keepdims=True),
            )
        )
    for lazy, eager in cases:
        with SchedulerRuns() as c:
            r = lazy()
            assert c.n == 0
            got = r.compute()
            assert c.n == 1
        want = eager()
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=64 * eps, atol=64 * eps)
    # independent: the closed form along the last axis at t = 2
    want = special.logsumexp(2.0 * L.astype(np.float64), axis=-1) / 2.0 - np.log(60) / 2.0
    got = tl.tilted_risk(Ld, 2.0).compute()
    np.testing.assert_allclose(got, want, rtol=64 * eps)
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        tl.tilted_risk(da.from_array(np.r_[l[:-1], np.nan], chunks=100), grid).compute()


# ---------------------------------------------------------------------------------------
# the distributed scheduler: graphs counted by a scheduler plugin


@pytest.fixture(scope="module")
def threads_cluster():
    distributed = pytest.importorskip("distributed")
    from distributed.diagnostics.plugin import SchedulerPlugin

    class GraphCounter(SchedulerPlugin):
        name = "tiltlab-lazy-graph-counter"

        def __init__(self):
            self.n = 0

        def update_graph(self, scheduler, **kwargs):
            self.n += 1

    cluster = distributed.LocalCluster(
        n_workers=2,
        processes=False,
        threads_per_worker=1,
        dashboard_address=":0",  # a free port: another cluster may hold the default one
    )
    client = distributed.Client(cluster, set_as_default=False)
    counter = GraphCounter()
    cluster.scheduler.add_plugin(counter)
    try:
        yield client, counter
    finally:
        client.close()
        cluster.close()


def test_one_graph_on_the_distributed_scheduler(threads_cluster):
    distributed = pytest.importorskip("distributed")
    client, counter = threads_cluster
    l, g = _risk_data(n=2000, seed=8)
    ld, gd = da.from_array(l, chunks=300), da.from_array(g, chunks=300)
    X, y, gg = _hier_data(n=900, seed=8)
    with client.as_current():
        for fn, want in [
            (lambda: tl.tilted_risk(ld, 2.0), tl.tilted_risk(l, 2.0)),
            (
                lambda: tl.tilted_risk(ld, np.array([-1.0, 0.0, 1.0])),
                tl.tilted_risk(l, np.array([-1.0, 0.0, 1.0])),
            ),
            (
                lambda: tl.hierarchical_risk(ld, gd, (1.0, -2.0)),
                tl.hierarchical_risk(l, g, (1.0, -2.0)),
            ),
            (
                lambda: tl.hierarchical_risk(ld, g, (1.0, -2.0)),
                tl.hierarchical_risk(l, g, (1.0, -2.0)),
            ),
        ]:
            before = counter.n
            r = fn()
            assert counter.n == before  # nothing submitted at call time
            got = r.compute()
            assert counter.n == before + 1  # one graph
            np.testing.assert_allclose(got, want, rtol=1e-13)
        obj = tl.TiltedObjective("logistic", *_dask_pair(X, y)[:2], groups=gg, tilts=(-1.0, 2.0))
        cl = ClientObjective(obj)  # persists the data (one graph) before counting
        distributed.wait([cl.plan.X, cl.plan.y])  # the persist graph reached the scheduler
        th = np.full(4, 0.1)
        before = counter.n
        f, grad = cl.value_and_gradient(th)
        assert counter.n == before + 1  # both sweeps and the upper levels in one graph
    f0, g0 = tl.TiltedObjective("logistic", X, y, groups=gg, tilts=(-1.0, 2.0)).value_and_gradient(
        th
    )
    assert abs(float(f) - float(f0)) <= 1e-13 * abs(float(f0))
    np.testing.assert_allclose(grad, g0, rtol=1e-11, atol=1e-14)


def test_second_sweep_forms_the_pieces_again_where_they_are_missing():
    """A product task that runs away from its chunk's first sweep (or after the kept
    pieces were dropped) forms them again: the same product either way."""
    from tiltlab.distributed import _groups
    from tiltlab.risk import GroupTree

    X, y, g = _hier_data(n=300, seed=11)
    loss = tl.TiltedObjective("logistic", X, y, t=1.0).loss
    th, v = np.full(4, 0.2), np.arange(4.0)
    upper = GroupTree(n_samples=6, levels=(), sample_layouts=())
    for mode, V in (("grad", None), ("hvp", v)):
        args = (X, y, None, g, th, V, loss, -2.0, 6, mode, "tok", 0)
        st = _groups.group_sweep(*args)
        root = _groups.group_root(upper, (1.0, -2.0), mode, "<f8", st)
        kept = _groups.group_products(*args, root)  # takes the kept pieces
        assert ("tok", 0) not in _groups._KEPT
        again = _groups.group_products(*args, root)  # nothing kept: formed again
        np.testing.assert_array_equal(kept, again)
        ref = tl.TiltedObjective("logistic", X, y, groups=g, tilts=(1.0, -2.0))
        want = ref.gradient(th) if mode == "grad" else ref.hvp(th, v)
        np.testing.assert_allclose(kept, want, rtol=1e-12, atol=1e-14)


_LOADS: list = []


def _load_rows(a, r0, r1):
    _LOADS.append((r0, r1))
    return a[r0:r1].copy()


def test_hierarchical_objective_on_data_read_at_each_evaluation():
    """Not persisted (data beyond the workers' memory): one sweep that reads each chunk once
    (per-group sums), instead of two sweeps that would hold every loaded chunk until the
    second one."""
    X, y, g = _hier_data(n=800, seed=12)
    bounds = [(0, 300), (300, 300), (300, 800)]  # with an empty chunk
    load = dask.delayed(_load_rows, pure=True)
    Xd = da.concatenate(
        [da.from_delayed(load(X, a, b), shape=(b - a, 4), dtype=X.dtype) for a, b in bounds]
    )
    yd = da.concatenate(
        [da.from_delayed(load(y, a, b), shape=(b - a,), dtype=y.dtype) for a, b in bounds]
    )
    kw = {"groups": g, "tilts": (2.0, -1.0)}
    obj = tl.TiltedObjective("logistic", Xd, yd, **kw)
    assert not distribute(obj, persist=False).persisted
    ref = tl.TiltedObjective("logistic", X, y, **kw)
    th, v = np.full(4, 0.3), np.linspace(-1.0, 1.0, 4)
    _LOADS.clear()
    with SchedulerRuns() as c:
        f, gr = dask.compute(*obj.value_and_gradient(da.from_array(th)))
        assert c.n == 1
    for a, b in bounds[::2]:  # the non-empty chunks: each read once, X and y
        assert _LOADS.count((a, b)) == 2
    f0, g0 = ref.value_and_gradient(th)
    assert abs(float(f) - float(f0)) <= 1e-13 * abs(float(f0))
    np.testing.assert_allclose(np.asarray(gr), g0, rtol=1e-12, atol=1e-14)
    hv = obj.hvp(da.from_array(th), da.from_array(v))
    np.testing.assert_allclose(np.asarray(hv), ref.hvp(th, v), rtol=1e-11, atol=1e-13)


def test_dask_tilts_checked_inside_the_one_graph(threads_cluster):
    """``tilted_risk`` with a Dask tilt and the default ``check_finite``: no graph at call
    time (the finiteness check of the losses and the tilt's own check run in the result's
    graph), one graph when computed, and the eager path's errors at compute time."""
    client, counter = threads_cluster
    l, _ = _risk_data(n=2000, seed=9)
    ld = da.from_array(l, chunks=300)
    bad = da.from_array(np.r_[l[:-1], np.nan], chunks=300)
    grid = np.array([-1.0, 0.0, 2.5])
    with client.as_current():
        for t, want in [
            (da.asarray(2.0), special.logsumexp(2.0 * l) / 2.0 - np.log(l.size) / 2.0),
            (da.from_array(grid, chunks=2), [tl.tilted_risk(l, float(v)) for v in grid]),
        ]:
            before = counter.n
            r = tl.tilted_risk(ld, t)
            assert counter.n == before  # nothing submitted at call time
            got = r.compute()
            assert counter.n == before + 1  # one graph
            assert got.shape == np.shape(want)
            np.testing.assert_allclose(got, want, rtol=1e-13)
        before = counter.n
        r_bad = tl.tilted_risk(bad, da.asarray(2.0))
        r_nan_t = tl.tilted_risk(ld, da.asarray(np.nan))
        assert counter.n == before
        with pytest.raises(ValueError, match="`losses` contains NaN"):
            r_bad.compute()
        with pytest.raises(ValueError, match="`t` must not be NaN"):
            r_nan_t.compute()
    keep = tl.tilted_risk(ld, da.asarray(-1.0), keepdims=True).compute()
    np.testing.assert_allclose(keep, [tl.tilted_risk(l, -1.0)], rtol=1e-13)


@pytest.mark.parametrize("t", [2.0, -1.5, 0.0, np.float32(0.5), np.inf])
def test_risks_with_a_float_tilt_and_default_arguments_compute_nothing_at_call_time(t):
    # a scheduler that counts every graph run (any compute, not only those that report
    # to local callbacks): the calls with default arguments build graphs and run none;
    # computing the result runs one
    runs = []

    def counting_get(dsk, keys, **kwargs):
        runs.append(keys)
        return dask.get(dsk, keys, **kwargs)

    l, g = _risk_data()
    ld = da.from_array(l, chunks=250)
    with dask.config.set(scheduler=counting_get):
        risk = tl.tilted_risk(ld, t)
        hier = tl.hierarchical_risk(ld, g, (t, 0.5))
        hier_dask_labels = tl.hierarchical_risk(ld, da.from_array(g, chunks=250), (t, 0.5))
        assert runs == []
        got = [float(r.compute()) for r in (risk, hier, hier_dask_labels)]
        assert len(runs) == 3
    want = [
        float(tl.tilted_risk(l, t)),
        float(tl.hierarchical_risk(l, g, (t, 0.5))),
        float(tl.hierarchical_risk(l, g, (t, 0.5))),
    ]
    np.testing.assert_allclose(got, want, rtol=1e-13)


# ---------------------------------------------------------------------------------------
# losses near the float maximum at t = 0, and tilts beyond the losses' precision


def _exact_mean(l, p=None):
    """The prior-weighted mean of ``l`` in exact rational arithmetic, rounded once."""
    from fractions import Fraction

    p = np.ones(len(l)) if p is None else p
    num = sum(Fraction(float(pi)) * Fraction(float(li)) for li, pi in zip(l, p, strict=True))
    return float(num / sum(Fraction(float(pi)) for pi in p))


def _lazy(fn):
    """``fn()`` built without running a graph, then computed in one."""
    with SchedulerRuns() as c:
        r = fn()
        assert c.n == 0
        got = r.compute()
        assert c.n == 1
    return got


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_mean_of_losses_spread_beyond_the_float_maximum(dtype, chunks, weighted):
    # the spread 1.88 * max overflows: differences to the smallest loss are not finite
    big = float(np.finfo(dtype).max)
    eps = float(np.finfo(dtype).eps)
    l = (np.array([0.94, -0.94, 0.56]) * big).astype(dtype)
    p = np.array([1.0, 2.0, 3.0]) if weighted else None
    ld = da.from_array(l, chunks=chunks)
    pd = None if p is None else da.from_array(p, chunks=chunks)
    # a few roundings, each at most eps times the largest magnitude involved
    atol = 16 * eps * big
    got = _lazy(lambda: tl.tilted_risk(ld, 0.0, weights=pd))
    assert got.dtype == dtype
    assert abs(float(got) - _exact_mean(l, p)) <= atol
    grid = _lazy(lambda: tl.tilted_risk(ld, np.array([np.inf, 0.0, -np.inf]), weights=pd))
    assert grid[0] == l.max() and grid[2] == l.min()
    assert abs(float(grid[1]) - _exact_mean(l, p)) <= atol
    w = _lazy(lambda: tl.tilted_weights(ld, 0.0, weights=pd))
    prior = np.ones(3) / 3 if p is None else p / p.sum()
    np.testing.assert_allclose(w, prior, rtol=4 * eps, atol=0)
    # N-d losses: one mean per row, along either axis
    L = np.stack([l, l[::-1], l[[1, 0, 2]]])
    Ld = da.from_array(L, chunks=(2, chunks))
    for ax in (0, 1):
        got = _lazy(lambda ax=ax: tl.tilted_risk(Ld, 0.0, axis=ax, weights=pd))
        rows = np.moveaxis(L, ax, -1)
        want = [_exact_mean(r, p) for r in rows]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("codes", ["numpy", "dask"])
def test_hierarchical_mean_of_a_group_spread_beyond_the_float_maximum(dtype, codes):
    big = float(np.finfo(dtype).max)
    eps = float(np.finfo(dtype).eps)
    l = (np.array([0.94, -0.94, 0.56, 0.2]) * big).astype(dtype)
    g = np.array([0, 0, 1, 1])  # group 0 spans more than the float maximum
    ld = da.from_array(l, chunks=3)
    gd = g if codes == "numpy" else da.from_array(g, chunks=3)
    atol = 16 * eps * big
    got = _lazy(lambda: tl.hierarchical_risk(ld, gd, (0.0, 0.0)))
    assert abs(float(got) - _exact_mean(l)) <= atol
    # the group means are 0 and 0.38 * max: their extremes at infinite outer tilts
    means = [_exact_mean(l[g == k]) for k in (0, 1)]
    for t, want in [(-np.inf, min(means)), (np.inf, max(means))]:
        got = _lazy(lambda t=t: tl.hierarchical_risk(ld, gd, (t, 0.0)))
        assert abs(float(got) - want) <= atol


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tilts_beyond_the_float32_range_are_the_extremes(dtype):
    # 1e300 and -1e39 round to +-inf in float32, the precision the risks of these losses
    # are accumulated in: the risk is the largest (smallest) loss, the weights its indicator
    l = np.array([1.0, 2.0, 3.0], dtype=dtype)
    ld = da.from_array(l, chunks=2)
    for t, want, w in [(1e300, 3.0, [0.0, 0.0, 1.0]), (-1e39, 1.0, [1.0, 0.0, 0.0])]:
        got = _lazy(lambda t=t: tl.tilted_risk(ld, t))
        assert got.dtype == dtype and float(got) == want
        got = _lazy(lambda t=t: tl.tilted_weights(ld, t))
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, w)
        assert float(_lazy(lambda t=t: tl.tilted_risk(ld, da.asarray(t)))) == want
    np.testing.assert_array_equal(
        _lazy(lambda: tl.tilted_risk(ld, np.array([1e300, -1e39]))), [3.0, 1.0]
    )
    L = da.from_array(np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 2.0]], dtype=dtype), chunks=2)
    np.testing.assert_array_equal(_lazy(lambda: tl.tilted_risk(L, 1e300, axis=1)), [3.0, 3.0])
    np.testing.assert_array_equal(_lazy(lambda: tl.tilted_risk(L, -1e39, axis=0)), [1.0, 1.0, 2.0])


@pytest.mark.parametrize("codes", ["numpy", "dask"])
def test_hierarchical_tilts_beyond_the_float32_range(codes):
    l = np.array([1.0, 2.0, 3.0, 5.0], dtype=np.float32)
    g = np.array([0, 0, 1, 1])
    ld = da.from_array(l, chunks=3)
    gd = g if codes == "numpy" else da.from_array(g, chunks=3)
    eps = float(np.finfo(np.float32).eps)

    def lse_mean(v):  # the tilted risk at t = 1 of equally weighted values
        return float(special.logsumexp(v) - np.log(len(v)))

    cases = [
        ((1.0, 1e300), lse_mean([2.0, 5.0])),  # the group maxima, tilted at 1
        ((1.0, -1e39), lse_mean([1.0, 3.0])),  # the group minima
        ((1e300, 1.0), lse_mean([3.0, 5.0])),  # the largest group risk
        ((-1e39, 1.0), lse_mean([1.0, 2.0])),  # the smallest group risk
        ((1e300, -1e39), 3.0),
    ]
    for tilts, want in cases:
        got = _lazy(lambda tilts=tilts: tl.hierarchical_risk(ld, gd, tilts))
        assert got.dtype == np.float32
        assert abs(float(got) - want) <= 8 * eps * abs(want), tilts


# ---------------------------------------------------------------------------------------
# finite prior weights whose total overflows

#: finite priors whose total overflows: uniform near the float maximum, and unequal weights
#: near it
HUGE_PRIORS = {
    np.float64: [[1e308] * 4, [1.7e308, 5e307, 1e308, 1.2e308]],
    np.float32: [[1e38] * 4, [3.3e38, 1e37, 2e38, 3e38]],
}
HUGE_LOSSES = [0.1, 0.5, 2.0, 3.0]
HUGE_TILTS = [-np.inf, -50.0, -1.0, 0.0, 1e-300, 1e-9, 1.0, 50.0, np.inf]


def _within(deviation, bound):
    """Every entry of ``deviation`` at most ``bound`` (broadcast)."""
    deviation, bound = np.broadcast_arrays(np.asarray(deviation, dtype=np.float64), bound)
    assert np.all(deviation <= bound), (deviation, bound)


def _rounding_bound(t, spread, n, n_chunks):
    """Roundings (in ulps, relative) of a risk's normaliser over ``n`` samples in
    ``n_chunks`` chunks: each ``p exp(t (l - c))``, the sums and the finish take ``n + 4``,
    ``exp`` of an argument rounded at ``|t| spread`` takes ``2 |t| spread``, and moving a
    chunk's sums to the merged shift ``|t| spread + 2`` more per merge."""
    k = 0.0 if np.isinf(t) else abs(t) * spread
    return n + 4 + 2 * k + (n_chunks - 1) * (k + 2)


@pytest.mark.slow  # about 6 s a case; test_risk.py's Dask case covers it in the push tier
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_prior_whose_total_overflows(dtype, chunks):
    # the risks and weights are those of the normalised prior (for the uniform one, those
    # without a prior), whatever the chunks: the 50-digit reference of the prior's values
    l = np.array(HUGE_LOSSES, dtype=dtype)
    l64 = [float(v) for v in l]
    n, spread, top = len(l64), float(np.ptp(l64)), max(abs(v) for v in l64)
    eps, tiny = float(np.finfo(dtype).eps), float(np.finfo(dtype).smallest_normal)
    n_chunks = -(-n // chunks)
    ld = da.from_array(l, chunks=chunks)
    held = [float(np.asarray(t, dtype=dtype)) for t in HUGE_TILTS]  # as the dtype holds them
    rtol = np.array([_rounding_bound(t, spread, n, n_chunks) * eps for t in held])
    rows = np.stack([l, l[::-1], l[[2, 0, 3, 1]]])
    g = np.array([0, 0, 1, 1])
    for prior in HUGE_PRIORS[dtype]:
        p = np.array(prior, dtype=dtype)
        with np.errstate(over="ignore"):
            assert np.all(np.isfinite(p)) and not np.isfinite(p.sum())
        pq = [float(v) for v in p]
        pd = da.from_array(p, chunks=chunks)
        refs = [reference_tilted(l64, t, pq) for t in held]
        want = np.array([float(r) for r, _ in refs])
        grid = _lazy(lambda pd=pd: tl.tilted_risk(ld, np.array(HUGE_TILTS), weights=pd))
        assert grid.dtype == dtype
        _within(np.abs(grid - want), rtol * top + tiny)
        dgrid = _lazy(lambda pd=pd: tl.tilted_risk(ld, da.asarray(HUGE_TILTS), weights=pd))
        _within(np.abs(dgrid - want), rtol * top + tiny)
        # the prior times a power of two (exact) that makes its total finite: the same bits
        small = da.from_array(np.ldexp(p, 1 - np.frexp(p.max())[1]), chunks=chunks)
        np.testing.assert_array_equal(
            grid, _lazy(lambda s=small: tl.tilted_risk(ld, np.array(HUGE_TILTS), weights=s))
        )
        for t, (_, ref_w), want_r, tol in zip(HUGE_TILTS, refs, want, rtol, strict=True):
            r = _lazy(lambda t=t, pd=pd: tl.tilted_risk(ld, t, weights=pd))
            assert r.dtype == dtype and abs(float(r) - want_r) <= tol * top, t
            w = _lazy(lambda t=t, pd=pd: tl.tilted_weights(ld, t, weights=pd))
            want_w = np.array([float(v) for v in ref_w])
            assert w.dtype == dtype
            # weights below the normal range keep that many of its ulps (absolutely)
            _within(np.abs(w - want_w), tol * (want_w + tiny) + tiny * eps)
        # N-d losses: one risk per row, along either axis
        want_rows = np.array(
            [
                [float(reference_tilted([float(v) for v in row], t, pq)[0]) for row in rows]
                for t in held
            ]
        )
        Ld = da.from_array(rows, chunks=(2, chunks))
        for lazy_rows, ax in ((Ld, 1), (Ld.T, 0)):
            got = _lazy(
                lambda a=lazy_rows, ax=ax, pd=pd: tl.tilted_risk(
                    a, np.array(HUGE_TILTS), axis=ax, weights=pd
                )
            )
            assert got.dtype == dtype and got.shape == want_rows.shape
            _within(np.abs(got - want_rows), rtol[:, None] * top + tiny)
        # two groups of two samples, NumPy and Dask labels: the bound at each level, added
        for tilts in [(1.0, -2.0), (-1.0, 0.0), (np.inf, 1.0), (2.0, -np.inf), (0.0, 50.0)]:
            want_h, want_hw = reference_hierarchy(l64, [g], list(tilts), prior=pq)
            hb = sum(_rounding_bound(t, spread, n, n_chunks) for t in tilts) * eps
            for labels in (g, da.from_array(g, chunks=chunks)):
                got = _lazy(
                    lambda t=tilts, g=labels, pd=pd: tl.hierarchical_risk(ld, g, t, weights=pd)
                )
                assert got.dtype == dtype and abs(float(got) - float(want_h)) <= hb * top, tilts
                hw = np.asarray(tl.hierarchical_weights(ld, labels, tilts, weights=pd).compute())
                want_hw = np.array([float(v) for v in want_hw])
                assert hw.dtype == dtype
                _within(np.abs(hw - want_hw), hb * (want_hw + tiny))

"""Tilted L-BFGS on Dask: in-memory scaling and an out-of-core fit.

(a) ``inmem``: logistic TERM (t = -1, l2 = 1e-4) on ``--rows`` x 32 float64 (default
    2e6: 512 MB) with NumPy (one BLAS thread, in this process) and with Dask on a
    ``LocalCluster`` of 1 and of 2 worker processes (one thread each). Fits run round-robin
    (``--repeats`` rounds, medians) with a fixed iteration budget, so every backend does
    the same work; reported: time per fit, time per evaluation, the ratios to NumPy, and
    graphs per iteration (counted by a scheduler plugin).

(b) ``ooc``: the same objective in float32 from an on-disk ``numpy.memmap`` file
    (``--ooc-rows`` x 32, default 1e8: 12.8 GB) read chunk by chunk inside the worker tasks
    through ``dask.array.from_delayed``; 2 workers with ``memory_limit=3GB`` each, so the
    data cannot be held in memory. Reported: the time to read the data once through the
    same chunk loaders (a graph that only sums the chunks) against the time of one
    evaluation (value and gradient), both after evicting the file from the page cache
    (``posix_fadvise(DONTNEED)``), and a short L-BFGS fit.

(c) ``hier``: one ``value_and_gradient`` of the hierarchical objective (logistic, ``--groups``
    Zipf-sized groups, tilts (-1, 2), ``--rows`` x 32 float64, default 1e6) and of the
    sample-level one (t = -1) on NumPy (one BLAS thread, in this process) and on a
    ``LocalCluster`` of 2 workers with one thread each (worker processes; ``--in-process``:
    threads of this process), interleaved, ``--repeats`` rounds, medians (and the ratio of
    the fastest runs, less sensitive to other processes). Reported: the Dask / NumPy
    ratios, the Dask evaluations in units of one plain Dask pass over the same persisted
    data (the value and gradient of the untilted least squares, ``X.T @ (X @ theta -
    y)``, one graph), and the graphs per evaluation (scheduler plugin) of the NumPy face the solvers
    use (``ClientObjective``) and of the objective's own methods on Dask arrays (lazy
    results, both fetched by one ``dask.compute``), and with ``--before DIR`` the same two
    calls of an older tiltlab in the same run (DIR holds a copy of the package renamed
    ``tiltlab_before``, see below). Also counted: the graphs that
    ``tilted_risk`` and ``hierarchical_risk`` of Dask losses submit when called and when
    computed.

(d) ``fit``: the L-BFGS fit of the logistic TERM objective (t = -1, l2 = 1e-4, ``--rows`` x
    32 float64, default 5e5, fixed iteration budget) and of its hierarchical form (200
    Zipf-sized groups, tilts (-1, 2)) on NumPy (one thread, in this process: the fused CPU
    engine for the sample level) and on a ``LocalCluster`` of 2 worker processes with one
    thread each, where the chunks of the sample-level objective take the fused CPU kernels
    (``dask fused``) or, with ``fused = False`` on the objective, the generic NumPy
    expressions (``dask generic``: the route before the kernels served Dask chunks).
    Interleaved rounds, medians; reported: time per fit and per evaluation, the ratio to
    the NumPy fit, the overhead per L-BFGS iteration and per evaluation against NumPy
    (Dask time minus NumPy time), graphs per iteration, and the load average.

(e) ``groups``: one ``value_and_gradient`` of a hierarchical objective (``--loss logistic``
    or ``multinomial`` with ``--classes`` classes, ``--groups`` Zipf-sized groups, tilts
    (-1, 2), ``--rows`` x 32 float64, default 5e5, chunks of ``--chunk`` rows) on Dask's
    default threaded scheduler in this process, with the NumPy chunks on the fused
    grouped kernel (``fused = True``) and on the generic route (``fused = False``, the
    same objective toggled), interleaved, ``--repeats`` rounds (at least 7), medians;
    reported with the load average and the agreement of the two results.

Usage::

    PYTHONPATH=. python benchmarks/dask_scaling.py inmem [--rows 2000000] [--repeats 3]
    PYTHONPATH=. python benchmarks/dask_scaling.py ooc [--ooc-rows 100000000] [--dir /tmp/x]
    PYTHONPATH=.:/tmp/b python benchmarks/dask_scaling.py hier [--rows 1000000] \
        [--groups 200] [--repeats 7] [--in-process] [--before /tmp/b]
    NUMBA_NUM_THREADS=1 PYTHONPATH=. python benchmarks/dask_scaling.py fit [--rows 500000] \
        [--repeats 5] [--max-iter 15]
    PYTHONPATH=. python benchmarks/dask_scaling.py groups --loss multinomial --classes 5 \
        --groups 100 --chunk 100000 [--rows 500000] [--repeats 7]

A ``--before`` copy: ``git archive <commit> tiltlab | tar -x -C /tmp/b``, rename
``/tmp/b/tiltlab`` to ``/tmp/b/tiltlab_before`` and replace ``"tiltlab.`` by
``"tiltlab_before.`` in its module-name strings (``sed -i 's/"tiltlab\\./"tiltlab_before./g'
/tmp/b/tiltlab_before/_backends.py``) so that it registers its own Dask engine; the
folder must be on ``PYTHONPATH`` for the worker processes.

(``PYTHONPATH=.`` so that the worker processes import this checkout's tiltlab.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

D = 32
T = -1.0
L2 = 1e-4


def _data(n: int, seed: int = 0, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, D), dtype=np.float64 if dtype == np.float64 else np.float32)
    X[:, 0] = 1.0
    beta = np.linspace(-1.0, 1.0, D).astype(X.dtype)
    p = 1.0 / (1.0 + np.exp(-(X @ beta)))
    y = (rng.uniform(size=n) < p).astype(X.dtype)
    return X, y


class _Counter:
    """A scheduler plugin counting submitted graphs (``update_graph`` calls)."""

    def __new__(cls):
        from distributed.diagnostics.plugin import SchedulerPlugin

        class GraphCounter(SchedulerPlugin):
            name = "graph-counter"

            def __init__(self):
                self.n = 0

            def update_graph(self, scheduler, **kwargs):
                self.n += 1

        return GraphCounter()


def _cluster(n_workers: int, memory_limit: str):
    import distributed

    cluster = distributed.LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True,
        memory_limit=memory_limit, dashboard_address=":0", silence_logs=40,
    )
    client = distributed.Client(cluster, set_as_default=False)
    counter = _Counter()
    cluster.scheduler.add_plugin(counter)
    return cluster, client, counter


def inmem(rows: int, repeats: int, max_iter: int) -> None:
    import dask.array as da
    import distributed
    from threadpoolctl import threadpool_limits

    import tiltlab as tl
    from tiltlab.distributed import ClientObjective, distribute

    X, y = _data(rows)
    chunk = 1 << 17  # 131072 rows x 32 float64 = 32 MiB per chunk
    print(f"(a) in memory: {rows} x {D} float64 ({X.nbytes / 1e9:.2f} GB), logistic, t={T}, "
          f"l2={L2}, lbfgs max_iter={max_iter} (tol=0: fixed work), chunks of {chunk} rows")
    setups = {}
    for w in (1, 2):
        cluster, client, counter = _cluster(w, "6GB")
        with client.as_current():
            obj = tl.TiltedObjective("logistic", da.from_array(X, chunks=(chunk, D)),
                                     da.from_array(y, chunks=chunk), t=T, l2=L2)
            plan = distribute(obj, persist=True)
            distributed.wait([plan.X, plan.y])
            ClientObjective(obj).value_and_gradient(np.zeros(D))  # workers import tiltlab
        setups[w] = (cluster, client, counter, obj)
    ref = tl.TiltedObjective("logistic", X, y, t=T, l2=L2)
    times: dict[str, list] = {"numpy": [], "dask-1": [], "dask-2": []}
    per_eval: dict[str, list] = {k: [] for k in times}
    graphs: dict[str, list] = {k: [] for k in times}
    xs = {}
    for _ in range(repeats):
        with threadpool_limits(1):
            t0 = time.perf_counter()
            r = tl.minimize(ref, method="lbfgs", tol=0.0, max_iter=max_iter)
            dt = time.perf_counter() - t0
        n_eval = {"numpy": r.n_passes}  # one pass per evaluation (the one-pass engine)
        times["numpy"].append(dt)
        per_eval["numpy"].append(dt / max(r.n_passes, 1))
        xs["numpy"] = r.x
        for w, (_, client, counter, obj) in setups.items():
            key = f"dask-{w}"
            with client.as_current():
                before = counter.n
                t0 = time.perf_counter()
                r = tl.minimize(obj, method="lbfgs", tol=0.0, max_iter=max_iter)
                dt = time.perf_counter() - t0
            times[key].append(dt)
            per_eval[key].append(dt / r.nfev)
            graphs[key].append((counter.n - before) / max(r.nit, 1))
            xs[key] = np.asarray(r.x)
            n_eval[key] = r.nfev
    print(f"  load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in times:
        g = f", graphs/iteration {statistics.median(graphs[k]):.2f}" if graphs[k] else ""
        print(f"  {k:7s} fit {med[k]:7.2f} s (runs {', '.join(f'{v:.2f}' for v in times[k])}),"
              f" per evaluation {statistics.median(per_eval[k]) * 1e3:7.1f} ms, "
              f"ratio to numpy {med[k] / med['numpy']:.2f}{g}")
    print(f"  evaluations per fit: {n_eval}; max |x_dask - x_numpy| / max |x_numpy|: "
          + ", ".join(f"{k} {np.abs(xs[k] - xs['numpy']).max() / np.abs(xs['numpy']).max():.1e}"
                      for k in ("dask-1", "dask-2")))
    for cluster, client, _, _ in setups.values():
        client.close()
        cluster.close()


def _write_memmap(path: str, n: int, block: int = 1 << 20) -> None:
    if os.path.exists(path + ".done"):  # written in full by an earlier run
        return
    Xm = np.lib.format.open_memmap(path + ".X", mode="w+", dtype=np.float32, shape=(n, D))
    ym = np.lib.format.open_memmap(path + ".y", mode="w+", dtype=np.float32, shape=(n,))
    t0 = time.perf_counter()
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        Xb, yb = _data(r1 - r0, seed=r0, dtype=np.float32)
        Xm[r0:r1] = Xb
        ym[r0:r1] = yb
    Xm.flush()
    ym.flush()
    del Xm, ym
    open(path + ".done", "w").close()
    print(f"  wrote {n * D * 4 / 1e9:.1f} GB in {time.perf_counter() - t0:.0f} s")


def _load(path: str, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of an on-disk .npy array, read inside the worker task."""
    a = np.load(path, mmap_mode="r")
    return np.array(a[r0:r1])


def _evict(path: str) -> None:
    for suffix in (".X", ".y"):
        fd = os.open(path + suffix, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def ooc(rows: int, directory: str, chunk: int, fit_iter: int) -> None:
    import dask
    import dask.array as da

    import tiltlab as tl
    from tiltlab.distributed import ClientObjective, distribute

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"data_{rows}")
    print(f"(b) out of core: {rows} x {D} float32 ({rows * D * 4 / 1e9:.1f} GB) in {path}.X "
          f"(numpy memmap), chunks of {chunk} rows ({chunk * D * 4 / 2**20:.0f} MiB), "
          "2 workers x 1 thread, memory_limit=3GB each")
    _write_memmap(path, rows)
    load = dask.delayed(_load, pure=True)
    starts = list(range(0, rows, chunk))
    Xs = [da.from_delayed(load(path + ".X", r, min(rows, r + chunk)),
                          shape=(min(rows, r + chunk) - r, D), dtype=np.float32) for r in starts]
    ys = [da.from_delayed(load(path + ".y", r, min(rows, r + chunk)),
                          shape=(min(rows, r + chunk) - r,), dtype=np.float32) for r in starts]
    X, y = da.concatenate(Xs, axis=0), da.concatenate(ys, axis=0)
    cluster, client, counter = _cluster(2, "3GB")
    with client.as_current():
        obj = tl.TiltedObjective("logistic", X, y, t=T, l2=L2)  # (validation reads X once)
        plan = distribute(obj)
        print(f"  persisted: {plan.persisted} (data larger than half the workers' memory)")
        cl = ClientObjective(obj)
        rows_read = []
        for rep in range(2):
            _evict(path)
            t0 = time.perf_counter()
            dask.compute(X.sum(axis=0), y.sum())
            read = time.perf_counter() - t0
            _evict(path)
            t0 = time.perf_counter()
            cl.value_and_gradient(np.zeros(D, dtype=np.float32) + 0.01 * rep)
            ev = time.perf_counter() - t0
            rows_read.append((read, ev))
            print(f"  round {rep}: read once {read:6.1f} s ({rows * D * 4 / 1e9 / read:.2f} GB/s),"
                  f" one evaluation {ev:6.1f} s, ratio {ev / read:.2f}")
        before = counter.n
        t0 = time.perf_counter()
        res = tl.minimize(obj, method="lbfgs", tol=0.0, max_iter=fit_iter)
        dt = time.perf_counter() - t0
        print(f"  lbfgs {res.nit} iterations: {dt:.1f} s, {res.nfev} evaluations "
              f"({dt / res.nfev:.1f} s each, page cache warm after the first), "
              f"{(counter.n - before) / max(res.nit, 1):.2f} graphs/iteration, "
              f"fun {float(res.fun):.6f}")
    client.close()
    cluster.close()


def _zipf_groups(n: int, G: int, rng) -> np.ndarray:
    """Labels of ``n`` samples in at most ``G`` Zipf-sized groups (codes 0 .. G'-1)."""
    g = np.minimum(rng.zipf(1.5, size=n) - 1, G - 1)
    return np.unique(g, return_inverse=True)[1].reshape(-1)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _risk_graphs(counter, client) -> None:
    """Graphs submitted by ``tilted_risk`` / ``hierarchical_risk`` of Dask losses."""
    import dask.array as da

    import tiltlab as tl

    rng = np.random.default_rng(1)
    n = 200_000
    ld = da.from_array(rng.exponential(size=n), chunks=25_000)
    g = _zipf_groups(n, 100, rng)
    gd = da.from_array(g, chunks=25_000)
    cases = {
        "tilted_risk(l, 2.0)": lambda: tl.tilted_risk(ld, 2.0),
        "tilted_risk(l, [1, 2]) (a grid)": lambda: tl.tilted_risk(ld, np.array([1.0, 2.0])),
        "tilted_risk(l, da.asarray(2.0))": lambda: tl.tilted_risk(ld, da.asarray(2.0)),
        "hierarchical_risk(l, numpy codes)": lambda: tl.hierarchical_risk(ld, g, (1.0, -2.0)),
        "hierarchical_risk(l, dask codes)": lambda: tl.hierarchical_risk(ld, gd, (1.0, -2.0)),
    }
    with client.as_current():
        for name, fn in cases.items():
            before = counter.n
            r = fn()
            at_call = counter.n - before
            r.compute()
            print(f"  {name:36s} graphs at call {at_call}, in all {counter.n - before}")


def hier(rows: int, n_groups: int, repeats: int, in_process: bool, before_dir: str | None
         ) -> None:
    import importlib
    import sys

    import dask
    import dask.array as da
    import distributed
    from threadpoolctl import threadpool_limits

    import tiltlab as tl

    mods = {"after": tl}
    if before_dir:
        sys.path.insert(0, before_dir)
        mods["before"] = importlib.import_module("tiltlab_before")
    X, y = _data(rows)
    g = _zipf_groups(rows, n_groups, np.random.default_rng(2))
    chunk = 1 << 17
    print(f"(c) hierarchy: {rows} x {D} float64 logistic, {int(g.max()) + 1} Zipf groups "
          f"(largest {np.bincount(g).max()} samples), tilts (-1, 2); sample level t=-1; "
          f"chunks of {chunk} rows; 2 workers x 1 thread, "
          f"{'threads of this process' if in_process else 'worker processes'}")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=not in_process, memory_limit="4GB",
        dashboard_address=":0", silence_logs=40,
    )
    client = distributed.Client(cluster, set_as_default=False)
    counter = _Counter()
    cluster.scheduler.add_plugin(counter)
    kw_h = {"groups": g, "tilts": (-1.0, 2.0), "l2": L2}
    kw_s = {"t": T, "l2": L2}
    fns, graphs = {}, {}
    theta = np.full(D, 0.01)
    with client.as_current():
        Xd, yd = da.from_array(X, chunks=(chunk, D)), da.from_array(y, chunks=chunk)
        Xd, yd = client.persist([Xd, yd])
        distributed.wait([Xd, yd])
        # one plain Dask pass over the same persisted data: the value and gradient of the
        # untilted least squares in Dask's own graph, the unit of the target for a
        # hierarchical evaluation
        resid = Xd @ theta - yd
        fns["dask plain pass"] = lambda: dask.compute(0.5 * (resid * resid).sum(), Xd.T @ resid)
        for label, mod in mods.items():
            for kind, kw in (("hier", kw_h), ("sample", kw_s)):
                obj = mod.TiltedObjective("logistic", Xd, yd, **kw)
                dist = importlib.import_module(f"{mod.__name__}.distributed")
                dist.distribute(obj, persist=True)
                cl = dist.ClientObjective(obj)  # NumPy in and out: what the solvers call
                cl.value_and_gradient(theta)  # warm: the workers import tiltlab
                fns[f"dask {kind} ({label})"] = lambda c=cl: c.value_and_gradient(theta)
                # the Dask-array methods, both results fetched by one dask.compute
                fns[f"dask {kind} (Dask arrays, {label})"] = (
                    lambda o=obj: dask.compute(*o.value_and_gradient(theta)))
    ref_h = tl.TiltedObjective("logistic", X, y, **kw_h)
    ref_s = tl.TiltedObjective("logistic", X, y, **kw_s)
    fns["numpy hier"] = lambda: ref_h.value_and_gradient(theta)
    fns["numpy sample"] = lambda: ref_s.value_and_gradient(theta)
    times: dict[str, list] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            if k.startswith("numpy"):
                with threadpool_limits(1):
                    times[k].append(_timed(fn))
            else:
                with client.as_current():
                    n0 = counter.n
                    times[k].append(_timed(fn))
                    graphs.setdefault(k, []).append(counter.n - n0)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    print(f"  load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    for k in fns:
        np_key = "numpy hier" if "hier" in k else "numpy sample"
        extra = (f", ratio to numpy {med[k] / med[np_key]:.2f} (fastest runs: "
                 f"{best[k] / best[np_key]:.2f}), graphs per evaluation "
                 f"{statistics.median(graphs[k]):.0f}" if k in graphs else "")
        runs = ", ".join(f"{v * 1e3:.0f}" for v in times[k])
        print(f"  {k:36s} {med[k] * 1e3:8.1f} ms{extra} (runs {runs})")
    for k in ("dask hier (after)", "dask hier (Dask arrays, after)"):
        print(f"  {k} / numpy sample (a hierarchy as cheap as the sample level on NumPy): "
              f"{med[k] / med['numpy sample']:.2f}")
    for k in [k for k in fns if k.startswith("dask") and k != "dask plain pass"]:
        print(f"  {k} / dask plain pass: {med[k] / med['dask plain pass']:.2f} (fastest runs: "
              f"{best[k] / best['dask plain pass']:.2f})")
    with client.as_current():
        f0, g0 = ref_h.value_and_gradient(theta)
        for k in ("dask hier (after)", "dask hier (Dask arrays, after)"):
            f1, g1 = fns[k]()
            print(f"  {k} vs numpy: |df|/|f| "
                  f"{abs(float(f1) - float(f0)) / abs(float(f0)):.1e}, "
                  f"max|dg|/max|g| {np.abs(g1 - g0).max() / np.abs(g0).max():.1e}")
    _risk_graphs(counter, client)
    client.close()
    cluster.close()


def fit(rows: int, n_groups: int, repeats: int, max_iter: int, hier_only: bool = False) -> None:
    import dask.array as da
    import distributed
    from threadpoolctl import threadpool_limits

    import tiltlab as tl
    from tiltlab.distributed import ClientObjective, distribute

    X, y = _data(rows)
    g = _zipf_groups(rows, n_groups, np.random.default_rng(2))
    chunk = 1 << 17
    print(
        f"(d) fit: {rows} x {D} float64 logistic, t={T}, l2={L2}; hierarchy: "
        f"{int(g.max()) + 1} Zipf groups, tilts (-1, 2); lbfgs max_iter={max_iter}, tol=0; "
        f"chunks of {chunk} rows; 2 worker processes x 1 thread; NUMBA_NUM_THREADS="
        f"{os.environ.get('NUMBA_NUM_THREADS', 'unset')}; load average at the start "
        f"{os.getloadavg()}"
    )
    cluster, client, counter = _cluster(2, "4GB")
    kw = {"sample": {"t": T, "l2": L2}, "hier": {"groups": g, "tilts": (-1.0, 2.0), "l2": L2}}
    kinds = ("hier",) if hier_only else ("sample", "hier")
    objs: dict = {}
    fused_of: dict = {}
    with client.as_current():
        Xd, yd = da.from_array(X, chunks=(chunk, D)), da.from_array(y, chunks=chunk)
        Xd, yd = client.persist([Xd, yd])  # the data reach the workers once
        distributed.wait([Xd, yd])
        for k in kinds:
            obj = tl.TiltedObjective("logistic", Xd, yd, **kw[k])
            plan = distribute(obj, persist=True)
            distributed.wait([plan.X, plan.y])
            ClientObjective(obj).value_and_gradient(np.zeros(D))  # workers import, load kernels
            if k == "sample":  # one objective (one persisted copy), the route toggled per fit
                objs["dask fused"], objs["dask generic"] = obj, obj
                fused_of["dask fused"], fused_of["dask generic"] = True, False
            else:  # NumPy chunks of a hierarchy: the fused grouped kernel, or generic
                objs["dask hier fused"], objs["dask hier generic"] = obj, obj
                fused_of["dask hier fused"], fused_of["dask hier generic"] = True, False
                obj.fused = False
                ClientObjective(obj).value_and_gradient(np.zeros(D))
        del Xd, yd
    for k in kinds:
        objs[f"numpy {k}"] = tl.TiltedObjective("logistic", X, y, **kw[k])
        with threadpool_limits(1):
            objs[f"numpy {k}"].value_and_gradient(np.zeros(D))  # load the kernels
    times: dict[str, list] = {k: [] for k in objs}
    per_eval: dict[str, list] = {k: [] for k in objs}
    graphs: dict[str, list] = {k: [] for k in objs}
    nits: dict[str, list] = {k: [] for k in objs}
    xs: dict = {}
    for _ in range(repeats):
        for name, obj in objs.items():
            if name.startswith("numpy"):
                with threadpool_limits(1):
                    t0 = time.perf_counter()
                    r = tl.minimize(obj, method="lbfgs", tol=0.0, max_iter=max_iter)
                    dt = time.perf_counter() - t0
                nfev = r.nfev
            else:
                obj.fused = fused_of[name]
                with client.as_current():
                    before = counter.n
                    t0 = time.perf_counter()
                    r = tl.minimize(obj, method="lbfgs", tol=0.0, max_iter=max_iter)
                    dt = time.perf_counter() - t0
                    graphs[name].append((counter.n - before) / max(r.nit, 1))
                nfev = r.nfev
            times[name].append(dt)
            per_eval[name].append(dt / max(nfev, 1))
            nits[name].append(r.nit)
            xs[name] = np.asarray(r.x)
    print(f"  load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    med = {k: statistics.median(v) for k, v in times.items()}
    pe = {k: statistics.median(v) for k, v in per_eval.items()}
    for name in objs:
        base = "numpy hier" if "hier" in name else "numpy sample"
        nit = statistics.median(nits[name])
        line = (
            f"  {name:17s} fit {med[name] * 1e3:8.1f} ms (runs "
            f"{', '.join(f'{v * 1e3:.0f}' for v in times[name])}), {nit:.0f} iterations, "
            f"per evaluation {pe[name] * 1e3:7.1f} ms"
        )
        if name.startswith("dask"):
            line += (
                f", ratio to {base} {med[name] / med[base]:.2f}, overhead per iteration "
                f"{(med[name] - med[base]) / max(nit, 1) * 1e3:.1f} ms, per evaluation "
                f"{(pe[name] - pe[base]) * 1e3:.1f} ms, graphs/iteration "
                f"{statistics.median(graphs[name]):.2f}"
            )
        print(line)
    for name in [k for k in objs if k.startswith("dask")]:
        base = "numpy hier" if "hier" in name else "numpy sample"
        err = np.abs(xs[name] - xs[base]).max() / np.abs(xs[base]).max()
        print(f"  {name}: max |x - x_numpy| / max |x_numpy| = {err:.1e}")
    client.close()
    cluster.close()
    if not hier_only:
        _chunk_times(X[:chunk], y[:chunk], repeats)
    _group_chunk_times(X[:chunk], y[:chunk], g[:chunk], int(g.max()) + 1, repeats)


def groups(rows: int, n_groups: int, repeats: int, loss: str, classes: int, chunk: int) -> None:
    import dask
    import dask.array as da

    import tiltlab as tl
    from tiltlab.distributed import distribute
    from tiltlab.distributed._groups import fused_groups

    rng = np.random.default_rng(0)
    X, y = _data(rows)
    theta = np.full(D, 0.01)
    if loss == "multinomial":  # labels of a softmax model with Gumbel noise; theta near it
        B = rng.standard_normal((D, classes)) / np.sqrt(D)
        y = np.argmax(X @ B + rng.gumbel(size=(rows, classes)), axis=1)
        theta = 0.5 * B
    g = _zipf_groups(rows, n_groups, rng)
    obj = tl.TiltedObjective(
        loss, da.from_array(X, chunks=(chunk, D)), da.from_array(y, chunks=chunk),
        groups=g, tilts=(-1.0, 2.0), l2=L2,
    )  # fmt: skip
    plan = distribute(obj)
    print(
        f"(e) groups: {rows} x {D} float64 {loss}"
        + (f" (K = {classes})" if loss == "multinomial" else "")
        + f", {int(g.max()) + 1} Zipf groups, tilts (-1, 2), chunks of {chunk} rows, "
        f"threaded scheduler ({os.cpu_count()} cores), data persisted: {plan.persisted}, "
        f"fused grouped route applies: {fused_groups(obj.problem, plan)}; NUMBA_NUM_THREADS="
        f"{os.environ.get('NUMBA_NUM_THREADS', 'unset')}; load average at the start "
        f"{os.getloadavg()}"
    )

    def run(fused: bool):
        obj.fused = fused
        return dask.compute(*obj.value_and_gradient(theta))

    out = {True: run(True), False: run(False)}  # kernels loaded, graphs warm
    times: dict[bool, list] = {True: [], False: []}
    for _ in range(max(repeats, 7)):
        for fused in (True, False):
            times[fused].append(_timed(lambda f=fused: run(f)))
    (f1, g1), (f0, g0) = out[True], out[False]
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, name in ((True, "fused grouped kernel"), (False, "generic route")):
        print(f"  {name:21s} {med[k] * 1e3:8.1f} ms per value_and_gradient (runs "
              f"{', '.join(f'{v * 1e3:.0f}' for v in times[k])})")  # fmt: skip
    print(
        f"  generic / fused {med[False] / med[True]:.2f}; |df|/|f| "
        f"{abs(float(f1) - float(f0)) / abs(float(f0)):.1e}, max|dg|/max|g| "
        f"{np.abs(g1 - g0).max() / np.abs(g0).max():.1e}; load average at the end "
        f"{os.getloadavg()}"
    )


def _group_chunk_times(Xb, yb, gb, n_groups: int, repeats: int) -> None:
    """The work of one chunk of the hierarchy, in this process: its group state with the
    per-group gradient sums by the fused grouped kernel, by the generic one-sweep NumPy
    expressions (per-group sums, the route of data read from their source) and the
    generic two sweeps of persisted chunks (group states, then ``X_b^T c`` at the
    per-group factors; here the factors of this chunk alone). Interleaved, medians."""
    from tiltlab.distributed._groups import group_products, group_root, group_sweep
    from tiltlab.distributed._groups_stream import chunk_group_sums
    from tiltlab.losses import get_loss
    from tiltlab.risk import GroupTree

    loss = get_loss("logistic")
    theta = np.full(D, 0.01)
    upper = GroupTree(n_samples=n_groups, levels=(), sample_layouts=())
    args = (Xb, yb, None, gb, theta, None, loss, 2.0, n_groups, "grad")

    def two_sweeps():
        st = group_sweep(*args, "bench", 0)
        root = group_root(upper, (-1.0, 2.0), "grad", "<f8", st)
        return group_products(*args, "bench", 0, root)

    runs = {
        "fused": lambda: chunk_group_sums(*args, True),
        "generic one sweep": lambda: chunk_group_sums(*args, False),
        "generic two sweeps": two_sweeps,
    }
    times: dict[str, list] = {k: [] for k in runs}
    for fn in runs.values():  # warm
        fn()
    for _ in range(max(repeats, 5) * 2):
        for k, fn in runs.items():
            times[k].append(_timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"  one hierarchy chunk's task ({Xb.shape[0]} x {D}, {n_groups} groups, value and "
        f"gradient, this process, one thread): "
        + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items())
        + f"; load average {os.getloadavg()}"
    )


def _chunk_times(Xb: np.ndarray, yb: np.ndarray, repeats: int) -> None:
    """The work of one chunk's task, in this process: its state for a value and gradient
    by the fused kernels and by the generic NumPy expressions (interleaved, medians)."""
    from tiltlab.distributed._states import chunk_sample_state
    from tiltlab.losses import get_loss

    loss = get_loss("logistic")
    theta = np.full(D, 0.01)
    times: dict[bool, list] = {True: [], False: []}
    for fused in (True, False):  # warm
        chunk_sample_state(Xb, yb, None, theta, None, loss, T, "grad", fused)
    for _ in range(max(repeats, 5) * 4):
        for fused in (True, False):
            times[fused].append(
                _timed(lambda f=fused: chunk_sample_state(Xb, yb, None, theta, None, loss, T,
                                                          "grad", f))
            )
    f, g = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"  one chunk's task ({Xb.shape[0]} x {D}, value and gradient state, this process, "
        f"one thread): fused {f * 1e3:.2f} ms, generic {g * 1e3:.2f} ms, ratio {g / f:.2f}; "
        f"load average {os.getloadavg()}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["inmem", "ooc", "hier", "fit", "groups"])
    ap.add_argument("--rows", type=int, default=None,
                    help="rows of (a) and (c) (default 2e6 and 1e6)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (a) and 7 (c)")
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--before", default=None, help="folder with a package `tiltlab_before`")
    ap.add_argument("--max-iter", type=int, default=15)
    ap.add_argument("--hier-only", action="store_true", help="fit: the hierarchy alone")
    ap.add_argument("--ooc-rows", type=int, default=100_000_000)
    ap.add_argument("--chunk", type=int, default=1 << 20, help="rows per chunk of (b), (e)")
    ap.add_argument("--loss", default="logistic", choices=["logistic", "multinomial"])
    ap.add_argument("--classes", type=int, default=5, help="(e): K of the multinomial loss")
    ap.add_argument("--fit-iter", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/tiltlab_ooc")
    a = ap.parse_args()
    if a.part == "inmem":
        inmem(a.rows or 2_000_000, a.repeats or 3, a.max_iter)
    elif a.part == "fit":
        fit(a.rows or 500_000, a.groups, a.repeats or 5, a.max_iter, a.hier_only)
    elif a.part == "groups":
        groups(a.rows or 500_000, a.groups, a.repeats or 7, a.loss, a.classes, a.chunk)
    elif a.part == "hier":
        hier(a.rows or 1_000_000, a.groups, a.repeats or 7, a.in_process, a.before)
    else:
        ooc(a.ooc_rows, a.dir, a.chunk, a.fit_iter)


if __name__ == "__main__":
    main()

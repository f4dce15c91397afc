"""The one-pass engine against one matrix-vector product, side by side in one process.

For each shape, dtype and loss this times, interleaved and repeated (medians):

* ``X @ theta`` (one read of X: the unit of the table),
* ``TiltedObjective.value_and_gradient`` and ``hvp`` of this checkout,
* optionally the same calls of an older tiltlab (``--before DIR``, a folder holding an
  importable copy of the package named ``tiltlab_before``), for before/after tables,
* hierarchical ``value_and_gradient`` with Zipf-sized groups, against the sample-level one,
* ``tilted_risk``/``tilted_weights`` against ``scipy.special.logsumexp``/``softmax`` and
  ``hierarchical_risk`` with 10, 1000 and 100,000 uniform and Zipf-sized groups against
  ``tilted_risk`` (float64 and float32; the peak extra memory in losses-sized vectors),

and the extra memory of a gradient (tracemalloc peak over the inputs, NumPy only).

Usage::

    python benchmarks/engine_speed.py                 # full table (a few minutes)
    python benchmarks/engine_speed.py --quick         # smaller shapes
    python benchmarks/engine_speed.py --threads 1 --json out.json
    git archive <commit> tiltlab | tar -x -C /tmp/b && mv /tmp/b/tiltlab /tmp/b/tiltlab_before
    python benchmarks/engine_speed.py --before /tmp/b

Nothing here asserts a timing; figures go in benchmarks/README.md and the issue notes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import tracemalloc

import numpy as np
import scipy.special as sps

import tiltlab as tl


def _medians(fns: dict, repeat: int) -> dict:
    times: dict = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():  # interleaved: drift hits every side alike
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def _problem(n, d, loss, dtype, rng):
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    if loss == "squared":
        y = (X @ theta + rng.standard_normal(n)).astype(dtype)
        t = -2.0
    else:
        y = (rng.random(n) < 0.3).astype(dtype)
        t = 1.0
    return X, y, theta, t


def objective_table(shapes, dtypes, losses, repeat, before, rng):
    rows = []
    for n, d in shapes:
        for dtype in dtypes:
            for loss in losses:
                X, y, theta, t = _problem(n, d, loss, dtype, rng)
                obj = tl.TiltedObjective(loss, X, y, t=t)
                v = np.ones_like(theta)
                fns = {
                    "matvec": lambda X=X, th=theta: X @ th,
                    "vg": lambda o=obj, th=theta: o.value_and_gradient(th),
                    "hvp": lambda o=obj, th=theta, v=v: o.hvp(th, v),
                }
                if before is not None:
                    old = before.TiltedObjective(loss, X, y, t=t)
                    fns["vg_before"] = lambda o=old, th=theta: o.value_and_gradient(th)
                    fns["hvp_before"] = lambda o=old, th=theta, v=v: o.hvp(th, v)
                med = _medians(fns, repeat)
                row = {
                    "n": n, "d": d, "dtype": np.dtype(dtype).name, "loss": loss,
                    "matvec_ms": 1e3 * med["matvec"],
                }
                for k in fns:
                    if k != "matvec":
                        row[k] = med[k] / med["matvec"]
                tracemalloc.start()
                obj.value_and_gradient(theta)
                row["vg_extra_MB"] = tracemalloc.get_traced_memory()[1] / 1e6
                tracemalloc.stop()
                row["X_MB"] = X.nbytes / 1e6
                rows.append(row)
                print(_fmt(row), flush=True)
    return rows


def _zipf_groups(n, G, rng):
    w = 1.0 / np.arange(1, G + 1) ** 1.1
    g = rng.choice(G, size=n, p=w / w.sum())
    _, codes = np.unique(g, return_inverse=True)  # dense codes 0..G'-1
    return codes


def hierarchy_table(n, Gs, repeat, before, rng, dtypes=(np.float64, np.float32)):
    rows = []
    base = 3 * rng.exponential(size=n)
    for G in Gs:
        for kind in ("uniform", "zipf"):
            g = rng.integers(0, G, n) if kind == "uniform" else _zipf_groups(n, G, rng)
            _, g = np.unique(g, return_inverse=True)
            for dtype in dtypes:
                losses = base.astype(dtype)
                fns = {
                    "tilted_risk": lambda l=losses: tl.tilted_risk(l, 1.0),
                    "hier": lambda l=losses, g=g: tl.hierarchical_risk(l, g, (1.0, -2.0)),
                }
                if before is not None:
                    fns["hier_before"] = lambda l=losses, g=g: before.hierarchical_risk(
                        l, g, (1.0, -2.0))
                med = _medians(fns, repeat)
                tracemalloc.start()
                tl.hierarchical_risk(losses, g, (1.0, -2.0))
                peak = tracemalloc.get_traced_memory()[1] / losses.nbytes
                tracemalloc.stop()
                row = {"n": n, "groups": int(g.max()) + 1, "sizes": kind,
                       "dtype": np.dtype(dtype).name,
                       "tilted_risk_ms": 1e3 * med["tilted_risk"],
                       "hier/tilted_risk": med["hier"] / med["tilted_risk"],
                       "peak_extra_N_vectors": peak}
                if "hier_before" in med:
                    row["before/tilted_risk"] = med["hier_before"] / med["tilted_risk"]
                rows.append(row)
                print(_fmt(row), flush=True)
    return rows


def hier_objective_table(n, d, G, repeat, rng):
    X, y, theta, _ = _problem(n, d, "logistic", np.float64, rng)
    g = _zipf_groups(n, G, rng)
    flat = tl.TiltedObjective("logistic", X, y, t=1.0)
    hier = tl.TiltedObjective("logistic", X, y, groups=g, tilts=(1.0, 0.5))
    med = _medians({"flat": lambda: flat.value_and_gradient(theta),
                    "hier": lambda: hier.value_and_gradient(theta)}, repeat)
    row = {"n": n, "d": d, "groups": int(g.max()) + 1,
           "hier/sample-level": med["hier"] / med["flat"]}
    print(_fmt(row), flush=True)
    return [row]


def aggregation_table(ns, dtypes, repeat, rng):
    rows = []
    for n in ns:
        for dtype in dtypes:
            l = (3 * rng.exponential(size=n)).astype(dtype)
            med = _medians({
                "logsumexp": lambda l=l: sps.logsumexp(l),
                "softmax": lambda l=l: sps.softmax(l),
                "mean": lambda l=l: l.mean(),
                "risk": lambda l=l: tl.tilted_risk(l, 1.0),
                "risk_small_t": lambda l=l: tl.tilted_risk(l, 1e-3),
                "risk_t0": lambda l=l: tl.tilted_risk(l, 0.0),
                "weights": lambda l=l: tl.tilted_weights(l, 1.0),
            }, repeat)
            grid = np.linspace(-4, 4, 16)
            g = _medians({"grid": lambda l=l, grid=grid: tl.tilted_risk(l, grid),
                          "loop": lambda l=l, grid=grid: [tl.tilted_risk(l, float(s))
                                                          for s in grid]},
                         max(3, repeat // 3))
            row = {"n": n, "dtype": np.dtype(dtype).name,
                   "risk/logsumexp": med["risk"] / med["logsumexp"],
                   "risk(t=1e-3)/logsumexp": med["risk_small_t"] / med["logsumexp"],
                   "weights/softmax": med["weights"] / med["softmax"],
                   "risk(t=0)/mean": med["risk_t0"] / med["mean"],
                   "grid16/loop16": g["grid"] / g["loop"]}
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


def _fmt(row):
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (threadpoolctl)")
    ap.add_argument("--before", default=None, help="folder with a package `tiltlab_before`")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", choices=["objective", "hierarchy", "aggregation"], default=None)
    args = ap.parse_args(argv)
    before = None
    if args.before:
        sys.path.insert(0, args.before)
        before = importlib.import_module("tiltlab_before")
    rng = np.random.default_rng(0)
    scale = 10 if args.quick else 1
    shapes = [(1_000_000 // scale, 20), (200_000 // scale, 100), (20_000 // scale, 1000)]
    ctx = None
    if args.threads:
        from threadpoolctl import threadpool_limits

        ctx = threadpool_limits(args.threads)
    out = {"threads": args.threads}
    if args.only in (None, "objective"):
        print("# value_and_gradient and hvp, in units of one X @ theta")
        out["objective"] = objective_table(shapes, [np.float64, np.float32],
                                           ["squared", "logistic"], args.repeat, before, rng)
        print("# hierarchical objective (Zipf groups) against the sample-level one")
        out["hier_objective"] = hier_objective_table(200_000 // scale, 50, 200, args.repeat, rng)
    if args.only in (None, "hierarchy"):
        print("# hierarchical_risk against tilted_risk on the same losses")
        out["hierarchy"] = hierarchy_table(1_000_000 // scale, [10, 1000, 100_000],
                                           args.repeat, before, rng)
    if args.only in (None, "aggregation"):
        print("# aggregations against SciPy")
        out["aggregation"] = aggregation_table([1_000_000 // scale, 10_000_000 // scale],
                                               [np.float64, np.float32], args.repeat, rng)
    if ctx is not None:
        ctx.unregister()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

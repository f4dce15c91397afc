"""The one-pass engine against one matrix-vector product, side by side in one process.

For each shape, dtype and loss this times, interleaved and repeated (medians):

* ``X @ theta`` (one read of X: the unit of the table),
* ``TiltedObjective.value_and_gradient`` and ``hvp`` of this checkout,
* optionally the same calls of an older tiltlab (``--before DIR``, a folder holding an
  importable copy of the package named ``tiltlab_before``), for before/after tables,
* HIV-1 class-level TERM (tilts (50, 0)): one ``value_and_gradient`` against the
  hand-written two-class NumPy function of ``hiv1_positive_tilt.py``,
* the hierarchical objective at 1e6 x 20 (logistic, tilts (1, 1), 1,000 and 100,000
  Zipf-sized groups) against the sample-level one: ``value_and_gradient``, ``weights``
  and ``value``,
* ``tilted_risk``/``tilted_weights`` against ``scipy.special.logsumexp``/``softmax`` and
  ``hierarchical_risk``/``hierarchical_weights`` with 10, 1000 and 100,000 uniform and
  Zipf-sized groups against ``tilted_risk``/``tilted_weights`` (float64 and float32; the
  peak extra memory in losses-sized vectors),

and the extra memory of a gradient (tracemalloc peak over the inputs, NumPy only).

Usage::

    python benchmarks/engine_speed.py                 # full table (a few minutes)
    python benchmarks/engine_speed.py --quick         # smaller shapes
    python benchmarks/engine_speed.py --threads 1 --json out.json
    git archive <commit> tiltlab | tar -x -C /tmp/b && mv /tmp/b/tiltlab /tmp/b/tiltlab_before
    python benchmarks/engine_speed.py --before /tmp/b
    python benchmarks/engine_speed.py --only hier-objective --threads 1 --before /tmp/b

Nothing here asserts a timing; figures go in benchmarks/README.md and the Speed page.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.special as sps

import tiltlab as tl


def _medians(fns: dict, repeat: int, warm: bool = False) -> dict:
    times: dict = {k: [] for k in fns}
    if warm:  # compilation, caches built on the first calls: not timed
        for f in fns.values():
            f()
            f()
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
                    "tilted_weights": lambda l=losses: tl.tilted_weights(l, 1.0),
                    "hier_w": lambda l=losses, g=g: tl.hierarchical_weights(l, g, (1.0, -2.0)),
                }
                if before is not None:
                    fns["hier_before"] = lambda l=losses, g=g: before.hierarchical_risk(
                        l, g, (1.0, -2.0))
                    fns["hier_w_before"] = lambda l=losses, g=g: before.hierarchical_weights(
                        l, g, (1.0, -2.0))
                med = _medians(fns, repeat, warm=True)
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
                row["tilted_weights_ms"] = 1e3 * med["tilted_weights"]
                row["hier_w/tilted_weights"] = med["hier_w"] / med["tilted_weights"]
                if "hier_w_before" in med:
                    row["before_w/tilted_weights"] = med["hier_w_before"] / med["tilted_weights"]
                rows.append(row)
                print(_fmt(row), flush=True)
    return rows


def _group_labels(n, G, kind, rng):
    """Group labels of ``n`` samples: ``"zipf1.5"`` draws ``G`` group sizes from
    ``rng.zipf(1.5)`` and the samples' groups in proportion to them (few groups end up
    with samples), ``"1/k^1.1"`` gives group ``k`` the probability ``1/k^1.1`` (most of
    the ``G`` groups have samples, many of them one)."""
    if kind == "zipf1.5":
        sizes = rng.zipf(1.5, G).astype(float)
        return rng.choice(G, n, p=sizes / sizes.sum())
    return _zipf_groups(n, G, rng)


def hier_objective_table(n, d, Gs, repeat, before, rng):
    """The hierarchical objective (tilts (1, 1)) against the sample-level one (t = 1) on
    the same data: value_and_gradient (the sample-level one by the default engine, the
    fused CPU kernel where numba is installed, and by the one-pass NumPy engine),
    weights and value."""
    X, y, theta, _ = _problem(n, d, "logistic", np.float64, rng)
    flat = tl.TiltedObjective("logistic", X, y, t=1.0)
    flat_np = tl.TiltedObjective("logistic", X, y, t=1.0)
    flat_np.fused = False
    rows = []
    for G in Gs:
        for kind in ("zipf1.5", "1/k^1.1"):
            g = _group_labels(n, G, kind, rng)
            hier = tl.TiltedObjective("logistic", X, y, groups=g, tilts=(1.0, 1.0))
            fns = {
                "flat_vg": lambda: flat.value_and_gradient(theta),
                "flat_np_vg": lambda: flat_np.value_and_gradient(theta),
                "hier_vg": lambda h=hier: h.value_and_gradient(theta),
                "flat_w": lambda: flat.weights(theta),
                "hier_w": lambda h=hier: h.weights(theta),
                "flat_v": lambda: flat.value(theta),
                "hier_v": lambda h=hier: h.value(theta),
            }
            if before is not None:
                old = before.TiltedObjective("logistic", X, y, groups=g, tilts=(1.0, 1.0))
                fns["before_vg"] = lambda o=old: o.value_and_gradient(theta)
                fns["before_w"] = lambda o=old: o.weights(theta)
            med = _medians(fns, repeat, warm=True)
            row = {"n": n, "d": d, "labels": G, "sizes": kind,
                   "groups": int(np.unique(g).size),
                   "flat_vg_ms": 1e3 * med["flat_vg"],
                   "vg/flat_vg": med["hier_vg"] / med["flat_vg"],
                   "vg/flat_onepass_vg": med["hier_vg"] / med["flat_np_vg"],
                   "weights/flat_weights": med["hier_w"] / med["flat_w"],
                   "value/flat_value": med["hier_v"] / med["flat_v"]}
            if before is not None:
                row["before_vg/flat_vg"] = med["before_vg"] / med["flat_vg"]
                row["before_w/flat_weights"] = med["before_w"] / med["flat_w"]
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


def hiv1_hierarchy_row(repeat, before):
    """One evaluation of HIV-1 class-level TERM (tilts (50, 0), l2 = 1e-4): the
    objective's value_and_gradient against the hand-written two-class NumPy function of
    ``hiv1_positive_tilt.py``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hiv1_positive_tilt import L2, TILTS, ClassTERM, load_full_hiv1

    X, y = load_full_hiv1()
    ref = ClassTERM(X, y, TILTS[0], L2)
    obj = tl.TiltedObjective("logistic", X, y, groups=y, tilts=TILTS, l2=L2)
    theta = np.random.default_rng(0).standard_normal(X.shape[1]) * 0.05
    fns = {"hand": lambda: ref(theta), "obj": lambda: obj.value_and_gradient(theta)}
    if before is not None:
        old = before.TiltedObjective("logistic", X, y, groups=y, tilts=TILTS, l2=L2)
        fns["before"] = lambda: old.value_and_gradient(theta)
    med = _medians(fns, repeat, warm=True)
    row = {"n": int(X.shape[0]), "d": int(X.shape[1]), "hand_ms": 1e3 * med["hand"],
           "obj_ms": 1e3 * med["obj"], "obj/hand": med["obj"] / med["hand"]}
    if before is not None:
        row["before_ms"] = 1e3 * med["before"]
        row["before/hand"] = med["before"] / med["hand"]
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
    ap.add_argument("--only", choices=["objective", "hierarchy", "hier-objective", "aggregation"],
                    default=None)
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
    if args.only in (None, "hierarchy", "hier-objective"):
        print("# HIV-1 class-level TERM: one evaluation against the hand-written function")
        out["hiv1_hierarchy"] = hiv1_hierarchy_row(max(args.repeat, 41), before)
        print("# hierarchical objective (tilts (1, 1)) against the sample-level one (t = 1)")
        out["hier_objective"] = hier_objective_table(1_000_000 // scale, 20, [1000, 100_000],
                                                     args.repeat, before, rng)
    if args.only in (None, "hierarchy"):
        print("# hierarchical_risk/_weights against tilted_risk/_weights on the same losses")
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

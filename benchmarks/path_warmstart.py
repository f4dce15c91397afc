"""Warm starts along a tilt path: iterations of ``tilt_path`` against cold solves.

For each method and problem, a 20-tilt path is solved twice on the same objective and
tolerance:

* cold: 20 independent ``tiltlab.minimize(obj.with_tilt(t), method=m)`` from zero;
* secant: ``tiltlab.tilt_path(obj, ts, method=m, predictor="secant")`` (continuation from
  ``t = 0``, each start extrapolated through the last two solutions, each solve warm
  started with the previous solver state);
* tangent: ``tiltlab.tilt_path(obj, ts, method=m)`` (the default: each start predicted
  by cubic Hermite extrapolation through the last two solutions and their tangents; L-BFGS
  seeded at each tilt with the Ritz pairs of the last tangent solve);
* with ``--unseeded``, also "unseeded": the tangent path with L-BFGS started without
  pairs, as before the Ritz pairs (the private switch ``Continuation.SEED_PAIRS``), to
  compare both in one run.

A path's extra anchor solve at ``t = 0`` is counted too. Iterations are counted by a
callback over every solver call; passes over the data by the objectives' counters: the
solves' for cold runs, ``TiltPath.n_passes`` for paths (which includes the predictions
and the tangent solves, one pass per product with ``X`` or ``X^T``). Seconds are wall
time of the whole path (or of the 20 cold solves), the median of ``--repeat`` runs
interleaved in one process, after one evaluation and one Hessian-vector product that
compile the kernels. The ratios compare the tangent path (and the unseeded one) with the
cold solves; "failed" names the sides where a solve did not succeed (``none``: all did).

Problems: the README's example (squared loss, 50 rows, five
gross outliers) and a logistic regression (400 rows, 5 features, ``l2=1e-3``), both on
``t`` in ``linspace(-2, 2, 20)``, and HIV-1 (all 6590 rows, 161 one-hot columns, logistic
loss, sample-level tilt, ``l2=1e-4``) on ``t`` in ``linspace(0, 50, 20)``.

Run:
    python benchmarks/path_warmstart.py
    python benchmarks/path_warmstart.py --methods lbfgs newton --dtype float32
    python benchmarks/path_warmstart.py --problems hiv1 --methods newton lbfgs --repeat 3
    python benchmarks/path_warmstart.py --problems hiv1 --methods lbfgs --unseeded --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import tiltlab as tl
from tiltlab.solvers._continuation import Continuation

METHODS = ("gd", "agd", "lbfgs", "newton", "stochastic")
PROBLEMS = ("readme", "logistic", "hiv1")


def problems(dtype, which, n_tilts):
    """(name, objective, tilts) for each problem in ``which``."""
    small = np.linspace(-2, 2, n_tilts)
    if "readme" in which:
        X = np.c_[np.ones(50), np.linspace(0, 1, 50)]
        y = 2 * X[:, 1] + 1
        y[:5] += 10
        obj = tl.TiltedObjective("squared", X.astype(dtype), y.astype(dtype))
        yield "README squared", obj, small
    if "logistic" in which:
        rng = np.random.default_rng(0)
        X = np.c_[np.ones(400), rng.normal(size=(400, 4))]
        y = (rng.random(400) < 1 / (1 + np.exp(-X @ rng.normal(size=5)))).astype(float)
        obj = tl.TiltedObjective("logistic", X.astype(dtype), y.astype(dtype), l2=1e-3)
        yield "logistic", obj, small
    if "hiv1" in which:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from hiv1_positive_tilt import L2, load_full_hiv1

        X, y = load_full_hiv1()
        obj = tl.TiltedObjective("logistic", X.astype(dtype), y.astype(dtype), l2=L2)
        yield "HIV-1", obj, np.linspace(0, 50, n_tilts)


def count(fn):
    n = [0]

    def cb(state):
        n[0] += 1
        return False

    t0 = time.perf_counter()
    out = fn(cb)
    return n[0], out, time.perf_counter() - t0


def run_once(obj, ts, m, kw, sides):
    """(iterations, passes, seconds, all ok) of the cold solves and of each path."""
    objs = [obj.with_tilt(float(t)) for t in ts]
    it, cold, sec = count(
        lambda cb: [tl.minimize(o, method=m, callback=cb, **kw) for o in objs]
    )
    out = {"cold": (it, sum(r.n_passes for r in cold), sec, all(r.success for r in cold))}
    for side in sides[1:]:
        pred = "secant" if side == "secant" else "tangent"
        Continuation.SEED_PAIRS = side != "unseeded"
        try:
            it, path, sec = count(
                lambda cb, pred=pred: tl.tilt_path(
                    obj, ts, method=m, callback=cb, predictor=pred, **kw
                )
            )
        finally:
            Continuation.SEED_PAIRS = True
        out[side] = (it, path.n_passes, sec, path.success)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    ap.add_argument("--n-tilts", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell (median time)")
    ap.add_argument("--unseeded", action="store_true",
                    help="also the tangent path without L-BFGS's Ritz pairs (as before them)")
    args = ap.parse_args()
    sides = ("cold", "secant", "tangent") + (("unseeded",) if args.unseeded else ())
    dtype = np.dtype(args.dtype)
    print(f"{args.n_tilts} tilts per path, {args.dtype}, default tolerances; "
          f"iterations / passes over the data / seconds (median of {args.repeat})")
    head = f"{'problem':14s} {'method':10s}"
    for side in sides:
        head += f" {side + ' it':>11s} {'pass':>7s} {'s':>6s}"
    head += f" {'it ratio':>8s} {'pass ratio':>10s} {'s ratio':>7s}"
    if args.unseeded:
        head += f" {'unseeded: it':>12s} {'pass':>5s} {'s':>5s}"
    print(head + f" {'failed':>6s}")
    for name, obj, ts in problems(dtype, args.problems, args.n_tilts):
        for m in args.methods:
            kw = {"seed": 0, "max_iter": 4000} if m == "stochastic" else {}
            if m == "stochastic":
                kw["tol"] = 1e-2  # the stochastic method stops on a full-gradient check
            z = obj.zeros()  # compile the kernels before the clock runs
            obj.value_and_gradient(z)
            obj.linearize(z).hvp(z)
            runs = [run_once(obj, ts, m, kw, sides) for _ in range(args.repeat)]
            row = f"{name:14s} {m:10s}"
            med = {}
            for side in sides:
                it, passes = runs[0][side][0], runs[0][side][1]
                sec = statistics.median(r[side][2] for r in runs)
                med[side] = (it, passes, sec)
                row += f" {it:11d} {passes:7.0f} {sec:6.2f}"
            failed = [s for s in sides if not all(r[s][3] for r in runs)]
            c, w = med["cold"], med["tangent"]
            row += f" {w[0] / c[0]:8.2f} {w[1] / c[1]:10.2f} {w[2] / c[2]:7.2f}"
            if args.unseeded:
                u = med["unseeded"]
                row += f" {u[0] / c[0]:12.2f} {u[1] / c[1]:5.2f} {u[2] / c[2]:5.2f}"
            print(row + f" {','.join(failed) or 'none':>6s}", flush=True)


if __name__ == "__main__":
    main()

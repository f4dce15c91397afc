"""Warm starts along a tilt path: iterations of ``tilt_path`` against cold solves.

For each method and problem, a 20-tilt path is solved twice on the same objective and
tolerance:

* cold: 20 independent ``tiltlab.minimize(obj.with_tilt(t), method=m)`` from zero;
* warm: ``tiltlab.tilt_path(obj, ts, method=m)`` (continuation from ``t = 0``; its extra
  anchor solve at ``t = 0`` is counted too).

Iterations are counted by a callback over every solver call, and passes over the data
by the objectives' counters. Problems: the README's example (squared loss, 50 rows, five
gross outliers) and a logistic regression (400 rows, 5 features, ``l2=1e-3``), both on
``t`` in ``linspace(-2, 2, 20)``, and HIV-1 (all 6590 rows, 161 one-hot columns, logistic
loss, sample-level tilt, ``l2=1e-4``) on ``t`` in ``linspace(0, 50, 20)``.

Run:
    python benchmarks/path_warmstart.py
    python benchmarks/path_warmstart.py --methods lbfgs newton --dtype float32
    python benchmarks/path_warmstart.py --problems hiv1
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import tiltlab as tl

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

    out = fn(cb)
    return n[0], out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    ap.add_argument("--n-tilts", type=int, default=20)
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    print(f"{args.n_tilts} tilts per path, {args.dtype}, default tolerances")
    print(f"{'problem':16s} {'method':10s} {'cold it':>8s} {'warm it':>8s} {'ratio':>6s} "
          f"{'cold pass':>9s} {'warm pass':>9s} {'all ok':>6s}")
    for name, obj, ts in problems(dtype, args.problems, args.n_tilts):
        for m in args.methods:
            kw = {"seed": 0, "max_iter": 4000} if m == "stochastic" else {}
            if m == "stochastic":
                kw["tol"] = 1e-2  # the stochastic method stops on a full-gradient check
            objs = [obj.with_tilt(float(t)) for t in ts]
            it_cold, cold = count(
                lambda cb, objs=objs, m=m, kw=kw: [
                    tl.minimize(o, method=m, callback=cb, **kw) for o in objs
                ]
            )
            p_cold = sum(r.n_passes for r in cold)
            ok_cold = all(r.success for r in cold)
            it_warm, path = count(
                lambda cb, m=m, kw=kw, obj=obj, ts=ts: tl.tilt_path(
                    obj, ts, method=m, callback=cb, **kw
                )
            )
            p_warm = sum(r.n_passes for r in path.results)
            print(f"{name:16s} {m:10s} {it_cold:8d} {it_warm:8d} {it_warm / it_cold:6.2f} "
                  f"{p_cold:9.0f} {p_warm:9.0f} {str(ok_cold and path.success):>6s}")


if __name__ == "__main__":
    main()

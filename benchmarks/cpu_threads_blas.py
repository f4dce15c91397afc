r"""The fused CPU kernels' threads next to a threaded BLAS in the same process.

A solver, a line search or a cross-validation loop calls NumPy's BLAS between two
evaluations of the objective (``X @ theta``, predictions on held-out rows). OpenBLAS keeps
its worker threads spinning for a while after each call (``OPENBLAS_THREAD_TIMEOUT``), and
on a machine with few cores they then compete with the kernels' own threads. This script
times ``TiltedObjective.value_and_gradient`` (fused engine, ``X`` of ``--shape``) in three
patterns, interleaved within each repetition (medians over ``--repeat``):

* ``alone``: evaluations back to back;
* ``after_blas``: each evaluation right after one ``X @ theta`` (a solver's step);
* ``after_pause``: each evaluation after ``--pause`` seconds idle (the BLAS pool asleep).

With ``--before DIR`` (a folder holding an importable copy of an older package named
``tiltlab_before``, made as in ``cpu_kernel_speed.py``) the same three patterns are timed
for the older code in the same repetitions, alternating which side goes first.

Usage::

    python benchmarks/cpu_threads_blas.py
    git archive <commit> tiltlab | tar -x -C /tmp/b && mv /tmp/b/tiltlab /tmp/b/tiltlab_before
    grep -rl '"tiltlab\.' /tmp/b | xargs sed -i 's/"tiltlab\./"tiltlab_before./g'
    python benchmarks/cpu_threads_blas.py --before /tmp/b --json out.json

(The second line renames the modules that the copy registers by name, so that its lazy
registrations load its own modules.)

Wall-clock times (the effect is one of threads). Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import numpy as np

import tiltlab as tl

#: in this order within a repetition, so that ``alone`` follows an evaluation (the one after
#: the pause) and no BLAS call
PATTERNS = ("after_pause", "alone", "after_blas")


def _evaluations(pkg, X, y, loss):
    obj = pkg.TiltedObjective(loss, X, y, t=1.0)
    theta = np.zeros(X.shape[1], dtype=X.dtype)
    for _ in range(3):  # compiled kernels loaded, engine bound
        obj.value_and_gradient(theta)
    return obj, theta


def _one(obj, theta, X, pattern, pause):
    """One timed evaluation in ``pattern`` (the preparation is not timed)."""
    if pattern == "after_blas":
        X @ theta
    elif pattern == "after_pause":
        time.sleep(pause)
    t0 = time.perf_counter()
    obj.value_and_gradient(theta)
    return time.perf_counter() - t0


def run(shape, dtype, loss, repeat, pause, before=None):
    n, d = shape
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d)).astype(dtype)
    # labels without a BLAS call, so that the first evaluations run before any
    y = (X * rng.standard_normal(d).astype(dtype)).sum(axis=1) + rng.standard_normal(n)
    y = y.astype(dtype) if loss != "logistic" else np.sign(y).astype(dtype)
    sides = {"after": _evaluations(tl, X, y, loss)}
    if before is not None:
        sides["before"] = _evaluations(before, X, y, loss)
    times = {(s, p): [] for s in sides for p in PATTERNS}
    matvec = []
    for r in range(repeat):
        time.sleep(pause)
        t0 = time.perf_counter()
        X @ sides["after"][1]
        matvec.append(time.perf_counter() - t0)
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            obj, theta = sides[side]
            for p in PATTERNS:
                times[side, p].append(_one(obj, theta, X, p, pause))
    rows = []
    for side in sides:
        row = {"side": side, "n": n, "d": d, "dtype": np.dtype(dtype).name, "loss": loss}
        row["matvec_ms"] = 1e3 * float(np.median(matvec))
        for p in PATTERNS:
            row[f"{p}_ms"] = 1e3 * float(np.median(times[side, p]))
        row["after_blas_over_alone"] = row["after_blas_ms"] / row["alone_ms"]
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="200000x100")
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--loss", default="squared")
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--pause", type=float, default=0.5, help="seconds idle (after_pause)")
    ap.add_argument("--before", default=None, help="folder with a package `tiltlab_before`")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.lower().split("x"))
    before = None
    if args.before:
        sys.path.insert(0, args.before)
        before = importlib.import_module("tiltlab_before")
    rows = run(shape, np.dtype(args.dtype), args.loss, args.repeat, args.pause, before)
    for row in rows:
        print(
            f"{row['side']:6s} n={row['n']} d={row['d']} {row['dtype']} {row['loss']}: "
            f"alone {row['alone_ms']:.2f} ms, after a matvec {row['after_blas_ms']:.2f} ms "
            f"(x{row['after_blas_over_alone']:.2f}), after a pause {row['after_pause_ms']:.2f}"
            f" ms; matvec {row['matvec_ms']:.2f} ms"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

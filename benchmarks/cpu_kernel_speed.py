"""The fused CPU kernels (numba) against one matrix-vector product, side by side.

For each shape, dtype and loss this times, interleaved and repeated (medians; the order of
the calls is reversed at every repetition, so that no call always follows the same one),
in units of one NumPy ``X @ theta`` with the same number of threads:

* ``vg``: ``FusedProblem.value_and_gradient`` (data bound once, as an engine keeps it);
* ``hvp``: ``FusedProblem.hvp`` (one pass, loss and weights included);
* ``lin_hvp``: :meth:`Linearization.hvp` (a Newton-CG inner product at a fixed ``theta``);
* ``generic_vg``/``generic_hvp``: ``TiltedObjective`` with ``fused = False`` (the generic
  array-API path), for a comparison in the same run;
* optionally the same three kernel calls of an older tiltlab (``--before DIR``, a folder
  holding an importable copy of the package named ``tiltlab_before``): ``vg_before``,
  ``hvp_before``, ``lin_hvp_before``, for before/after tables from one run.

``--threads N`` limits both BLAS (threadpoolctl) and numba (``numba.set_num_threads``).
``--cpu-time`` (with ``--threads 1``) times each call by the calling thread's CPU time
instead of the wall clock: on a shared, loaded machine, time spent preempted by other
processes then does not count (cache and memory contention still do).
``--compile`` measures instead the first call of every kernel in a fresh process, once
with an empty numba cache (compilation) and once with the cache it filled (a new
process's first call). ``--first`` measures the first evaluations of an objective
(``value_and_gradient``, 4096 x 128 float64, squared loss) in new processes with an empty
cache and then the filled one, in the default mode (missing kernels compiled in the
background) and with ``TILTLAB_FUSED=wait`` (compiled on the first call).

Usage::

    python benchmarks/cpu_kernel_speed.py                  # full table
    python benchmarks/cpu_kernel_speed.py --threads 1 --json out.json
    python benchmarks/cpu_kernel_speed.py --quick          # shapes / 10
    python benchmarks/cpu_kernel_speed.py --compile
    python benchmarks/cpu_kernel_speed.py --first
    git archive <commit> tiltlab | tar -x -C /tmp/b && mv /tmp/b/tiltlab /tmp/b/tiltlab_before
    python benchmarks/cpu_kernel_speed.py --threads 1 --before /tmp/b

Nothing here asserts a timing; figures go in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

import tiltlab as tl
from tiltlab import _cpu_kernels as ck

SHAPES = [(200_000, 100), (20_000, 1000), (1_000_000, 20)]
DTYPES = [np.float64, np.float32]
LOSSES = ["squared", "logistic"]


#: the clock: wall time, or (``--cpu-time``, with one thread) the calling thread's CPU time,
#: which other processes on a loaded machine do not inflate by preempting it
_CLOCK = {"clock": time.perf_counter}


def _medians(fns: dict, repeat: int) -> dict:
    clock = _CLOCK["clock"]
    times: dict = {k: [] for k in fns}
    order = list(fns)
    for _ in range(repeat):
        for k in order:  # interleaved: drift hits every side alike
            t0 = clock()
            fns[k]()
            times[k].append(clock() - t0)
        order.reverse()  # and no call always follows the same one
    return {k: float(np.median(v)) for k, v in times.items()}


def _problem(n, d, loss, dtype, rng):
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    if loss == "poisson":  # counts of mean exp(z)
        y = rng.poisson(np.exp(X @ theta)).astype(dtype)
        t = -2.0
    elif loss not in ("logistic", "hinge", "squared_hinge"):  # real targets
        y = (X @ theta + rng.standard_normal(n)).astype(dtype)
        t = -2.0
    else:
        y = (rng.random(n) < 0.3).astype(dtype)
        t = 1.0
    v = rng.standard_normal(d).astype(dtype)
    return X, y, theta, v, t


def speed_table(shapes, repeat, generic, rng, before=None, losses=LOSSES, dtypes=DTYPES):
    rows = []
    for n, d in shapes:
        for dtype in dtypes:
            for loss in losses:
                X, y, theta, v, t = _problem(n, d, loss, dtype, rng)
                fp = ck.FusedProblem(loss, X, y)
                lin = fp.linearize(theta, t)
                fns = {
                    "matvec": lambda X=X, th=theta: X @ th,
                    "vg": lambda fp=fp, th=theta, t=t: fp.value_and_gradient(th, t),
                    "hvp": lambda fp=fp, th=theta, v=v, t=t: fp.hvp(th, v, t),
                    "lin_hvp": lambda lin=lin, v=v: lin.hvp(v),
                }
                if before is not None:
                    old = before.FusedProblem(loss, X, y)
                    old_lin = old.linearize(theta, t)
                    fns["vg_before"] = lambda fp=old, th=theta, t=t: fp.value_and_gradient(th, t)
                    fns["hvp_before"] = lambda fp=old, th=theta, v=v, t=t: fp.hvp(th, v, t)
                    fns["lin_hvp_before"] = lambda lin=old_lin, v=v: lin.hvp(v)
                if generic:
                    obj = tl.TiltedObjective(loss, X, y, t=t)
                    obj.fused = False  # the NumPy path, not the fused engine
                    fns["generic_vg"] = lambda o=obj, th=theta: o.value_and_gradient(th)
                    fns["generic_hvp"] = lambda o=obj, th=theta, v=v: o.hvp(th, v)
                for f in fns.values():  # warm: compiled code, caches, allocator
                    f()
                med = _medians(fns, repeat)
                row = {
                    "n": n,
                    "d": d,
                    "dtype": np.dtype(dtype).name,
                    "loss": loss,
                    "matvec_ms": 1e3 * med["matvec"],
                }
                for k in fns:
                    if k != "matvec":
                        row[k] = med[k] / med["matvec"]
                rows.append(row)
                print(_fmt(row), flush=True)
    return rows


_FIRST_CALL = r"""
import json, sys, time
import numpy as np
t0 = time.perf_counter()
from tiltlab import _cpu_kernels as ck
out = {}
rng = np.random.default_rng(0)
for dtype in (np.float64, np.float32):
    X = rng.standard_normal((4096, 16)).astype(dtype)
    th = np.zeros(16, dtype)
    y = (rng.random(4096) < 0.5).astype(dtype)
    T = np.zeros((16, 3), dtype)
    c = rng.integers(0, 3, 4096)
    calls = {
        "vg": lambda: ck.fused_value_and_gradient("logistic", X, y, th, 1.0),
        "hvp": lambda: ck.fused_hvp("logistic", X, y, th, th, 1.0),
        "linearize+hvp": lambda: ck.fused_linearize("logistic", X, y, th, 1.0).hvp(th),
        "multinomial vg": lambda: ck.fused_value_and_gradient("multinomial", X, c, T, 1.0),
        "multinomial hvp": lambda: ck.fused_hvp("multinomial", X, c, T, T, 1.0),
        "multinomial linearize+hvp": lambda: ck.fused_linearize(
            "multinomial", X, c, T, 1.0).hvp(T),
    }
    for name, f in calls.items():
        t1 = time.perf_counter()
        f()
        first = time.perf_counter() - t1
        t1 = time.perf_counter()
        f()
        out[f"{np.dtype(dtype).name} {name}"] = (first, time.perf_counter() - t1)
print(json.dumps(out))
"""


def compile_table():
    """First calls in fresh processes: an empty numba cache, then the cache it filled."""
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold (compiles)", "cached (new process)"):
            out = subprocess.run(
                [sys.executable, "-c", _FIRST_CALL],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            for name, (first, second) in json.loads(out.stdout).items():
                row = {"cache": label, "kernel": name, "first_s": first, "second_s": second}
                rows.append(row)
                print(_fmt(row), flush=True)
    return rows


_FIRST_EVAL = r"""
import json, time
import numpy as np
import tiltlab
rng = np.random.default_rng(0)
X = rng.standard_normal((4096, 128))
y = X @ rng.standard_normal(128) + rng.standard_normal(4096)
theta = np.zeros(128)
times = []
for _ in range(2):  # two objectives: the second is created after the first's first call
    obj = tiltlab.TiltedObjective("squared", X, y, t=1.0)
    for _ in range(2):
        t0 = time.perf_counter()
        obj.value_and_gradient(theta)
        times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def first_eval_table():
    """The objective's first evaluations (4096 x 128 float64, squared loss) in new processes:
    an empty cache, then the cache the first process (and its background compilation)
    filled, in the default mode and with ``TILTLAB_FUSED=wait``."""
    rows = []
    for mode in ("", "wait"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache, TILTLAB_FUSED=mode)
            for label in ("empty cache", "filled cache"):
                t0 = time.perf_counter()
                out = subprocess.run(
                    [sys.executable, "-c", _FIRST_EVAL],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                wall = time.perf_counter() - t0
                a1, a2, b1, b2 = json.loads(out.stdout)
                row = {
                    "mode": mode or "default",
                    "cache": label,
                    "obj1_first_s": a1,
                    "obj1_second_s": a2,
                    "obj2_first_s": b1,
                    "obj2_second_s": b2,
                    "process_s": wall,
                }
                rows.append(row)
                print(_fmt(row), flush=True)
                # let a background compilation finish before the next process
                deadline = time.time() + 1800
                while time.time() < deadline and not any(Path(cache).rglob("*.ready")):
                    time.sleep(1)
    return rows


def _fmt(row):
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shapes / 10, fewer repeats")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None, help="BLAS and numba threads")
    ap.add_argument("--no-generic", action="store_true", help="skip TiltedObjective")
    ap.add_argument("--compile", action="store_true", help="first-call (compile) times")
    ap.add_argument(
        "--first", action="store_true", help="the objective's first evaluations, new processes"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the thread's CPU clock (needs --threads 1)",
    )
    ap.add_argument("--before", default=None, help="folder with a package `tiltlab_before`")
    ap.add_argument("--shapes", default=None, help="e.g. 200000x100,1000000x20")
    ap.add_argument("--losses", default=",".join(LOSSES))
    ap.add_argument("--dtypes", default="float64,float32")
    args = ap.parse_args(argv)
    if not ck.available():
        sys.exit("numba is not installed or the kernels are switched off (TILTLAB_FUSED)")
    if args.compile:
        rows = compile_table()
    elif args.first:
        rows = first_eval_table()
    else:
        import numba

        shapes = SHAPES
        if args.shapes:
            shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
        if args.quick:
            shapes = [(n // 10, d) for n, d in shapes]
        if args.cpu_time:
            if args.threads != 1:
                sys.exit("--cpu-time needs --threads 1 (the work must run on this thread)")
            _CLOCK["clock"] = time.thread_time
        before = None
        if args.before:
            sys.path.insert(0, args.before)
            before = importlib.import_module("tiltlab_before._cpu_kernels")
        repeat = args.repeat if not args.quick else 3
        ctx = nullcontext()
        if args.threads:
            from threadpoolctl import threadpool_limits

            ctx = threadpool_limits(args.threads)
            numba.set_num_threads(args.threads)
        print(f"threads: numba {numba.get_num_threads()}, BLAS {args.threads or 'default'}")
        with ctx:
            rows = speed_table(
                shapes,
                repeat,
                not args.no_generic,
                np.random.default_rng(0),
                before,
                args.losses.split(","),
                [np.dtype(s).type for s in args.dtypes.split(",")],
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

"""``minimize_dro`` against one TERM fit at its optimal tilt, side by side.

For a logistic regression with flipped labels (``N x d``, default 20000 x 20, float64)
and each KL radius, this times, interleaved and repeated (medians of the calling
thread's CPU time with ``--cpu-time``, else of the wall clock):

* ``dro``: ``tiltlab.minimize_dro(objective, kl=r)`` from zeros;
* ``term``: ``tiltlab.minimize(objective.with_tilt(t))`` from zeros, at the optimal tilt
  ``t`` that ``minimize_dro`` found (what a user who knew ``t`` would run; where the
  optimum is the min-max limit ``t = inf``, at the tilt where the fit stopped);

and prints their ratio with the iterations and passes over the data of each. For the
CVaR (``--cvar``) it times ``minimize_dro(objective, cvar=alpha)`` against the ERM fit.
BLAS and the compiled kernels run on ``--threads`` threads (default 1, through
``threadpoolctl`` and ``numba.set_num_threads``), so that the two sides use the same.

Usage::

    python benchmarks/dro_speed.py                       # radii 0.01, 0.1, 0.5
    python benchmarks/dro_speed.py --radii 0.05 --repeat 7 --cpu-time
    python benchmarks/dro_speed.py --cvar 0.1 0.3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tiltlab as tl


def data(n: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    y = (X @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0).astype(float)
    flip = rng.random(n) < 0.1
    y[flip] = 1.0 - y[flip]
    return tl.TiltedObjective("logistic", X, y)


def timed(fn, clock):
    start = clock()
    out = fn()
    return clock() - start, out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--radii", type=float, nargs="*", default=[0.01, 0.1, 0.5])
    ap.add_argument("--cvar", type=float, nargs="*", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cpu-time", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    try:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:  # pragma: no cover - the kernels fall back to NumPy
        pass
    clock = time.process_time if args.cpu_time else time.perf_counter
    obj = data(args.n, args.d)
    tl.minimize_dro(obj, kl=0.1)  # compile and warm every kernel once
    cases = [("kl", r) for r in args.radii] if args.cvar is None else [
        ("cvar", a) for a in args.cvar
    ]
    print(f"N={args.n} d={args.d} logistic float64, {args.repeat} repetitions, "
          f"{'CPU' if args.cpu_time else 'wall'} time, medians, {args.threads} thread(s)")
    print(f"{'case':>12} {'robust':>9} {'reference':>9} {'ratio':>6} {'nit':>9} {'passes':>11}")
    for kind, v in cases:
        dro = tl.minimize_dro(obj, **{kind: v})
        t_ref = dro.t if dro.t < float("inf") else dro.history["t"][-1]
        ref_obj = obj.with_tilt(t_ref if kind == "kl" else 0.0)
        a, b = [], []
        for k in range(args.repeat):
            calls = [
                (a, lambda kw={kind: v}: tl.minimize_dro(obj, **kw)),
                (b, lambda o=ref_obj: tl.minimize(o)),
            ]
            for store, fn in calls if k % 2 == 0 else calls[::-1]:
                store.append(timed(fn, clock)[0])
        ref = tl.minimize(ref_obj)
        ta, tb = statistics.median(a), statistics.median(b)
        label = f"{kind}={v:g}"
        print(f"{label:>12} {ta:9.4f} {tb:9.4f} {ta / tb:6.2f} {dro.nit:4d}/{ref.nit:<4d} "
              f"{dro.n_passes:5.0f}/{ref.n_passes:<5.0f}")  # fmt: skip
        print(f"{'':>12} t={dro.t:.6g} robust value={float(dro.fun):.10g} status={dro.status.name}")


if __name__ == "__main__":
    main()

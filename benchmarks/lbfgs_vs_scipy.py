"""tiltlab's L-BFGS against SciPy's L-BFGS-B on HIV-1 class-level TERM (t = 50), one thread.

Same problem as ``hiv1_positive_tilt.py`` (all 6590 rows, 161 columns, logistic loss,
tilts (50, 0) across/inside the two classes, ``l2 = 1e-4``). Three runs, interleaved,
medians over ``--repeat`` rounds, one BLAS thread (threadpoolctl) and one numba thread:

* ``scipy``: ``scipy.optimize.minimize(method="L-BFGS-B")`` driving the plain NumPy
  value-and-gradient ``ClassTERM`` of ``hiv1_positive_tilt.py``, stopped (callback) at
  the first iterate whose gradient 2-norm is at or below tiltlab's final one: equal
  final gradient norm;
* ``tiltlab/plain``: ``tiltlab.minimize(method="lbfgs")`` driving the SAME plain NumPy
  function (through a minimal objective shim): the solvers' own overhead compared;
* ``tiltlab/objective``: ``tiltlab.minimize`` on ``TiltedObjective`` (the library path;
  the objective's own speed is measured by benchmarks/engine_speed.py).

A second table times the solvers alone: each run's evaluations are recorded once and then
replayed in call order (the function returns the recorded value and gradient, so every
rerun follows the same path at no evaluation cost; the final iterate is checked against
the recorded run's). ``paired`` is the median over rounds of each run's time over SciPy's
in the same round. ``--before DIR`` adds the rows of an older copy of the package,
importable as ``tiltlab_before`` from ``DIR`` (``git archive REV tiltlab | tar -x -C DIR
&& mv DIR/tiltlab DIR/tiltlab_before``), in the same alternating rounds. ``--perturb N``
also solves ``N`` neighbouring problems (``l2`` times ``1 + 0.01 k``, k = 1..N) once each
with both solvers to the same tolerance and reports the totals: the number of iterations
on one problem is a draw of the trajectory's rounding (the two solvers follow each other
to about 1e-8 for the first 80 iterations on this problem and then part), and the
neighbours show how the evaluation counts compare on average.

Run:
    python benchmarks/lbfgs_vs_scipy.py
    python benchmarks/lbfgs_vs_scipy.py --repeat 7 --tol 1e-8
    python benchmarks/lbfgs_vs_scipy.py --repeat 15 --before /tmp/old --perturb 40
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

import numpy as np
from scipy.optimize import minimize as sp_minimize
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hiv1_positive_tilt import L2, TILTS, ClassTERM, load_full_hiv1  # noqa: E402

import tiltlab as tl  # noqa: E402


class PlainObjective:
    """The smallest object ``tiltlab.minimize`` accepts (the members of
    ``tiltlab.objective.Objective``), around a NumPy ``fg``."""

    import array_api_compat.numpy as xp

    def __init__(self, fg, p):
        self.fg, self.p, self.n_passes, self.n_samples = fg, p, 0, None

    def value_and_gradient(self, theta):
        self.n_passes += 2
        f, g = self.fg(theta)
        return np.float64(f), g

    def value(self, theta):
        return self.value_and_gradient(theta)[0]

    def zeros(self):
        return np.zeros(self.p)

    def gradient(self, theta):
        return self.value_and_gradient(theta)[1]

    def hvp(self, theta, v):
        raise NotImplementedError("L-BFGS does not call hvp")

    def hessian(self, theta):
        raise NotImplementedError("L-BFGS does not call hessian")

    def linearize(self, theta):
        raise NotImplementedError("L-BFGS does not call linearize")

    def check_theta(self, theta, name="theta"):
        return np.asarray(theta, dtype=np.float64)

    _theta = check_theta


def run_scipy(ref, p, target):
    last = {}

    def fg(th):
        f, g = ref(th)
        last["x"], last["g"] = th.copy(), g
        return f, g

    def cb(intermediate_result):
        x = intermediate_result.x
        # the accepted point is the last one evaluated: reuse its gradient (no extra pass)
        g = last["g"] if np.array_equal(x, last["x"]) else ref(x)[1]
        if np.linalg.norm(g) <= target:
            raise StopIteration

    t0 = time.perf_counter()
    res = sp_minimize(fg, np.zeros(p), jac=True, method="L-BFGS-B", callback=cb,
                      options={"gtol": 0.0, "ftol": 0.0, "maxiter": 10_000, "maxcor": 10})
    return time.perf_counter() - t0, res.nit, res.nfev, np.linalg.norm(ref(res.x)[1])


class Replay:
    """A value-and-gradient function that records its first run and then replays it.

    After :meth:`rewind`, the ``k``-th call returns the ``k``-th recorded ``(f, g)``
    whatever its argument: a deterministic solver then retraces the recorded path, and
    its time is its own work alone.
    """

    def __init__(self, fg):
        self.fg, self.calls, self.k = fg, [], None

    def __call__(self, theta):
        if self.k is None:
            f, g = self.fg(theta)
            self.calls.append((f, g.copy()))
            return f, g
        f, g = self.calls[self.k]
        self.k += 1
        return f, g

    def rewind(self) -> None:
        self.k = 0


def solver_only(mods, ref, p, tol, repeat):
    """Median seconds per solve of each solver with its evaluations replayed."""
    runs = {}
    for name, mod in mods.items():
        fn = Replay(ref)
        r = mod.minimize(PlainObjective(fn, p), method="lbfgs", tol=tol)
        runs[name] = (fn, mod, np.array(r.x), r.nit)
    target = np.linalg.norm(ref(runs["tiltlab"][2])[1])
    sp = Replay(ref)
    _, nit_sp, _, _ = run_scipy(sp, p, target)
    n_sp = len(sp.calls) - 1  # run_scipy evaluates the final point once more, untimed
    times: dict[str, list[float]] = {k: [] for k in [*runs, "scipy"]}
    for _ in range(repeat):
        for name, (fn, mod, x, _) in runs.items():
            fn.rewind()
            t0 = time.perf_counter()
            r = mod.minimize(PlainObjective(fn, p), method="lbfgs", tol=tol)
            times[name].append(time.perf_counter() - t0)
            assert np.array_equal(np.asarray(r.x), x), "the replay left the recorded path"
        sp.rewind()
        times["scipy"].append(run_scipy(sp, p, target)[0])
    nits = {k: v[3] for k, v in runs.items()} | {"scipy": nit_sp}
    evals = {k: len(v[0].calls) for k, v in runs.items()} | {"scipy": n_sp}
    return times, nits, evals


def neighbours(X, y, mod, n, tol):
    """Totals over ``n`` neighbouring problems: seconds, iterations and evaluations."""
    p = X.shape[1]
    tot = {"tiltlab": [0.0, 0, 0], "scipy": [0.0, 0, 0]}
    for k in range(1, n + 1):
        ref = ClassTERM(X, y, TILTS[0], L2 * (1 + 0.01 * k))
        plain = PlainObjective(ref, p)
        t0 = time.perf_counter()
        r = mod.minimize(plain, method="lbfgs", tol=tol)
        el = time.perf_counter() - t0
        for key, val in zip(("tiltlab", "scipy"), ((el, r.nit, r.n_passes / 2),
                            run_scipy(ref, p, np.linalg.norm(ref(r.x)[1]))[:3]), strict=True):
            tot[key] = [a + b for a, b in zip(tot[key], val, strict=True)]
    return tot


def _paired(times, base):
    """Median over rounds of the ratio to SciPy's time in the same round (robust to a
    load that drifts between rounds)."""
    return statistics.median(a / b for a, b in zip(times, base, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--before", metavar="DIR",
                    help="also time the package `tiltlab_before` found in DIR")
    ap.add_argument("--perturb", type=int, default=0, metavar="N",
                    help="also solve N neighbouring problems (l2 scaled) once each")
    args = ap.parse_args()
    before = None
    if args.before:
        sys.path.insert(0, args.before)
        before = importlib.import_module("tiltlab_before")
    X, y = load_full_hiv1()
    ref = ClassTERM(X, y, TILTS[0], L2)
    obj = tl.TiltedObjective("logistic", X, y, groups=y.astype(int), tilts=TILTS, l2=L2)
    p = X.shape[1]
    g0 = np.linalg.norm(ref(np.zeros(p))[1])
    times: dict[str, list[float]] = {"scipy": [], "tiltlab/plain": [], "tiltlab/objective": []}
    mods = [tl]
    if before is not None:
        mods.append(before)
        times.update({"before/plain": [], "before/objective": []})
        obj_before = before.TiltedObjective("logistic", X, y, groups=y.astype(int),
                                            tilts=TILTS, l2=L2)  # fmt: skip
    info = {}
    try:  # tiltlab's fused CPU kernels run in numba's pool, which threadpoolctl leaves alone
        import numba

        numba.set_num_threads(1)
    except ImportError:  # pragma: no cover - numba is optional
        pass
    with threadpool_limits(limits=1):
        for _ in range(args.repeat):
            for mod in mods:
                key = "tiltlab" if mod is tl else "before"
                t0 = time.perf_counter()
                r = mod.minimize(PlainObjective(ref, p), method="lbfgs", tol=args.tol)
                times[f"{key}/plain"].append(time.perf_counter() - t0)
                gn = np.linalg.norm(ref(r.x)[1])
                info[f"{key}/plain"] = (r.nit, r.n_passes / 2, gn)
                if mod is tl:
                    gn_plain = gn
                t0 = time.perf_counter()
                r = mod.minimize(obj if mod is tl else obj_before, method="lbfgs", tol=args.tol)
                times[f"{key}/objective"].append(time.perf_counter() - t0)
                info[f"{key}/objective"] = (r.nit, None, np.linalg.norm(ref(r.x)[1]))
            el, nit, nfev, gn = run_scipy(ref, p, gn_plain)
            times["scipy"].append(el)
            info["scipy"] = (nit, nfev, gn)
    print(f"HIV-1 t=50, {X.shape[0]}x{p}, one BLAS thread, medians of {args.repeat}, "
          f"tol={args.tol:g} (relative to ||grad(0)|| = {g0:.3g})")
    base = statistics.median(times["scipy"])
    print(f"{'run':20s} {'median s':>9s} {'vs scipy':>9s} {'paired':>7s} {'nit':>5s} "
          f"{'fg evals':>8s} {'final ||g||/||g0||':>18s}")
    for k, v in times.items():
        nit, nfev, gn = info[k]
        med = statistics.median(v)
        print(f"{k:20s} {med:9.4f} {med / base:9.2f} {_paired(v, times['scipy']):7.2f} "
              f"{nit:5d} {'' if nfev is None else int(nfev):>8} {gn / g0:18.2e}")
    solvers = {"tiltlab": tl} | ({"before": before} if before is not None else {})
    with threadpool_limits(limits=1):
        t_only, nits, evals = solver_only(solvers, ref, p, args.tol, args.repeat)
    base = statistics.median(t_only["scipy"])
    print(f"\nthe solvers alone (evaluations replayed), medians of {args.repeat}")
    print(f"{'run':20s} {'median ms':>9s} {'vs scipy':>9s} {'paired':>7s} {'us / it':>8s} "
          f"{'nit':>5s} {'fg evals':>8s}")
    for k, v in t_only.items():
        med = statistics.median(v)
        print(f"{k:20s} {med * 1e3:9.2f} {med / base:9.2f} {_paired(v, t_only['scipy']):7.2f} "
              f"{med / nits[k] * 1e6:8.1f} {nits[k]:5d} {evals[k]:8d}")
    if args.perturb:
        with threadpool_limits(limits=1):
            tot = neighbours(X, y, tl, args.perturb, args.tol)
        (ts, its, es), (tsp, itsp, esp) = tot["tiltlab"], tot["scipy"]
        print(f"\n{args.perturb} neighbouring problems (l2 x (1 + 0.01 k)), totals: "
              f"tiltlab {ts:.3f} s, {its} it, {int(es)} evals; scipy {tsp:.3f} s, {itsp} it, "
              f"{int(esp)} evals; time ratio {ts / tsp:.2f}, evaluations ratio "
              f"{es / esp:.3f}")


if __name__ == "__main__":
    main()

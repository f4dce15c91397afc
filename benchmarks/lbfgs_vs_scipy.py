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

Run:
    python benchmarks/lbfgs_vs_scipy.py
    python benchmarks/lbfgs_vs_scipy.py --repeat 7 --tol 1e-8
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-8)
    args = ap.parse_args()
    X, y = load_full_hiv1()
    ref = ClassTERM(X, y, TILTS[0], L2)
    obj = tl.TiltedObjective("logistic", X, y, groups=y.astype(int), tilts=TILTS, l2=L2)
    p = X.shape[1]
    g0 = np.linalg.norm(ref(np.zeros(p))[1])
    times: dict[str, list[float]] = {"scipy": [], "tiltlab/plain": [], "tiltlab/objective": []}
    info = {}
    try:  # tiltlab's fused CPU kernels run in numba's pool, which threadpoolctl leaves alone
        import numba

        numba.set_num_threads(1)
    except ImportError:  # pragma: no cover - numba is optional
        pass
    with threadpool_limits(limits=1):
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = tl.minimize(PlainObjective(ref, p), method="lbfgs", tol=args.tol)
            times["tiltlab/plain"].append(time.perf_counter() - t0)
            gn_plain = np.linalg.norm(ref(r.x)[1])
            info["tiltlab/plain"] = (r.nit, r.n_passes / 2, gn_plain)
            t0 = time.perf_counter()
            r = tl.minimize(obj, method="lbfgs", tol=args.tol)
            times["tiltlab/objective"].append(time.perf_counter() - t0)
            info["tiltlab/objective"] = (r.nit, None, np.linalg.norm(ref(r.x)[1]))
            el, nit, nfev, gn = run_scipy(ref, p, gn_plain)
            times["scipy"].append(el)
            info["scipy"] = (nit, nfev, gn)
    print(f"HIV-1 t=50, {X.shape[0]}x{p}, one BLAS thread, medians of {args.repeat}, "
          f"tol={args.tol:g} (relative to ||grad(0)|| = {g0:.3g})")
    base = statistics.median(times["scipy"])
    print(f"{'run':20s} {'median s':>9s} {'vs scipy':>9s} {'nit':>5s} {'fg evals':>8s} "
          f"{'final ||g||/||g0||':>18s}")
    for k, v in times.items():
        nit, nfev, gn = info[k]
        med = statistics.median(v)
        print(f"{k:20s} {med:9.4f} {med / base:9.2f} {nit:5d} "
              f"{'' if nfev is None else int(nfev):>8} {gn / g0:18.2e}")


if __name__ == "__main__":
    main()

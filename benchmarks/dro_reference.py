"""``minimize_dro`` against SciPy references, values and times side by side.

* KL (logistic, flipped labels): ``minimize_dro(objective, kl=r)`` against SciPy's
  L-BFGS-B on the joint problem ``min over (theta, log t) of R_t(theta) + r / t``, written
  here with ``scipy.special.logsumexp`` (best of three starts in ``log t``);
* CVaR (absolute loss with Student-t noise; hinge loss with flipped labels):
  ``minimize_dro(objective, cvar=alpha)`` against the linear program
  ``min eta + sum_i u_i / (alpha N)`` s.t. ``u_i >= pieces - eta``, ``u >= 0``, solved
  by HiGHS (``scipy.optimize.linprog``).

Each pair is timed interleaved (medians of ``--repeat`` runs of the process's CPU time,
BLAS and the compiled kernels on ``--threads`` threads, default 1). Prints a Markdown
table with the ratio of the two times (reference over tiltlab); on a shared machine
only the ratio, measured side by side, means anything.

Usage::

    python benchmarks/dro_reference.py --n 2000 --d 10 --repeat 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
from scipy.optimize import linprog
from scipy.optimize import minimize as sp_minimize
from scipy.special import expit, logsumexp

import tiltlab as tl


def logistic(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    y = (X @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0).astype(float)
    f = rng.random(n) < 0.1
    y[f] = 1 - y[f]
    return X, y


def regression(n, d, seed=1):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    return X, X @ rng.normal(size=d) + rng.standard_t(2, size=n)


def kl_scipy(X, y, r):
    n, d = X.shape

    def f(v):
        theta, t = v[:d], math.exp(v[d])
        z = X @ theta
        ell = np.logaddexp(0, z) - y * z
        lz = logsumexp(t * ell) - math.log(n)
        w = np.exp(t * ell - math.log(n) - lz)
        return lz / t + r / t, np.r_[X.T @ (w * (expit(z) - y)), w @ ell - lz / t - r / t]

    runs = [sp_minimize(f, np.r_[np.zeros(d), s], jac=True, method="L-BFGS-B",
                        options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 5000})
            for s in (-2.0, 0.0, 2.0)]  # fmt: skip
    return min(r_.fun for r_ in runs)


def cvar_lp(kind, X, y, alpha):
    n, d = X.shape
    c = np.r_[np.zeros(d), 1.0, np.full(n, 1 / (alpha * n))]
    one, eye = np.ones((n, 1)), np.eye(n)
    if kind == "absolute":
        A = np.r_[np.c_[X, -one, -eye], np.c_[-X, -one, -eye]]
        b = np.r_[y, -y]
    else:
        s = 2 * y - 1
        A = np.r_[np.c_[-s[:, None] * X, -one, -eye], np.c_[np.zeros((n, d)), -one, -eye]]
        b = np.r_[-np.ones(n), np.zeros(n)]
    from scipy.sparse import csr_matrix

    res = linprog(c, A_ub=csr_matrix(A), b_ub=b,
                  bounds=[(None, None)] * (d + 1) + [(0, None)] * n, method="highs")  # fmt: skip
    return res.fun


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    try:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:  # pragma: no cover - the kernels fall back to NumPy
        pass
    n, d = args.n, args.d
    Xl, yl = logistic(n, d)
    Xr, yr = regression(n, d)
    cases = []
    for r in (0.01, 0.1, 1.0):
        obj = tl.TiltedObjective("logistic", Xl, yl)
        cases.append((f"KL r={r:g}, logistic",
                      lambda o=obj, r=r: float(tl.minimize_dro(o, kl=r).fun),
                      lambda r=r: kl_scipy(Xl, yl, r), "SciPy L-BFGS-B, joint"))  # fmt: skip
    for kind, (X, y) in (("absolute", (Xr, yr)), ("hinge", (Xl, yl))):
        for a in (0.05, 0.3):
            obj = tl.TiltedObjective(kind, X, y)
            cases.append((f"CVaR a={a:g}, {kind}",
                          lambda o=obj, a=a: float(tl.minimize_dro(o, cvar=a).fun),
                          lambda k=kind, X=X, y=y, a=a: cvar_lp(k, X, y, a),
                          "HiGHS LP"))  # fmt: skip
    tl.minimize_dro(tl.TiltedObjective("logistic", Xl, yl), kl=0.1)  # warm the kernels
    print(f"N={n}, d={d}; medians of {args.repeat} interleaved runs, CPU time, "
          f"{args.threads} thread(s)\n")  # fmt: skip
    print("| problem | tiltlab value | reference value | rel. difference | "
          "time ratio (reference / tiltlab) | reference |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, ours, ref, label in cases:
        ta, tb, va, vb = [], [], None, None
        for k in range(args.repeat):
            for which in ((0, 1) if k % 2 == 0 else (1, 0)):
                start = time.process_time()
                if which == 0:
                    va = ours()
                    ta.append(time.process_time() - start)
                else:
                    vb = ref()
                    tb.append(time.process_time() - start)
        ratio = statistics.median(tb) / statistics.median(ta)
        print(f"| {name} | {va:.10g} | {vb:.10g} | {(va - vb) / abs(vb):+.1e} | "
              f"{ratio:.1f} | {label} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""Multi-threaded fits with every library's default threading, at t = 0 and t != 0.

What a user compares: ``TiltedClassifier`` and ``TiltedRegressor`` against scikit-learn
and glum, each with its default threads (all cores in BLAS, OpenMP and numba), side by
side in one process. Problem (default 1,000,000 x 100 float64, Gaussian features, an
unpenalised intercept, ``alpha = 1e-4``):

* classification at t = 0, the same objective ``mean logloss + alpha/2 ||w||^2``:
  ``TiltedClassifier(alpha)``, ``LogisticRegression(C = 1 / (alpha N))`` with
  ``solver="lbfgs"`` and ``"newton-cholesky"``, glum's
  ``GeneralizedLinearRegressor(family="binomial", alpha, l1_ratio=0)``;
* regression at t = 0, ``mean r**2 + alpha/2 ||w||^2``: ``TiltedRegressor(alpha)`` (the
  normal equations, as ``Ridge``), ``Ridge(alpha N / 2)``, glum ``family="normal"``;
* at t != 0 the tilted objective has no counterpart elsewhere; what a user weighs it
  against is the robust or plain fit they would run instead: ``TiltedClassifier(t=1)``
  (class-fair tilting of the log-loss) next to the same ``LogisticRegression`` runs, and
  ``TiltedRegressor(t=-1)`` (robust to corrupted targets, 5% of them replaced by
  N(5, 5) draws) next to ``HuberRegressor(epsilon=1.35, alpha=alpha N / 2)`` and
  ``Ridge``. Those rows compare costs of different estimators, not of one objective.

Tolerances: the gradient tolerance ``--tol`` (default 1e-6) in each library's own
meaning at t = 0, with the tilted estimators given ``tol / ||grad at 0||`` so that they
stop on the Euclidean norm of the gradient of the same objective, which is stricter than
scikit-learn's largest entry (see ``estimators_speed.py``); ``HuberRegressor`` keeps its
default ``tol=1e-5`` (projected gradient). ``early_stopping=False``: every estimator
minimises its objective on all rows. Objective values and gradient norms at t = 0 are
recomputed in plain NumPy and printed beside the times.

Timing: the fits of a block interleaved (the order alternating between repeats),
``--repeat`` each, medians; the first fit of the process (loading the fused kernels) is
run before and not timed. ``ratio`` = the tilted estimator's median / the other's
(< 1: tiltlab faster). The load average before and after is printed: on a shared machine
absolute seconds are noisy and the ratios, measured side by side, less so.

Run (glum is optional: ``pip install glum``):
    python benchmarks/estimators_threads.py                      # 1e6 x 100, --repeat 3
    python benchmarks/estimators_threads.py --n 200000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
from estimators_speed import logistic_objective, squared_objective, timed_fits
from scipy.special import expit


def _threads_line() -> str:
    parts = [f"{os.cpu_count()} CPUs"]
    try:
        from threadpoolctl import threadpool_info

        pools = {
            (p["user_api"], p.get("internal_api")): p["num_threads"] for p in threadpool_info()
        }
        parts += [f"{api}/{impl}: {k}" for (api, impl), k in sorted(pools.items())]
    except ImportError:  # pragma: no cover
        pass
    try:
        import numba

        parts.append(f"numba: {numba.get_num_threads()}")
    except ImportError:  # pragma: no cover
        pass
    return ", ".join(parts)


def _block(title, ests, X, y, repeat, objective, alpha, ours) -> None:
    times, fitted = timed_fits(ests, X, y, repeat)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{title}")
    head = (
        f"{'estimator':<26} {'median s':>9} {'runs':>28} {'nit':>5} "
        f"{'objective':>14} {'||grad||':>9}"
    )
    print(head)
    print("-" * len(head))
    for name, est in fitted.items():
        nit = getattr(est, "n_iter_", None)
        nit = "-" if nit is None else int(np.max(nit))
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        f_s = g_s = "-"
        if objective is not None:
            w = np.asarray(est.coef_).reshape(-1)
            b = float(np.asarray(est.intercept_).reshape(-1)[0])
            f, g = objective(X, y, w, b, alpha)
            f_s, g_s = f"{f:.10f}", f"{np.linalg.norm(g):.2e}"
        print(f"{name:<26} {med[name]:>9.3f} {runs:>28} {nit:>5} {f_s:>14} {g_s:>9}")
    for other in times:
        if other != ours:
            print(f"  ratio {ours} / {other} = {med[ours] / med[other]:.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=100)
    ap.add_argument("--alpha", type=float, default=1e-4)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from sklearn.linear_model import HuberRegressor, LogisticRegression, Ridge

    from tiltlab.estimators import TiltedClassifier, TiltedRegressor

    try:
        import glum
    except ImportError:  # optional comparison
        glum = None
        print("glum not installed: skipped (pip install glum)")

    n, d, alpha, tol = args.n, args.d, args.alpha, args.tol
    rng = np.random.default_rng(args.seed)
    X = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d) / np.sqrt(d) * 2.0
    y_class = (rng.random(n) < expit(X @ w_true + 0.5)).astype(np.int64)
    y_reg = X @ rng.standard_normal(d) + rng.standard_normal(n)
    y_noisy = y_reg.copy()
    k = n // 20
    y_noisy[:k] = rng.normal(5.0, 5.0, k)
    print(f"data: {n} x {d} float64, alpha={alpha:g}, tol={tol:g}; threads: {_threads_line()}")
    print(f"load average before: {os.getloadavg()}")
    # the first fits of the process load (or compile) the fused kernels: not timed
    for t in (0.0, 1.0):
        TiltedClassifier(alpha=alpha, t=t).fit(X[:2000], y_class[:2000])
        TiltedRegressor(alpha=alpha, t=-t, early_stopping=False).fit(X[:2000], y_reg[:2000])

    C = 1.0 / (alpha * n)
    g0c = np.linalg.norm(logistic_objective(X, y_class, np.zeros(d), 0.0, alpha)[1])
    g0r = np.linalg.norm(squared_objective(X, y_reg, np.zeros(d), 0.0, alpha)[1])
    lr = {
        "LogisticRegression(lbfgs)": lambda: LogisticRegression(
            C=C, solver="lbfgs", tol=tol, max_iter=10_000
        ),
        "LR(newton-cholesky)": lambda: LogisticRegression(
            C=C, solver="newton-cholesky", tol=tol, max_iter=10_000
        ),
    }
    clf0 = {"TiltedClassifier t=0": lambda: TiltedClassifier(alpha=alpha, tol=tol / g0c), **lr}
    if glum is not None:
        clf0["glum binomial"] = lambda: glum.GeneralizedLinearRegressor(
            family="binomial", alpha=alpha, l1_ratio=0.0, gradient_tol=tol
        )
    _block(
        "classification, t = 0 (one objective)",
        clf0, X, y_class, args.repeat, logistic_objective, alpha, "TiltedClassifier t=0",
    )  # fmt: skip
    clf1 = {"TiltedClassifier t=1": lambda: TiltedClassifier(alpha=alpha, t=1.0, tol=tol), **lr}
    _block(
        "classification, t = 1 beside the plain logistic fits (different objectives)",
        clf1, X, y_class, args.repeat, None, alpha, "TiltedClassifier t=1",
    )  # fmt: skip
    ridge = {"Ridge": lambda: Ridge(alpha=alpha * n / 2)}
    reg0 = {
        "TiltedRegressor t=0": lambda: TiltedRegressor(
            alpha=alpha, tol=tol / g0r, early_stopping=False
        ),
        **ridge,
    }
    if glum is not None:  # (1/2N) sum r^2 + alpha/4 ||w||^2: half our objective
        reg0["glum normal"] = lambda: glum.GeneralizedLinearRegressor(
            family="normal", alpha=alpha / 2, l1_ratio=0.0, gradient_tol=tol / 2
        )
    _block(
        "regression, t = 0 (one objective)",
        reg0, X, y_reg, args.repeat, squared_objective, alpha, "TiltedRegressor t=0",
    )  # fmt: skip
    reg1 = {
        "TiltedRegressor t=-1": lambda: TiltedRegressor(
            alpha=alpha, t=-1.0, tol=tol, early_stopping=False
        ),
        "HuberRegressor": lambda: HuberRegressor(epsilon=1.35, alpha=alpha * n / 2, max_iter=1000),
        **ridge,
    }
    _block(
        "regression with 5% corrupted targets, t = -1 beside HuberRegressor and Ridge "
        "(different objectives)",
        reg1, X, y_noisy, args.repeat, None, alpha, "TiltedRegressor t=-1",
    )  # fmt: skip
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

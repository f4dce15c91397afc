"""TiltedClassifier / TiltedRegressor at t = 0 against scikit-learn (and glum, if installed).

Classification: ``LogisticRegression`` with ``solver="lbfgs"`` and ``"newton-cholesky"``,
and glum's ``GeneralizedLinearRegressor(family="binomial", l1_ratio=0)`` when glum is
installed (``pip install glum``; skipped otherwise). Regression (``--regression``):
``TiltedRegressor(alpha=a)`` against ``Ridge(alpha=a * N / 2)`` (a direct solver).

Problem: N x d Gaussian features (default 100,000 x 50, float64), labels drawn from a
logistic model, binary logistic loss with an unpenalised intercept and the ridge term
``alpha/2 ||w||^2`` (alpha = 1e-4). Both estimators minimise the same objective::

    mean_i logloss_i + alpha/2 ||w||^2      (LogisticRegression with C = 1 / (alpha N))

Equal tolerance: scikit-learn's lbfgs stops when the largest gradient entry of this
objective is below ``tol``; TiltedClassifier is given ``tol / ||grad at 0||`` so that it
stops when the Euclidean norm of the same gradient is below ``tol`` (a stricter test, since
the max entry never exceeds the norm). The script recomputes both solutions' objective
values and gradient norms in plain NumPy (independent of both libraries) and prints them.

Timing: one thread in every BLAS and OpenMP pool (threadpoolctl; scikit-learn's loss
functions use OpenMP), the two fits interleaved (the order alternating),
``--repeat`` runs each, medians. ``ratio`` = TiltedClassifier's median / scikit-learn's
(< 1: tiltlab is faster). The machine's load average is printed: on a shared machine the
absolute seconds are noisy; the ratio, measured side by side, much less so.

Run:
    python benchmarks/estimators_speed.py
    python benchmarks/estimators_speed.py --n 20000 --d 20 --repeat 3 --tol 1e-6
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import numpy as np
from scipy.special import expit


def objective_and_grad(X: np.ndarray, y: np.ndarray, w: np.ndarray, b: float, alpha: float):
    """Plain-NumPy value and gradient (coefficients, then intercept) of the objective."""
    z = X @ w + b
    f = np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * alpha * float(w @ w)
    r = (expit(z) - y) / y.size
    return f, np.r_[X.T @ r + alpha * w, r.sum()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=1e-4)
    ap.add_argument("--tol", type=float, nargs="+", default=[1e-4, 1e-6])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    from tiltlab.estimators import TiltedClassifier

    try:
        import glum
    except ImportError:  # optional comparison
        glum = None
        print("glum not installed: skipped (pip install glum)")

    rng = np.random.default_rng(args.seed)
    X = rng.standard_normal((args.n, args.d))
    w_true = rng.standard_normal(args.d) / np.sqrt(args.d) * 2.0
    y = (rng.random(args.n) < expit(X @ w_true + 0.5)).astype(np.int64)
    g0 = np.linalg.norm(objective_and_grad(X, y, np.zeros(args.d), 0.0, args.alpha)[1])
    C = 1.0 / (args.alpha * args.n)
    print(
        f"data: {args.n} x {args.d} float64, logistic, alpha={args.alpha:g} (C={C:g}), "
        f"||grad at 0|| = {g0:.4g}; load average {os.getloadavg()}"
    )
    head = (
        f"{'tol':>8} {'estimator':<22} {'median s':>9} {'runs':>28} {'nit':>5} "
        f"{'objective':>14} {'||grad||':>9}"
    )
    print(head)
    print("-" * len(head))
    with threadpool_limits(limits=1):  # BLAS and OpenMP (sklearn's Cython loss)
        for tol in args.tol:
            ests = {
                "TiltedClassifier": lambda tol=tol: TiltedClassifier(
                    alpha=args.alpha, tol=tol / g0, max_iter=10_000
                ),
                "LogisticRegression": lambda tol=tol: LogisticRegression(
                    C=C, solver="lbfgs", tol=tol, max_iter=10_000
                ),
                "LR(newton-cholesky)": lambda tol=tol: LogisticRegression(
                    C=C, solver="newton-cholesky", tol=tol, max_iter=10_000
                ),
            }
            if glum is not None:  # same objective: mean log-loss + alpha/2 ||w||^2
                ests["glum"] = lambda tol=tol: glum.GeneralizedLinearRegressor(
                    family="binomial", alpha=args.alpha, l1_ratio=0.0, gradient_tol=tol
                )
            times: dict[str, list[float]] = {k: [] for k in ests}
            fitted: dict[str, object] = {}
            for r in range(args.repeat):
                order = list(ests) if r % 2 == 0 else list(ests)[::-1]
                for name in order:
                    est = ests[name]()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ConvergenceWarning)
                        t0 = time.perf_counter()
                        est.fit(X, y)
                        times[name].append(time.perf_counter() - t0)
                    fitted[name] = est
            med = {k: statistics.median(v) for k, v in times.items()}
            for name, est in fitted.items():
                w = np.asarray(est.coef_).reshape(-1)
                b = float(np.asarray(est.intercept_).reshape(-1)[0])
                f, g = objective_and_grad(X, y, w, b, args.alpha)
                nit = int(np.max(est.n_iter_))
                runs = ", ".join(f"{t:.2f}" for t in times[name])
                print(
                    f"{tol:>8.0e} {name:<22} {med[name]:>9.3f} {runs:>28} {nit:>5} "
                    f"{f:>14.10f} {np.linalg.norm(g):>9.2e}"
                )
            for other in list(ests)[1:]:
                print(
                    f"{'':>8} ratio TiltedClassifier / {other} = "
                    f"{med['TiltedClassifier'] / med[other]:.2f}"
                )
        regression(args, X, rng)
    print(f"load average at the end: {os.getloadavg()}")


def regression(args, X, rng):
    """TiltedRegressor(t=0) against Ridge on the same features, interleaved medians."""
    from sklearn.linear_model import Ridge

    from tiltlab.estimators import TiltedRegressor

    y = X @ rng.standard_normal(X.shape[1]) + rng.standard_normal(X.shape[0])
    n = X.shape[0]
    ests = {
        "TiltedRegressor": lambda: TiltedRegressor(alpha=args.alpha, tol=1e-6, max_iter=10_000),
        "Ridge": lambda: Ridge(alpha=args.alpha * n / 2),
    }
    times: dict[str, list[float]] = {k: [] for k in ests}
    coefs = {}
    for r in range(args.repeat):
        for name in list(ests) if r % 2 == 0 else list(ests)[::-1]:
            est = ests[name]()
            t0 = time.perf_counter()
            est.fit(X, y)
            times[name].append(time.perf_counter() - t0)
            coefs[name] = np.asarray(est.coef_)
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = np.max(np.abs(coefs["TiltedRegressor"] - coefs["Ridge"]))
    print(
        f"regression: TiltedRegressor {med['TiltedRegressor']:.3f} s, Ridge {med['Ridge']:.3f} s,"
        f" ratio {med['TiltedRegressor'] / med['Ridge']:.2f}, max |coef difference| {diff:.1e}"
    )


if __name__ == "__main__":
    main()

"""TiltedClassifier / TiltedRegressor at t = 0 against scikit-learn (and glum, if installed).

Classification: ``LogisticRegression`` with ``solver="lbfgs"`` and ``"newton-cholesky"``,
and glum's ``GeneralizedLinearRegressor(family="binomial", l1_ratio=0)`` when glum is
installed (``pip install glum``; skipped otherwise). Regression: ``TiltedRegressor`` with
the squared loss against ``Ridge`` (a direct solve) and glum's ``family="normal"``.

Problem: N x d Gaussian features (default 100,000 x 50, float64), labels drawn from a
logistic model (classification) or a linear model with unit Gaussian noise (regression),
an unpenalised intercept and the ridge term ``alpha/2 ||w||^2`` (alpha = 1e-4). The
estimators minimise the same objectives::

    mean_i logloss_i + alpha/2 ||w||^2   LogisticRegression(C = 1 / (alpha N)), glum(alpha)
    mean_i r_i**2    + alpha/2 ||w||^2   Ridge(alpha * N / 2), glum(alpha / 2)

(tiltlab's squared loss is ``r**2``, with no factor 1/2). ``early_stopping=False``: the
tilted estimators minimise the objective on all rows, as the others do.

Equal tolerance: scikit-learn's lbfgs stops when the largest gradient entry of this
objective is below ``tol``; the tilted estimators are given ``tol / ||grad at 0||`` so that
they stop when the Euclidean norm of the same gradient is below ``tol`` (a stricter test,
since the max entry never exceeds the norm). ``Ridge`` solves the normal equations (no
tolerance). The script recomputes every solution's objective value and gradient norm in
plain NumPy (independent of the libraries) and prints them.

Timing: the fits interleaved (the order alternating), ``--repeat`` runs each, medians.
``--threads 1``: one thread in every BLAS and OpenMP pool (threadpoolctl; scikit-learn's
loss functions use OpenMP) *and* in numba's pool (tiltlab's fused CPU kernels), so that
every library runs on one core; ``--threads all``: every library's defaults. ``ratio`` =
the tilted estimator's median / the other's (< 1: tiltlab is faster). The first fit in the
process, which includes loading (or compiling) the fused kernels, is timed separately and
left out of the medians. The machine's load average is printed: on a shared machine the
absolute seconds are noisy; the ratio, measured side by side, much less so.

Run:
    python benchmarks/estimators_speed.py
    python benchmarks/estimators_speed.py --n 20000 --d 20 --repeat 3 --tol 1e-6 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings

import numpy as np
from scipy.special import expit


def logistic_objective(X, y, w, b, alpha):
    """Plain-NumPy value and gradient (coefficients, then intercept) of the logistic one."""
    z = X @ w + b
    f = np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * alpha * float(w @ w)
    r = (expit(z) - y) / y.size
    return f, np.r_[X.T @ r + alpha * w, r.sum()]


def squared_objective(X, y, w, b, alpha):
    """Plain-NumPy value and gradient of ``mean r**2 + alpha/2 ||w||^2``."""
    r = X @ w + b - y
    f = np.mean(r * r) + 0.5 * alpha * float(w @ w)
    return f, np.r_[2.0 * (X.T @ r) / y.size + alpha * w, 2.0 * r.sum() / y.size]


@contextlib.contextmanager
def threads(mode: str):
    """One thread in BLAS, OpenMP and numba (``"1"``), or the defaults (``"all"``)."""
    if mode == "all":
        yield
        return
    from threadpoolctl import threadpool_limits

    try:
        import numba
    except ImportError:  # pragma: no cover - numba is optional
        numba = None
    before = numba.get_num_threads() if numba is not None else None
    try:
        if numba is not None:
            numba.set_num_threads(1)
        with threadpool_limits(limits=1):
            yield
    finally:
        if numba is not None:
            numba.set_num_threads(before)


def timed_fits(ests: dict, X, y, repeat: int) -> tuple[dict, dict]:
    """Interleaved fits (order alternating); returns (times, last fitted estimators)."""
    from sklearn.exceptions import ConvergenceWarning

    times: dict[str, list[float]] = {k: [] for k in ests}
    fitted: dict[str, object] = {}
    for r in range(repeat):
        for name in list(ests) if r % 2 == 0 else list(ests)[::-1]:
            est = ests[name]()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                t0 = time.perf_counter()
                est.fit(X, y)
                times[name].append(time.perf_counter() - t0)
            fitted[name] = est
    return times, fitted


def report(tol, times, fitted, X, y, alpha, objective, ours: str) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, est in fitted.items():
        w = np.asarray(est.coef_).reshape(-1)
        b = float(np.asarray(est.intercept_).reshape(-1)[0])
        f, g = objective(X, y, w, b, alpha)
        nit = getattr(est, "n_iter_", None)
        nit = "-" if nit is None else int(np.max(nit))
        runs = ", ".join(f"{t:.3f}" for t in times[name])
        tol_s = "-" if tol is None else f"{tol:.0e}"
        print(
            f"{tol_s:>8} {name:<22} {med[name]:>9.4f} {runs:>34} {nit:>5} "
            f"{f:>14.10f} {np.linalg.norm(g):>9.2e}"
        )
    for other in list(times)[1:]:
        print(f"{'':>8} ratio {ours} / {other} = {med[ours] / med[other]:.2f}")


def header() -> None:
    head = (
        f"{'tol':>8} {'estimator':<22} {'median s':>9} {'runs':>34} {'nit':>5} "
        f"{'objective':>14} {'||grad||':>9}"
    )
    print(head)
    print("-" * len(head))


def classification(args, X, y, glum) -> None:
    from sklearn.linear_model import LogisticRegression

    from tiltlab.estimators import TiltedClassifier

    g0 = np.linalg.norm(logistic_objective(X, y, np.zeros(X.shape[1]), 0.0, args.alpha)[1])
    C = 1.0 / (args.alpha * X.shape[0])
    print(f"classification: logistic, C={C:g}, ||grad at 0|| = {g0:.4g}")
    header()
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
        times, fitted = timed_fits(ests, X, y, args.repeat)
        report(tol, times, fitted, X, y, args.alpha, logistic_objective, "TiltedClassifier")


def regression(args, X, y, glum) -> None:
    from sklearn.linear_model import Ridge

    from tiltlab.estimators import TiltedRegressor

    n = X.shape[0]
    g0 = np.linalg.norm(squared_objective(X, y, np.zeros(X.shape[1]), 0.0, args.alpha)[1])
    print(f"regression: squared loss, Ridge alpha={args.alpha * n / 2:g}, ||grad at 0|| = {g0:.4g}")
    header()
    for tol in args.tol:
        ests = {
            "TiltedRegressor": lambda tol=tol: TiltedRegressor(
                alpha=args.alpha, tol=tol / g0, max_iter=10_000, early_stopping=False
            ),
            "Ridge": lambda: Ridge(alpha=args.alpha * n / 2),
        }
        if glum is not None:  # (1/2N) sum r^2 + alpha/4 ||w||^2: half our objective
            ests["glum"] = lambda tol=tol: glum.GeneralizedLinearRegressor(
                family="normal", alpha=args.alpha / 2, l1_ratio=0.0, gradient_tol=tol / 2
            )
        times, fitted = timed_fits(ests, X, y, args.repeat)
        report(tol, times, fitted, X, y, args.alpha, squared_objective, "TiltedRegressor")
        ridge = np.asarray(fitted["Ridge"].coef_)
        diff = np.max(np.abs(np.asarray(fitted["TiltedRegressor"].coef_) - ridge))
        print(f"{'':>8} max |coef difference| TiltedRegressor - Ridge = {diff:.1e}")


def first_fits(X, y_class, y_reg, alpha) -> None:
    """The first fits of the process: fused-kernel load (or compile) included."""
    from tiltlab.estimators import TiltedClassifier, TiltedRegressor

    out = []
    for name, est, y in (
        ("TiltedClassifier", TiltedClassifier(alpha=alpha), y_class),
        ("TiltedRegressor", TiltedRegressor(alpha=alpha, early_stopping=False), y_reg),
    ):
        t0 = time.perf_counter()
        est.fit(X, y)
        out.append(f"{name} {time.perf_counter() - t0:.2f} s")
    print("first fit in this process (fused-kernel load or compile included): " + ", ".join(out))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=1e-4)
    ap.add_argument("--tol", type=float, nargs="+", default=[1e-4, 1e-6])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", choices=["1", "all", "both"], default="both")
    args = ap.parse_args(argv)

    try:
        import glum
    except ImportError:  # optional comparison
        glum = None
        print("glum not installed: skipped (pip install glum)")

    rng = np.random.default_rng(args.seed)
    X = rng.standard_normal((args.n, args.d))
    w_true = rng.standard_normal(args.d) / np.sqrt(args.d) * 2.0
    y_class = (rng.random(args.n) < expit(X @ w_true + 0.5)).astype(np.int64)
    y_reg = X @ rng.standard_normal(args.d) + rng.standard_normal(args.n)
    print(
        f"data: {args.n} x {args.d} float64, alpha={args.alpha:g}, "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()}"
    )
    first_fits(X, y_class, y_reg, args.alpha)
    for mode in ["1", "all"] if args.threads == "both" else [args.threads]:
        print(f"\n== threads: {'one (BLAS, OpenMP, numba)' if mode == '1' else 'defaults'} ==")
        with threads(mode):
            classification(args, X, y_class, glum)
            regression(args, X, y_reg, glum)
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

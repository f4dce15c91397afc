"""The direct (one Newton step) solve of TiltedRegressor at t = 0 with the squared loss.

References independent of the code under test: scikit-learn's ``Ridge`` (its own normal
equations on centred data), NumPy's ``lstsq``, and the objective's gradient written out
in NumPy.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.linear_model import Ridge  # noqa: E402

from tiltlab._compat import to_numpy  # noqa: E402
from tiltlab.estimators import TiltedRegressor  # noqa: E402
from tiltlab.estimators._direct import MAX_PARAMS, newton_solve  # noqa: E402


def _data(n=400, d=6, seed=0, shift=2.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, size=d) + shift
    y = X @ rng.normal(size=d) + 1.5 + rng.normal(size=n)
    return X, y, rng.uniform(0.1, 2.0, size=n)


def _grad(X, y, sw, coef, b, alpha, intercept=True):
    """Gradient of sum_i p_i r_i^2 + alpha/2 ||coef||^2 (p normalised), in NumPy."""
    p = np.full(len(y), 1.0 / len(y)) if sw is None else sw / sw.sum()
    r = X @ coef + b - y
    g = 2.0 * X.T @ (p * r) + alpha * coef
    return np.r_[g, 2.0 * np.sum(p * r)] if intercept else g


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("solver", ["lbfgs", "newton"])
def test_matches_ridge(fit_intercept, weighted, solver):
    X, y, sw = _data()
    sw = sw if weighted else None
    alpha = 0.05
    est = TiltedRegressor(
        alpha=alpha, solver=solver, fit_intercept=fit_intercept, early_stopping=False
    ).fit(X, y, sample_weight=sw)
    assert est.result_.method == "newton" and est.n_iter_ == 1 and est.result_.success
    S = len(y) if sw is None else sw.sum()
    ref = Ridge(alpha=alpha * S / 2, fit_intercept=fit_intercept, solver="cholesky")
    ref.fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-9, atol=1e-11)
    assert est.intercept_ == pytest.approx(float(ref.intercept_), rel=1e-9, abs=1e-11)
    # the gradient test the iterative solvers meet, on the gradient computed here
    b = est.intercept_ if fit_intercept else 0.0
    g = _grad(X, y, sw, est.coef_, b, alpha, fit_intercept)
    g0 = _grad(X, y, sw, np.zeros(X.shape[1]), 0.0, alpha, fit_intercept)
    assert np.linalg.norm(g) <= est.tol * np.linalg.norm(g0)
    assert float(to_numpy(est.result_.fun)) == pytest.approx(
        np.average((X @ est.coef_ + b - y) ** 2, weights=sw) + alpha / 2 * est.coef_ @ est.coef_,
        rel=1e-12,
    )


def test_same_minimiser_as_the_iterative_solver():
    X, y, _ = _data(seed=1)
    direct = TiltedRegressor(alpha=0.01, early_stopping=False, tol=1e-10).fit(X, y)
    # any solver option turns the direct route off: the L-BFGS iterations run
    iterative = TiltedRegressor(
        alpha=0.01, early_stopping=False, tol=1e-10, solver_options={"memory": 10}
    ).fit(X, y)
    assert direct.result_.method == "newton" and iterative.result_.method == "lbfgs"
    assert iterative.n_iter_ > 1
    np.testing.assert_allclose(direct.coef_, iterative.coef_, rtol=1e-7, atol=1e-9)
    assert direct.intercept_ == pytest.approx(iterative.intercept_, rel=1e-7)
    np.testing.assert_allclose(direct.predict(X), iterative.predict(X), rtol=1e-8, atol=1e-8)


def test_collinear_without_ridge_runs_the_iterative_solver():
    # a duplicated column and no ridge term: the Hessian is singular, the minimiser not
    # unique; L-BFGS from zero finds the least-squares fit, as before
    X, y, _ = _data(seed=2, shift=0.0)
    X = np.c_[X, X[:, 0]]
    est = TiltedRegressor(alpha=0.0, early_stopping=False, tol=1e-10).fit(X, y)
    assert est.result_.method == "lbfgs" and est.result_.success
    Xa = np.c_[X, np.ones(len(y))]
    sol = np.linalg.lstsq(Xa, y, rcond=None)[0]
    np.testing.assert_allclose(est.predict(X), Xa @ sol, rtol=1e-7, atol=1e-7)


def test_unmet_tolerance_goes_on_iteratively():
    # tol = 0 can never be met by the gradient test: the solver goes on from the direct
    # solution and stops at working precision, at the same minimiser
    X, y, _ = _data(seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = TiltedRegressor(alpha=0.1, tol=0.0, early_stopping=False).fit(X, y)
    assert est.result_.method == "lbfgs" and est.result_.status.name == "PRECISION"
    ref = Ridge(alpha=0.1 * len(y) / 2).fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(
    "kwargs, fit_dtype",
    [
        ({"t": 0.5}, np.float64),
        ({"loss": "huber"}, np.float64),
        ({"solver": "gd", "max_iter": 5000}, np.float64),
        ({"early_stopping": True, "random_state": 0}, np.float64),
        ({}, np.float32),
    ],
)
def test_other_fits_stay_iterative(kwargs, fit_dtype):
    X, y, _ = _data(n=300, d=3, seed=4)
    kw = {"alpha": 0.1, "early_stopping": False, **kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gd may stop at max_iter: only the route matters
        est = TiltedRegressor(**kw).fit(X.astype(fit_dtype), y.astype(fit_dtype))
    assert est.result_.method != "newton" or kw.get("solver") == "newton"
    assert est.n_iter_ > 1


def test_too_many_parameters_or_too_few_rows_stay_iterative():
    X, y, _ = _data(n=30, d=40, seed=5)  # fewer rows than coefficients
    est = TiltedRegressor(alpha=0.1, early_stopping=False).fit(X, y)
    assert est.result_.method == "lbfgs"
    X, y, _ = _data(n=MAX_PARAMS + 50, d=MAX_PARAMS, seed=6)  # p = d + 1 > MAX_PARAMS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 50 iterations may not converge: only the route
        est = TiltedRegressor(alpha=0.1, early_stopping=False, max_iter=50).fit(X, y)
    assert est.result_.method == "lbfgs"


@pytest.mark.parametrize("weighted", [False, True])
def test_newton_solve_every_backend(xp, weighted):
    """The solve runs in the namespace of the data and returns arrays of it."""
    X, y, sw = _data(n=200, d=4, seed=7)
    if not weighted:
        sw = None
    args = [xp.asarray(a, dtype=xp.float64) for a in (X, y)]
    swx = None if sw is None else xp.asarray(sw, dtype=xp.float64)
    theta, res = newton_solve(*args, swx, alpha=0.2, intercept=True, tol=1e-8, xp=xp)
    assert res is not None and res.success and res.nit == 1
    for a in (theta, res.x, res.jac):
        assert type(a) is type(args[0]) and a.dtype == args[0].dtype
    S = len(y) if sw is None else sw.sum()
    ref = Ridge(alpha=0.2 * S / 2, solver="cholesky").fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(
        to_numpy(theta), np.r_[ref.coef_, ref.intercept_], rtol=1e-9, atol=1e-11
    )
    g = _grad(X, y, sw, ref.coef_, ref.intercept_, 0.2)
    np.testing.assert_allclose(to_numpy(res.jac), g, atol=1e-10)


def test_nonfinite_or_singular_host_system_declines(xp):
    X = np.zeros((10, 2))  # zero columns without a ridge term: no unique minimiser
    y = np.arange(10.0)
    args = [xp.asarray(a, dtype=xp.float64) for a in (X, y)]
    assert newton_solve(*args, None, alpha=0.0, intercept=True, tol=1e-8, xp=xp) == (None, None)


@pytest.mark.parametrize("n", [1000, 3000])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_default_regressor_at_t0_is_ridge_at_any_size(n, dtype):
    """With default arguments (``early_stopping="auto"``) the untilted fit uses every row.

    From 1,000 rows "auto" used to hold out 10% for early stopping even at t = 0, and the
    coefficients differed from ``Ridge(alpha=a * N / 2)`` by 0.6-5%. float64 takes the
    direct solve (exact to rounding). float32 runs L-BFGS to ``tol`` = 1e-6 relative to
    the gradient at zero on data rounded to float32 (relative change ~6e-8 per entry):
    the error of theta is then at most cond(H) times (1e-6 + a few 6e-8) relative, in norm.
    """
    rng = np.random.default_rng(n)
    X = rng.normal(size=(n, 6)) + 2.0
    y = X @ rng.normal(size=6) + 1.5 + rng.standard_t(3, size=n)
    alpha = 0.05
    ours = TiltedRegressor(alpha=alpha).fit(X.astype(dtype), y.astype(dtype))
    ref = Ridge(alpha=alpha * n / 2, solver="cholesky").fit(X, y)
    assert "validation" not in ours.result_.history  # no rows held out
    got = np.r_[ours.coef_, ours.intercept_]
    want = np.r_[ref.coef_, ref.intercept_]
    Xa = np.c_[X, np.ones(n)]
    H = 2 * Xa.T @ Xa / n + alpha * np.diag(np.r_[np.ones(6), 0.0])
    cond = np.linalg.cond(H)
    eps = np.finfo(dtype).eps
    bound = cond * (1e-6 + 8 * eps) if dtype == np.float32 else cond * 1e3 * eps
    assert np.linalg.norm(got - want) <= bound * np.linalg.norm(want)

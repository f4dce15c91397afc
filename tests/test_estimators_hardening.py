"""Estimators against independent references at the edges: convergence reports of the
kinked losses, log-probabilities of extreme scores, extreme sample weights, parameter
types, and the pinball loss's quantile in the cross-validated regressor."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from scipy.special import log_softmax  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import (  # noqa: E402
    LinearRegression,
    QuantileRegressor,
)
from sklearn.model_selection import KFold  # noqa: E402

from tiltlab.estimators import (  # noqa: E402
    TiltedClassifier,
    TiltedClassifierCV,
    TiltedRegressor,
    TiltedRegressorCV,
)
from tiltlab.estimators._scores import contaminated_log_likelihood  # noqa: E402


def _regression(n=80, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * np.array([1.0, 10.0, 100.0])
    y = X @ np.array([0.5, -0.3, 0.2]) + rng.standard_t(3, size=n)
    return X, y


def _pinball(y, z, q):
    r = y - z
    return float(np.mean(np.maximum(q * r, (q - 1.0) * r)))


# --------------------------------------------------------- convergence of kinked losses


@pytest.mark.parametrize("loss", ["absolute", "pinball"])
def test_kinked_loss_out_of_iterations_warns(loss):
    X, y = _regression()
    q = 0.5
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        est = TiltedRegressor(loss=loss, max_iter=2).fit(X, y)
    assert not est.result_.success
    # the warning is owed: the linear program's optimum (HiGHS) is far below the fit's
    ref = QuantileRegressor(quantile=q, alpha=0.0, solver="highs").fit(X, y)
    assert _pinball(y, est.predict(X), q) > 1.1 * _pinball(y, ref.predict(X), q)


def test_kinked_loss_converged_fit_does_not_warn():
    X, y = _regression(n=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = TiltedRegressor(loss="absolute").fit(X, y)
    assert est.result_.status.name == "VALUE_CONVERGED"


def test_hinge_out_of_iterations_warns():
    X, y = _regression()
    codes = np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        TiltedClassifier(loss="hinge", max_iter=2).fit(X, codes)


# ------------------------------------------------------------------ log-probabilities


@pytest.mark.parametrize("loss, n_classes", [("logistic", 2), ("multinomial", 2), ("logistic", 3)])
def test_predict_log_proba_of_extreme_scores_is_log_softmax(loss, n_classes):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2))
    z = X @ np.array([1.0, 2.0])
    y = np.digitize(z, np.quantile(z, np.linspace(0, 1, n_classes + 1)[1:-1]))
    est = TiltedClassifier(loss=loss).fit(X, y)
    Xe = 1e3 * X  # scores of several thousand: the smaller probabilities underflow to 0
    scores = Xe @ est.coef_.T + est.intercept_
    if scores.shape[1] == 1:
        scores = np.c_[np.zeros_like(scores), scores]
    ref = log_softmax(scores, axis=1)  # SciPy's stable log-softmax
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = est.predict_log_proba(Xe)
    assert np.all(np.isfinite(got))
    # rounding of scores of magnitude ~|s|: a few ulps of the largest score
    atol = 8 * np.finfo(np.float64).eps * np.abs(scores).max()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=atol)
    np.testing.assert_allclose(np.exp(got), est.predict_proba(Xe), atol=1e-15)


# ------------------------------------------------------------- extreme sample weights


@pytest.mark.parametrize("t", [0.0, 0.5])
def test_huge_sample_weights_act_as_their_ratios(t):
    # only the ratios of the weights count (they are normalised): weights whose sum
    # overflows float64 give the fit of the same weights scaled down
    X, y = _regression(n=40)
    ratios = np.r_[np.ones(20), np.full(20, 3.0)]
    huge = 5e307 * ratios  # finite; their sum is not
    est = TiltedRegressor(t=t, tol=1e-10).fit(X, y, sample_weight=huge)
    if t == 0.0:
        ref = LinearRegression().fit(X, y, sample_weight=ratios)
        ref_coef, ref_b = ref.coef_, ref.intercept_
        np.testing.assert_allclose(est.tilted_weights_, ratios / ratios.sum(), rtol=1e-14)
    else:
        ref = TiltedRegressor(t=t, tol=1e-10).fit(X, y, sample_weight=ratios)
        ref_coef, ref_b = ref.coef_, ref.intercept_
    # tol 1e-10 on the gradient, condition number of X^T X ~ 1e4 (feature scales 1 to 100)
    np.testing.assert_allclose(est.coef_, ref_coef, rtol=1e-7, atol=1e-9)
    assert est.intercept_ == pytest.approx(ref_b, rel=1e-7, abs=1e-8)
    assert est.tilted_weights_.sum() == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("scale", [1e39, 1e-50])
def test_float32_data_take_weights_beyond_the_float32_range(scale):
    # finite, positive float64 weights whose float32 rounding is inf or 0
    X, y = _regression(n=40)
    X32, y32 = X.astype(np.float32), y.astype(np.float32)
    ratios = np.r_[np.ones(20), np.full(20, 2.0)]
    est = TiltedRegressor().fit(X32, y32, sample_weight=scale * ratios)
    ref = LinearRegression().fit(
        X32.astype(np.float64), y32.astype(np.float64), sample_weight=ratios
    )
    assert est.coef_.dtype == np.float32
    # float32 solve of a problem with condition number ~ 1e4: relative error ~ 1e4 * 6e-8
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize(
    "weight, match",
    [
        (0.0, "`sample_weight` must not be all zero"),
        (-1.0, "`sample_weight` must be non-negative"),
        (np.nan, "`sample_weight` must be finite"),
        (np.inf, "`sample_weight` must be finite"),
    ],
)
def test_bad_scalar_sample_weight_is_named(weight, match):
    X, y = _regression(n=20)
    with pytest.raises(ValueError, match=match):
        TiltedRegressor(t=0.5).fit(X, y, sample_weight=weight)


def test_scalar_sample_weight_beyond_float32_is_uniform():
    X, y = _regression(n=20)
    X32, y32 = X.astype(np.float32), y.astype(np.float32)
    est = TiltedRegressor().fit(X32, y32, sample_weight=1e39)
    ref = LinearRegression().fit(X32.astype(np.float64), y32.astype(np.float64))
    # float32 solve of a problem with condition number ~ 1e4: relative error ~ 1e4 * 6e-8
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=2e-3, atol=1e-4)


# ------------------------------------------------------- the CV regressor's pinball loss


@pytest.mark.slow  # 0.2-0.4 s: three pinball fits
def test_regressor_cv_fits_the_requested_quantile():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 1))
    y = X[:, 0] + rng.standard_t(3, size=30)
    q = 0.9
    cv = TiltedRegressorCV(loss="pinball", quantile=q, ts=[0.0], cv=2, random_state=0)
    cv.fit(X, y)
    assert cv.best_estimator_.quantile == q
    ref = QuantileRegressor(quantile=q, alpha=0.0, solver="highs").fit(X, y)
    fit, best = _pinball(y, cv.predict(X), q), _pinball(y, ref.predict(X), q)
    # the value test stops near the LP optimum (HiGHS); the median's fit is twice as bad here
    assert fit <= best * (1 + 1e-3)


# ------------------------------------------------------------------- parameter types


@pytest.mark.parametrize(
    "est, name",
    [
        (TiltedRegressor(fit_intercept="no"), "fit_intercept"),
        (TiltedRegressor(warm_start="no"), "warm_start"),
        (TiltedClassifier(fit_intercept="no"), "fit_intercept"),
        (TiltedClassifier(warm_start="no"), "warm_start"),
        (TiltedRegressorCV(ts=[0.0], cv=2, fit_intercept="no"), "fit_intercept"),
        (TiltedRegressorCV(ts=[0.0], cv=2, refit="no"), "refit"),
        (TiltedClassifierCV(ts=[0.0], cv=2, refit="no"), "refit"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else v,
)
def test_boolean_parameters_reject_other_values(est, name):
    X, y = _regression(n=20)
    y = (y > np.median(y)).astype(int)
    # scikit-learn's linear models reject a string for their boolean parameters too
    with pytest.raises(ValueError, match=f"`{name}` must be True or False"):
        est.fit(X, y)


# -------------------------------------------- residual scores of the CV regressor, Poisson


def _poisson_folds():
    rng = np.random.default_rng(12)
    X = rng.normal(size=(90, 2))
    y = rng.poisson(np.exp(X @ np.array([0.8, -0.5]) + 1.5)).astype(float)
    return X, y, KFold(3, shuffle=True, random_state=0)


def _poisson_mean(X, y, Xt):
    """The Poisson GLM's (log link, no penalty) mean at ``Xt``, by Newton's method (IRLS)."""
    A = np.c_[X, np.ones(len(y))]
    theta = np.zeros(A.shape[1])
    theta[-1] = np.log(y.mean())
    for _ in range(50):
        mu = np.exp(A @ theta)
        step = np.linalg.solve(A.T @ (mu[:, None] * A), A.T @ (y - mu))
        theta += step
        if np.abs(step).max() < 1e-14:
            break
    return np.exp(np.c_[Xt, np.ones(len(Xt))] @ theta)


def test_regressor_cv_clean_score_uses_the_poisson_mean():
    # the residuals are y - predict(X), the mean exp(X w + b), not the linear predictor
    X, y, folds = _poisson_folds()
    cv = TiltedRegressorCV(loss="poisson", ts=[0.0], cv=folds, scoring="clean", tol=1e-10)
    cv.fit(X, y)
    for k, (tr, te) in enumerate(folds.split(X)):
        mu, yt = _poisson_mean(X[tr], y[tr], X[te]), y[te]
        r = mu - yt
        mad = 1.4826 * np.median(np.abs(r - np.median(r)))
        keep = np.abs(r - np.median(r)) <= 3.0 * mad
        with np.errstate(divide="ignore", invalid="ignore"):
            dev = mu - yt - np.where(yt > 0, yt * np.log(mu / yt), 0.0)  # half deviance
        # folds fitted to tol 1e-10: scores agree to ~1e-8 (relative)
        assert cv.cv_results_[f"split{k}_test_score"][0] == pytest.approx(
            -dev[keep].mean(), rel=1e-7
        )


def test_regressor_cv_likelihood_score_uses_the_poisson_mean():
    X, y, folds = _poisson_folds()
    cv = TiltedRegressorCV(loss="poisson", ts=[0.0], cv=folds, scoring="likelihood", tol=1e-10)
    cv.fit(X, y)
    for k, (tr, te) in enumerate(folds.split(X)):
        yt = y[te]
        g = -0.5 * ((yt - yt.mean()) / yt.std()) ** 2 - np.log(yt.std() * np.sqrt(2 * np.pi))
        want = contaminated_log_likelihood(yt - _poisson_mean(X[tr], y[tr], X[te]), g)
        assert cv.cv_results_[f"split{k}_test_score"][0] == pytest.approx(want, rel=1e-6)

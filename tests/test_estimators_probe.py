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
from sklearn.linear_model import QuantileRegressor  # noqa: E402

from tiltlab.estimators import (  # noqa: E402
    TiltedClassifier,
    TiltedRegressor,
)


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

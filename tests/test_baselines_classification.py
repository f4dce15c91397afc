"""The HIV-1 table's classification baselines against independent references.

Linear SVM against scikit-learn's LinearSVC, the focal loss against finite differences and
its gamma = 0 limit (logistic regression), HRM's weights against the formula and its b = 1
limit, and the chi-square worst case against SciPy's SLSQP and the closed form of the
unclipped case.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize

from tiltlab.baselines import (
    chi_square_worst_case,
    fit_focal,
    fit_hrm,
    fit_learn_reweight,
    fit_linear_svm,
    fit_robust_risk,
    focal_loss,
    hrm_weights,
)


def _problem(n=120, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    z = X @ rng.normal(size=d) + 0.3
    y = (rng.random(n) < 1 / (1 + np.exp(-2 * z))).astype(float)  # overlapping classes
    return X, y


def _logistic_reference(X, y):
    sklearn = pytest.importorskip("sklearn.linear_model")
    model = sklearn.LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-12, max_iter=100000)
    return model.fit(X, y).coef_.ravel()


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_linear_svm_matches_liblinear(C):
    svm = pytest.importorskip("sklearn.svm")
    X, y = _problem(seed=1)
    w, b = fit_linear_svm(X, y, C=C, tol=1e-10)
    ref = svm.LinearSVC(C=C, loss="hinge", tol=1e-8, max_iter=1_000_000).fit(X, y)

    def primal(w, b):
        s = 2 * y - 1
        return 0.5 * (w @ w + b * b) + C * np.maximum(0, 1 - s * (X @ w + b)).sum()

    # the same strictly convex problem: the same minimiser and value
    assert primal(w, b) == pytest.approx(primal(ref.coef_.ravel(), ref.intercept_[0]), rel=1e-6)
    np.testing.assert_allclose(np.r_[w, b], np.r_[ref.coef_.ravel(), ref.intercept_], atol=2e-4)


def test_focal_loss_derivative_and_logistic_limit():
    rng = np.random.default_rng(2)
    z = rng.normal(size=50) * 3
    y = (rng.random(50) < 0.5).astype(float)
    for gamma in (0.0, 0.5, 2.0, 5.0):
        v, dz = focal_loss(z, y, gamma)
        h = 1e-6
        fd = (focal_loss(z + h, y, gamma)[0] - focal_loss(z - h, y, gamma)[0]) / (2 * h)
        np.testing.assert_allclose(dz, fd, rtol=1e-6, atol=1e-9)
        p = 1 / (1 + np.exp(-z))
        pt = np.where(y == 1, p, 1 - p)
        np.testing.assert_allclose(v, -((1 - pt) ** gamma) * np.log(pt), rtol=1e-12)
    X, y = _problem(seed=3)
    np.testing.assert_allclose(fit_focal(X, y, gamma=0.0), _logistic_reference(X, y), rtol=1e-5)


def test_hrm_weights_and_erm_limit():
    losses = np.array([0.3, 2.0, 0.1, 5.0, 1.0])
    a, b = 0.01, 0.0
    F = np.array([1, 3, 0, 4, 2]) / 5  # ranks / n, written out by hand
    want = 3 * (1 - b) / (a * a - a + 1) * (3 * F**2 - 2 * (a + 1) * F + a) + 1
    np.testing.assert_allclose(hrm_weights(losses, a, b), want, rtol=1e-14)
    np.testing.assert_allclose(hrm_weights(losses, a, b=1.0), np.ones(5))
    X, y = _problem(seed=4)
    np.testing.assert_allclose(fit_hrm(X, y, b=1.0), _logistic_reference(X, y), rtol=1e-5)


def _slsqp_worst_case(losses, rho):
    n = losses.size
    cons = [
        {"type": "eq", "fun": lambda p: p.sum() - 1},
        {"type": "ineq", "fun": lambda p: rho - 0.5 * np.mean((n * p - 1) ** 2)},
    ]
    res = scipy.optimize.minimize(
        lambda p: -p @ losses, np.full(n, 1 / n), jac=lambda p: -losses, bounds=[(0, 1)] * n,
        constraints=cons, method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000},
    )  # fmt: skip
    return res.x


@pytest.mark.parametrize("rho", [0.05, 0.5, 3.0])
def test_chi_square_worst_case_against_slsqp(rho):
    rng = np.random.default_rng(5)
    losses = rng.exponential(size=12)
    p = chi_square_worst_case(losses, rho)
    assert p.min() >= 0 and p.sum() == pytest.approx(1)
    assert 0.5 * np.mean((12 * p - 1) ** 2) <= rho + 1e-9
    ref = _slsqp_worst_case(losses, rho)
    assert p @ losses == pytest.approx(ref @ losses, rel=1e-6)
    assert p @ losses >= ref @ losses - 1e-9


def test_chi_square_closed_form_and_corner():
    losses = np.array([1.0, 1.2, 0.9, 1.1])
    rho = 0.01  # small: no weight is clipped, p = 1/n + sqrt(2 rho / n) (l - mean) / |l - mean|
    z = losses - losses.mean()
    want = 0.25 + np.sqrt(2 * rho / 4) * z / np.linalg.norm(z)
    np.testing.assert_allclose(chi_square_worst_case(losses, rho), want, rtol=1e-10)
    # a radius that holds the point mass: the worst case is the largest loss
    np.testing.assert_allclose(chi_square_worst_case(losses, 10.0), [0, 1, 0, 0])
    with pytest.raises(ValueError, match="`rho`"):
        chi_square_worst_case(losses, 0.0)
    with pytest.raises(ValueError, match="`losses`"):
        chi_square_worst_case(np.array([np.nan]), 1.0)


def test_robust_risk_limits():
    X, y = _problem(seed=6)
    # a vanishing radius is ERM
    np.testing.assert_allclose(fit_robust_risk(X, y, 1e-12), _logistic_reference(X, y), rtol=1e-4)
    # the fitted model has a smaller robust risk than ERM's
    w_erm = _logistic_reference(X, y)
    w = fit_robust_risk(X, y, 1.0)

    def robust(w):
        z = X @ w
        losses = np.logaddexp(0, z) - y * z
        return chi_square_worst_case(losses, 1.0) @ losses

    assert robust(w) < robust(w_erm)


def test_learn_reweight_follows_the_clean_set():
    X, y = _problem(n=300, seed=7)
    X = np.column_stack([X, np.ones(len(y))])
    flipped = y.copy()
    ones = np.nonzero(y[:250] == 1)[0]
    flipped[ones[: int(0.6 * ones.size)]] = 0  # a systematic noise: 60% of the ones hidden
    clean = slice(250, 300)
    w_erm = fit_learn_reweight(X, flipped, X[clean], y[clean], meta_step=1e-12, n_iter=500)
    w_lrw = fit_learn_reweight(X, flipped, X[clean], y[clean], meta_step=None, n_iter=500)

    def acc(w):
        return np.mean((X @ w > 0) == y)

    assert acc(w_lrw) > acc(w_erm) + 0.05
    with pytest.raises(ValueError, match="`X_clean`"):
        fit_learn_reweight(X, y, X[:, :2], y)
    with pytest.raises(ValueError, match="`y`"):
        fit_learn_reweight(X, y + 1, X, y)


def test_focal_loss_refuses_labels_and_gamma_outside_their_domain():
    # a label 2 (or -1) was scored as a 0 and gamma < 0 accepted: fit_focal refuses both
    with pytest.raises(ValueError, match="`y`"):
        focal_loss(np.array([0.5, 0.5]), np.array([1, 2]))
    with pytest.raises(ValueError, match="`y`"):
        focal_loss(np.array([0.5, 0.5]), np.array([1, -1]))
    for gamma in (-1.0, np.nan):
        with pytest.raises(ValueError, match="`gamma`"):
            focal_loss(np.array([0.5]), np.array([1]), gamma=gamma)
    # valid labels keep the closed form -(1 - p_t)^gamma log p_t
    z, y = np.array([0.7, -1.2]), np.array([1, 0])
    pt = np.array([1 / (1 + np.exp(-0.7)), 1 / (1 + np.exp(-1.2))])
    np.testing.assert_allclose(focal_loss(z, y)[0], -((1 - pt) ** 2) * np.log(pt), rtol=1e-14)


def test_hrm_refuses_non_finite_parameters_and_losses():
    # a or b = NaN made every weight NaN: L-BFGS-B stopped at once and fit_hrm returned its
    # logistic start; NaN losses have no rank
    X, y = _problem(n=40)
    for kw in ({"a": np.nan}, {"b": np.inf}):
        with pytest.raises(ValueError, match="`a` and `b`"):
            fit_hrm(X, y, **kw)
        with pytest.raises(ValueError, match="`a` and `b`"):
            hrm_weights(np.arange(3.0), **kw)
    with pytest.raises(ValueError, match="`losses`"):
        hrm_weights(np.array([np.nan, 1.0]))


def test_learn_reweight_refuses_bad_step_and_count():
    # lr = -1 ascended the loss (coefficients of -664 on a 3-point problem) and
    # n_iter = -1 returned zeros, both silently
    X, y = _problem(n=40)
    for kw, name in (
        ({"lr": -1.0}, "`lr`"),
        ({"lr": np.nan}, "`lr`"),
        ({"n_iter": -1}, "`n_iter`"),
    ):
        with pytest.raises(ValueError, match=name):
            fit_learn_reweight(X, y, X[:10], y[:10], **kw)


@pytest.mark.parametrize("fit", [fit_linear_svm, fit_focal, fit_hrm, fit_robust_risk])
@pytest.mark.parametrize("max_iter", [0, -3, 2.5, True])
def test_classifier_iteration_caps_are_checked(fit, max_iter):
    # max_iter=0 returned the unfitted start (zeros or the logistic fit) silently
    X, y = _problem(n=20, d=3)
    args = (0.5,) if fit is fit_robust_risk else ()
    with pytest.raises(ValueError, match="`max_iter`"):
        fit(X, y, *args, max_iter=max_iter)

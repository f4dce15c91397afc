"""Estimator conventions: precision, zero sample weights, warm starts and argument checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402

from tiltlab.estimators import TiltedClassifier, TiltedRegressor  # noqa: E402


@pytest.fixture
def ill_conditioned():
    """Least squares with strongly correlated features (condition number ~ 1e3)."""
    rng = np.random.default_rng(3)
    base = rng.normal(size=(400, 1))
    X = base + 0.03 * rng.normal(size=(400, 4))
    X = np.c_[X, rng.normal(size=(400, 2))]
    y = X @ np.array([1.0, -1.0, 2.0, -2.0, 0.5, 1.5]) + 0.1 * rng.normal(size=400)
    return X, y


# ------------------------------------------------------------------------- precision


def test_float16_is_fitted_in_float32(ill_conditioned):
    X, y = ill_conditioned
    X16, y16 = X.astype(np.float16), y.astype(np.float16)
    est = TiltedRegressor(alpha=0.0, tol=1e-6).fit(X16, y16)
    assert est.coef_.dtype == np.float32
    # the reference: least squares on the float16-rounded data, in float64
    ref = LinearRegression().fit(X16.astype(np.float64), y16.astype(np.float64))
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=2e-3)
    assert est.predict(X16).dtype == np.float32


def test_float32_reaches_the_float32_solution(ill_conditioned):
    """No hidden tolerance floor: float32 gets as close as float32 can (was off by 0.07)."""
    X, y = ill_conditioned
    ref = LinearRegression().fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = TiltedRegressor(alpha=0.0, tol=1e-7).fit(X.astype(np.float32), y.astype(np.float32))
    assert est.coef_.dtype == np.float32
    assert est.result_.success
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=2e-3)


@pytest.mark.parametrize("tol", [1e-3, 1e-5])
def test_user_tol_is_honoured_in_float32(ill_conditioned, tol):
    """The gradient (recomputed in float64) at the float32 fit meets the user's tol."""
    X, y = ill_conditioned
    Xa = np.c_[X, np.ones(len(y))]
    est = TiltedRegressor(alpha=0.0, tol=tol).fit(X.astype(np.float32), y.astype(np.float32))
    theta = np.r_[est.coef_, est.intercept_].astype(np.float64)
    X32 = Xa.astype(np.float32).astype(np.float64)
    y32 = y.astype(np.float32).astype(np.float64)

    def grad(th):
        return 2 * X32.T @ (X32 @ th - y32) / len(y32)

    g0 = np.linalg.norm(grad(np.zeros(Xa.shape[1])))
    assert np.linalg.norm(grad(theta)) <= 1.5 * tol * g0


# -------------------------------------------------------------- zero sample weights


def test_a_group_of_zero_weight_is_dropped():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 2))
    groups = np.repeat([0, 1, 2], 30)
    y = X @ np.array([1.0, -1.0]) + groups + 0.1 * rng.normal(size=90)
    sw = np.where(groups == 1, 0.0, 1.0)
    est = TiltedRegressor(tilts=(1.0, 0.0), tol=1e-10).fit(X, y, sample_weight=sw, groups=groups)
    keep = groups != 1
    ref = TiltedRegressor(tilts=(1.0, 0.0), tol=1e-10).fit(X[keep], y[keep], groups=groups[keep])
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-7)
    assert est.tilted_weights_.shape == (90,)
    assert np.all(est.tilted_weights_[~keep] == 0)
    np.testing.assert_allclose(est.tilted_weights_[keep], ref.tilted_weights_, rtol=1e-7)


def test_zero_weight_rows_act_like_dropped_rows_at_t0():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3))
    y = X @ np.array([1.0, 0.0, -2.0]) + rng.normal(size=60)
    sw = np.ones(60)
    sw[:15] = 0.0
    est = TiltedRegressor(tol=1e-10).fit(X, y, sample_weight=sw)
    ref = LinearRegression().fit(X[15:], y[15:])
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-7)


def test_class_groups_with_one_class_left_raise_naming_class():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 2))
    y = np.arange(40) % 2
    est = TiltedClassifier(tilts=(1.0, 0.0), groups="class")
    with pytest.raises(ValueError, match=r"\bclass"):
        est.fit(X, y, sample_weight=y.astype(float))


def test_class_groups_with_a_zero_weight_class_drop_it():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(90, 2))
    y = np.repeat([0, 1, 2], 30)
    X[:, 0] += y
    sw = np.where(y == 2, 0.0, 1.0)
    est = TiltedClassifier(loss="hinge", tilts=(1.0, 0.0), groups="class", tol=1e-8)
    est.fit(X, y, sample_weight=sw)
    assert est.classes_.tolist() == [0, 1, 2]  # every label seen, as scikit-learn does
    assert np.all(est.tilted_weights_[y == 2] == 0)


# --------------------------------------------------------------------- warm starts


def test_warm_start_refit_with_another_number_of_classes():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(150, 3))
    y3 = np.repeat([0, 1, 2], 50)
    X[:, 0] += y3
    est = TiltedClassifier(warm_start=True, alpha=0.01, tol=1e-10)
    est.fit(X[:100], y3[:100])  # two classes: one coefficient row
    assert est.coef_.shape == (1, 3)
    est.fit(X, y3)  # three classes: multinomial
    assert est.coef_.shape == (3, 3)
    ref = LogisticRegression(C=1 / (0.01 * 150), tol=1e-12, max_iter=10_000).fit(X, y3)
    np.testing.assert_allclose(est.predict_proba(X), ref.predict_proba(X), atol=1e-6)


# ----------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        (np.array([0, 1, None, 1] * 10, dtype=object), ValueError, "`groups`"),
        (np.array([0, "a", 1, "b"] * 10, dtype=object), TypeError, "`groups`"),
    ],
)
def test_bad_group_labels(groups, error, match):
    rng = np.random.default_rng(6)
    X, y = rng.normal(size=(40, 2)), rng.normal(size=40)
    with pytest.raises(error, match=match):
        TiltedRegressor(tilts=(1.0, 0.0)).fit(X, y, groups=groups)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tol": 1e-3}, r"`solver_options`.*'tol'.*`tol`"),
        ({"max_iter": 5}, r"`solver_options`.*`max_iter`"),
        ({"method": "gd"}, r"`solver_options`.*`solver`"),
        ({"seed": 1}, r"`solver_options`.*`random_state`"),
        ({"batch_size": 1.5}, r"batch_size"),
        ({"batch_size": 0}, r"batch_size"),
        ({"max_passes": 0}, r"max_passes"),
        ({"max_passes": -1.0}, r"max_passes"),
        ([("tol", 1.0)], r"`solver_options`"),
    ],
)
def test_bad_solver_options(options, match):
    rng = np.random.default_rng(7)
    X, y = rng.normal(size=(30, 2)), rng.normal(size=30)
    with pytest.raises((ValueError, TypeError), match=match):
        TiltedRegressor(solver="stochastic", solver_options=options).fit(X, y)


def test_good_solver_options_reach_the_solver():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(200, 2))
    y = X @ np.array([1.0, -1.0]) + 0.1 * rng.normal(size=200)
    est = TiltedRegressor(
        solver="stochastic", random_state=0, max_iter=50, solver_options={"batch_size": 200}
    ).fit(X, y)
    assert est.result_.nit <= 50

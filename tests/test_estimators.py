"""TiltedRegressor / TiltedClassifier against independent references, and their behaviour."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge  # noqa: E402
from sklearn.model_selection import GridSearchCV, GroupKFold, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import tiltlab as tl  # noqa: E402
from tiltlab.estimators import TiltedClassifier, TiltedRegressor  # noqa: E402


@pytest.fixture
def reg_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 2.0 + 0.3 * rng.normal(size=80)
    return X, y


@pytest.fixture
def clf_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 3))
    y = (X @ np.array([1.0, -1.0, 0.5]) + 0.8 * rng.normal(size=120) > 0.3).astype(int)
    return X, y


def test_import_tiltlab_does_not_import_sklearn():
    code = (
        "import sys, tiltlab; assert 'sklearn' not in sys.modules; "
        "assert tiltlab.estimators.TiltedRegressor.__name__ == 'TiltedRegressor'; "
        "assert 'sklearn' in sys.modules"
    )
    from pathlib import Path

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


# ------------------------------------------------------------------ references at t = 0


def test_regressor_t0_equals_least_squares(reg_data):
    X, y = reg_data
    ours = TiltedRegressor(tol=1e-10).fit(X, y)
    ref = LinearRegression().fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-7)


@pytest.mark.parametrize("weighted", [False, True])
def test_regressor_ridge_convention_and_unpenalised_intercept(reg_data, weighted):
    X, y = reg_data
    X = X + 5.0  # a far-off mean: a penalised intercept would show
    sw = np.random.default_rng(2).uniform(0.5, 2.0, size=y.size) if weighted else None
    alpha = 0.3
    ours = TiltedRegressor(alpha=alpha, tol=1e-10).fit(X, y, sample_weight=sw)
    S = y.size if sw is None else sw.sum()
    ref = Ridge(alpha=alpha * S / 2).fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-6)


@pytest.mark.parametrize("solver", ["lbfgs", "newton"])
def test_classifier_binary_t0_equals_logistic_regression(clf_data, solver):
    X, y = clf_data
    alpha = 0.05
    ours = TiltedClassifier(alpha=alpha, solver=solver, tol=1e-10).fit(X + 3.0, y)
    ref = LogisticRegression(C=1 / (alpha * y.size), tol=1e-12, max_iter=10_000).fit(X + 3.0, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-6)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-8)
    assert ours.coef_.shape == (1, 3) and ours.intercept_.shape == (1,)


def test_classifier_multinomial_t0_equals_logistic_regression():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    alpha = 0.01
    ours = TiltedClassifier(alpha=alpha, tol=1e-10).fit(X, y)
    ref = LogisticRegression(C=1 / (alpha * y.size), tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-6)
    # softmax coefficients are defined up to a shift shared by the classes
    np.testing.assert_allclose(
        ours.coef_ - ours.coef_.mean(0), ref.coef_ - ref.coef_.mean(0), atol=1e-5
    )
    assert ours.coef_.shape == (3, 4)
    assert ours.score(X, y) == pytest.approx(ref.score(X, y))


# --------------------------------------------------------------- tilted weights / tilting


def test_tilted_weights_match_tiltlab_reference(reg_data):
    X, y = reg_data
    y = y.copy()
    y[:8] += 15.0  # outliers
    sw = np.random.default_rng(3).uniform(0.5, 2.0, size=y.size)
    est = TiltedRegressor(t=-1.0, tol=1e-10).fit(X, y, sample_weight=sw)
    losses = (X @ est.coef_ + est.intercept_ - y) ** 2  # the squared loss, by hand
    ref = tl.tilted_weights(losses, -1.0, weights=sw)
    np.testing.assert_allclose(est.tilted_weights_, ref, rtol=1e-10)
    assert est.tilted_weights_[:8].sum() < 1e-3  # the outliers are suppressed
    # stationarity of the tilted objective, checked with the by-hand weights
    Xa = np.c_[X, np.ones(len(y))]
    r = Xa @ np.r_[est.coef_, est.intercept_] - y
    grad = Xa.T @ (ref * 2 * r)
    assert np.linalg.norm(grad) < 1e-6 * np.linalg.norm(Xa.T @ (sw / sw.sum() * 2 * y))


def test_hierarchical_class_weights_match_reference(clf_data):
    X, y = clf_data
    est = TiltedClassifier(tilts=(5.0, -1.0), groups="class", tol=1e-10).fit(X, y)
    z = X @ est.coef_[0] + est.intercept_[0]
    losses = np.logaddexp(0.0, z) - y * z  # logistic loss, by hand
    ref = tl.hierarchical_weights(losses, y, (5.0, -1.0))
    np.testing.assert_allclose(est.tilted_weights_, ref, rtol=1e-9, atol=1e-15)
    # same fit with the groups given to fit
    est2 = TiltedClassifier(tilts=(5.0, -1.0), tol=1e-10).fit(X, y, groups=y)
    np.testing.assert_allclose(est2.coef_, est.coef_, rtol=1e-8)


def test_positive_class_tilt_raises_rare_class_recall():
    rng = np.random.default_rng(4)
    X = np.r_[rng.normal(0, 1, (380, 2)), rng.normal(1.2, 1, (20, 2))]
    y = np.r_[np.zeros(380), np.ones(20)]
    erm = TiltedClassifier().fit(X, y)
    term = TiltedClassifier(tilts=(20.0, 0.0), groups="class").fit(X, y)
    rare = y == 1
    assert (term.predict(X[rare]) == 1).mean() > (erm.predict(X[rare]) == 1).mean() + 0.2


def test_huber_and_absolute_losses_reference(reg_data):
    X, y = reg_data
    # absolute loss at t = 0 is median regression. The objective is piecewise linear: the
    # minimiser is a vertex and the objective grows only linearly away from it, with a
    # slope that can be tiny in some direction (here an objective 3e-6 above the minimum
    # sits 5e-3 away in the predictions). So the predictions are ill-conditioned in the
    # objective, and L-BFGS has no gradient-based stopping certificate on a non-smooth
    # function: it stops where its line search fails at a kink, which depends on the
    # rounding of the BLAS kernel (5.5e-3 in the predictions on another kernel, 1.3e-5
    # relative in the objective). What holds on every machine is the comparison of
    # objective values with the certified optimum f*: for any u with |u_i| <= 1,
    # f(theta) >= (u.y - ([X 1]^T u).theta) / n (weak duality), and the dual LP's u
    # (SciPy's linprog, HiGHS) makes that bound meet the primal LP's value
    # (QuantileRegressor) to 1e-7. L-BFGS only ever decreases the objective; the
    # acceptance criterion is 1e-4 relative above f*, 7x what a line-search failure at a
    # kink was seen to leave.
    from scipy.optimize import linprog
    from sklearn.linear_model import QuantileRegressor

    ours = TiltedRegressor(loss="absolute", max_iter=150).fit(X, y)
    ref = QuantileRegressor(quantile=0.5, alpha=0.0).fit(X, y)
    n = len(y)
    Xa = np.c_[X, np.ones(n)]
    dual = linprog(-y / n, A_eq=Xa.T, b_eq=np.zeros(Xa.shape[1]), bounds=(-1, 1), method="highs")
    assert dual.status == 0

    def lower(coef, intercept):  # weak duality: a lower bound of f at every theta
        return (dual.x @ y - (Xa.T @ dual.x) @ np.r_[coef, intercept]) / n

    f_ref = np.mean(np.abs(ref.predict(X) - y))
    assert 0 <= f_ref - lower(ref.coef_, ref.intercept_) <= 1e-7 * f_ref  # f* is known
    f_ours = np.mean(np.abs(ours.predict(X) - y))
    assert lower(ours.coef_, ours.intercept_) <= f_ours <= f_ref * (1 + 1e-4)
    # the same objective: the fit's reported value is the mean absolute residual
    assert float(ours.result_.fun) == pytest.approx(f_ours, rel=1e-12)
    # huber: the stationarity condition written by hand
    est = TiltedRegressor(loss="huber", epsilon=0.5, tol=1e-10).fit(X, y)
    r = X @ est.coef_ + est.intercept_ - y
    psi = np.clip(r, -0.5, 0.5)
    Xa = np.c_[X, np.ones(len(y))]
    assert np.abs(Xa.T @ psi).max() < 1e-6


def test_multiclass_hinge_is_one_vs_rest():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    est = TiltedClassifier(loss="squared_hinge", tol=1e-9).fit(X, y)
    assert est.coef_.shape == (3, 4) and est.tilted_weights_.shape == (150, 3)
    for k in range(3):  # each row is the binary squared-hinge fit of class k vs the rest
        bk = TiltedClassifier(loss="squared_hinge", tol=1e-9).fit(X, (y == k).astype(int))
        np.testing.assert_allclose(est.coef_[k], bk.coef_[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(est.predict(X), np.argmax(est.decision_function(X), axis=1))
    assert not hasattr(est, "predict_proba")
    assert est.score(X, y) > 0.9


# ---------------------------------------------------------------------------- options


def test_early_stopping_uses_validation_split():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(200, 3))
    y = X @ np.array([1.0, 2.0, -1.0])
    y[:40] = rng.normal(5, 5, size=40)
    est = TiltedRegressor(t=-2.0, early_stopping=True, n_iter_no_change=5, random_state=0)
    est.fit(X, y)
    assert est.result_.history.get("validation")
    assert est.result_.best_iteration is not None
    np.testing.assert_allclose(est.coef_, [1.0, 2.0, -1.0], atol=0.05)
    assert est.tilted_weights_.shape == (200,)
    # same seed, same split, same answer
    again = TiltedRegressor(t=-2.0, early_stopping=True, n_iter_no_change=5, random_state=0)
    np.testing.assert_array_equal(again.fit(X, y).coef_, est.coef_)


def test_warm_start_reuses_solution(reg_data):
    X, y = reg_data
    est = TiltedRegressor(t=-0.5, warm_start=True, tol=1e-8).fit(X, y)
    first = est.n_iter_
    est.fit(X, y)
    assert est.n_iter_ < first
    est.set_params(t=-0.6).fit(X, y)
    assert est.n_iter_ < first


def test_stochastic_solver_and_random_state(reg_data):
    X, y = reg_data
    kw = dict(solver="stochastic", max_iter=300, random_state=0, alpha=0.1)
    a = TiltedRegressor(**kw).fit(X, y)
    b = TiltedRegressor(**kw).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    exact = TiltedRegressor(alpha=0.1, tol=1e-10).fit(X, y)
    np.testing.assert_allclose(a.coef_, exact.coef_, atol=0.02)


def test_float32_stays_float32(reg_data):
    X, y = reg_data
    est = TiltedRegressor(t=-0.5).fit(X.astype(np.float32), y.astype(np.float32))
    assert est.coef_.dtype == np.float32
    ref = TiltedRegressor(t=-0.5).fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("kwargs", "fit_kw", "match"),
    [
        ({"t": float("nan")}, {}, "`t`"),
        ({"t": "a"}, {}, "`t`"),
        ({"tilts": (1.0,)}, {"groups": np.arange(80) % 2}, "`tilts`"),
        ({"tilts": (1.0, 0.0, 0.0)}, {"groups": np.arange(80) % 2}, "`tilts`"),
        ({"tilts": (1.0, 0.0)}, {}, "groups"),
        ({"tilts": (1.0, 0.0), "t": 1.0}, {"groups": np.arange(80) % 2}, "`t`"),
        ({}, {"groups": np.arange(80) % 2}, "`tilts`"),
        ({"tilts": (1.0, 0.0)}, {"groups": np.arange(79)}, "`groups`"),
        ({"alpha": -1.0}, {}, "`alpha`"),
        ({"solver": "sgd"}, {}, "`solver`"),
        ({"max_iter": 0}, {}, "`max_iter`"),
        ({"loss": "logistic"}, {}, "`loss`"),
        ({"loss": "huber", "epsilon": 0.0}, {}, "`epsilon`"),
        ({"early_stopping": True, "validation_fraction": 1.5}, {}, "`validation_fraction`"),
        ({}, {"sample_weight": -np.ones(80)}, "`sample_weight`"),
        ({}, {"sample_weight": np.ones(3)}, "`sample_weight`"),
    ],
)
def test_regressor_bad_input(reg_data, kwargs, fit_kw, match):
    X, y = reg_data
    with pytest.raises((ValueError, TypeError), match=match):
        TiltedRegressor(**kwargs).fit(X, y, **fit_kw)


def test_classifier_bad_groups(clf_data):
    X, y = clf_data
    with pytest.raises(ValueError, match="`groups`"):
        TiltedClassifier(tilts=(1.0, 0.0), groups="label").fit(X, y)
    with pytest.raises(ValueError, match="`groups`"):
        TiltedClassifier(tilts=(1.0, 0.0), groups="class").fit(X, y, groups=y)
    with pytest.raises(ValueError, match="class"):
        TiltedClassifier().fit(X, np.zeros_like(y))
    with pytest.raises(ValueError, match="`loss`"):
        TiltedClassifier(loss="squared").fit(X, y)


def test_convergence_warning(reg_data):
    X, y = reg_data
    # (a tilt: at t = 0 the squared loss is solved exactly in one Newton step)
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        TiltedRegressor(t=0.5, max_iter=1, tol=1e-12).fit(X, y)


# --------------------------------------------------------------- scikit-learn machinery


def test_pipeline_gridsearch_cross_val_score():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(150, 3)) * [1.0, 10.0, 0.1]
    y = X @ np.array([1.0, 0.1, 10.0]) + 0.1 * rng.normal(size=150)
    y[:20] += rng.normal(10, 5, size=20)
    pipe = make_pipeline(StandardScaler(), TiltedRegressor())
    search = GridSearchCV(
        pipe,
        {"tiltedregressor__t": [-2.0, 0.0, 2.0]},
        scoring="neg_median_absolute_error",
        cv=3,
    ).fit(X, y)
    assert search.best_params_["tiltedregressor__t"] == -2.0
    scores = cross_val_score(make_pipeline(StandardScaler(), TiltedClassifier()), X, y > 0, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.7


def test_groups_through_metadata_routing():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(120, 2))
    g = np.repeat(np.arange(4), 30)
    y = X @ np.array([1.0, -1.0]) + np.where(g == 3, 2.0, 0.0) + 0.1 * rng.normal(size=120)
    with sklearn.config_context(enable_metadata_routing=True):
        est = TiltedRegressor(tilts=(2.0, 0.0)).set_fit_request(groups=True)
        search = GridSearchCV(est, {"tilts": [(0.0, 0.0), (2.0, 0.0)]}, cv=GroupKFold(2))
        search.fit(X, y, groups=g)  # routed to the splitter and to the estimator's fit
        assert search.best_estimator_.tilted_weights_.shape == (120,)
        scores = cross_val_score(est, X, y, cv=GroupKFold(2), params={"groups": g})
        assert np.all(np.isfinite(scores))
    # the group tilt magnifies the worst group: its share of the weight grows with t
    flat = TiltedRegressor(tilts=(0.0, 0.0)).fit(X, y, groups=g)
    tilted = TiltedRegressor(tilts=(2.0, 0.0)).fit(X, y, groups=g)
    assert tilted.tilted_weights_[g == 3].sum() > flat.tilted_weights_[g == 3].sum() + 0.1


@pytest.mark.parametrize("loss", ["squared", "logistic", "multinomial"])
def test_masked_ridge_objective_derivatives(loss):
    """The intercept-sparing ridge wrapper against finite differences and its own Hessian."""
    from scipy.optimize import approx_fprime

    from tiltlab.estimators._objective import make_objective

    rng = np.random.default_rng(8)
    X = np.c_[rng.normal(size=(40, 3)), np.ones(40)]
    y = {
        "squared": rng.normal(size=40),
        "logistic": rng.integers(0, 2, 40),
        "multinomial": rng.integers(0, 3, 40),
    }[loss]
    obj = make_objective(loss, X, y, t=-0.7, alpha=0.3, intercept=True)
    plain = tl.TiltedObjective(loss, X, y, t=-0.7)
    theta = rng.normal(size=obj.shape)
    penalty = 0.15 * np.sum(theta[:-1] ** 2)  # the intercept row is not penalised
    assert float(obj.value(theta)) == pytest.approx(float(plain.value(theta)) + penalty)
    flat = theta.reshape(-1)
    fd = approx_fprime(flat, lambda th: float(obj.value(th.reshape(obj.shape))), 1e-7)
    np.testing.assert_allclose(np.reshape(obj.gradient(theta), -1), fd, rtol=1e-5, atol=1e-6)
    v = rng.normal(size=obj.shape)
    H = np.asarray(obj.hessian(theta))
    np.testing.assert_allclose(np.reshape(obj.hvp(theta, v), -1), H @ v.reshape(-1), atol=1e-10)
    g = lambda th: np.reshape(obj.gradient(th.reshape(obj.shape)), -1)  # noqa: E731
    fd_h = (g(flat + 1e-6 * v.reshape(-1)) - g(flat - 1e-6 * v.reshape(-1))) / 2e-6
    np.testing.assert_allclose(H @ v.reshape(-1), fd_h, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # fits to convergence on kinked losses: the full tier
def test_kinked_losses_stop_on_the_value_test():
    # hinge and absolute fits stop once the objective stalls (ftol = tol), a success;
    # solver_options={"ftol": 0} restores the gradient test alone, which a kink never meets:
    # those runs end in a stalled line search (silent) or use up max_iter (a warning)
    import warnings

    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    quick = TiltedClassifier(loss="hinge").fit(X, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        slow = TiltedClassifier(loss="hinge", solver_options={"ftol": 0.0}).fit(X, y)
    warned = any(issubclass(w.category, ConvergenceWarning) for w in caught)
    assert warned == any(r.status.name == "MAX_ITER" for r in slow.result_)
    for a, b in zip(quick.result_, slow.result_, strict=True):
        assert a.status.name == "VALUE_CONVERGED" and a.success
        assert b.status.name != "VALUE_CONVERGED"
        assert a.nit <= b.nit
        # stopped where the value had stalled: a value test bounds no gap on a polyhedral
        # loss (measured here: 1e-12, 2e-6 and 4e-7 relative above the longer run's
        # values), so the bound is 1e-4 relative, 50x the largest
        assert float(a.fun) <= float(b.fun) * (1 + 1e-4)

"""Robust fits of the estimators (``robustness="kl"|"cvar"``) against minimize_dro on the
same objective, which tests/test_minimize_dro.py checks against SciPy references."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.model_selection import GridSearchCV  # noqa: E402

import tiltlab as tl  # noqa: E402
from tiltlab.estimators import TiltedClassifier, TiltedRegressor  # noqa: E402


def _data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = X @ np.array([1.0, -2.0]) + 0.5 + rng.standard_t(2, size=n)
    return X, y


def test_kl_regressor_matches_minimize_dro():
    X, y = _data()
    est = TiltedRegressor(robustness="kl", radius=0.3, tol=1e-10).fit(X, y)
    Xi = np.c_[X, np.ones(len(y))]  # no ridge (alpha = 0): the plain objective
    res = tl.minimize_dro(tl.TiltedObjective("squared", Xi, y), kl=0.3)
    np.testing.assert_allclose(np.r_[est.coef_, est.intercept_], res.x, rtol=1e-6, atol=1e-8)
    w = est.worst_case_weights_
    assert w.shape == (len(y),) and abs(w.sum() - 1) < 1e-12
    assert est.result_.t == pytest.approx(res.t, rel=1e-5)


def test_cvar_classifier_weights_and_value():
    X, y = _data(seed=1)
    yc = (y > np.median(y)).astype(int)
    est = TiltedClassifier(robustness="cvar", tail=0.2).fit(X, yc)
    w = est.worst_case_weights_
    assert w.max() <= 1 / (0.2 * len(yc)) * (1 + 1e-12) and abs(w.sum() - 1) < 1e-12
    assert est.result_.success


def test_grid_search_tunes_the_radius():
    X, y = _data(seed=2)
    grid = {"robustness": [None, "kl", "cvar"], "radius": [0.05, 0.5], "tail": [0.5]}
    gs = GridSearchCV(TiltedRegressor(), grid, cv=3).fit(X, y)
    assert gs.best_params_["robustness"] in (None, "kl", "cvar")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"robustness": "chi2"}, "`robustness`"),
        ({"robustness": "kl", "radius": -1.0}, "`radius`"),
        ({"robustness": "cvar", "tail": 0.0}, "`tail`"),
        ({"robustness": "kl", "t": -1.0}, "leave `t` at 0"),
        ({"robustness": "cvar", "solver": "newton"}, "`solver`"),
    ],
)
def test_bad_robust_parameters(kw, match):
    X, y = _data(n=30)
    with pytest.raises(ValueError, match=match):
        TiltedRegressor(**kw).fit(X, y)

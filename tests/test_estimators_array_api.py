"""Array-API dispatch: torch CPU inputs through the tilted estimators.

scikit-learn's array-API mode needs ``SCIPY_ARRAY_API=1`` in the environment before SciPy
is imported, which a shared test session cannot promise; so ``test_array_api_subprocess``
reruns this file in a child process with the variable set, where the tests below run
(they are skipped in a session without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from tiltlab.estimators import (  # noqa: E402
    TiltedClassifier,
    TiltedClassifierCV,
    TiltedRegressor,
    TiltedRegressorCV,
)

IN_CHILD = os.environ.get("SCIPY_ARRAY_API") == "1"
needs_flag = pytest.mark.skipif(
    not IN_CHILD, reason="needs SCIPY_ARRAY_API=1 (run by test_array_api_subprocess)"
)


@pytest.mark.slow
@pytest.mark.skipif(IN_CHILD, reason="this is the child process")
def test_array_api_subprocess():
    pytest.importorskip("torch")
    env = dict(os.environ, SCIPY_ARRAY_API="1")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "--tier",
            "full",
            "-rs",
            __file__,
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    # everything ran in the child: only this launcher test itself is skipped there
    assert " passed" in summary and "1 skipped" in summary and "failed" not in summary, summary


@pytest.fixture
def reg_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 2.0 + 0.3 * rng.normal(size=80)
    return X, y


def _torch():
    return pytest.importorskip("torch")


@needs_flag
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_array_api_dispatch_torch_regressor(reg_data, dtype):
    torch = _torch()
    X, y = reg_data
    Xt = torch.asarray(X.astype(dtype))
    yt = torch.asarray(y.astype(dtype))
    ref = TiltedRegressor(t=-0.5, alpha=0.1).fit(X, y)
    with sklearn.config_context(array_api_dispatch=True):
        est = TiltedRegressor(t=-0.5, alpha=0.1).fit(Xt, yt)
        for attr in ("coef_", "intercept_", "tilted_weights_"):
            val = getattr(est, attr)
            assert isinstance(val, torch.Tensor) and val.device == Xt.device, attr
            assert val.dtype == Xt.dtype
        pred = est.predict(Xt)
        assert isinstance(pred, torch.Tensor)
        score = est.score(Xt, yt)
    tol = 1e-6 if dtype == "float64" else 1e-2
    np.testing.assert_allclose(est.coef_.numpy(), ref.coef_, rtol=tol, atol=tol)
    assert float(score) == pytest.approx(ref.score(X, y), abs=tol)


@needs_flag
def test_array_api_dispatch_torch_classifier():
    torch = _torch()
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    ref = TiltedClassifier(tilts=(2.0, 0.0), groups="class", tol=1e-10).fit(X, y)
    with sklearn.config_context(array_api_dispatch=True):
        Xt, yt = torch.asarray(X), torch.asarray(y)
        est = TiltedClassifier(tilts=(2.0, 0.0), groups="class", tol=1e-10).fit(Xt, yt)
        for attr in ("coef_", "intercept_", "classes_", "tilted_weights_"):
            assert isinstance(getattr(est, attr), torch.Tensor), attr
        proba = est.predict_proba(Xt)
        pred = est.predict(Xt)
        assert isinstance(proba, torch.Tensor) and isinstance(pred, torch.Tensor)
    np.testing.assert_allclose(proba.numpy(), ref.predict_proba(X), atol=1e-6)
    np.testing.assert_array_equal(pred.numpy(), ref.predict(X))


def test_without_dispatch_torch_input_is_converted(reg_data):
    torch = _torch()
    X, y = reg_data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = TiltedRegressor().fit(torch.asarray(X), torch.asarray(y))
    assert isinstance(est.coef_, np.ndarray)


@needs_flag
@pytest.mark.parametrize(
    ("estimator", "dtype_name"),
    [
        (TiltedRegressor(t=-0.5), "float64"),
        (TiltedRegressor(t=-0.5), "float32"),
        (TiltedClassifier(t=0.5), "float64"),
        (TiltedClassifier(t=0.5), "float32"),
        (TiltedRegressorCV(ts=[-1.0, 0.0], cv=3), "float64"),
        (TiltedClassifierCV(ts=[0.0, 1.0], cv=3), "float64"),
    ],
    ids=lambda e: e if isinstance(e, str) else type(e).__name__,
)
def test_sklearn_array_api_check_torch(estimator, dtype_name):
    from sklearn.utils.estimator_checks import check_array_api_input

    pytest.importorskip("torch")
    check_array_api_input(
        type(estimator).__name__,
        estimator,
        array_namespace="torch",
        device_name="cpu",
        dtype_name=dtype_name,
        check_values=True,
    )


FOUR = [
    TiltedRegressor(t=-0.5),
    TiltedClassifier(t=0.5),
    TiltedRegressorCV(ts=[-1.0, 0.0], cv=3),
    TiltedClassifierCV(ts=[0.0, 1.0], cv=3),
]


@needs_flag
@pytest.mark.parametrize("array_namespace", ["array_api_strict", "torch"])
@pytest.mark.parametrize("estimator", FOUR, ids=lambda e: type(e).__name__)
def test_sklearn_array_api_same_namespace_check(estimator, array_namespace):
    """Predicting with NumPy data after an array-API fit raises scikit-learn's ValueError
    naming the method (it used to fail with "Cannot interpret 'array_api_strict.float64'
    as a data type", a dtype of one library handed to NumPy)."""
    checks = pytest.importorskip("sklearn.utils.estimator_checks")
    if not hasattr(checks, "check_array_api_same_namespace"):
        pytest.skip("scikit-learn < 1.9 has no check_array_api_same_namespace")
    pytest.importorskip(array_namespace)
    device_name = "cpu" if array_namespace == "torch" else None
    checks.check_array_api_same_namespace(
        type(estimator).__name__, estimator, array_namespace, device_name
    )


@needs_flag
@pytest.mark.parametrize("estimator", FOUR, ids=lambda e: type(e).__name__)
def test_same_namespace_rule_without_sklearns_check(estimator, reg_data, monkeypatch):
    """The rule on scikit-learn versions without ``check_same_namespace``."""
    xps = pytest.importorskip("array_api_strict")
    import sklearn.utils._array_api as sk_array_api

    monkeypatch.delattr(sk_array_api, "check_same_namespace", raising=False)
    X, y = reg_data
    y = (y > np.median(y)).astype(np.float64)
    with sklearn.config_context(array_api_dispatch=True):
        est = sklearn.base.clone(estimator).fit(xps.asarray(X), xps.asarray(y))
        with pytest.raises(ValueError, match=rf"{type(est).__name__}\.predict\(\)"):
            est.predict(X)
        pred = est.predict(xps.asarray(X))
    assert type(pred).__module__.startswith("array_api_strict")


def _same_fit_cases():
    rng = np.random.default_rng(7)
    n, d = 1200, 5  # from 1,000 rows: "auto" early stopping holds out a split at t != 0
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = X @ w + 0.5 + 0.3 * rng.normal(size=n)
    y[:120] = rng.normal(5.0, 5.0, size=120)
    Xi = np.round(3 * X).astype(np.int64)
    labels = (X @ w + rng.logistic(size=n) > 0).astype(np.int64)
    three = np.digitize(X @ w + rng.logistic(size=n), [-1.0, 1.0])
    return [
        ("regressor t=-0.5, auto early stopping", TiltedRegressor(t=-0.5, random_state=3), X, y),
        ("regressor t=0, direct", TiltedRegressor(alpha=0.01), X, y),
        ("regressor t=1, huber", TiltedRegressor(t=1.0, loss="huber", random_state=3), X, y),
        ("regressor, integer data", TiltedRegressor(t=-0.5, random_state=3), Xi, y),
        ("classifier t=0.5", TiltedClassifier(t=0.5), X, labels),
        ("classifier t=-1, early stopping",
         TiltedClassifier(t=-1.0, early_stopping=True, random_state=3), X, labels),
        ("classifier, integer data", TiltedClassifier(t=0.5), Xi, labels),
        ("multinomial", TiltedClassifier(loss="multinomial", t=0.5), X, three),
        ("regressor CV", TiltedRegressorCV(ts=[-1.0, 0.0, 1.0], cv=3, random_state=3), X, y),
    ]  # fmt: skip


@needs_flag
@pytest.mark.parametrize("library", ["torch", "array_api_strict"])
def test_every_namespace_gives_the_numpy_fit(library):
    """Same settings and seed: the coefficients of a fit in another array library are
    NumPy's to 1e-6 relative (early-stopping split, seeds, dtypes, tolerances and solver
    are the same; the engines differ, NumPy's fused CPU kernel against the generic array
    API one, so agreement is to rounding amplified by a short iteration count). Integer
    data used to be fitted in PyTorch's default float32."""
    mod = pytest.importorskip(library)
    from sklearn.base import clone

    def back(a):
        return np.asarray(a.cpu().numpy() if library == "torch" else np.from_dlpack(a))

    for name, est, X, y in _same_fit_cases():
        ref = clone(est).fit(X, y)
        with sklearn.config_context(array_api_dispatch=True):
            got = clone(est).fit(mod.asarray(X), mod.asarray(y))
        assert str(got.coef_.dtype).endswith("float64"), name
        want = np.r_[np.ravel(ref.coef_), np.ravel(ref.intercept_)]
        have = np.r_[np.ravel(back(got.coef_)), np.ravel(back(got.intercept_))]
        err = np.linalg.norm(have - want) / np.linalg.norm(want)
        assert err <= 1e-6, (name, err)
        if hasattr(ref, "t_"):
            assert got.t_ == ref.t_, name

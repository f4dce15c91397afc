"""Tilt-path continuation: the tilt derivative of the gradient, the path's tangent, the
Hermite predictor, and tangent-predicted paths against cold solves."""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.objective.tilt_derivative import gradient_tilt_derivative
from tiltlab.solvers._continuation import PathPoint, hermite, supports_tangent, tangent


def _host(a):
    return to_numpy(a).astype(np.float64)


def _logistic(n=200, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ rng.normal(size=d)))).astype(float)
    return X, y


def _squared(n=60, seed=1):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=n)]
    y = X @ np.array([0.5, -1.0]) + 0.3 * rng.normal(size=n)
    y[:3] += 4.0  # outliers: the path moves
    return X, y


def _fd_in_t(fn, t, h):
    """Central difference in ``t`` with a Richardson estimate of its error."""
    d1 = (fn(t + h) - fn(t - h)) / (2 * h)
    d2 = (fn(t + 2 * h) - fn(t - 2 * h)) / (4 * h)
    return d1, np.abs(d1 - d2).max()


@pytest.mark.parametrize("t", [0.0, 1.5, -1.0])
def test_gradient_tilt_derivative_matches_finite_differences(xp, t):
    X, y = _logistic()
    w = np.random.default_rng(3).uniform(0.2, 2.0, size=y.size)
    obj = tl.TiltedObjective(
        "logistic", xp.asarray(X), xp.asarray(y), t=t, weights=xp.asarray(w), l2=1e-2
    )
    theta = np.array([0.3, -0.5, 0.8, 0.1])
    got = gradient_tilt_derivative(obj, xp.asarray(theta))
    assert got.dtype == obj.dtype and got.shape == (4,)

    def grad(s):
        return _host(obj.with_tilt(s).gradient(xp.asarray(theta)))

    fd, err = _fd_in_t(grad, t, 1e-3)
    np.testing.assert_allclose(_host(got), fd, rtol=0, atol=10 * err + 1e-9)
    assert np.abs(fd).max() > 1e-3  # the check is not vacuous
    assert obj.n_passes == 2 + 0  # the derivative's two passes (``grad`` used copies)


def test_gradient_tilt_derivative_multinomial_and_float32():
    rng = np.random.default_rng(0)
    X = np.c_[np.ones(80), rng.normal(size=(80, 2))]
    y = rng.integers(0, 3, size=80)
    theta = 0.3 * rng.normal(size=(3, 3))
    obj = tl.TiltedObjective("multinomial", X, y, t=0.7)

    def grad(s):
        return np.asarray(obj.with_tilt(s).gradient(theta))

    fd, err = _fd_in_t(grad, 0.7, 1e-3)
    got = gradient_tilt_derivative(obj, theta)
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got, fd, rtol=0, atol=10 * err + 1e-9)
    o32 = tl.TiltedObjective("multinomial", X.astype(np.float32), y, t=0.7)
    g32 = gradient_tilt_derivative(o32, theta.astype(np.float32))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, got, rtol=0, atol=1e-4 * np.abs(got).max())


def test_gradient_tilt_derivative_rejects_what_it_cannot_do():
    X, y = _squared()
    hier = tl.TiltedObjective("squared", X, y, groups=(y > 0).astype(int), tilts=(1.0, 0.0))
    with pytest.raises(NotImplementedError, match="sample-level"):
        gradient_tilt_derivative(hier, np.zeros(2))
    with pytest.raises(ValueError, match="infinite tilt"):
        gradient_tilt_derivative(tl.TiltedObjective("squared", X, y, t=np.inf), np.zeros(2))
    with pytest.raises(ValueError, match="theta"):
        gradient_tilt_derivative(tl.TiltedObjective("squared", X, y), np.zeros(3))
    assert not supports_tangent(hier)


def _solve(obj, x0=None):
    return tl.minimize(obj, x0, method="newton", tol=1e-13).x


@pytest.mark.parametrize(("loss", "t"), [("logistic", 2.0), ("logistic", 0.0), ("squared", -0.3)])
@pytest.mark.parametrize("dense", [False, True])
def test_tangent_matches_finite_differences_of_cold_solutions(xp, loss, t, dense):
    X, y = _logistic() if loss == "logistic" else _squared()
    obj = tl.TiltedObjective(loss, xp.asarray(X), xp.asarray(y), l2=1e-2)
    x = _solve(obj.with_tilt(t))
    tan = tangent(obj.with_tilt(t), x, dense=dense, rtol=1e-12, max_iter=100)
    assert tan is not None and tan.d.dtype == obj.dtype
    assert (tan.n_products == 0) == dense

    def sol(s):
        return _host(_solve(obj.with_tilt(s), x))

    fd, err = _fd_in_t(sol, t, 1e-3)
    assert np.abs(fd).max() > 1e-3  # the path moves
    np.testing.assert_allclose(_host(tan.d), fd, rtol=0, atol=10 * err + 1e-7)


def test_tangent_refuses_a_point_of_negative_curvature():
    # two samples, t = -0.5: at theta = 0 the tilted Hessian 2 + t Var_w(2 (theta - y)) < 0
    obj = tl.TiltedObjective("squared", np.ones((2, 1)), np.array([-1.0, 2.0]), t=-0.5)
    assert float(obj.hessian(np.zeros(1))[0, 0]) < 0
    assert tangent(obj, np.zeros(1)) is None
    assert tangent(obj, np.zeros(1), dense=True) is None


def test_hermite_reproduces_polynomials_of_its_degree():
    def f(t):
        return np.array([t**3 - 2 * t, 0.5 * t**2 + 1.0, t**5 - t**4])

    def df(t):
        return np.array([3 * t**2 - 2, t, 5 * t**4 - 4 * t**3])

    pts = [PathPoint(t, f(t), df(t)) for t in (0.2, 0.5, 1.1)]
    for t in (1.7, -0.4, 0.8):
        # two points: the cubic through them (exact for the first two components)
        np.testing.assert_allclose(hermite(pts[1:], t)[:2], f(t)[:2], rtol=1e-12)
        np.testing.assert_allclose(hermite(pts[1:], t, derivative=True)[:2], df(t)[:2], rtol=1e-12)
        # three points: the quintic (exact for all three)
        np.testing.assert_allclose(hermite(pts, t), f(t), rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(hermite(pts, t, derivative=True), df(t), rtol=1e-11, atol=1e-12)
    # one point: the tangent line
    np.testing.assert_allclose(hermite(pts[:1], 0.7), f(0.2) + 0.5 * df(0.2))


@pytest.mark.parametrize("method", ["lbfgs", "newton"])
def test_tangent_path_equals_cold_solves(method):
    X, y = _logistic(n=300, d=5, seed=2)
    obj = tl.TiltedObjective("logistic", X, y, l2=1e-3)
    ts = np.r_[np.linspace(-0.8, 0.0, 4), np.linspace(0.5, 6.0, 6)]
    path = tl.tilt_path(obj, ts, method=method, tol=1e-10)
    assert path.success
    secant = tl.tilt_path(obj, ts, method=method, tol=1e-10, predictor="secant")
    for k, t in enumerate(ts):
        ref = _solve(obj.with_tilt(float(t)))
        np.testing.assert_allclose(path.x[k], ref, rtol=0, atol=1e-7)
        np.testing.assert_allclose(secant.x[k], ref, rtol=0, atol=1e-7)
    # the cost of the predictions is counted
    assert path.n_passes > sum(r.n_passes for r in path.results)


@pytest.mark.slow  # 5-6 s on Dask; the push tier runs the tangent path on NumPy
def test_tangent_path_float32_and_backends(xp):
    X, y = _squared()
    ts = [-0.5, 0.0, 0.5, 1.0, 1.5]
    ref = tl.tilt_path(tl.TiltedObjective("squared", X, y, l2=1e-3), ts, tol=1e-12)
    obj = tl.TiltedObjective(
        "squared", xp.asarray(X.astype(np.float32)), xp.asarray(y.astype(np.float32)), l2=1e-3
    )
    path = tl.tilt_path(obj, ts)
    assert path.success, [r.message for r in path.results]
    assert path.x.dtype == obj.dtype
    np.testing.assert_allclose(_host(path.x), np.asarray(ref.x), rtol=0, atol=2e-3)


def test_tangent_path_falls_back_without_a_tangent():
    # a loss without a linear predictor has no tangent here: the secant predicts, and
    # every tilt is still solved (the solutions against cold solves)
    from tiltlab.datasets import point_estimation_2d, point_estimation_objective

    points, _ = point_estimation_2d(n=40, seed=0)
    obj = point_estimation_objective(points)
    assert not supports_tangent(obj)
    ts = [-1.0, 0.0, 0.5, 1.0, 2.0]
    path = tl.tilt_path(obj, ts, method="newton", tol=1e-10, theta0=points.mean(axis=0))
    assert path.success
    for k, t in enumerate(ts):
        ref = _solve(obj.with_tilt(t), points.mean(axis=0))
        np.testing.assert_allclose(path.x[k], ref, atol=1e-7)


def test_tangent_predictor_cuts_iterations():
    # the README problem: the tangent path needs at most half the cold iterations
    X = np.c_[np.ones(50), np.linspace(0, 1, 50)]
    y = 2 * X[:, 1] + 1
    y[:5] += 10
    obj = tl.TiltedObjective("squared", X, y)
    ts = np.linspace(-2, 2, 20)
    for method in ("lbfgs", "newton"):
        cold = sum(tl.minimize(obj.with_tilt(float(t)), method=method).nit for t in ts)
        path = tl.tilt_path(obj, ts, method=method)
        assert path.success
        assert sum(r.nit for r in path.results) <= 0.5 * cold


def test_predictor_argument_is_checked():
    X, y = _squared()
    with pytest.raises(ValueError, match="`predictor` must be"):
        tl.tilt_path(tl.TiltedObjective("squared", X, y), [0.0, 1.0], predictor="cubic")

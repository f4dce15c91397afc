"""Tests of tiltlab.diagnostics against independent references.

References: Hessians built in NumPy from per-sample gradients (tilted Hessian lemma),
SciPy eigensolvers and optimisers, central finite differences of the paper's GLM
quantities and of tilted solutions, scipy.stats.entropy and closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit, logsumexp, softmax
from scipy.stats import entropy as scipy_entropy

from tiltlab import TiltedObjective
from tiltlab._compat import to_numpy
from tiltlab.diagnostics import (
    classify_stationary_point,
    condition_number,
    effective_sample_size,
    fit_step_size_rule,
    glm_statistics,
    smoothness,
    solution_derivative,
    step_size,
    strong_convexity,
    tilted_weight_stats,
    weight_entropy,
)
from tiltlab.losses import CallableLoss
from tiltlab.testing import assert_close

# ----------------------------------------------------------------------------------------
# data and independent references
# ----------------------------------------------------------------------------------------


def _regression(n=30, d=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X[:, 0] = 1.0
    y = X @ np.linspace(0.5, -1.0, d) + 0.5 * rng.standard_normal(n)
    return X, y


def _classification(n=30, d=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X[:, 0] = 1.0
    y = (rng.random(n) < expit(X @ np.linspace(0.2, 1.0, d))).astype(np.int64)
    return X, y


def _data(loss, **kw):
    return _regression(**kw) if loss == "squared" else _classification(**kw)


def _np_parts(loss, X, y, theta):
    """Per-sample losses and derivatives in z, written out in NumPy."""
    z = X @ theta
    if loss == "squared":
        return (z - y) ** 2, 2.0 * (z - y), np.full_like(z, 2.0)
    s = expit(z)
    return np.logaddexp(0.0, z) - y * z, s - y, s * (1.0 - s)


def _np_hessian(loss, X, y, theta, t, l2, prior=None):
    """Tilted Hessian from explicit per-sample gradients g_i and Hessians d2_i x_i x_i^T."""
    ell, d1, d2 = _np_parts(loss, X, y, theta)
    logp = np.log(np.full(len(y), 1.0 / len(y)) if prior is None else prior / prior.sum())
    w = softmax(t * ell + logp)
    G = d1[:, None] * X  # per-sample gradients, N x d
    Gc = G - w @ G
    H = (X.T * (w * d2)) @ X + t * Gc.T @ (w[:, None] * Gc) + l2 * np.eye(X.shape[1])
    return 0.5 * (H + H.T)


def _solve(obj, x0):
    """A tight local solution with SciPy (trust-region Newton on value/gradient/Hessian)."""

    def fun(th):
        v, g = obj.value_and_gradient(th)
        return float(v), np.asarray(g, dtype=np.float64)

    res = minimize(
        fun,
        x0,
        jac=True,
        method="trust-exact",
        hess=lambda th: np.asarray(obj.hessian(th)),
        options={"gtol": 1e-13},
    )
    x = res.x
    for _ in range(3):  # Newton polish to machine precision
        x = x - np.linalg.solve(np.asarray(obj.hessian(x)), np.asarray(obj.gradient(x)))
    return x


# ----------------------------------------------------------------------------------------
# smoothness, strong convexity, condition number
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("t", [-1.0, 0.0, 1.5])
def test_curvature_matches_independent_hessian(loss, t):
    X, y = _data(loss)
    prior = np.random.default_rng(3).random(len(y)) + 0.5
    theta = np.array([0.2, -0.4, 0.3])
    obj = TiltedObjective(loss, X, y, t=t, l2=0.05, weights=prior)
    ev = np.linalg.eigvalsh(_np_hessian(loss, X, y, theta, t, 0.05, prior))
    assert_close(smoothness(obj, theta).value, ev[-1], xp=np, rtol=1e-10)
    assert_close(strong_convexity(obj, theta).value, ev[0], xp=np, rtol=1e-10, atol=1e-12)
    cond = ev[-1] / ev[0] if ev[0] > 0 else np.inf
    assert_close(condition_number(obj, theta), cond, xp=np, rtol=1e-9)


def test_dense_and_lanczos_agree_on_d300():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 300)) / np.sqrt(300)
    y = rng.integers(0, 2, 600)
    obj = TiltedObjective("logistic", X, y, t=1.0, l2=1e-3)
    theta = 0.3 * rng.standard_normal(300)
    for fn in (smoothness, strong_convexity):
        dense = fn(obj, theta, method="dense")
        lanczos = fn(obj, theta, method="lanczos")
        assert (dense.method, lanczos.method) == ("dense", "lanczos")
        assert_close(lanczos.value, to_numpy(dense.value), xp=np, rtol=1e-9)
    assert smoothness(obj, theta).method == "dense"  # auto: d <= 500
    assert_close(
        condition_number(obj, theta, method="lanczos"),
        to_numpy(condition_number(obj, theta, method="dense")),
        xp=np,
        rtol=1e-8,
    )


def test_lanczos_beyond_dense_limit_matches_numpy():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((700, 520)) / np.sqrt(520)
    y = X @ rng.standard_normal(520)
    obj = TiltedObjective("squared", X, y, t=0.5)
    theta = np.zeros(520)
    res = smoothness(obj, theta)  # auto -> lanczos
    assert res.method == "lanczos"
    ev = np.linalg.eigvalsh(_np_hessian("squared", X, y, theta, 0.5, 0.0))
    assert_close(res.value, ev[-1], xp=np, rtol=1e-9)


def test_radius_samples_the_ball():
    X, y = _regression()
    obj = TiltedObjective("squared", X, y, t=2.0)
    theta = np.array([0.1, 0.2, -0.3])
    at = smoothness(obj, theta)
    ball = smoothness(obj, theta, radius=0.5, n_samples=20, seed=4)
    assert at.n_evaluated == 1 and ball.n_evaluated == 21
    assert float(ball.value) >= float(at.value)
    assert np.linalg.norm(np.asarray(ball.argmax) - theta) <= 0.5 + 1e-12
    # the reported value is the independent curvature at the reported point
    ev = np.linalg.eigvalsh(_np_hessian("squared", X, y, np.asarray(ball.argmax), 2.0, 0.0))
    assert_close(ball.value, ev[-1], xp=np, rtol=1e-10)
    again = smoothness(obj, theta, radius=0.5, n_samples=20, seed=4)
    assert float(again.value) == float(ball.value)
    low = strong_convexity(obj, theta, radius=0.5, n_samples=20)
    assert float(low.value) <= float(strong_convexity(obj, theta).value)
    assert low.argmin.shape == theta.shape
    with pytest.raises(AttributeError, match="argmin"):
        _ = ball.argmin


def test_strong_convexity_at_least_l2_for_positive_tilt():
    """Strong-convexity lemma: for t > 0 the Hessian dominates sum w_i H_i + l2 I."""
    X, y = _classification(n=40, d=4, seed=5)
    rng = np.random.default_rng(6)
    for t in (0.1, 1.0, 10.0):
        obj = TiltedObjective("logistic", X, y, t=t, l2=0.3)
        for _ in range(3):
            theta = 2.0 * rng.standard_normal(4)
            assert float(strong_convexity(obj, theta).value) >= 0.3 * (1 - 1e-12)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"radius": -1.0}, "radius"),
        ({"n_samples": -2}, "n_samples"),
        ({"method": "qr"}, "method"),
    ],
)
def test_curvature_input_errors(bad, match):
    X, y = _regression()
    obj = TiltedObjective("squared", X, y, t=1.0)
    with pytest.raises(ValueError, match=match):
        smoothness(obj, np.zeros(3), **bad)


def test_curvature_other_errors():
    X, y = _regression()
    obj = TiltedObjective("squared", X, y, t=1.0)
    with pytest.raises(ValueError, match="theta"):
        smoothness(obj, np.zeros(4))
    with pytest.raises(ValueError, match="infinite tilt"):
        smoothness(obj.with_tilt(np.inf), np.zeros(3))
    with pytest.raises(TypeError, match="objective"):
        smoothness("squared", np.zeros(3))


# ----------------------------------------------------------------------------------------
# stationary points
# ----------------------------------------------------------------------------------------


def _quadratic_loss(signs):
    """One sample f(theta) = sum_k s_k theta_k^2, or the degenerate theta_0^2 + theta_1^4."""
    if signs == "quartic":
        return CallableLoss(
            lambda th, X, y: np.array([th[0] ** 2 + th[1] ** 4]),
            lambda th, X, y: np.array([[2 * th[0], 4 * th[1] ** 3]]),
            lambda th, X, y: np.array([[[2.0, 0.0], [0.0, 12 * th[1] ** 2]]]),
        )
    s = np.asarray(signs, dtype=float)
    return CallableLoss(
        lambda th, X, y: np.array([np.sum(s * th * th)]),
        lambda th, X, y: (2 * s * th)[None, :],
        lambda th, X, y: np.diag(2 * s)[None, :, :],
    )


@pytest.mark.parametrize(
    "signs, kind",
    [
        ((1.0, 1.0), "local minimum"),
        ((1.0, -1.0), "strict saddle"),
        ((-1.0, -1.0), "local maximum"),
        ("quartic", "degenerate"),
    ],
)
def test_classify_simple_functions(signs, kind):
    obj = TiltedObjective(_quadratic_loss(signs), t=0.5)
    res = classify_stationary_point(obj, np.zeros(2))
    assert res.kind == kind
    assert res.is_stationary and float(res.gradient_norm) == 0.0
    if signs != "quartic":
        assert_close(res.eigenvalues, np.sort(2 * np.asarray(signs)), xp=np)


def test_classify_term_saddle_for_negative_tilt():
    """Two samples y = +-1 on one feature: for t < -1/2 the symmetric point is a saddle."""
    X = np.array([[1.0, 0.0], [1.0, 0.0]])
    y = np.array([1.0, -1.0])
    obj = TiltedObjective("squared", X, y, t=-5.0, l2=0.1)
    res = classify_stationary_point(obj, np.zeros(2))
    assert res.kind == "strict saddle" and res.is_stationary
    # Hessian by hand: first coordinate 2 + 4t + l2 (covariance of gradients +-2), second l2
    assert_close(res.eigenvalues, np.array([2 + 4 * -5.0 + 0.1, 0.1]), xp=np)
    assert classify_stationary_point(obj.with_tilt(0.0), np.zeros(2)).kind == "local minimum"
    # the two minima near theta_0 = +-1 found by SciPy are strict local minima
    for start in (0.5, -0.5):
        sol = _solve(obj, np.array([start, 0.0]))
        assert np.sign(sol[0]) == np.sign(start)
        assert classify_stationary_point(obj, sol).kind == "local minimum"
    off = classify_stationary_point(obj, np.array([0.3, 0.0]))
    assert not off.is_stationary


# ----------------------------------------------------------------------------------------
# step-size rule
# ----------------------------------------------------------------------------------------


def test_step_size_rule_envelopes_measured_smoothness():
    X, y = _regression(n=40, seed=2)
    obj = TiltedObjective("squared", X, y, l2=0.01)
    ts = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
    path, x = [], np.zeros(3)
    for t in ts:
        x = _solve(obj.with_tilt(t), x)
        path.append(x)
    rule = fit_step_size_rule(obj, path, ts)
    C1, C2 = rule
    assert C2 > 0 and C1 > 0
    betas = [
        np.linalg.eigvalsh(_np_hessian("squared", X, y, th, t, 0.01))[-1]
        for t, th in zip(ts, path, strict=True)
    ]
    assert_close(rule.betas, np.array(betas), rtol=1e-10)
    # the LP envelope touches beta(t) at active tilts: compare up to LP rounding
    assert np.all(C1 + C2 * np.array(ts) >= np.array(betas) * (1 - 1e-8))
    assert rule(2.0) == step_size(C1, C2, 2.0) == 1.0 / (C1 + 2.0 * C2)
    # stacked path array and a least-squares fit
    ls = fit_step_size_rule(obj, np.stack(path), ts, fit="lstsq")
    slope, intercept = np.polyfit(ts, betas, 1)
    assert_close(np.array([ls.C1, ls.C2]), np.array([intercept, slope]), rtol=1e-8)


def test_step_size_rule_errors_and_arrays():
    X, y = _regression()
    obj = TiltedObjective("squared", X, y)
    with pytest.raises(ValueError, match="ts"):
        fit_step_size_rule(obj, np.zeros(3), [-1.0, 1.0])
    with pytest.raises(ValueError, match="ts"):
        fit_step_size_rule(obj, np.zeros(3), [1.0])
    with pytest.raises(ValueError, match="theta_or_path"):
        fit_step_size_rule(obj, [np.zeros(3)] * 2, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="fit"):
        fit_step_size_rule(obj, np.zeros(3), [0.0, 1.0], fit="max")
    with pytest.raises(ValueError, match="C1"):
        step_size(0.0, 1.0, 0.0)
    assert_close(step_size(1.0, 2.0, np.array([0.0, 1.0])), np.array([1.0, 1.0 / 3.0]), xp=np)


# ----------------------------------------------------------------------------------------
# GLM statistics: each lemma of the paper's GLM appendix against finite differences
# ----------------------------------------------------------------------------------------

H_T = 1e-5  # step for derivatives in t
H_TH = 1e-6  # step for derivatives in theta


def _glm_case(kind):
    """(objective, theta). "paper": all rows equal, so A(x . theta) is shared (paper's
    setting, logistic has c = 0); otherwise a regression GLM with per-sample cumulants."""
    if kind == "paper":
        rng = np.random.default_rng(7)
        X = np.tile(np.array([1.0, 0.5, -0.3]), (25, 1))
        y = (rng.random(25) < 0.6).astype(np.int64)
        return TiltedObjective("logistic", X, y, t=0.8), np.array([0.4, -0.2, 0.3])
    X, y = _data(kind)
    prior = np.random.default_rng(8).random(len(y)) + 0.5
    return TiltedObjective(kind, X, y, t=0.8, weights=prior), np.array([0.3, -0.5, 0.2])


def _fd_t(obj, theta, attr, order=1):
    t, h = obj.t, H_T if order == 1 else 1e-3  # second differences: round-off ~ eps/h^2
    f = {s: getattr(glm_statistics(obj.with_tilt(t + s * h), theta), attr) for s in (-1, 0, 1)}
    f = {k: np.asarray(v) for k, v in f.items()}
    if order == 1:
        return (f[1] - f[-1]) / (2 * h)
    return (f[1] - 2 * f[0] + f[-1]) / h**2


def _fd_theta(fun, theta):
    """Central-difference Jacobian of fun(theta) (last axis = derivative direction)."""
    cols = []
    for k in range(theta.size):
        e = np.zeros_like(theta)
        e[k] = H_TH
        cols.append((np.asarray(fun(theta + e)) - np.asarray(fun(theta - e))) / (2 * H_TH))
    return np.stack(cols, axis=-1)


def _shared_A(theta):
    """A(theta) = softplus(x . theta) and derivatives for the "paper" case."""
    x = np.array([1.0, 0.5, -0.3])
    z = x @ theta
    s = expit(z)
    return np.logaddexp(0.0, z), s * x, s * (1 - s) * np.outer(x, x)


@pytest.mark.parametrize("kind", ["squared", "logistic", "paper"])
def test_lemma_partial_derivatives_of_gamma(kind):
    """d/dt Gamma = -theta^T M ;  grad_theta Gamma = -t M  (hold as stated, any data)."""
    obj, theta = _glm_case(kind)
    st = glm_statistics(obj, theta)
    assert_close(_fd_t(obj, theta, "Gamma"), -theta @ np.asarray(st.M), rtol=1e-7)
    grad = _fd_theta(lambda th: glm_statistics(obj, th).Gamma, theta)
    assert_close(grad, -obj.t * np.asarray(st.M), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("kind", ["squared", "logistic", "paper"])
def test_lemma_partial_derivatives_of_M(kind):
    """d/dt M = -V theta ;  grad_theta M = -t V  (hold as stated, any data)."""
    obj, theta = _glm_case(kind)
    st = glm_statistics(obj, theta)
    V = np.asarray(st.V)
    assert_close(_fd_t(obj, theta, "M"), -V @ theta, rtol=1e-6, atol=1e-9)
    jac = _fd_theta(lambda th: glm_statistics(obj, th).M, theta)
    assert_close(jac, -obj.t * V, rtol=1e-6, atol=1e-9)


def test_definitions_and_lemma_V_positive():
    """Gamma, M, V, Lambda recomputed from their definitions; V > 0 (lemma) when the
    centred statistics span R^d; Lambda = t A + Gamma and pi = w in the paper's setting."""
    obj, theta = _glm_case("squared")
    X, y, t = np.asarray(obj.X), np.asarray(obj.y), obj.t
    p = np.asarray(obj.with_tilt(0.0).weights(theta))
    T = (2 * y)[:, None] * X
    gamma = logsumexp(-t * T @ theta, b=p)
    pi = p * np.exp(-t * T @ theta - gamma)
    M = pi @ T
    V = (T - M).T @ (pi[:, None] * (T - M))
    ell = (X @ theta - y) ** 2
    st = glm_statistics(obj, theta)
    assert_close(st.Gamma, gamma, xp=np, rtol=1e-12)
    assert_close(st.M, M, xp=np, rtol=1e-12)
    assert_close(st.V, V, xp=np, rtol=1e-12)
    assert_close(st.Lambda, logsumexp(t * ell, b=p), xp=np, rtol=1e-12)
    assert np.linalg.eigvalsh(np.asarray(st.V))[0] > 0
    # the paper's setting: one shared cumulant, no offset
    obj, theta = _glm_case("paper")
    st = glm_statistics(obj, theta)
    A, _, _ = _shared_A(theta)
    assert_close(st.Lambda, obj.t * A + float(st.Gamma), xp=np, rtol=1e-12)
    assert_close(st.statistic_weights, np.asarray(st.weights), xp=np, rtol=1e-10)


def test_lemma_derivative_of_lambda_in_t():
    """Paper: d/dt Lambda = A - theta^T M. Holds as stated in the paper's setting; with
    per-sample cumulants and offsets, A -> sum w_i (A(z_i) + c(y_i)) and M -> tilted_M."""
    obj, theta = _glm_case("paper")
    st = glm_statistics(obj, theta)
    A, _, _ = _shared_A(theta)
    assert_close(_fd_t(obj, theta, "Lambda"), A - theta @ np.asarray(st.M), rtol=1e-8)
    for kind in ("squared", "logistic"):
        obj, theta = _glm_case(kind)
        st = glm_statistics(obj, theta)
        fd = _fd_t(obj, theta, "Lambda")
        corrected = float(st.cumulant_mean) - theta @ np.asarray(st.tilted_M)
        assert_close(fd, corrected, rtol=1e-8)
        # d/dt Lambda is the tilted mean loss (independent NumPy computation)
        ell, _, _ = _np_parts(kind, np.asarray(obj.X), np.asarray(obj.y), theta)
        assert_close(fd, np.asarray(st.weights) @ ell, rtol=1e-8)
    # the literal statement fails for the squared loss (c(y) = y^2 varies per sample)
    obj, theta = _glm_case("squared")
    st = glm_statistics(obj, theta)
    literal = float(st.cumulant_mean) - theta @ np.asarray(st.M)
    assert abs(literal - _fd_t(obj, theta, "Lambda")) > 1e-2


def test_lemma_second_derivative_of_lambda_in_t():
    """Paper: d2/dt2 Lambda = theta^T V theta (paper's setting); in general it is the
    tilted variance of the losses."""
    obj, theta = _glm_case("paper")
    st = glm_statistics(obj, theta)
    V = np.asarray(st.V)
    assert_close(_fd_t(obj, theta, "Lambda", order=2), theta @ V @ theta, rtol=1e-5)
    obj, theta = _glm_case("squared")
    st = glm_statistics(obj, theta)
    w = np.asarray(st.weights)
    ell, _, _ = _np_parts("squared", np.asarray(obj.X), np.asarray(obj.y), theta)
    var = w @ (ell - w @ ell) ** 2
    assert_close(_fd_t(obj, theta, "Lambda", order=2), var, rtol=1e-5)
    assert abs(theta @ np.asarray(st.V) @ theta - var) > 0.1 * var


@pytest.mark.parametrize("kind", ["paper", "squared", "logistic"])
def test_lemma_gradient_of_lambda_in_theta(kind):
    """Paper: grad Lambda = t grad A - t M; generally t (cumulant_grad - tilted_M)."""
    obj, theta = _glm_case(kind)
    st = glm_statistics(obj, theta)
    fd = _fd_theta(lambda th: glm_statistics(obj, th).Lambda, theta)
    t = obj.t
    if kind == "paper":
        _, dA, _ = _shared_A(theta)
        assert_close(fd, t * dA - t * np.asarray(st.M), rtol=1e-7)
    assert_close(fd, t * (np.asarray(st.cumulant_grad) - np.asarray(st.tilted_M)), rtol=1e-7)
    assert_close(fd, t * np.asarray(obj.gradient(theta)), rtol=1e-7)


@pytest.mark.parametrize("kind", ["paper", "squared"])
def test_lemma_hessian_of_lambda_in_theta(kind):
    """Paper: hess Lambda = t hess A + t^2 V; generally t hess-bar A + t^2 Cov_w(grad l)."""
    obj, theta = _glm_case(kind)
    st = glm_statistics(obj, theta)
    t = obj.t
    fd = _fd_theta(
        lambda th: (
            t * np.asarray(glm_statistics(obj, th).cumulant_grad)
            - t * np.asarray(glm_statistics(obj, th).tilted_M)
        ),
        theta,
    )
    if kind == "paper":
        _, _, d2A = _shared_A(theta)
        assert_close(fd, t * d2A + t**2 * np.asarray(st.V), rtol=1e-6, atol=1e-10)
    else:
        X, y = np.asarray(obj.X), np.asarray(obj.y)
        _, d1, _ = _np_parts(kind, X, y, theta)
        G = d1[:, None] * X
        w = np.asarray(st.weights)
        cov = (G - w @ G).T @ (w[:, None] * (G - w @ G))
        assert_close(fd, t * np.asarray(st.cumulant_hess) + t**2 * cov, rtol=1e-6)
        assert np.abs(cov - np.asarray(st.V)).max() > 0.1  # the literal form needs this fix


def test_lemma_mixed_derivative_of_lambda():
    """Paper: d/dt grad Lambda = grad A - M + t V theta (paper's setting)."""
    obj, theta = _glm_case("paper")
    st = glm_statistics(obj, theta)
    t = obj.t

    def grad_lambda(tt):
        s = glm_statistics(obj.with_tilt(tt), theta)
        return tt * (np.asarray(s.cumulant_grad) - np.asarray(s.tilted_M))

    fd = (grad_lambda(t + H_T) - grad_lambda(t - H_T)) / (2 * H_T)
    _, dA, _ = _shared_A(theta)
    assert_close(fd, dA - np.asarray(st.M) + t * np.asarray(st.V) @ theta, rtol=1e-7)


def test_glm_statistics_errors():
    X, y = _regression()
    with pytest.raises(ValueError, match="GLM"):
        glm_statistics(TiltedObjective("huber", X, y, t=1.0), np.zeros(3))
    hier = TiltedObjective("squared", X, y, groups=np.arange(30) % 3, tilts=(1.0, 0.5))
    with pytest.raises(NotImplementedError, match="sample-level"):
        glm_statistics(hier, np.zeros(3))
    with pytest.raises(NotImplementedError, match="sample-level"):
        solution_derivative(hier, np.zeros(3))


# ----------------------------------------------------------------------------------------
# derivative of the tilted solution
# ----------------------------------------------------------------------------------------


def _fd_solution(obj, theta, h=1e-4):
    t = obj.t
    plus = _solve(obj.with_tilt(t + h), theta)
    minus = _solve(obj.with_tilt(t - h), theta)
    return (plus - minus) / (2 * h)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("t", [-0.5, 0.7, 2.0])
def test_solution_derivative_matches_finite_differences(loss, t):
    X, y = _data(loss)
    obj = TiltedObjective(loss, X, y, t=t, l2=0.1)
    theta = _solve(obj, np.zeros(3))
    assert classify_stationary_point(obj, theta).kind == "local minimum"
    fd = _fd_solution(obj, theta)
    general = solution_derivative(obj, theta)
    assert_close(general, fd, xp=np, rtol=1e-6, atol=1e-9 * np.abs(fd).max())
    glm = solution_derivative(obj, theta, method="glm")
    assert_close(glm, to_numpy(general), xp=np, rtol=1e-10, atol=1e-13)
    iterative = solution_derivative(obj, theta, solver="iterative")
    assert_close(iterative, to_numpy(general), xp=np, rtol=1e-8, atol=1e-12)


def test_solution_derivative_paper_closed_form():
    """Implicit-function lemma as stated: -(hess A + t V)^{-1} V theta (paper's setting,
    intercept-only logistic model, no ridge)."""
    y = (np.arange(40) % 10 < 7).astype(np.int64)  # 70% ones: theta(t) moves with t
    for t in (-0.5, 0.7, 2.0):
        obj = TiltedObjective("logistic", np.ones((40, 1)), y, t=t)
        theta = _solve(obj, np.zeros(1))
        st = glm_statistics(obj, theta)
        s = expit(theta[0])
        V = np.asarray(st.V)
        paper = -np.linalg.solve(s * (1 - s) + t * V, V @ theta)
        fd = _fd_solution(obj, theta)
        assert_close(paper, fd, rtol=1e-6)
        assert_close(solution_derivative(obj, theta), paper, xp=np, rtol=1e-10)
        assert_close(solution_derivative(obj, theta, method="glm"), paper, xp=np, rtol=1e-10)


def test_solution_derivative_multinomial_and_callable():
    rng = np.random.default_rng(10)
    X = rng.standard_normal((30, 2))
    y = rng.integers(0, 3, 30)
    obj = TiltedObjective("multinomial", X, y, t=0.7, l2=0.2)
    theta = _solve(obj, np.zeros(6)).reshape(2, 3)
    fd = _fd_solution(obj, theta.ravel()).reshape(2, 3)
    assert_close(solution_derivative(obj, theta), fd, xp=np, rtol=1e-6, atol=1e-9)
    # a callable loss: per-sample quartics (theta - a_i)^4 + (theta - a_i)^2 in 2-D
    a = rng.standard_normal((8, 2))

    def fun(th, X_, y_):
        r = th[None, :] - a
        return np.sum(r**4 + r**2, axis=1)

    def grad(th, X_, y_):
        r = th[None, :] - a
        return 4 * r**3 + 2 * r

    def hess(th, X_, y_):
        r = th[None, :] - a
        return (12 * r**2 + 2)[:, :, None] * np.eye(2)[None]

    cobj = TiltedObjective(CallableLoss(fun, grad, hess), t=-0.3)
    theta = _solve(cobj, np.zeros(2))
    assert_close(solution_derivative(cobj, theta), _fd_solution(cobj, theta), xp=np, rtol=1e-6)
    with pytest.raises(ValueError, match="GLM"):
        solution_derivative(cobj, theta, method="glm")
    with pytest.raises(ValueError, match="method"):
        solution_derivative(cobj, theta, method="paper")


# ----------------------------------------------------------------------------------------
# entropy and effective sample size
# ----------------------------------------------------------------------------------------


def test_entropy_and_ess_closed_forms():
    n = 7
    assert_close(weight_entropy(np.full(n, 1.0 / n)), np.log(n), xp=np, rtol=1e-14)
    assert_close(effective_sample_size(np.ones(n)), float(n), xp=np, rtol=1e-14)
    one_hot = np.zeros(n)
    one_hot[3] = 1.0
    assert float(weight_entropy(one_hot)) == 0.0
    assert float(effective_sample_size(one_hot)) == 1.0
    w = np.random.default_rng(0).random((4, n)) * np.array([0, 1, 1, 1, 0.2, 3, 1])
    assert_close(weight_entropy(w), scipy_entropy(w, axis=-1), xp=np, rtol=1e-13)
    assert_close(weight_entropy(w.T, axis=0), scipy_entropy(w, axis=-1), xp=np, rtol=1e-13)
    q = w / w.sum(axis=1, keepdims=True)
    assert_close(effective_sample_size(w), 1.0 / np.sum(q**2, axis=1), xp=np, rtol=1e-13)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_entropy_and_ess_of_weights_whose_sum_overflows(dtype):
    # finite weights near the largest float (e.g. raw exp(t l) in float32): their sum
    # overflows, yet both statistics only depend on the ratios w_i / w_j
    big = float(np.finfo(dtype).max) * 0.9
    rows = [[big, big, 1.0], [big, big / 3, 0.0]]
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(50):
        ent_ref, ess_ref = [], []
        for row in rows:
            wm = [mpmath.mpf(float(dtype(v))) for v in row]
            q = [v / sum(wm) for v in wm]
            ent_ref.append(float(-sum(v * mpmath.log(v) for v in q if v > 0)))
            ess_ref.append(float(1 / sum(v * v for v in q)))
    w = np.array(rows, dtype=dtype)
    eps = float(np.finfo(dtype).eps)
    # both are well conditioned in the weights: a few roundings of relative size eps
    ent, ess = weight_entropy(w), effective_sample_size(w)
    assert ent.dtype == dtype and ess.dtype == dtype
    np.testing.assert_allclose(ent, ent_ref, rtol=16 * eps)
    np.testing.assert_allclose(ess, ess_ref, rtol=16 * eps)


@pytest.mark.parametrize(
    "weights, match",
    [
        (np.array([1.0, -1.0]), "non-negative"),
        (np.zeros(3), "all zero"),
        (np.array(1.0), "dimension"),
        (np.array([np.nan, 1.0]), "NaN"),
    ],
)
def test_entropy_input_errors(weights, match):
    with pytest.raises(ValueError, match=match):
        weight_entropy(weights)


def test_tilted_weight_stats():
    X, y = _regression()
    theta = np.zeros(3)
    s0 = tilted_weight_stats(TiltedObjective("squared", X, y, t=0.0), theta)
    assert_close(s0.entropy, np.log(30), xp=np, rtol=1e-13)
    assert_close(s0.effective_sample_size, 30.0, xp=np, rtol=1e-13)
    s = tilted_weight_stats(TiltedObjective("squared", X, y, t=3.0), theta)
    w = softmax(3.0 * (X @ theta - y) ** 2)
    assert_close(s.weights, w, xp=np, rtol=1e-12)
    assert_close(s.entropy, scipy_entropy(w), xp=np, rtol=1e-12)
    assert_close(s.effective_sample_size, 1.0 / np.sum(w**2), xp=np, rtol=1e-12)


# ----------------------------------------------------------------------------------------
# backends
# ----------------------------------------------------------------------------------------


def test_weights_backends(xp):
    w_np = np.array([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    w = xp.asarray(w_np)
    assert_close(weight_entropy(w), scipy_entropy(w_np, axis=-1), xp=xp, dtype=w.dtype)
    q = w_np / w_np.sum(axis=1, keepdims=True)
    assert_close(effective_sample_size(w), 1.0 / np.sum(q**2, axis=1), xp=xp, dtype=w.dtype)
    w32 = xp.asarray(w_np, dtype=xp.float32)
    assert_close(weight_entropy(w32), scipy_entropy(w_np, axis=-1), xp=xp, dtype=xp.float32)
    ints = xp.asarray([1, 1, 0])
    assert_close(effective_sample_size(ints), 2.0, xp=xp)


def test_curvature_backends(xp):
    X_np, y_np = _classification(n=20, d=3, seed=11)
    theta_np = np.array([0.1, -0.2, 0.3])
    obj = TiltedObjective("logistic", xp.asarray(X_np), xp.asarray(y_np), t=1.2, l2=0.1)
    theta = xp.asarray(theta_np)
    ev = np.linalg.eigvalsh(_np_hessian("logistic", X_np, y_np, theta_np, 1.2, 0.1))
    dt = obj.dtype
    res = smoothness(obj, theta)
    assert_close(res.value, ev[-1], xp=xp, dtype=dt)
    assert_close(res.point, theta_np, xp=xp, dtype=dt)
    assert_close(strong_convexity(obj, theta).value, ev[0], xp=xp, dtype=dt)
    assert_close(condition_number(obj, theta), ev[-1] / ev[0], xp=xp, dtype=dt)
    ball = smoothness(obj, theta, radius=0.3, n_samples=3)
    assert ball.n_evaluated == 4 and float(to_numpy(ball.value)) >= ev[-1] * (1 - 1e-12)
    assert_close(ball.point, to_numpy(ball.point), xp=xp, dtype=dt)
    assert_close(smoothness(obj, theta, method="lanczos").value, ev[-1], xp=xp, dtype=dt)
    stats = tilted_weight_stats(obj, theta)
    assert_close(stats.entropy, scipy_entropy(to_numpy(stats.weights)), xp=xp, dtype=dt)


def test_glm_and_derivative_backends(xp):
    X_np, y_np = _regression(n=20, seed=12)
    obj_np = TiltedObjective("squared", X_np, y_np, t=0.7, l2=0.1)
    theta_np = _solve(obj_np, np.zeros(3))
    obj = TiltedObjective("squared", xp.asarray(X_np), xp.asarray(y_np), t=0.7, l2=0.1)
    theta = xp.asarray(theta_np)
    st, ref = glm_statistics(obj, theta), glm_statistics(obj_np, theta_np)
    for name in ("Lambda", "Gamma", "M", "V", "tilted_V", "cumulant_hess"):
        assert_close(
            getattr(st, name), getattr(ref, name), xp=xp, dtype=obj.dtype, rtol=1e-10, err_msg=name
        )
    want = to_numpy(solution_derivative(obj_np, theta_np))
    for method in ("general", "glm"):
        assert_close(
            solution_derivative(obj, theta, method=method), want, xp=xp, dtype=obj.dtype, rtol=1e-10
        )


def test_float32_kept():
    X, y = _classification(n=20, d=3, seed=13)
    obj = TiltedObjective("logistic", X.astype(np.float32), y, t=0.5, l2=0.1)
    theta = np.zeros(3, dtype=np.float32)
    ev = np.linalg.eigvalsh(_np_hessian("logistic", X, y, np.zeros(3), 0.5, 0.1))
    assert_close(smoothness(obj, theta).value, ev[-1], xp=np, dtype=np.float32)
    assert_close(
        solution_derivative(obj, theta),
        to_numpy(
            solution_derivative(TiltedObjective("logistic", X, y, t=0.5, l2=0.1), np.zeros(3))
        ).astype(np.float32),
        xp=np,
        dtype=np.float32,
        rtol=1e-4,
        atol=1e-6,
    )

"""The fused CUDA value and gradient on the CPU: the kernel's sequence of calls to the
scalar functions of ``tilt.cuh`` (built as host C), with its row groups, lanes sharing a
shift and unused groups, then the finish kernel's merge, checked against 50-digit mpmath.

The cases include those a GPU showed wrong: ``theta = 0`` (every loss equal), where
groups without rows used to keep an infinite shift that the finish multiplied by a zero
mass (NaN).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from cuda_host import finish_vg, host, simulate_vg, warp_merge

from tiltlab._cupy.source import launch_shape

mpmath.mp.dps = 50


def _mp_value_grad(l, d1, X, t):
    lm = [mpmath.mpf(float(v)) for v in l]
    n = len(lm)
    if abs(t) * float(max(lm) - min(lm)) < 1e-30:
        mean = mpmath.fsum(lm) / n
        value = mean + t * mpmath.fsum((v - mean) ** 2 for v in lm) / n / 2
        w = [mpmath.mpf(1) / n] * n
    else:
        m = max(lm) if t > 0 else min(lm)
        e = [mpmath.exp(t * (v - m)) for v in lm]
        z = mpmath.fsum(e)
        value = m + mpmath.log(z / n) / t
        w = [v / z for v in e]
    grad = [
        float(mpmath.fsum(w[i] * float(d1[i]) * float(X[i, j]) for i in range(n)))
        for j in range(X.shape[1])
    ]
    return float(value), np.array(grad)


def _problem(loss, n, d, dtype, zero_theta, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = np.zeros(d, dtype) if zero_theta else (rng.standard_normal(d) / 2).astype(dtype)
    if loss == "squared":
        y = (X.astype(np.float64) @ theta + 2 * rng.standard_normal(n)).astype(dtype)
    else:
        y = (rng.random(n) < 0.4).astype(dtype)
    return X, y, theta


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t", [-2.0, -1e-9, 1e-200, 1e-3, 0.5, 30.0])
@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("zero_theta", [False, True])
@pytest.mark.parametrize(("d", "n_groups"), [(3, 5), (3, 64), (1, 50), (1, 64), (40, 16)])
def test_kernel_and_finish_match_mpmath(loss, t, dtype, zero_theta, d, n_groups):
    h = host(dtype)
    n = 37
    X, y, theta = _problem(loss, n, d, dtype, zero_theta)
    L, _, R = launch_shape(d)
    st, acc = simulate_vg(h, X, y, theta, t, loss, n_groups, L, R)
    used = st[:, 6] > 0
    assert used.sum() == min(n_groups, n)  # groups beyond the rows stay empty
    assert np.all(st[~used, 1] == -np.inf) and np.all(st[~used, 2] == np.inf)
    value, grad, status = finish_vg(h, st, acc, t)
    assert status == 0 and math.isfinite(value) and np.all(np.isfinite(grad))
    # the reference: the same losses (host C at the kernel's z) in 50 digits
    z = (X.astype(np.float64) @ theta.astype(np.float64)).astype(dtype)
    ld = [h.loss(loss, float(zi), float(yi)) for zi, yi in zip(z, y, strict=True)]
    l = np.array([v[0] for v in ld])
    d1 = np.array([v[1] for v in ld])
    want_v, want_g = _mp_value_grad(l, d1, X, t)
    eps = float(np.finfo(dtype).eps)
    assert abs(value - want_v) <= 32 * eps * float(np.max(np.abs(l)))
    gscale = float(np.max(np.abs(d1))) * float(np.max(np.abs(X)))
    np.testing.assert_allclose(grad, want_g, rtol=0, atol=64 * eps * gscale)
    if zero_theta and loss == "logistic":
        assert value == pytest.approx(math.log(2.0), rel=4 * eps)
    # the kernel merges the groups of a warp first (then the warps of a block)
    per_warp = 32 // L
    if n_groups % per_warp == 0:
        st_w, acc_w = warp_merge(h, st, acc, t, per_warp)
        value_w, grad_w, status_w = finish_vg(h, st_w, acc_w, t)
        assert status_w == 0
        assert abs(value_w - want_v) <= 32 * eps * float(np.max(np.abs(l)))
        np.testing.assert_allclose(grad_w, want_g, rtol=0, atol=64 * eps * gscale)


@pytest.mark.parametrize("t", [-1e-9, 1e-9, -3.0, 3.0, 1e8])
def test_finish_with_the_old_unused_group_rows(t):
    # groups without rows as the kernel used to leave them: the shift infinite (-inf for
    # t > 0, +inf for t < 0), mass and sums 0. With every loss equal (theta = 0) the
    # finish multiplied that shift by the mass (NaN); the merge now tests for the empty
    # state instead.
    h = host(np.float64)
    v = math.log(2.0)
    used = h.of([v] * 4, t)
    c = -math.inf if t > 0 else math.inf
    unused = (c, -math.inf, math.inf, 0.0, 0.0, 0.0, 0.0)
    st = np.array([h.row(used), unused, h.row(used), unused])
    acc = np.array([[1.0, 2.0], [0.0, 0.0], [3.0, -2.0], [0.0, 0.0]])
    value, grad, status = finish_vg(h, st, acc, t)
    assert status == 0 and value == v
    np.testing.assert_allclose(grad, [0.5, 0.0], rtol=1e-15)


def test_finish_ridge_and_nonfinite_status():
    h = host(np.float64)
    st = np.array([h.row(h.of([1.0, 2.0], 1.0))])
    acc = np.array([[0.5, -0.5]])
    theta = np.array([3.0, 4.0])
    v0, g0, _ = finish_vg(h, st, acc, 1.0)
    v, g, status = finish_vg(h, st, acc, 1.0, theta, l2=0.1)
    assert status == 0 and v == pytest.approx(v0 + 0.05 * 25.0)
    np.testing.assert_allclose(g, g0 + 0.1 * theta)
    bad = np.array([h.row(h.of([1.0, math.inf], 1.0))])
    assert finish_vg(h, bad, acc, 1.0)[2] == 1
    nan = np.array([h.row(h.of([math.nan, 1.0], -1.0))])
    assert finish_vg(h, nan, acc, -1.0)[2] == 1

"""The host side of the fused CuPy kernel, on the CPU.

The kernel writes one partial state per lane group (running shift, extremes, ``s``, ``q``,
plain loss sum, count) and per-group gradient sums; :func:`tiltlab._cupy_kernels.
finish_partials` merges them through the tilted reduction. Here the partial states are
built the way the kernel builds them (an online pass per group, in NumPy) and the value
and gradient are checked against 50-digit mpmath, whatever the grouping.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from tiltlab._cupy_kernels import finish_partials

mpmath.mp.dps = 50


def _kernel_partials(l, d1, X, t, n_groups, stride):
    """Per-group states as the CUDA kernel writes them: rows ``g, g + stride, ...``, an
    online shift moved with ``expm1``/``exp`` rescalings, unused groups left empty."""
    d = X.shape[1]
    st = np.zeros((n_groups, 7))
    acc = np.zeros((n_groups, d))
    for g in range(n_groups):
        c = -math.inf if t > 0 else math.inf
        hi, lo, s, q, lsum, mass = -math.inf, math.inf, 0.0, 0.0, 0.0, 0.0
        a = np.zeros(d)
        for r in range(g, len(l), stride) if g < stride else []:
            li = l[r]
            hi, lo, lsum = max(hi, li), min(lo, li), lsum + li
            cand = max(c, li) if t > 0 else min(c, li)
            if cand != c:
                du = t * (c - cand)
                rr = math.exp(du)
                q = mass * (math.expm1(du) if mass > 0 else 0.0) + q * rr
                s, a, c = s * rr, a * rr, cand
            u = t * (li - c)
            s, q, mass = s + math.exp(u), q + math.expm1(u), mass + 1.0
            a = a + math.exp(u) * d1[r] * X[r]
        st[g] = (c if mass > 0 else 0.0, hi, lo, s, q, lsum, mass)
        acc[g] = a
    return st, acc


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


@pytest.mark.parametrize("t", [1e-200, -1e-9, 1e-3, 0.5, -2.0, 30.0])
@pytest.mark.parametrize(("n_groups", "stride"), [(1, 1), (7, 5), (16, 16), (40, 40)])
def test_finish_partials_matches_mpmath(t, n_groups, stride):
    rng = np.random.default_rng(3)
    n, d = 37, 3
    X = rng.standard_normal((n, d))
    res = rng.standard_normal(n) * 2.0
    l, d1 = res**2, 2.0 * res  # squared loss
    st, acc = _kernel_partials(l, d1, X, t, n_groups, stride)
    value, grad = finish_partials(st, acc, t, np.float64)
    want_v, want_g = _mp_value_grad(l, d1, X, t)
    assert value.dtype == np.float64
    assert abs(float(value) - want_v) <= 1e-14 * float(np.max(l))
    np.testing.assert_allclose(grad, want_g, rtol=1e-12, atol=1e-13)


def test_finish_partials_non_finite():
    st = np.array([[0.0, np.inf, 1.0, 1.0, 0.0, np.inf, 2.0]])
    assert finish_partials(st, np.zeros((1, 2)), 1.0, np.float64) is None

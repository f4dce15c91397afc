"""`tilted_advantage`: the advantage against the group's tilted mean, checked against
50-digit mpmath on every backend."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from tiltlab import tilted_advantage
from tiltlab._compat import to_numpy

mpmath.mp.dps = 50


def _reference(r, beta):
    """A_i = (exp(beta (r_i - R)) - 1) / beta with R the tilted mean, at 50 digits (more
    for tiny beta, so that 50 digits of R survive the division by beta)."""
    digits = 50 + max(0, int(-math.log10(abs(beta)))) if beta else 50
    with mpmath.workdps(digits):
        return _reference_at(r, beta)


def _reference_at(r, beta):
    rs = [mpmath.mpf(float(v)) for v in r]
    n = len(rs)
    if beta == 0:
        mean = mpmath.fsum(rs) / n
        return np.array([float(v - mean) for v in rs])
    b = mpmath.mpf(beta)
    big = max(rs) if beta > 0 else min(rs)  # shift: exp(b (r - big)) <= 1
    R = big + mpmath.log(mpmath.fsum(mpmath.exp(b * (v - big)) for v in rs) / n) / b
    return np.array([float(mpmath.expm1(b * (v - R)) / b) for v in rs])


BETAS = [-10.0, -1.0, -1e-3, -1e-9, -1e-300, 0.0, 5e-324, 1e-14, 1e-6, 0.5, 3.0, 30.0, 100.0]


def _tol(ref, r):
    # d_i = r_i - R carries an absolute rounding of a few ulps of max|r| (R is exact to a
    # few ulps of it), which expm1 carries into A_i with the factor exp(beta d_i) (bounded
    # by 1 + beta A_i); 1e-12 relative to |A_i| plus that absolute term
    return 1e-12 * (np.abs(ref) + np.max(np.abs(r)) * (1.0 + np.abs(ref)))


@pytest.mark.parametrize("beta", BETAS)
def test_matches_mpmath(beta):
    rng = np.random.default_rng(0)
    for r in (
        rng.random(8),
        rng.integers(0, 2, 16).astype(float),
        np.array([3.0]),
        np.array([1.0, 1.0, 1.0 + 1e-12]),
        1e3 + rng.random(5),
    ):
        if beta == 100.0 and np.ptp(r) > 1:
            r = r - r.min()
        got = tilted_advantage(r, beta)
        ref = _reference(r, beta)
        assert np.all(np.abs(got - ref) <= _tol(ref, r)), (beta, r, got, ref)


def test_beta_zero_is_centred_rewards_and_means_vanish():
    r = np.array([[0.0, 1.0, 1.0, 0.0], [2.0, 4.0, 4.0, 6.0]])
    np.testing.assert_array_equal(tilted_advantage(r, 0.0), r - r.mean(axis=1, keepdims=True))
    # the advantages average to zero in every group at every tilt (sum of w_i n - 1)
    for beta in (-3.0, 2.0, 50.0):
        a = tilted_advantage(r, beta)
        np.testing.assert_allclose(a.mean(axis=1), 0.0, atol=1e-12 * np.exp(abs(beta) * 6))


def test_axis_and_groups_equal_their_layouts():
    rng = np.random.default_rng(1)
    r = rng.random((3, 5))
    a0 = tilted_advantage(r, 2.0, axis=0)
    np.testing.assert_array_equal(a0, tilted_advantage(r.T, 2.0).T)
    # labels in any order: the same as each group on its own
    labels = np.array([2, 0, 2, 7, 0, 7, 2])
    x = rng.random(7)
    got = tilted_advantage(x, -4.0, groups=labels)
    for g in np.unique(labels):
        m = labels == g
        np.testing.assert_allclose(got[m], tilted_advantage(x[m], -4.0), rtol=1e-15, atol=0)
    # groups along axis 1 of a 2-d array: one group structure for each row
    got2 = tilted_advantage(np.stack([x, 2 * x]), -4.0, groups=labels, axis=1)
    np.testing.assert_allclose(
        got2[1], tilted_advantage(2 * x, -4.0, groups=labels), rtol=1e-15, atol=0
    )


def test_backends_keep_namespace_dtype(xp):
    r_np = np.array([[0.2, 0.9, 0.1, 0.7], [1.0, 0.0, 0.0, 0.5]])
    labels = [0, 1, 0, 1]
    for dtype in (xp.float64, xp.float32):
        r = xp.asarray(r_np, dtype=dtype)
        for kw in ({}, {"groups": labels}):
            got = tilted_advantage(r, 3.0, **kw)
            assert type(got) is type(r) and got.dtype == dtype and got.shape == r.shape
            ref = tilted_advantage(r_np, 3.0, **kw)
            rtol = 1e-14 if dtype == xp.float64 else 3e-6
            np.testing.assert_allclose(to_numpy(got), ref, rtol=rtol, atol=rtol)


def test_torch_autograd_through_rewards():
    torch = pytest.importorskip("torch")
    r = torch.tensor([0.3, 1.2, -0.4], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(tilted_advantage(r, 2.0)[0], r)
    # finite differences
    eps = 1e-6
    fd = []
    for j in range(3):
        e = torch.zeros(3, dtype=torch.float64)
        e[j] = eps
        with torch.no_grad():
            fd.append(
                float(tilted_advantage(r + e, 2.0)[0] - tilted_advantage(r - e, 2.0)[0]) / (2 * eps)
            )
    np.testing.assert_allclose(g.numpy(), fd, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"beta": math.inf}, ValueError, "beta"),
        ({"beta": math.nan}, ValueError, "beta"),
        ({"beta": "1"}, TypeError, "beta"),
        ({"beta": 1.0, "groups": [0, 1]}, ValueError, "groups"),
        ({"beta": 1.0, "groups": [0.5, 1, 1]}, ValueError, "groups"),
        ({"beta": 1.0, "axis": 3}, ValueError, "axis"),
    ],
)
def test_errors_name_the_argument(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        tilted_advantage(np.array([1.0, 2.0, 3.0]), **kwargs)
    with pytest.raises(ValueError, match="rewards"):
        tilted_advantage(np.array([1.0, np.nan]), 1.0)
    with pytest.raises(ValueError, match="rewards"):
        tilted_advantage(np.array([]), 1.0)

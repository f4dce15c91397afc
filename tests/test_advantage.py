"""`tilted_advantage`: the advantage against the group's tilted mean, checked against
50-digit mpmath on every backend."""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest

from tiltlab import tilted_advantage
from tiltlab._compat import to_numpy

mpmath.mp.dps = 50


def _parts(r, beta):
    """``(A, exp(v), R - c, c)`` at 50 digits (more for tiny ``beta``): the advantages, the
    factors ``exp(beta (r_i - R)) = n w_i``, the tilted mean against the shift ``c`` (the
    largest reward for ``beta >= 0``, else the smallest)."""
    digits = 50 + max(0, int(-math.log10(abs(beta)))) if beta else 50
    with mpmath.workdps(digits):
        rs = [mpmath.mpf(float(v)) for v in r]
        n = len(rs)
        c = max(rs) if beta >= 0 else min(rs)
        if beta == 0:
            R = mpmath.fsum(rs) / n
            return [v - R for v in rs], [mpmath.mpf(1)] * n, R - c, c
        # beta (r_i - R) = u_i - L, without R itself (1 - 1e-300 needs 300 digits)
        b = mpmath.mpf(beta)
        u = [b * (v - c) for v in rs]
        L = mpmath.log(mpmath.fsum(mpmath.exp(x) for x in u) / n)
        e = [mpmath.exp(x - L) for x in u]
        return [mpmath.expm1(x - L) / b for x in u], e, L / b, c


def _bound(r, beta, eps):
    """The reference advantages of one group and the error bound of each, in units that
    follow from the arithmetic: ``u_i = beta (r_i - c)`` (halved, scaled, doubled: two
    roundings of ``|u_i|``), the log normaliser ``L = beta (R - c)`` (a sum of ``n`` terms
    of one sign: ``n + 4`` roundings of ``|L|``, or of 1 where ``log`` of the plain sum is
    taken, for ``|beta| spread > 1``; a factor 2 for ``expm1`` of ``u`` in ``[-1, 0]``),
    ``u_i - L``, then ``expm1`` and the division (``|A_i|``); an error ``e`` of
    ``v_i = u_i - L`` moves ``A_i`` by ``exp(v_i) e / beta``."""
    A, e, rc, c = _parts(r, beta)
    n = len(A)
    with mpmath.workdps(50):  # spreads beyond the float maximum too
        rs = [mpmath.mpf(float(v)) for v in r]
        spread = max(rs) - min(rs)
        inv = mpmath.inf if beta == 0 else 1 / abs(mpmath.mpf(beta))
        log_scale = max(abs(rc), min(inv, spread))
        tol = [
            eps * (3 * abs(a) + f * (3 * abs(v - c) + 2 * (n + 4) * log_scale))
            for a, f, v in zip(A, e, rs, strict=True)
        ]
    return np.array([float(a) for a in A]), np.array([float(x) for x in tol])


BETAS = [-10.0, -1.0, -1e-3, -1e-9, -1e-300, 0.0, 5e-324, 1e-14, 1e-6, 0.5, 3.0, 30.0, 100.0]


@pytest.mark.parametrize("beta", BETAS)
def test_matches_mpmath(beta):
    rng = np.random.default_rng(0)
    eps = float(np.finfo(np.float64).eps)
    for r in (
        rng.random(8),
        rng.integers(0, 2, 16).astype(float),
        np.array([3.0]),
        np.array([1.0, 1.0, 1.0 + 1e-12]),
        1e3 + rng.random(5),
    ):
        got = tilted_advantage(r, beta)
        ref, tol = _bound(r, beta, eps)
        assert np.all(np.abs(got - ref) <= tol), (beta, r, got, ref)


#: rewards and tilts where the tilted mean, formed in absolute terms, cancels: large
#: ``|beta|`` (the advantages are about ``1 / beta``), large rewards against small gaps,
#: spreads beyond the float maximum; and tiny tilts, where the limit is ``r - mean(r)``
CANCELLING = [
    ([0.0, 1.0], 1e12),
    ([0.0, 1.0], -1e12),
    ([0.0, 1.0], 1e300),
    ([0.0, 1.0], -1e300),
    ([1e16, 0.0], 1.0),
    ([1e300, -1e300, 3.0], 1.0),
    ([1e300, -1e300, 3.0], -1e-300),
    ([0.0, 1e10], 1e300),
    ([1.5e308, -1.5e308, 0.0], 1e-308),
    ([1.5e308, -1.5e308, 0.0], -1e-320),
    ([1.5e308, -1.5e308, 0.0], 0.0),
    ([1e3 + 0.25, 1e3 + 0.5, 1e3, 1e3 + 2.0], 1e-8),
    ([1e3 + 0.25, 1e3 + 0.5, 1e3, 1e3 + 2.0], -1e-300),
    ([1e3 + 0.25, 1e3 + 0.5, 1e3, 1e3 + 2.0], 5e-324),
    ([0.0, 1.0, 1.0, 0.0], 1e-8),
    ([0.0, 1.0, 1.0, 0.0], 0.0),
    ([2.0, 3.0, 7.0], 1e-150),
    ([2.0, 3.0, 7.0], 30.0),
]


@pytest.mark.parametrize(("rewards", "beta"), CANCELLING)
def test_no_cancellation_against_mpmath(xp, xp_name, rewards, beta):
    r = np.array(rewards)
    want, tol = _bound(r, beta, float(np.finfo(np.float64).eps))
    with warnings.catch_warnings():
        if xp_name == "dask.array":  # worker threads do not see NumPy's error state
            warnings.simplefilter("ignore", RuntimeWarning)
        got = to_numpy(tilted_advantage(xp.asarray(r), beta))
    assert got.dtype == np.float64
    assert np.all(np.abs(got - want) <= tol), (got, want, tol)
    # the advantages average to zero: the mean of the errors, and the test's own sum
    n = r.shape[0]
    mean_tol = np.max(tol) + n * float(np.finfo(np.float64).eps) * np.max(np.abs(want))
    assert abs(np.mean(got)) <= mean_tol, (np.mean(got), mean_tol)


@pytest.mark.parametrize(
    ("rewards", "beta"),
    [
        ([10.0, 10.5, 11.0, 10.25], 1e6),
        ([10.0, 10.5, 11.0, 10.25], -1e6),
        ([0.0, 1.0, 1.0, 0.0], 1e30),
        ([3e38, -3e38, 1e38], 1e-38),
    ],
)
def test_float32_against_mpmath(xp, xp_name, rewards, beta):
    r = xp.asarray(np.array(rewards, dtype=np.float32))
    host = to_numpy(r).astype(np.float64)
    b = float(np.float32(beta))  # the tilt as the rewards' dtype holds it
    want, tol = _bound(host, b, float(np.finfo(np.float32).eps))
    with warnings.catch_warnings():
        if xp_name == "dask.array":  # worker threads do not see NumPy's error state
            warnings.simplefilter("ignore", RuntimeWarning)
        got = tilted_advantage(r, beta)
        assert got.dtype == r.dtype
        got = to_numpy(got).astype(np.float64)
    assert np.all(np.abs(got - want) <= tol), (got, want, tol)


def test_float32_tilt_beyond_the_dtype_range(xp):
    # a finite Python beta beyond float32's range is infinite in float32, as for the risk
    # functions; there every advantage is 0, the limit of (n w_i - 1) / beta (the exact
    # values, 1 / |beta| = 1e-39, lie below float32's normal range)
    r = xp.asarray(np.array([0.0, 1.0, 1.0, 0.0], dtype=np.float32))
    for beta in (-1e39, 1e39, 1e300):
        got = tilted_advantage(r, beta)
        assert got.dtype == r.dtype
        np.testing.assert_array_equal(np.abs(to_numpy(got)), np.zeros(4, dtype=np.float32))


def test_beta_zero_is_centred_rewards_and_means_vanish():
    r = np.array([[0.0, 1.0, 1.0, 0.0], [2.0, 4.0, 4.0, 6.0], [1e16, 3.0, 1e16 + 2.0, 0.5]])
    np.testing.assert_array_equal(
        tilted_advantage(r[:2], 0.0), r[:2] - r[:2].mean(axis=1, keepdims=True)
    )
    # the advantages average to zero in every group at every tilt (the mean of n w_i - 1):
    # to the mean of their error bounds, plus the rounding of the mean taken here
    eps = float(np.finfo(np.float64).eps)
    for beta in (-1e300, -3.0, -1e-9, 1e-300, 2.0, 50.0, 1e12):
        a = tilted_advantage(r, beta)
        for row, got in zip(r, a, strict=True):
            want, tol = _bound(row, beta, eps)
            bound = np.mean(tol) + row.size * eps * np.max(np.abs(want))
            assert abs(np.mean(got)) <= bound, (beta, row, np.mean(got), bound)


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

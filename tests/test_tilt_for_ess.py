"""Tests of tiltlab.tilt_for_ess against 50-digit mpmath root finding and closed forms."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.diagnostics import effective_sample_size
from tiltlab.testing import assert_close

mpmath.mp.dps = 50


# ---------------------------------------------------------------------------
# references: the ESS fraction at 50 digits, a dense grid of tilts, bisection


def mp_log_fraction(losses, t, prior=None):
    """log of (sum p e^{t l})^2 / sum p e^{2 t l}, p normalised (uniform by default)."""
    ls = [mpmath.mpf(float(v)) for v in losses]
    ps = [mpmath.mpf(1)] * len(ls) if prior is None else [mpmath.mpf(float(q)) for q in prior]
    tot = mpmath.fsum(ps)
    ps = [q / tot for q in ps]
    t = mpmath.mpf(t)
    s1 = mpmath.fsum(q * mpmath.exp(t * v) for q, v in zip(ps, ls, strict=True) if q > 0)
    s2 = mpmath.fsum(q * mpmath.exp(2 * t * v) for q, v in zip(ps, ls, strict=True) if q > 0)
    return 2 * mpmath.log(s1) - mpmath.log(s2)


def mp_tilt_for_ess(losses, fraction, sign, prior=None):
    """Brute force: bracket the root on a dense grid of log|t|, then bisect at 50 digits."""
    key = (
        tuple(map(float, losses)),
        float(fraction),
        sign,
        None if prior is None else tuple(map(float, prior)),
    )
    if key not in _REFS:
        _REFS[key] = _mp_root(losses, fraction, sign, prior)
    return _REFS[key]


_REFS: dict = {}


def _mp_root(losses, fraction, sign, prior):
    target = mpmath.log(mpmath.mpf(fraction))
    xs = [mpmath.mpf(x) / 4 for x in range(-30 * 4, 30 * 4 + 1)]  # log|t| in [-30, 30]

    def h(x):
        return mp_log_fraction(losses, sign * mpmath.exp(x), prior) - target

    prev = xs[0]
    assert h(prev) > 0, "grid does not start above the target"
    for x in xs[1:]:
        if h(x) <= 0:
            lo, hi = prev, x
            break
        prev = x
    else:  # pragma: no cover - the test data are chosen inside the grid
        raise AssertionError("no bracket on the grid")
    for _ in range(80):  # 2^-80 of a bracket 0.25 wide in log|t|
        mid = (lo + hi) / 2
        if h(mid) > 0:
            lo = mid
        else:
            hi = mid
    return float(sign * mpmath.exp((lo + hi) / 2))


def _data(seed=0, n=12):
    rng = np.random.default_rng(seed)
    return np.round(rng.exponential(size=n) + 0.05 * rng.normal(size=n), 6)


# ---------------------------------------------------------------------------
# against the brute force


@pytest.mark.parametrize("sign", [-1, 1])
@pytest.mark.parametrize("fraction", [0.999, 0.9, 0.5, 0.25, 0.1])
def test_matches_mpmath_bisection(sign, fraction):
    l = _data()
    want = mp_tilt_for_ess(l, fraction, sign)
    got = tl.tilt_for_ess(l, fraction, sign=sign)
    assert_close(got, want, xp=None, rtol=1e-8)
    assert float(got) * sign > 0


@pytest.mark.parametrize("sign", [-1, 1])
def test_prior_weights_match_mpmath(sign):
    l = _data(1)
    p = np.random.default_rng(2).uniform(0.1, 3.0, size=l.size)
    for fraction in (0.8, 0.3):
        want = mp_tilt_for_ess(l, fraction, sign, prior=p)
        assert_close(tl.tilt_for_ess(l, fraction, sign=sign, weights=p), want, rtol=1e-8)


def test_fraction_close_to_one_keeps_relative_precision():
    # log F ~ -var t^2: the root lies at t ~ 1e-5, where 2 log S1 - log S2 cancels
    l = _data(3)
    for fraction in (1 - 1e-6, 1 - 1e-10):
        want = mp_tilt_for_ess(l, fraction, -1)
        assert_close(tl.tilt_for_ess(l, fraction), want, rtol=1e-8)


def test_far_tail_large_tilts():
    # fractions just above 1/N need |t| far beyond the spread of the losses
    l = _data(4, n=20)
    for sign in (-1, 1):
        fraction = 1 / l.size * (1 + 1e-6)
        want = mp_tilt_for_ess(l, fraction, sign)
        assert_close(tl.tilt_for_ess(l, fraction, sign=sign), want, rtol=1e-8)


# ---------------------------------------------------------------------------
# closed form: two-point losses


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("fraction", [0.95, 0.8, 0.75])
def test_two_point_closed_form(k, fraction):
    # k losses at 1 and n - k at 0; q = k / n. With r = e^t, F = (q r + 1 - q)^2 /
    # (q r^2 + 1 - q), and F = f is the quadratic q (q - f) r^2 + 2 q (1 - q) r +
    # (1 - q)(1 - q - f) = 0, whose discriminant / 4 is q (1 - q) f (1 - f). For t > 0
    # the root above 1 is r = (q (1 - q) + sqrt(q (1 - q) f (1 - f))) / (q (f - q)); for
    # t < 0 swap the two values (q -> 1 - q, t -> -t).
    n = 10
    l = np.array([1.0] * k + [0.0] * (n - k))
    for sign, q in ((1, k / n), (-1, 1 - k / n)):
        if fraction <= q:
            with pytest.raises(ValueError, match="not attainable"):
                tl.tilt_for_ess(l, fraction, sign=sign)
            continue
        disc = math.sqrt(q * (1 - q) * fraction * (1 - fraction))
        r = (q * (1 - q) + disc) / (q * (fraction - q))
        assert r > 1
        assert_close(tl.tilt_for_ess(l, fraction, sign=sign), sign * math.log(r), rtol=1e-10)


# ---------------------------------------------------------------------------
# meaning: the Kish ESS of the tilted weights, priors as frequencies, monotonicity


def test_round_trip_through_public_ess():
    l = _data(5, n=200)
    for fraction, sign in ((0.7, -1), (0.05, -1), (0.3, 1)):
        t = tl.tilt_for_ess(l, fraction, sign=sign)
        ess = effective_sample_size(tl.tilted_weights(l, t))
        assert_close(ess / l.size, fraction, rtol=1e-9)


def test_integer_weights_are_frequencies():
    l = _data(6, n=15)
    counts = np.random.default_rng(7).integers(1, 5, size=l.size)
    expanded = np.repeat(l, counts)
    for fraction, sign in ((0.6, -1), (0.4, 1)):
        a = tl.tilt_for_ess(l, fraction, sign=sign, weights=counts)
        b = tl.tilt_for_ess(expanded, fraction, sign=sign)
        assert_close(a, float(b), rtol=1e-9)


def test_zero_weight_samples_do_not_count():
    l = _data(8, n=10)
    l[3] = 50.0  # the largest loss, with no prior weight
    l[6] = -50.0  # the smallest one, too
    p = np.ones(l.size)
    p[[3, 6]] = 0.0
    keep = np.delete(l, [3, 6])
    for sign in (-1, 1):
        a = tl.tilt_for_ess(l, 0.5, sign=sign, weights=p)
        assert_close(a, float(tl.tilt_for_ess(keep, 0.5, sign=sign)), rtol=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_fraction_is_monotone_in_abs_tilt(seed):
    # d/dt log F = 2 (mu(t) - mu(2t)) with mu non-decreasing: F falls in |t| on both
    # sides, for any prior. Checked at 50 digits on random data and random priors.
    rng = np.random.default_rng(seed)
    l = rng.normal(size=9) * rng.uniform(0.1, 10)
    p = rng.uniform(0, 1, size=9) ** 3
    for sign in (-1, 1):
        vals = [mp_log_fraction(l, sign * 10.0**e, p) for e in np.linspace(-4, 3, 60)]
        # (to 50-digit rounding where F has reached its limit)
        assert all(b <= a + 1e-40 for a, b in zip(vals, vals[1:], strict=False))
        assert vals[-1] < vals[0]
        assert vals[0] <= 0


# ---------------------------------------------------------------------------
# backends


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_backends(xp, dtype_name):
    l64 = _data(9, n=30)
    p = np.random.default_rng(10).uniform(0.5, 2.0, size=l64.size)
    dtype = getattr(xp, dtype_name)
    l = xp.asarray(l64, dtype=dtype)
    host = to_numpy(l).astype(np.float64)  # the losses as rounded to the dtype
    rtol = 1e-8 if dtype_name == "float64" else 2e-7  # the result is rounded to the dtype
    for fraction, sign, prior in ((0.5, -1, None), (0.2, 1, None), (0.6, -1, p)):
        want = mp_tilt_for_ess(host, fraction, sign, prior=prior)
        w = None if prior is None else xp.asarray(prior, dtype=dtype)
        got = tl.tilt_for_ess(l, fraction, sign=sign, weights=w)
        assert_close(got, want, xp=xp, dtype=dtype, rtol=rtol)
        assert got.shape == ()
    assert_close(tl.tilt_for_ess(l, 1.0), 0.0, xp=xp, dtype=dtype)


@pytest.mark.slow  # test_risk.py covers prepare_prior on every backend in push
def test_prior_whose_total_overflows(xp):
    # finite weights whose sum overflows: the uniform prior at the float maximum, and
    # unequal weights near it; the root is that of the normalised prior
    l64 = _data(11, n=6)
    l = xp.asarray(l64)
    for prior in ([1e308] * 6, [1.7e308, 5e307, 1e308, 1.2e308, 3e307, 9e307]):
        for fraction, sign in ((0.5, -1), (0.3, 1)):
            got = tl.tilt_for_ess(l, fraction, sign=sign, weights=xp.asarray(np.array(prior)))
            want = mp_tilt_for_ess(l64, fraction, sign, prior=prior)
            assert_close(got, want, xp=xp, dtype=l.dtype, rtol=1e-8)


def test_torch_losses_that_require_grad():
    # regression: reading the statistics of such losses on the host warned (an error here)
    torch = pytest.importorskip("torch")
    l64 = _data(11, n=25)
    l = torch.tensor(l64, requires_grad=True)
    t = tl.tilt_for_ess(l, 0.4)
    assert not t.requires_grad and t.dtype == torch.float64
    assert_close(t, mp_tilt_for_ess(l64, 0.4, -1), rtol=1e-8)


def test_integer_losses_give_default_float():
    t = tl.tilt_for_ess(np.array([0, 1, 2, 5, 9]), 0.5)
    assert t.dtype == np.float64 and t.shape == ()


# ---------------------------------------------------------------------------
# bad input


def test_equal_losses():
    l = np.full(8, 2.5)
    assert float(tl.tilt_for_ess(l, 1.0)) == 0.0
    with pytest.raises(ValueError, match="all equal"):
        tl.tilt_for_ess(l, 0.9)


def test_fraction_range_and_ties():
    l = np.array([0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 0.5, 1.5, 2.5, 0.25])
    for bad in (0.0, -0.5, 1.5, math.inf):
        with pytest.raises(ValueError, match="`fraction`"):
            tl.tilt_for_ess(l, bad)
    with pytest.raises(ValueError, match="`fraction` must not be NaN"):
        tl.tilt_for_ess(l, math.nan)
    # three of ten samples tie at the largest loss: F(+inf) = 0.3
    with pytest.raises(ValueError, match=r"not attainable.*0\.3"):
        tl.tilt_for_ess(l, 0.3, sign=1)
    assert float(tl.tilt_for_ess(l, 0.31, sign=1)) > 0
    # one sample at the smallest: anything above 1/N is attainable with sign -1
    with pytest.raises(ValueError, match="not attainable"):
        tl.tilt_for_ess(l, 0.1)
    assert float(tl.tilt_for_ess(l, 0.11)) < 0


@pytest.mark.parametrize("bad", ["0.5", None, True, 1j, [0.5, 0.6]])
def test_fraction_type(bad):
    with pytest.raises(TypeError, match="`fraction`"):
        tl.tilt_for_ess(np.arange(4.0), bad)


@pytest.mark.parametrize("bad", [0, 2, -2, 0.5])
def test_sign_value(bad):
    with pytest.raises(ValueError, match="`sign`"):
        tl.tilt_for_ess(np.arange(4.0), 0.5, sign=bad)


@pytest.mark.parametrize("bad", [True, "-1", None])
def test_sign_type(bad):
    with pytest.raises(TypeError, match="`sign`"):
        tl.tilt_for_ess(np.arange(4.0), 0.5, sign=bad)


def test_bad_losses_and_weights():
    with pytest.raises(ValueError, match="`losses` must be 1-d"):
        tl.tilt_for_ess(np.ones((2, 3)), 0.5)
    with pytest.raises(ValueError, match="`losses`"):
        tl.tilt_for_ess(np.array([]), 0.5)
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        tl.tilt_for_ess(np.array([1.0, np.nan]), 0.5)
    with pytest.raises(ValueError, match="`weights`"):
        tl.tilt_for_ess(np.arange(4.0), 0.5, weights=np.ones(3))
    with pytest.raises(ValueError, match="`weights` must be non-negative"):
        tl.tilt_for_ess(np.arange(4.0), 0.5, weights=np.array([1.0, -1.0, 1.0, 1.0]))


# ---------------------------------------------------------------------------
# the whole float range: the root is scale-free, the reference is not told so


def _mp_root_around(losses, fraction, sign, centre):
    """50-digit bisection of log F = log f in x = log|t|, bracketed on a grid of x in
    [centre - 40, centre + 40] (``centre`` near -log(spread))."""
    target = mpmath.log(mpmath.mpf(fraction))

    def h(x):
        return mp_log_fraction(losses, sign * mpmath.exp(x), None) - target

    xs = [mpmath.mpf(centre) + mpmath.mpf(k) / 4 for k in range(-160, 161)]
    assert h(xs[0]) > 0
    lo = xs[0]
    for x in xs[1:]:
        if h(x) <= 0:
            hi = x
            break
        lo = x
    for _ in range(90):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if h(mid) > 0 else (lo, mid)
    return float(sign * mpmath.exp((lo + hi) / 2))


@pytest.mark.parametrize(
    "losses",
    [
        [0.0, 1e200, 2e200, 3e200, 1e201],  # spread beyond sqrt(float max)
        [-1.5e308, 1.0e308, 1.7e308, 0.0],  # spread beyond float max itself
        [1e-300, 3e-300, 2e-300, 7e-300, 5e-300],  # tiny but normal spread
        [1.0, 1.0 + 2**-52, 1.0 + 2**-51, 1.0 + 2**-50],  # spread of a few ulps
    ],
)
@pytest.mark.parametrize("sign", [-1, 1])
def test_spreads_across_the_float_range(losses, sign):
    l = np.array(losses)
    half = float(np.max(l) / 2 - np.min(l) / 2)  # the spread may overflow, its half not
    for fraction in (0.9, 0.5):
        want = _mp_root_around(l, fraction, sign, -math.log(half) - math.log(2.0))
        assert_close(tl.tilt_for_ess(l, fraction, sign=sign), want, rtol=1e-8)


def test_subnormal_spread_raises_value_error():
    # the root lies beyond the float maximum (|t| ~ 1 / spread): the documented ValueError
    l = np.array([0.0, 5e-324, 1e-323, 2e-323])
    with pytest.raises(ValueError, match="outside the range"):
        tl.tilt_for_ess(l, 0.5)
    l32 = np.array([0.0, 1e-44, 3e-44], dtype=np.float32)
    with pytest.raises(ValueError, match="outside the range"):
        tl.tilt_for_ess(l32, 0.5)

"""Tests of tiltlab.tilt_for_kl and the KL radius of tiltlab.bounds, against 50-digit
mpmath: the divergence from its definition, the root by bisection, the worst case."""

from __future__ import annotations

import math
import re

import mpmath
import numpy as np
import pytest

import tiltlab as tl
from tiltlab import bounds
from tiltlab._compat import to_numpy
from tiltlab.testing import assert_close

mpmath.mp.dps = 50


def _prior(losses, prior):
    ps = [mpmath.mpf(1)] * len(losses) if prior is None else [mpmath.mpf(float(q)) for q in prior]
    tot = mpmath.fsum(ps)
    return [q / tot for q in ps]


def mp_kl(losses, t, prior=None):
    """KL(w_t || p) = sum_i w_i log(w_i / p_i) at 50 digits, from the definition."""
    ls = [mpmath.mpf(float(v)) for v in losses]
    ps = _prior(losses, prior)
    t = mpmath.mpf(t)
    m = max(v for v, q in zip(ls, ps, strict=True) if q > 0)
    pairs = zip(ps, ls, strict=True)
    e = [q * mpmath.exp(t * (v - m)) if q > 0 else mpmath.mpf(0) for q, v in pairs]
    z = mpmath.fsum(e)
    terms = (ei / z * mpmath.log(ei / z / q) for ei, q in zip(e, ps, strict=True) if ei > 0)
    return mpmath.fsum(terms)


def mp_tilt_for_kl(losses, radius, prior=None, centre=0.0):
    """Bisection of log KL(t) = log radius in x = log t, bracketed on a grid."""
    target = mpmath.log(mpmath.mpf(radius))

    def h(x):
        return mpmath.log(mp_kl(losses, mpmath.exp(x), prior)) - target

    xs = [mpmath.mpf(centre) + mpmath.mpf(k) / 4 for k in range(-120, 121)]
    assert h(xs[0]) < 0
    lo = xs[0]
    for x in xs[1:]:
        if h(x) >= 0:
            hi = x
            break
        lo = x
    else:  # pragma: no cover
        raise AssertionError("no bracket")
    for _ in range(90):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if h(mid) >= 0 else (mid, hi)
    return float(mpmath.exp((lo + hi) / 2))


def mp_worst_case(losses, radius, prior=None):
    """sup {E_q l : KL(q||p) <= r} = E_{w_t}[l] at the root t, at 50 digits."""
    t = mpmath.mpf(mp_tilt_for_kl(losses, radius, prior))
    ls = [mpmath.mpf(float(v)) for v in losses]
    ps = _prior(losses, prior)
    m = max(ls)
    e = [q * mpmath.exp(t * (v - m)) for q, v in zip(ps, ls, strict=True)]
    return float(mpmath.fsum(ei * v for ei, v in zip(e, ls, strict=True)) / mpmath.fsum(e))


def _data(seed=0, n=15):
    rng = np.random.default_rng(seed)
    return np.round(rng.exponential(size=n) + 0.05 * rng.normal(size=n), 6)


@pytest.mark.parametrize("radius", [1e-12, 1e-6, 0.01, 0.3, 1.0, 2.0])
def test_matches_mpmath_bisection(radius):
    l = _data()
    got = tl.tilt_for_kl(l, radius)
    assert_close(got, mp_tilt_for_kl(l, radius), xp=None, rtol=1e-10)


def test_divergence_at_the_tilt_is_the_radius():
    l = _data(1)
    for radius in (0.05, 0.7):
        t = float(tl.tilt_for_kl(l, radius))
        assert float(mp_kl(l, t)) == pytest.approx(radius, rel=1e-10)


def test_prior_weights_and_zero_weights():
    l = _data(2)
    p = np.random.default_rng(3).uniform(0.1, 3.0, size=l.size)
    p[[1, 4]] = 0.0
    for radius in (0.1, 1.0):
        want = mp_tilt_for_kl(l, radius, prior=p)
        assert_close(tl.tilt_for_kl(l, radius, weights=p), want, rtol=1e-10)


def test_limit_gives_infinity():
    # two of eight samples tied at the maximum: KL(w_t || p) -> log(8 / 2) as t -> inf
    l = np.array([0.1, 0.3, 0.2, 0.4, 6.0, 0.25, 0.15, 6.0])
    assert float(tl.tilt_for_kl(l, math.log(4.0))) == math.inf
    assert float(tl.tilt_for_kl(l, 3.0)) == math.inf
    near = math.log(4.0) * (1 - 1e-6)
    t = float(tl.tilt_for_kl(l, near))
    assert math.isfinite(t) and float(mp_kl(l, t)) == pytest.approx(near, rel=1e-9)
    assert float(tl.tilt_for_kl(np.full(4, 2.0), 0.5)) == math.inf  # equal losses
    assert float(tl.tilt_for_kl(l, 0.0)) == 0.0


@pytest.mark.parametrize("weights", [None, np.ones(21), np.linspace(0.1, 1.0, 21)])
def test_equal_losses_reach_no_positive_radius(weights):
    # equal losses keep the prior at every tilt: KL(w_t || p) = 0, so a positive radius
    # is beyond reach (t = inf), and the entropic value at risk is that common loss
    l = np.full(21, 0.5)
    assert float(tl.tilt_for_kl(l, 1e-300, weights=weights)) == math.inf
    assert float(tl.tilt_for_kl(l, 0.3, weights=weights)) == math.inf
    ev = bounds.entropic_value_at_risk(l, np.array([0.0, 1e-292, 0.5]), weights=weights)
    # the prior's normalisation rounds: a weighted mean of 21 equal losses is within
    # 21 roundings of the loss
    np.testing.assert_allclose(np.asarray(ev), 0.5, rtol=32 * np.finfo(float).eps, atol=0)


@pytest.mark.parametrize("scale", [1e-300, 1e200])
def test_scale_free_across_the_float_range(scale):
    l = _data(4) * scale
    want = mp_tilt_for_kl(l, 0.2, centre=-math.log(scale))
    assert_close(tl.tilt_for_kl(l, 0.2), want, rtol=1e-10)


@pytest.mark.parametrize("losses", [[5e-324, 0.0, 0.0], [0.0, -5e-324, -5e-324]])
def test_a_spread_of_the_smallest_subnormal(losses):
    # half the spread rounds to 0 there; the tilt that reaches the radius is the 50-digit
    # root for the losses [1, 0, 0] divided by the spread 2**-1074, beyond float64: a
    # ValueError that names the radius and gives that tilt, and the EVaR is the largest loss
    l = np.array(losses)
    root = mp_tilt_for_kl([1.0, 0.0, 0.0], 0.5)
    with pytest.raises(ValueError, match="`radius` is reached at the tilt") as err:
        tl.tilt_for_kl(l, 0.5)
    m = re.search(r"the tilt ([0-9.e+-]+) \* 2\*\*(\d+)", str(err.value))
    assert m is not None
    # the root search stops within 1e-12 in log t (its xtol): 1e-10 leaves a margin, as
    # in test_matches_mpmath_bisection
    assert math.isclose(math.ldexp(float(m.group(1)), int(m.group(2)) - 1074), root, rel_tol=1e-10)
    assert float(bounds.entropic_value_at_risk(l, radius=0.5)) == l.max()


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_backends(xp, dtype_name):
    l64 = _data(5, n=30)
    p = np.random.default_rng(6).uniform(0.5, 2.0, size=l64.size)
    dtype = getattr(xp, dtype_name)
    l = xp.asarray(l64, dtype=dtype)
    host = to_numpy(l).astype(np.float64)
    pw = xp.asarray(p, dtype=dtype)
    phost = to_numpy(pw).astype(np.float64)
    rtol = 1e-10 if dtype_name == "float64" else 2e-7
    for radius, w, ph in ((0.3, None, None), (1.2, pw, phost)):
        got = tl.tilt_for_kl(l, radius, weights=w)
        assert_close(got, mp_tilt_for_kl(host, radius, prior=ph), xp=xp, dtype=dtype, rtol=rtol)
        assert got.shape == ()


@pytest.mark.slow  # test_risk.py covers prepare_prior on every backend in push
def test_prior_whose_total_overflows(xp):
    # finite weights whose sum overflows: the uniform prior at the float maximum, and
    # unequal weights near it; the root is that of the normalised prior
    l64 = _data(7, n=6)
    l = xp.asarray(l64)
    for prior in ([1e308] * 6, [1.7e308, 5e307, 1e308, 1.2e308, 3e307, 9e307]):
        for radius in (0.1, 0.5):
            got = tl.tilt_for_kl(l, radius, weights=xp.asarray(np.array(prior)))
            want = mp_tilt_for_kl(l64, radius, prior=prior)
            assert_close(got, want, xp=xp, dtype=l.dtype, rtol=1e-10)


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (-0.1, ValueError, "`radius` must be a non-negative"),
        (float("nan"), ValueError, "`radius`"),
        ("1", TypeError, "`radius`"),
    ],
)
def test_bad_radius(bad, exc, match):
    with pytest.raises(exc, match=match):
        tl.tilt_for_kl(np.arange(4.0), bad)


def test_bad_losses():
    with pytest.raises(ValueError, match="1-d"):
        tl.tilt_for_kl(np.ones((2, 3)), 0.1)
    with pytest.raises(ValueError, match="losses"):
        tl.tilt_for_kl(np.array([1.0, np.nan]), 0.1)


# ---------------------------------------------------------------------------
# bounds: the radius in the entropic value at risk and the KL view


def test_evar_radius_matches_mpmath_and_alpha():
    l = _data(7)
    for radius in (0.05, 1.0):
        want = mp_worst_case(l, radius)
        assert_close(bounds.entropic_value_at_risk(l, radius=radius), want, rtol=1e-12)
        alpha = -math.expm1(-radius)
        assert_close(bounds.entropic_value_at_risk(l, alpha), want, rtol=1e-12)


def test_evar_radius_beyond_what_alpha_can_express():
    # alpha = 1 - exp(-40) rounds to 1; with a prior mass 1e-20 on the largest loss the
    # worst case at radius 40 is still below the maximum, at a finite tilt
    l = _data(8, n=10)
    p = np.ones(l.size)
    p[int(np.argmax(l))] = 1e-20
    want = mp_worst_case(l, 40.0, prior=p)
    got, t = bounds.entropic_value_at_risk(l, radius=40.0, weights=p, return_tilt=True)
    assert_close(got, want, rtol=1e-10)
    assert math.isfinite(float(t)) and float(got) < float(np.max(l))
    assert float(bounds.entropic_value_at_risk(l, radius=np.inf)) == float(np.max(l))


def test_evar_radius_arguments():
    l = _data(9)
    with pytest.raises(TypeError, match="exactly one of `alpha`"):
        bounds.entropic_value_at_risk(l, 0.5, radius=0.3)
    with pytest.raises(TypeError, match="exactly one of `alpha`"):
        bounds.entropic_value_at_risk(l)
    with pytest.raises(ValueError, match="`radius` must be >= 0"):
        bounds.entropic_value_at_risk(l, radius=-1.0)
    got = bounds.entropic_value_at_risk(l, radius=np.array([0.0, 0.5]))
    assert_close(got[0], np.mean(l), rtol=1e-14)
    assert_close(got[1], mp_worst_case(l, 0.5), rtol=1e-12)


def test_kl_view_with_radius(xp):
    L = np.stack([_data(10), _data(11)])
    got_v, got_q = bounds.kl_dro_dual(xp.asarray(L), radius=0.4)
    for i in range(2):
        assert_close(got_v[i], mp_worst_case(L[i], 0.4), xp=xp, rtol=1e-10)
        q = to_numpy(got_q[i, :])
        kl = float(np.sum(q[q > 0] * np.log(q[q > 0] * L.shape[1])))
        assert kl == pytest.approx(0.4, rel=1e-9)
    q = bounds.worst_case_distribution(xp.asarray(L[0]), radius=0.4)
    assert_close(q, to_numpy(got_q[0, :]), xp=xp, rtol=1e-12)
    with pytest.raises(TypeError, match="exactly one of `t`"):
        bounds.kl_dro_dual(L, 1.0, radius=0.4)

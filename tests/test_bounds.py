"""Tests of tiltlab.bounds against 50-digit mpmath, exact rational arithmetic,
scipy (linprog, rel_entr) and closed forms in which the bounds are attained."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from _contract import reference_tilted
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.optimize import linprog
from scipy.special import rel_entr

from tiltlab import bounds as tb
from tiltlab._compat import to_numpy
from tiltlab.testing import assert_close

mpmath.mp.dps = 50


# ---------------------------------------------------------------------------
# references (independent of the code under test)


def _mp(v):
    return v if isinstance(v, mpmath.mpf) else mpmath.mpf(float(v))


def _prior(n, prior):
    ps = [mpmath.mpf(1)] * n if prior is None else [_mp(q) for q in prior]
    total = mpmath.fsum(ps)
    return [q / total for q in ps]


def ref_mgf(values, t, prior=None):
    """E_p[exp(t l)] at 50 digits."""
    ps = _prior(len(values), prior)
    t = _mp(t)
    return mpmath.fsum(q * mpmath.exp(t * _mp(v)) for q, v in zip(ps, values, strict=True))


def ref_risk(values, t, prior=None):
    ps = None if prior is None else [_mp(q) for q in prior]
    return reference_tilted([_mp(v) for v in values], t, ps)[0]


def ref_tail_bound(values, a, t, floor=0.0, prior=None):
    """The theorem's ratio, evaluated naively (no overflow at 50 digits)."""
    a, F = _mp(a), _mp(floor)
    if t == 0:
        return (ref_risk(values, 0, prior) - F) / (a - F)
    t = _mp(t)
    # numerator and denominator divided by e^{tF}; expm1 keeps tiny t exact at 50 digits
    ps = _prior(len(values), prior)
    num = mpmath.fsum(q * mpmath.expm1(t * (_mp(v) - F)) for q, v in zip(ps, values, strict=True))
    return num / mpmath.expm1(t * (a - F))


def ref_kl_tilted(values, t, prior=None):
    """KL(w_t || p) for the tilted weights w_t, at 50 digits."""
    ps = _prior(len(values), prior)
    t = _mp(t)
    r = ref_risk(values, t, prior)
    w = [q * mpmath.exp(t * (_mp(v) - r)) for q, v in zip(ps, values, strict=True)]
    return mpmath.fsum(
        wi * t * (_mp(v) - r) for wi, v, q in zip(w, values, ps, strict=True) if q > 0
    )


def ref_evar(values, alpha, prior=None):
    """EVaR by solving KL(w_t || p) = log(1/(1-alpha)) with mpmath.findroot, after a
    bracketing scan; returns (value, tilt). Also checks the root minimises g."""
    level = -mpmath.log1p(-_mp(alpha))
    ps = _prior(len(values), prior)
    top = max(values)
    if -mpmath.log(mpmath.fsum(q for q, v in zip(ps, values, strict=True) if v == top)) <= level:
        return _mp(top), mpmath.inf  # KL(w_t || p) stays below the level: t -> inf

    def g(t):
        return ref_risk(values, t, prior) + level / t

    def h(s):
        return ref_kl_tilted(values, mpmath.exp(s), prior) - level

    grid = [mpmath.mpf(s) / 4 for s in range(-80, 81)]
    signs = [h(s) for s in grid]
    k = next(i for i in range(len(grid) - 1) if signs[i] < 0 <= signs[i + 1])
    s = mpmath.findroot(h, (grid[k], grid[k + 1]), solver="anderson")
    t = mpmath.exp(s)
    assert g(t) <= g(t * (1 + mpmath.mpf("1e-6"))) and g(t) <= g(t * (1 - mpmath.mpf("1e-6")))
    return g(t), t


def ref_var(values, alpha, prior=None):
    """Lower alpha-quantile with exact rational cumulative masses."""
    n = len(values)
    ps = [Fraction(1)] * n if prior is None else [Fraction(float(q)) for q in prior]
    total = sum(ps)
    al = Fraction(float(alpha))
    cands = [v for v, q in zip(values, ps, strict=True) if q > 0]
    best = math.inf
    for c in cands:
        mass = sum(q for v, q in zip(values, ps, strict=True) if v <= c) / total
        if mass >= al:
            best = min(best, c)
    return best


def ref_cvar_exact(values, alpha, prior=None):
    """Rockafellar-Uryasev minimum, exactly: the objective is convex and piecewise
    linear in c, so its minimum is attained at one of the losses."""
    n = len(values)
    ps = [Fraction(1)] * n if prior is None else [Fraction(float(q)) for q in prior]
    total = sum(ps)
    ps = [q / total for q in ps]
    s = 1 - Fraction(float(alpha))
    vals = [Fraction(float(v)) for v in values]

    def ru(c):
        return c + sum(q * max(v - c, 0) for q, v in zip(ps, vals, strict=True)) / s

    return float(min(ru(c) for c in vals))


def ref_cvar_lp(values, alpha, prior=None):
    """Rockafellar-Uryasev minimum by linear programming (scipy HiGHS)."""
    values = np.asarray(values, dtype=float)
    n = values.size
    p = np.full(n, 1.0 / n) if prior is None else np.asarray(prior, float) / np.sum(prior)
    s = 1.0 - alpha
    cost = np.concatenate(([1.0], p / s))  # variables (c, z_1..z_n)
    a_ub = np.hstack((-np.ones((n, 1)), -np.eye(n)))  # l_i - c - z_i <= 0
    bounds = [(None, None)] + [(0, None)] * n
    res = linprog(cost, A_ub=a_ub, b_ub=-values, bounds=bounds, method="highs")
    assert res.status == 0
    return res.fun


def to_xp(xp, a, dtype=None):
    out = xp.asarray(np.asarray(a))
    if dtype is not None:
        out = xp.astype(out, getattr(xp, dtype))
    return out


def npf(x):
    return np.asarray(to_numpy(x), dtype=np.float64)


# ---------------------------------------------------------------------------
# tail fraction, k-loss


def test_tail_fraction_counts_ties_and_weights():
    l = np.array([0.0, 1.0, 1.0, 2.0, 5.0])
    got = tb.tail_fraction(l, np.array([-1.0, 0.0, 1.0, 1.5, 5.0, 6.0]))
    assert_close(got, np.array([1.0, 1.0, 0.8, 0.4, 0.2, 0.0]), rtol=0)
    w = np.array([1.0, 2.0, 3.0, 0.0, 4.0])
    assert_close(tb.tail_fraction(l, 1.0, weights=w), np.asarray(0.9), rtol=1e-15)


def test_tail_fraction_batch_axis():
    rng = np.random.default_rng(1)
    L = rng.random((4, 9, 3))
    a = np.array([0.2, 0.5, 0.9])
    got = npf(tb.tail_fraction(L, a, axis=1))
    assert got.shape == (3, 4, 3)
    want = np.stack([(L >= ai).mean(axis=1) for ai in a])
    np.testing.assert_array_equal(got, want)


def test_k_loss_is_order_statistic():
    rng = np.random.default_rng(2)
    L = rng.normal(size=(3, 11))
    for k in (1, 4, 11):
        np.testing.assert_array_equal(npf(tb.k_loss(L, k)), np.sort(L, axis=1)[:, k - 1])
    np.testing.assert_array_equal(npf(tb.k_loss(L.T, 2, axis=0)), np.sort(L, axis=1)[:, 1])


@settings(max_examples=60, deadline=None)
@given(
    l=hnp.arrays(np.float64, st.integers(1, 12), elements=st.sampled_from([0.0, 0.5, 1.0, 2.0])),
    data=st.data(),
)
def test_k_loss_has_tail_share_at_least_n_minus_k_plus_1(l, data):
    # the counting fact behind the k-loss corollary: Q(R_(k)) >= (N - k + 1) / N
    n = l.size
    k = data.draw(st.integers(1, n))
    q = float(tb.tail_fraction(l, tb.k_loss(l, k)))
    assert q >= (n - k + 1) / n - 1e-15


# ---------------------------------------------------------------------------
# value-at-risk and superquantile


ALPHAS = [0.0, 0.1, 0.25, 0.3, 0.5, 0.55, 0.7, 0.9, 0.93, 0.999]


@pytest.mark.parametrize("weighted", [False, True])
def test_superquantile_matches_rockafellar_uryasev(weighted):
    rng = np.random.default_rng(3)
    l = np.round(rng.gamma(2.0, size=13), 2)
    l[[2, 7]] = l[5]  # ties at one atom
    prior = rng.uniform(0.1, 2.0, size=13) if weighted else None
    got = npf(tb.superquantile(l, np.array(ALPHAS), weights=prior))
    exact = [ref_cvar_exact(l, a, prior) for a in ALPHAS]
    lp = [ref_cvar_lp(l, a, prior) for a in ALPHAS]
    np.testing.assert_allclose(got, exact, rtol=1e-13)
    np.testing.assert_allclose(got, lp, rtol=1e-8)
    var = npf(tb.value_at_risk(l, np.array(ALPHAS), weights=prior))
    np.testing.assert_array_equal(var, [ref_var(l, a, prior) for a in ALPHAS])


def test_superquantile_fractional_atom_closed_form():
    l = np.array([1.0, 2.0, 3.0, 4.0])
    # top mass 1.5 samples: 4 whole and half of 3
    assert_close(tb.superquantile(l, 0.625), np.asarray((4 + 0.5 * 3) / 1.5), rtol=1e-15)
    # alpha = 0.7 with N = 10: N (1 - alpha) = 3 exactly in rationals, not 2.9999999999999996
    l10 = np.arange(1.0, 11.0)
    assert_close(tb.superquantile(l10, 0.7), np.asarray(9.0), rtol=1e-15)
    assert float(tb.value_at_risk(l10, 0.7)) == 7.0
    assert float(tb.superquantile(l10, 0.0)) == 5.5
    assert float(tb.value_at_risk(l10, 0.0)) == 1.0


def test_var_and_cvar_ignore_zero_weight_samples():
    l = np.array([-5.0, 1.0, 2.0, 100.0])
    w = np.array([0.0, 1.0, 1.0, 0.0])
    assert float(tb.value_at_risk(l, 0.0, weights=w)) == 1.0
    assert float(tb.superquantile(l, 0.0, weights=w)) == 1.5
    assert float(tb.superquantile(l, 0.9, weights=w)) == 2.0


def test_quantile_risks_batch_axis():
    rng = np.random.default_rng(4)
    L = rng.random((5, 8, 2))
    w = rng.uniform(0.5, 1.0, size=8)
    alphas = np.array([0.2, 0.65])
    got = npf(tb.superquantile(L, alphas, axis=1, weights=w))
    var = npf(tb.value_at_risk(L, alphas, axis=1, weights=w))
    assert got.shape == var.shape == (2, 5, 2)
    for i, a in enumerate(alphas):
        for r in range(5):
            for c in range(2):
                assert got[i, r, c] == pytest.approx(ref_cvar_exact(L[r, :, c], a, w), rel=1e-13)
                assert var[i, r, c] == ref_var(L[r, :, c], a, w)


# ---------------------------------------------------------------------------
# tilted tail bound


BOUND_TILTS = [-1e3, -50.0, -1.0, -1e-3, -1e-12, 0.0, 1e-12, 1e-3, 1.0, 7.5, 50.0, 1e3]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("floor", [0.0, -0.3])
def test_tilted_tail_bound_matches_mpmath(weighted, floor):
    rng = np.random.default_rng(5)
    l = rng.uniform(0.0, 1.0, size=40)
    prior = rng.uniform(0.2, 1.0, size=40) if weighted else None
    a = np.array([0.05, 0.5, 0.9, 1.2])
    got = npf(tb.tilted_tail_bound(l, a, np.array(BOUND_TILTS), floor=floor, weights=prior))
    assert got.shape == (len(BOUND_TILTS), a.size)
    want = np.array(
        [[float(ref_tail_bound(l, ai, t, floor, prior)) for ai in a] for t in BOUND_TILTS]
    )
    # the bound at t = 1e3 reaches 1e+300 or 1e-200: the naive form overflows there
    assert np.max(want) > 1e200 and np.min(want) < 1e-80
    np.testing.assert_allclose(got, want, rtol=1e-11)
    # it really is a bound on the tail share, at every tilt
    q = npf(tb.tail_fraction(l, a, weights=prior))
    assert np.all(q <= got * (1 + 1e-12))


def test_tilted_tail_bound_continuous_at_zero():
    l = np.array([0.2, 0.3, 1.1, 2.5, 0.0])
    a = 1.7
    at_zero = float(tb.tilted_tail_bound(l, a, 0.0, floor=-0.5))
    markov = (mpmath.fsum(_mp(v) for v in l) / 5 + mpmath.mpf("0.5")) / (_mp(a) + mpmath.mpf("0.5"))
    assert at_zero == pytest.approx(float(markov), rel=1e-15)
    for t in (1e-12, -1e-12, 1e-300, -1e-300):
        near = float(tb.tilted_tail_bound(l, a, t, floor=-0.5))
        assert near == pytest.approx(float(ref_tail_bound(l, a, t, -0.5)), rel=1e-13)
        assert near == pytest.approx(at_zero, rel=1e-10)


def test_tilted_tail_bound_infinite_tilts_are_limits():
    l = np.array([0.0, 0.0, 0.4, 1.0, 1.0])  # mass 0.4 at the maximum and at the floor
    a = np.array([0.3, 1.0, 1.5])
    got = npf(tb.tilted_tail_bound(l, a, np.array([-np.inf, np.inf])))
    np.testing.assert_array_equal(got[1], [np.inf, 0.4, 0.0])
    np.testing.assert_array_equal(got[0], [0.6, 0.6, 0.6])  # share strictly above F = 0
    big = [[float(ref_tail_bound(l, ai, t)) for ai in a[1:]] for t in (-1e5, 1e5)]
    np.testing.assert_allclose(got[:, 1:], big, rtol=1e-10, atol=1e-300)


def test_tilted_tail_bound_is_attained_by_two_point_losses():
    # losses at F or at a: Lemma-indicator equality, so Q(a) equals the bound at every t
    n, m, a = 7, 3, 2.5
    l = np.array([0.0] * (n - m) + [a] * m)
    b = npf(tb.tilted_tail_bound(l, a, np.array(BOUND_TILTS)))
    np.testing.assert_allclose(b, np.full(len(BOUND_TILTS), m / n), rtol=1e-12)


def test_tilted_tail_bound_float32():
    rng = np.random.default_rng(6)
    l = rng.uniform(0.0, 1.0, size=30)
    ts = np.array([-40.0, -1.0, 0.0, 1e-6, 1.0, 40.0])
    got = tb.tilted_tail_bound(l.astype(np.float32), 0.7, ts.astype(np.float32))
    assert got.dtype == np.float32
    want = [float(ref_tail_bound(l.astype(np.float32), 0.7, float(np.float32(t)))) for t in ts]
    np.testing.assert_allclose(got, want, rtol=2e-4)


# ---------------------------------------------------------------------------
# Chernoff bound


def test_chernoff_bound_matches_mpmath():
    rng = np.random.default_rng(7)
    l = rng.normal(size=25)
    ts = np.array([0.0, 1e-9, 0.5, 3.0, 100.0, 2e3])
    a = np.array([-1.0, 0.5, 2.0])
    got = npf(tb.chernoff_bound(l, a, ts))
    want = [[float(ref_mgf(l, t) * mpmath.exp(-_mp(t) * _mp(ai))) for ai in a] for t in ts]
    np.testing.assert_allclose(got, want, rtol=1e-11)
    assert_close(tb.chernoff_bound(l, l.max() + 0.5, np.inf), np.asarray(0.0), rtol=0)
    assert_close(tb.chernoff_bound(l, l.max() - 0.5, np.inf), np.asarray(np.inf), rtol=0)
    assert float(tb.chernoff_bound(l, l.max(), np.inf)) == pytest.approx(1 / 25)


# ---------------------------------------------------------------------------
# k-loss bound


def ref_k_bound(values, k, t, floor=0.0, paper=False):
    """The explicit bound: F + log((e^{u} - j/N) / (1 - j/N)) / t with u = t (R - F),
    j = k (the paper's corollary) or k - 1 (the count Q(R_(k)) >= (N-k+1)/N)."""
    with mpmath.workdps(400):  # e^{t (R - F)} - j/N may cancel far beyond 50 digits
        n, F = len(values), _mp(floor)
        j = mpmath.mpf(k if paper else k - 1) / n
        if t == 0:
            return F + (ref_risk(values, 0) - F) / (1 - j)
        t = _mp(t)
        e = mpmath.exp(t * (ref_risk(values, t) - F))
        arg = (e - j) / (1 - j)
        return F + mpmath.log(arg) / t if arg > 0 else mpmath.inf


@pytest.mark.parametrize("paper", [False, True])
def test_k_loss_bound_matches_mpmath(paper):
    rng = np.random.default_rng(8)
    l = rng.exponential(size=15)
    ts = [-30.0, -2.0, -1e-12, 0.0, 1e-12, 0.3, 2.0, 30.0, 1e3]
    for k in (1, 5, 14, 15):
        if paper and k == 15:
            continue
        got = npf(tb.k_loss_bound(l, k, np.array(ts), floor=-0.1, paper_constant=paper))
        want = np.array([float(ref_k_bound(l, k, t, -0.1, paper)) for t in ts])
        np.testing.assert_allclose(got, want, rtol=1e-11)
        assert np.all(got >= np.sort(l)[k - 1])


@pytest.mark.parametrize("k", [2, 3, 6])
def test_k_loss_bound_negative_tilts_with_floor_at_a_loss(k):
    # two losses at F: the t < 0 bound stays finite for k <= 3; at k = 3, forming
    # 1 + c (e^{t (R - F)} - 1) from R(t) cancels to 0 at t = -300 (a false +inf)
    rng = np.random.default_rng(16)
    l = np.round(rng.uniform(0.1, 1.0, size=8), 3)
    l[[0, 4]] = 0.0
    ts = np.array([-300.0, -30.0, -2.0, -1e-6])
    got = npf(tb.k_loss_bound(l, k, ts, floor=0.0))
    want = np.array([float(ref_k_bound(l, k, t)) for t in ts])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.all(got >= np.sort(l)[k - 1])


def test_k_loss_bound_is_attained_and_paper_constant_is_looser():
    # k - 1 losses at the floor and N - k + 1 at b: the sharp bound equals R_(k) = b
    n, k, b = 9, 4, 1.3
    l = np.array([0.0] * (k - 1) + [b] * (n - k + 1))
    ts = np.array([-1e4, -20.0, -1.0, -1e-9, 0.0, 0.5, 3.0, 40.0])
    sharp = npf(tb.k_loss_bound(l, k, ts))
    np.testing.assert_allclose(sharp, np.full(ts.size, b), rtol=1e-12)
    paper = npf(tb.k_loss_bound(l, k, ts, paper_constant=True))
    assert np.all(paper > b * (1 + 1e-6))


def test_k_loss_bound_special_tilts():
    l = np.array([0.0, 0.0, 0.5, 2.0])
    got = npf(tb.k_loss_bound(l, 2, np.array([-np.inf, np.inf])))
    np.testing.assert_array_equal(got, [0.0, 2.0])  # two losses at F, so R_(2) <= F
    # k = 3: the two smallest losses sit at F, so the t < 0 bound stays finite and tends
    # to R_(3) (forming 1 + c (e^{t (R - F)} - 1) from R(t) would underflow to 0 here)
    got3 = npf(tb.k_loss_bound(l, 3, np.array([-np.inf, -1e4])))
    assert got3[0] == 0.5
    assert got3[1] == pytest.approx(0.5 + math.log(2) / 1e4, rel=1e-13)
    got4 = npf(tb.k_loss_bound(l, 4, np.array([-np.inf, -1e4])))
    np.testing.assert_array_equal(got4, [np.inf, np.inf])
    # k = 1: R(t) itself; k = N: below max + log(N)/t
    assert float(tb.k_loss_bound(l, 1, 3.0)) == pytest.approx(float(ref_risk(l, 3.0)), rel=1e-14)
    assert float(tb.k_loss_bound(l, 4, 3.0)) <= float(ref_risk(l, 3.0)) + math.log(4) / 3


# ---------------------------------------------------------------------------
# entropic value-at-risk


@pytest.mark.parametrize("weighted", [False, True])
def test_evar_matches_mpmath(weighted):
    rng = np.random.default_rng(9)
    l = rng.gamma(1.5, size=12)
    prior = rng.uniform(0.3, 1.0, size=12) if weighted else None
    alphas = np.array([1e-6, 0.05, 0.5, 0.8, 0.9])
    val, tilt = tb.entropic_value_at_risk(l, alphas, weights=prior, return_tilt=True)
    for a, v, t in zip(alphas, npf(val), npf(tilt), strict=True):
        rv, rt = ref_evar(l, a, prior)
        assert v == pytest.approx(float(rv), rel=1e-12)
        assert t == pytest.approx(float(rt), rel=1e-7)


def test_evar_limits():
    l = np.array([1.0, 2.0, 4.0, 4.0])
    v0, t0 = tb.entropic_value_at_risk(l, 0.0, return_tilt=True)
    assert float(v0) == 2.75 and float(t0) == 0.0
    # mass 1/2 at the maximum >= 1 - alpha: the infimum is the maximum, as t -> inf
    v, t = tb.entropic_value_at_risk(l, 0.5, return_tilt=True)
    assert float(v) == 4.0 and float(t) == math.inf
    v, t = tb.entropic_value_at_risk(l, 0.4, return_tilt=True)
    assert float(v) < 4.0 and math.isfinite(float(t))
    assert float(tb.entropic_value_at_risk(np.full(5, 3.0), 0.9)) == 3.0


def test_evar_is_the_kl_ball_maximum():
    # at the optimal tilt, KL(w_t || p) = log(1/(1-alpha)) and EVaR = E_w[l]
    rng = np.random.default_rng(10)
    l = rng.normal(size=20)
    alpha = 0.7
    v, t = tb.entropic_value_at_risk(l, alpha, return_tilt=True)
    w = npf(tb.worst_case_distribution(l, float(t)))
    assert float(tb.kl_divergence(w)) == pytest.approx(-math.log1p(-alpha), rel=1e-9)
    assert float(v) == pytest.approx(float(w @ l), rel=1e-9)


def test_evar_batch_axis():
    rng = np.random.default_rng(11)
    L = rng.random((6, 3))
    got = npf(tb.entropic_value_at_risk(L, np.array([0.3, 0.6]), axis=0))
    assert got.shape == (2, 3)
    for c in range(3):
        assert got[1, c] == pytest.approx(float(ref_evar(L[:, c], 0.6)[0]), rel=1e-12)


# ---------------------------------------------------------------------------
# KL-DRO view


@pytest.mark.parametrize("t", [-3.0, -0.2, 0.4, 2.0, 25.0])
def test_kl_dro_value_and_maximiser(t):
    rng = np.random.default_rng(12)
    l = rng.normal(size=10)
    p = rng.uniform(0.2, 1.0, size=10)
    p_n = p / p.sum()
    value, q = tb.kl_dro_dual(l, t, weights=p)
    assert float(value) == pytest.approx(float(ref_risk(l, t, p)), rel=1e-13)
    q = npf(q)

    def objective(r):
        return float(r @ l - np.sum(rel_entr(r, p_n)) / t)

    best = objective(q)
    assert best == pytest.approx(float(value), rel=1e-12)
    sign = 1.0 if t > 0 else -1.0  # a maximum for t > 0, a minimum for t < 0
    for _ in range(25):
        d = rng.normal(size=10)
        d -= d.mean()
        for eps in (1e-3, 1e-1):
            r = np.clip(q + eps * d * q, 0, None)
            r /= r.sum()
            assert sign * objective(r) <= sign * best + 1e-12


def test_kl_dro_infinite_and_zero_tilt():
    l = np.array([0.0, 3.0, 3.0, 1.0])
    v, q = tb.kl_dro_dual(l, np.array([0.0, np.inf]))
    np.testing.assert_array_equal(npf(v), [1.75, 3.0])
    np.testing.assert_array_equal(npf(q), [[0.25] * 4, [0.0, 0.5, 0.5, 0.0]])


def test_kl_divergence_matches_scipy():
    rng = np.random.default_rng(13)
    q = rng.random((3, 6))
    q[0, 2] = 0.0
    p = rng.random(6)
    got = npf(tb.kl_divergence(q, p))
    qn = q / q.sum(axis=1, keepdims=True)
    want = np.sum(rel_entr(qn, p / p.sum()), axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert float(tb.kl_divergence(np.array([0.5, 0.5]), np.array([1.0, 0.0]))) == math.inf
    assert float(tb.kl_divergence(np.array([0.0, 1.0]), np.array([1.0, 1.0]))) == pytest.approx(
        math.log(2), rel=1e-15
    )
    np.testing.assert_allclose(npf(tb.kl_divergence(q.T, p, axis=0)), want, rtol=1e-13)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kl_divergence_of_weights_whose_sum_overflows(dtype):
    # q and p are normalised first, so only the ratios of their entries matter; finite
    # entries near the largest float must not turn the sums into inf
    big = dtype(float(np.finfo(dtype).max) * 0.9)
    cases = [([big, big], [1.0, 3.0]), ([1.0, 3.0], [big, big]), ([big, big / 4, 0], [big] * 3)]
    for qv, pv in cases:
        with mpmath.workdps(50):
            qm = [mpmath.mpf(float(dtype(v))) for v in qv]
            pm = [mpmath.mpf(float(dtype(v))) for v in pv]
            qm = [v / sum(qm) for v in qm]
            pm = [v / sum(pm) for v in pm]
            terms = [a * mpmath.log(a / b) for a, b in zip(qm, pm, strict=True) if a > 0]
            want, size = float(sum(terms)), float(sum(abs(v) for v in terms))
        got = tb.kl_divergence(np.array(qv, dtype=dtype), np.array(pv, dtype=dtype))
        assert got.dtype == dtype
        # a sum of terms with rounding errors of relative size eps
        assert abs(float(got) - want) <= 32 * float(np.finfo(dtype).eps) * size


# ---------------------------------------------------------------------------
# properties (hypothesis)


nonneg_losses = hnp.arrays(
    np.float64,
    st.integers(1, 25),
    elements=st.floats(0.0, 100.0, allow_nan=False, allow_infinity=False),
)
any_losses = hnp.arrays(
    np.float64,
    st.integers(1, 25),
    elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
)
tilts = st.floats(-50.0, 50.0, allow_nan=False)
levels = st.floats(0.0, 0.999, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(l=nonneg_losses, t=tilts, frac=st.floats(1e-6, 1.0), use_w=st.booleans(), data=st.data())
def test_property_tail_bound_holds(l, t, frac, use_w, data):
    assume(l.max() > 0)
    a = frac * l.max()
    assume(a > 0)  # frac * a subnormal maximum can underflow to the floor
    w = None
    if use_w:
        w = data.draw(hnp.arrays(np.float64, l.size, elements=st.floats(0.01, 1.0)))
    q = float(tb.tail_fraction(l, a, weights=w))
    b = float(tb.tilted_tail_bound(l, a, t, weights=w))
    assert q <= b * (1 + 1e-9) + 1e-12
    if t > 0:
        c = float(tb.chernoff_bound(l, a, t, weights=w))
        assert q <= c * (1 + 1e-9) + 1e-300
        if c < 1:  # the floor only helps
            assert b <= c * (1 + 1e-9)


def test_tail_bound_with_a_prior_on_subnormal_losses(xp):
    # two equal subnormal losses with a uniform prior: the prior-weighted mean rounds to
    # 0 (half the smallest subnormal), which made the bound 0 below Q(a) = 1; the tilted
    # risk lies between the smallest and largest loss on the support, whatever rounds
    tiny = float(np.nextafter(0.0, 1.0))
    l = xp.asarray([tiny, tiny], dtype=xp.float64)
    t = xp.asarray([-1.0, 0.0, 1.0], dtype=xp.float64)
    for w in (None, [1.0, 1.0], [0.5, 1.0]):
        ww = None if w is None else xp.asarray(w, dtype=xp.float64)
        assert float(tb.tail_fraction(l, tiny, weights=ww)) == 1.0
        b = tb.tilted_tail_bound(l, tiny, t, weights=ww)
        assert type(b) is type(l) and b.dtype == l.dtype
        assert np.all(np.asarray(to_numpy(b)) >= 1.0), (w, b)


@settings(max_examples=100, deadline=None)
@given(l=nonneg_losses, t=tilts, paper=st.booleans(), data=st.data())
def test_property_k_loss_bound_holds(l, t, paper, data):
    n = l.size
    assume(not (paper and n == 1))
    k = data.draw(st.integers(1, n - 1 if paper else n))
    kl = float(tb.k_loss(l, k))
    b = float(tb.k_loss_bound(l, k, t, paper_constant=paper))
    assert kl <= b + 1e-9 * max(1.0, kl)
    if paper:
        sharp = float(tb.k_loss_bound(l, k, t))
        assert sharp <= b + 1e-12 * max(1.0, abs(b))


@settings(max_examples=80, deadline=None)
@given(l=any_losses, a1=levels, a2=levels, use_w=st.booleans(), data=st.data())
def test_property_quantile_risk_ordering(l, a1, a2, use_w, data):
    lo, hi = sorted((a1, a2))
    w = None
    if use_w:
        w = data.draw(hnp.arrays(np.float64, l.size, elements=st.floats(0.01, 1.0)))
    tol = 1e-11 * max(1.0, float(np.max(np.abs(l))))
    var = npf(tb.value_at_risk(l, np.array([lo, hi]), weights=w))
    cv = npf(tb.superquantile(l, np.array([lo, hi]), weights=w))
    ev = npf(tb.entropic_value_at_risk(l, np.array([lo, hi]), weights=w))
    mean = float(np.average(l, weights=w))
    assert np.all(var <= cv + tol)
    assert cv[0] <= cv[1] + tol
    assert np.all(mean - tol <= cv) and np.all(cv <= l.max() + tol)
    assert np.all(cv <= ev + tol) and np.all(ev <= l.max() + tol)
    assert ev[0] <= ev[1] + tol


# ---------------------------------------------------------------------------
# backends


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_backends_keep_namespace_and_dtype(xp, dtype):
    rng = np.random.default_rng(14)
    l = rng.uniform(0.0, 2.0, size=(3, 16))
    w = rng.uniform(0.2, 1.0, size=16)
    x = to_xp(xp, l, dtype)
    wx = to_xp(xp, w, dtype)
    l_ref = np.asarray(l, dtype=dtype).astype(np.float64)
    w_ref = np.asarray(w, dtype=dtype).astype(np.float64)
    rtol = 1e-12 if dtype == "float64" else 2e-5
    dt = x.dtype

    a = np.array([0.5, 1.0, 1.5])
    want_q = np.stack([np.average(l_ref >= ai, axis=1, weights=w_ref) for ai in a])
    assert_close(
        tb.tail_fraction(x, to_xp(xp, a, dtype), weights=wx), want_q, xp=xp, dtype=dt, rtol=rtol
    )
    assert_close(tb.k_loss(x, 5), np.sort(l_ref, axis=1)[:, 4], xp=xp, dtype=dt, rtol=0)

    alphas = np.array([0.0, 0.3, 0.85])
    want_cv = [[ref_cvar_exact(row, al, w_ref) for row in l_ref] for al in alphas]
    assert_close(
        tb.superquantile(x, alphas, weights=wx), np.array(want_cv), xp=xp, dtype=dt, rtol=rtol
    )
    want_cv_u = [[ref_cvar_exact(row, al) for row in l_ref] for al in alphas]
    assert_close(tb.superquantile(x, alphas), np.array(want_cv_u), xp=xp, dtype=dt, rtol=rtol)
    want_var = [[ref_var(row, al, w_ref) for row in l_ref] for al in alphas]
    assert_close(
        tb.value_at_risk(x, alphas, weights=wx), np.array(want_var), xp=xp, dtype=dt, rtol=0
    )

    ts = np.array([-20.0, 0.0, 0.5, 20.0])
    tx = to_xp(xp, ts, dtype)
    want_b = [
        [[float(ref_tail_bound(row, ai, t)) for row in l_ref] for ai in (0.7, 1.4)] for t in ts
    ]
    bound_rtol = 1e-11 if dtype == "float64" else 5e-4
    assert_close(
        tb.tilted_tail_bound(x, [0.7, 1.4], tx), np.array(want_b), xp=xp, dtype=dt, rtol=bound_rtol
    )
    want_c = [
        [
            [float(ref_mgf(row, t) * mpmath.exp(-_mp(t) * _mp(ai))) for row in l_ref]
            for ai in (0.7, 1.4)
        ]
        for t in ts[1:]
    ]
    assert_close(
        tb.chernoff_bound(x, [0.7, 1.4], tx[1:]), np.array(want_c), xp=xp, dtype=dt, rtol=bound_rtol
    )
    want_k = [[float(ref_k_bound(row, 12, t)) for row in l_ref] for t in ts]
    assert_close(tb.k_loss_bound(x, 12, tx), np.array(want_k), xp=xp, dtype=dt, rtol=bound_rtol)


def test_backends_evar_and_kl_dro(xp):
    rng = np.random.default_rng(15)
    l = rng.uniform(0.0, 2.0, size=9)
    x = to_xp(xp, l)
    v, t = tb.entropic_value_at_risk(x, 0.6, return_tilt=True)
    rv, rt = ref_evar(l, 0.6)
    assert_close(v, np.asarray(float(rv)), xp=xp, dtype=x.dtype, rtol=1e-12)
    assert_close(t, np.asarray(float(rt)), xp=xp, dtype=x.dtype, rtol=1e-7)
    value, q = tb.kl_dro_dual(x, 1.5)
    assert_close(value, np.asarray(float(ref_risk(l, 1.5))), xp=xp, dtype=x.dtype, rtol=1e-13)
    kl = tb.kl_divergence(q)
    qn = npf(q)
    assert_close(
        kl, np.asarray(np.sum(rel_entr(qn, np.full(9, 1 / 9)))), xp=xp, dtype=x.dtype, rtol=1e-12
    )


# ---------------------------------------------------------------------------
# bad input


L3 = [0.1, 0.5, 2.0]


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: tb.tail_fraction([], 1.0), ValueError, "`losses` must not be empty"),
        (lambda: tb.tail_fraction([1.0, np.nan], 1.0), ValueError, "`losses` contains NaN"),
        (lambda: tb.tail_fraction(L3, np.inf), ValueError, "`a` contains infinite"),
        (lambda: tb.tail_fraction(L3, [[1.0]]), ValueError, "`a` must be a scalar or a 1-d"),
        (lambda: tb.tail_fraction(L3, None), TypeError, "`a`"),
        (lambda: tb.tail_fraction(L3, 1.0, weights=[1, -1, 1]), ValueError, "`weights`"),
        (lambda: tb.k_loss(L3, 0), ValueError, "`k` must lie in"),
        (lambda: tb.k_loss(L3, 4), ValueError, "`k` must lie in"),
        (lambda: tb.k_loss(L3, 1.5), TypeError, "`k` must be an integer"),
        (lambda: tb.k_loss(L3, True), TypeError, "`k` must be an integer"),
        (lambda: tb.superquantile(L3, 1.0), ValueError, "`alpha` must lie in"),
        (lambda: tb.superquantile(L3, -0.1), ValueError, "`alpha` must lie in"),
        (lambda: tb.value_at_risk(L3, np.nan), ValueError, "`alpha` must lie in"),
        (lambda: tb.entropic_value_at_risk(L3, 1.0), ValueError, "`alpha` must lie in"),
        (lambda: tb.tilted_tail_bound(L3, 0.0, 1.0), ValueError, "`a` must be greater"),
        (lambda: tb.tilted_tail_bound(L3, 1.0, np.nan), ValueError, "`t` must not be NaN"),
        (lambda: tb.tilted_tail_bound(L3, 1.0, 1.0, floor=0.2), ValueError, "`floor` exceeds"),
        (lambda: tb.tilted_tail_bound([-1.0, 2.0], 1.0, 1.0), ValueError, "`floor` exceeds"),
        (lambda: tb.tilted_tail_bound(L3, 1.0, 1.0, floor=np.nan), ValueError, "`floor`"),
        (lambda: tb.chernoff_bound(L3, 1.0, -1.0), ValueError, "`t` must be non-negative"),
        (lambda: tb.k_loss_bound(L3, 4, 1.0), ValueError, "`k` must lie in"),
        (lambda: tb.k_loss_bound(L3, 3, 1.0, paper_constant=True), ValueError, "`k`"),
        (lambda: tb.k_loss_bound(L3, 2, np.nan), ValueError, "`t` must not be NaN"),
        (lambda: tb.kl_divergence([0.5, -0.5]), ValueError, "`q` must be non-negative"),
        (lambda: tb.kl_divergence([0.5, 0.5], [1.0]), ValueError, "`p` of shape"),
        (lambda: tb.kl_divergence([0.5, 0.5], [0.0, 0.0]), ValueError, "`p` must not be all"),
        (lambda: tb.kl_dro_dual(L3, np.nan), ValueError, "`t` must not be NaN"),
    ],
)
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_mixed_backends_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="`losses` and `weights`"):
        tb.superquantile(np.array(L3), 0.5, weights=torch.ones(3, dtype=torch.float64))


# ---------------------------------------------------------------------------
# value at risk: one definition with and without weights (NumPy's inverted_cdf)


def test_value_at_risk_levels_k_over_n_agree_with_numpy_inverted_cdf(xp):
    rng = np.random.default_rng(7)
    for n in (1, 3, 5, 9, 11, 28):
        host = rng.normal(size=n)
        losses = xp.asarray(host)
        levels = np.arange(n) / n
        plain = to_numpy(tb.value_at_risk(losses, levels))
        unit = to_numpy(tb.value_at_risk(losses, levels, weights=xp.ones(n, dtype=losses.dtype)))
        ref = np.array([np.quantile(host, a, method="inverted_cdf") for a in levels])
        np.testing.assert_array_equal(plain, ref)
        np.testing.assert_array_equal(unit, ref)


def test_value_at_risk_weighted_agrees_with_numpy_inverted_cdf():
    rng = np.random.default_rng(3)
    for n in (2, 7, 40):
        losses = rng.normal(size=n)
        w = rng.exponential(size=n)
        w[rng.random(n) < 0.3] = 0.0
        w[0] = 1.0
        for a in np.concatenate([rng.random(25), [0.0, 0.2, 0.5]]):
            got = float(tb.value_at_risk(losses, a, weights=w))
            assert got == np.quantile(losses, a, method="inverted_cdf", weights=w)


def test_value_at_risk_one_fifth_of_five():
    l = np.arange(1.0, 6.0)
    assert float(tb.value_at_risk(l, 0.2)) == 1.0
    assert float(tb.value_at_risk(l, 0.2, weights=np.ones(5))) == 1.0

"""Group risks with one shift for all groups (and their repair), the compiled segment
kernels behind them, and the sort-free group codes of hierarchies.

References are independent of the code under test: per-group Python loops with
``scipy.special.logsumexp`` in float64 (for float32 inputs, and float64 inputs of modest
spread) and 50-digit mpmath.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _contract import reference_tilted
from scipy.special import logsumexp

import tiltlab as tl
from tiltlab import segments as kernels
from tiltlab._cpu_kernels import available
from tiltlab.accumulator import (
    TiltState,
    group_risk,
    labelled_risk,
    pooled_risk,
    shared_shift_risk,
)
from tiltlab.risk import hierarchy as _hierarchy
from tiltlab.risk.hierarchy import _codes_and_counts, build_tree, hierarchy_eval
from tiltlab.segments import Segments

TILTS = [0.0, 1e-8, -1e-8, 2.0, -2.0, 50.0, -50.0]
needs_numba = pytest.mark.skipif(not available(), reason="numba is not installed")


def _zipf_codes(n, G, rng, a=1.1):
    w = 1.0 / np.arange(1, G + 1) ** a
    return rng.choice(G, size=n, p=w / w.sum())


def _ref_lse(l, t, p, codes, G):
    """Per-group tilted risks by a Python loop over groups (float64, SciPy)."""
    out = np.full(G, np.nan)
    l64 = l.astype(np.float64)
    p64 = np.ones_like(l64) if p is None else p.astype(np.float64)
    for g in range(G):
        m = (codes == g) & (p64 > 0)
        if not m.any():
            continue
        lg, pg = l64[m], p64[m] / p64[m].sum()
        mean = np.sum(pg * lg)
        if t == 0.0:
            out[g] = mean
        elif abs(t) * np.ptp(lg) < 1e-5:  # the cumulant series (the log of a float64 sum
            # near one loses the risk here); its next term, t^3 k4 / 24, is below rounding
            d = lg - mean
            out[g] = mean + t * np.sum(pg * d * d) / 2 + t * t * np.sum(pg * d**3) / 6
        elif abs(t) * np.ptp(lg) <= 1.0:  # the log of a sum near one: log1p of expm1s
            lo = lg.min()
            out[g] = lo + np.log1p(np.sum(pg * np.expm1(t * (lg - lo)))) / t
        elif abs(t) < 1e-3:  # neither: 50 digits
            with mpmath.workdps(50):
                tt = mpmath.mpf(t)
                z = mpmath.fsum(
                    mpmath.mpf(a) * mpmath.exp(tt * mpmath.mpf(b))
                    for a, b in zip(pg, lg, strict=True)
                )
                out[g] = float(mpmath.log(z / mpmath.fsum(mpmath.mpf(a) for a in pg)) / tt)
        else:
            out[g] = logsumexp(t * lg, b=pg) / t
    return out


def _ref_mp(l, t, p, codes, G):
    """Per-group tilted risks in 50-digit arithmetic (NaN for a group without mass)."""
    out = np.full(G, np.nan)
    for g in range(G):
        idx = [i for i in np.flatnonzero(codes == g) if p is None or p[i] > 0]
        if idx:
            prior = None if p is None else [float(p[i]) for i in idx]
            out[g] = float(reference_tilted([float(l[i]) for i in idx], t, prior)[0])
    return out


def _tol(l, codes, ref, dtype):
    """Rounding bound per group: a few dozen ulps of the group's scale (its risk and the
    spread of its losses), which every floating-point evaluation of the risk incurs."""
    eps = float(np.finfo(dtype).eps)
    G = ref.shape[0]
    scale = np.abs(np.nan_to_num(ref))
    la = np.abs(l.astype(np.float64))
    big = np.zeros(G)
    np.maximum.at(big, codes, la)
    return 48 * eps * (scale + big) + 1e3 * float(np.finfo(dtype).tiny)


def _data(n, G, rng, dtype, spread="moderate"):
    extra = np.arange(0, G, 2)  # small groups exist
    codes = np.concatenate([_zipf_codes(n - extra.size, G, rng), extra])
    if spread == "moderate":
        l = 3 * rng.exponential(size=n)
    elif spread == "across":  # groups far apart, a third of them with risks near zero
        g = np.arange(G)
        tiny = g % 3 == 0
        offset = np.where(tiny, 0.0, 50.0 * (g % 6))
        l = offset[codes] + rng.exponential(size=n) * np.where(tiny, 1e-3, 1.0)[codes]
    else:  # "within": losses over many orders of magnitude inside each group
        l = np.exp(rng.normal(size=n) * 4)
    return codes, l.astype(dtype)


# ---------------------------------------------------------------------------------------
# the shared shift against the references


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("t", TILTS)
@pytest.mark.parametrize("spread", ["moderate", "across", "within"])
@pytest.mark.parametrize("prior", [False, True])
def test_shared_shift_matches_logsumexp_loop(dtype, t, spread, prior):
    rng = np.random.default_rng(7)
    G = 60
    codes, l = _data(1500, G + 3, rng, dtype, spread)  # codes G..G+2 unused: empty groups
    codes = np.where(codes >= G, 0, codes)
    seg = Segments.from_codes(codes, G + 3)
    p = None
    if prior:
        p = rng.random(l.shape).astype(dtype)
        p[rng.random(l.shape) < 0.2] = 0.0
        p[codes == 1] = 0.0  # a group without support
    r, repaired = shared_shift_risk(l, t, p, seg)
    ref = _ref_lse(l, t, p, codes, G + 3)
    assert r.dtype == np.dtype(dtype) and r.shape == (G + 3,)
    np.testing.assert_array_equal(np.isnan(r), np.isnan(ref))
    assert np.isnan(r[G:]).all()
    on = ~np.isnan(ref)
    tol = _tol(l, codes, ref, dtype)
    err = np.abs(r.astype(np.float64) - ref)
    assert np.all(err[on] <= tol[on]), (np.max(err[on] / tol[on]), repaired)
    # the group state with its own shift gives the same numbers
    own = TiltState.from_block(l, t, p, segments=seg).risk(np, l.dtype)
    np.testing.assert_array_equal(np.isnan(own), np.isnan(r))
    assert np.all(np.abs(own[on].astype(np.float64) - r[on]) <= 2 * tol[on])
    if spread == "across" and t not in (0.0, 1e-8, -1e-8, -2.0):
        # t = 2: the shift sits near 73, far from the risks near zero; t = +-50: the
        # exponentials of groups 50 or more away from the shift underflow
        assert repaired.size > 0


@pytest.mark.parametrize("t", [-50.0, -2.0, -1e-8, 0.0, 1e-8, 2.0, 50.0])
def test_shared_shift_matches_mpmath(t):
    rng = np.random.default_rng(3)
    G = 25
    codes = np.concatenate([_zipf_codes(150, G, rng), np.arange(G)])  # one-item groups too
    l = np.concatenate([rng.normal(size=100) * 3, rng.exponential(size=75) * 20])
    l[codes == 3] += 5e3  # one group far above the others
    seg = Segments.from_codes(codes)
    r, repaired = shared_shift_risk(l, t, None, seg)
    ref = _ref_mp(l, t, None, codes, G)
    tol = _tol(l, codes, ref, np.float64)
    assert np.all(np.abs(r - ref) <= tol), np.max(np.abs(r - ref) / tol)
    if t > 1.0:
        assert repaired.size >= G - 1  # the shift sits 5e3 above all but group 3
    if t < -1.0:
        assert 3 in repaired.tolist()


def test_repair_is_exact_where_the_shared_sum_underflows():
    # two groups 1e4 apart at t = 1: the low group's exponentials underflow to zero
    l = np.array([0.0, 1.0, 2.0, 1e4, 1e4 + 1.0])
    seg = Segments.from_codes([0, 0, 0, 1, 1])
    r, repaired = shared_shift_risk(l, 1.0, None, seg)
    assert repaired.tolist() == [0]
    want = [math.log(np.mean(np.exp([0.0, 1.0, 2.0]))), 1e4 + math.log((1 + math.e) / 2)]
    np.testing.assert_allclose(r, want, rtol=1e-15)
    # float32: the underflow limit is lower (exp(-87) is already subnormal)
    r32, rep32 = shared_shift_risk(
        np.array([0.0, 1.0, 90.0], np.float32), 1.0, None, Segments.from_codes([0, 0, 1])
    )
    assert rep32.tolist() == [0]
    assert r32.dtype == np.float32
    np.testing.assert_allclose(r32, [math.log((1 + math.e) / 2), 90.0], rtol=1e-6)


def test_risks_near_zero_and_single_items_are_exact():
    # a group whose risk is (close to) zero carries the shift's rounding: repaired
    l = np.array([0.0, 0.0, 1e-12, 30.0, 31.0, 5.0])
    seg = Segments.from_codes([0, 0, 1, 2, 2, 3])
    r, repaired = shared_shift_risk(l, -2.0, None, seg)
    assert r[0] == 0.0 and r[1] == 1e-12 and r[3] == 5.0
    assert {0, 1} <= set(repaired.tolist())


def test_shared_shift_declines_an_overflowing_spread():
    l = np.array([-1e308, 1e308, 0.0])
    seg = Segments.from_codes([0, 1, 1])
    assert shared_shift_risk(l, 1.0, None, seg) is None
    r = group_risk(l, 1.0, None, seg, np)  # the group state handles it
    assert r[0] == -1e308 and r[1] == 1e308


def test_shared_shift_rejects_nonfinite_on_the_support_only():
    seg = Segments.from_codes([0, 0, 1])
    l = np.array([1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        shared_shift_risk(l, 1.0, None, seg)
    r, _ = shared_shift_risk(l, 1.0, np.array([1.0, 0.0, 1.0]), seg)
    np.testing.assert_allclose(r, [1.0, 2.0])


# ---------------------------------------------------------------------------------------
# hierarchical risk: the fast level against the general evaluation and mpmath


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    "tilts", [(1.0, -2.0), (-2.0, 50.0), (0.0, 1e-8), (50.0, 0.0), (-1e-8, -50.0)]
)
def test_hierarchical_risk_matches_weights_path_and_mpmath(dtype, tilts):
    rng = np.random.default_rng(11)
    G = 40
    codes = np.concatenate([_zipf_codes(400, G, rng), np.arange(G)])
    l = (3 * rng.exponential(size=codes.size)).astype(dtype)
    l[codes == 5] += 300.0
    got = tl.hierarchical_risk(l, codes, tilts)
    tree = build_tree(codes, l.size)
    general, _ = hierarchy_eval(l, None, tree, tilts, np, route="tree")  # group states
    rtol = 1e-12 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(got, general, rtol=rtol)
    R = _ref_mp(l, tilts[1], None, codes, G)
    P = np.bincount(codes, minlength=G)
    with mpmath.workdps(50):
        if tilts[0] == 0.0:
            s = mpmath.fsum(int(a) * mpmath.mpf(b) for a, b in zip(P, R, strict=True))
            J = float(s / int(P.sum()))
        else:
            t = mpmath.mpf(tilts[0])
            pairs = zip(P, R, strict=True)
            s = mpmath.fsum(int(a) * mpmath.exp(t * mpmath.mpf(b)) for a, b in pairs)
            J = float(mpmath.log(s / int(P.sum())) / t)
    np.testing.assert_allclose(float(got), J, rtol=rtol)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_hierarchical_risk_with_prior_zeros_and_three_levels(dtype):
    rng = np.random.default_rng(5)
    n = 900
    inner = np.concatenate([_zipf_codes(n - 60, 60, rng), np.arange(60)])
    outer = inner % 7
    l = (rng.normal(size=n) * 4).astype(dtype)
    w = rng.random(n)
    w[rng.random(n) < 0.3] = 0.0
    w[np.flatnonzero(inner == 0)[0]] = 1.0  # every group keeps some weight
    for k in range(60):
        w[np.flatnonzero(inner == k)[0]] = 1.0
    for tilts in [(1.0, -2.0, 50.0), (-50.0, 0.0, -1e-8), (2.0, 2.0, 2.0)]:
        got = tl.hierarchical_risk(l, [outer, inner], tilts, weights=w.astype(dtype))
        tree = build_tree([outer, inner], n)
        p = (w / w.sum()).astype(dtype)
        general, _ = hierarchy_eval(l, p, tree, tilts, np, route="tree")
        np.testing.assert_allclose(got, general, rtol=1e-12 if dtype == "float64" else 3e-5)


@needs_numba
@pytest.mark.slow  # 1e6 losses
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_hierarchical_risk_large_uses_kernels_and_agrees(dtype):
    rng = np.random.default_rng(2)
    n = kernels.MIN_ITEMS + 1234
    G = 5000
    codes = _zipf_codes(n, G, rng)
    _, codes = np.unique(codes, return_inverse=True)
    l = (3 * rng.exponential(size=n)).astype(dtype)
    for tilts in [(1.0, -2.0), (-1.0, 2.0), (0.0, 1e-8)]:
        got = tl.hierarchical_risk(l, codes, tilts)
        general, _ = hierarchy_eval(l, None, build_tree(codes, n), tilts, np, route="tree")
        np.testing.assert_allclose(got, general, rtol=1e-12 if dtype == "float64" else 2e-5)
        G_ = int(codes.max()) + 1
        R = _ref_lse(l, tilts[1], None, codes, G_)
        J = _ref_lse(R, tilts[0], np.bincount(codes).astype(np.float64), np.zeros(G_, int), 1)[0]
        np.testing.assert_allclose(float(got), J, rtol=1e-12 if dtype == "float64" else 2e-5)


# ---------------------------------------------------------------------------------------
# integer labels straight to group risks (no tree): labelled_risk and its route


def _gappy_labels(n, G, rng):
    """Zipf-sized groups under labels with gaps (every third label unused), shuffled."""
    codes = np.concatenate([_zipf_codes(n - G, G, rng), np.arange(G)])
    return rng.permutation(codes * 3 // 2 + (codes % 2))  # 0, 2, 3, 5, 6, 8, ...


@needs_numba
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("t", [-50.0, -2.0, 0.0, 1e-8, 2.0])
@pytest.mark.parametrize("spread", ["moderate", "across"])
def test_labelled_risk_matches_logsumexp_loop(monkeypatch, dtype, t, spread):
    # few groups, with the side-by-side kernel forced (it serves more than
    # MAX_LANED_GROUPS groups), so that the reference loop stays short
    monkeypatch.setattr(kernels, "MAX_LANED_GROUPS", 16)
    rng = np.random.default_rng(17)
    n, G = kernels.MIN_ITEMS + 500, 300
    codes, l = _data(n, G, rng, dtype, spread)
    labels = codes * 3 // 2 + (codes % 2)  # gaps
    r, counts = labelled_risk(l, t, labels)
    present = np.unique(labels)
    assert r.dtype == np.dtype(dtype) and r.shape == counts.shape == present.shape
    np.testing.assert_array_equal(counts, np.bincount(labels)[present])
    _, dense = np.unique(labels, return_inverse=True)
    ref = _ref_lse(l, t, None, dense, present.size)
    tol = _tol(l, dense, ref, dtype)
    err = np.abs(r.astype(np.float64) - ref)
    assert np.all(err <= tol), np.max(err / tol)
    # the partition route gives the same numbers
    want, _ = shared_shift_risk(l, t, None, Segments.from_codes(dense))
    np.testing.assert_array_equal(r, want)


@needs_numba
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_labelled_risk_many_groups_against_the_group_state(dtype):
    rng = np.random.default_rng(4)
    n, G = 4 * kernels.MIN_ITEMS, kernels.MAX_LANED_GROUPS + 3000
    labels = _gappy_labels(n, G, rng)
    l = (3 * rng.exponential(size=n)).astype(dtype)
    l[labels % 7 == 0] *= 1e-4  # risks near zero: repaired
    r, counts = labelled_risk(l, -2.0, labels)
    present, dense = np.unique(labels, return_inverse=True)
    assert r.shape == (present.size,) and present.size > kernels.MAX_LANED_GROUPS
    np.testing.assert_array_equal(counts, np.bincount(dense))
    seg = Segments.from_codes(dense)
    own = TiltState.from_block(l, -2.0, None, segments=seg).risk(np, l.dtype)
    tol = _tol(l, dense, own.astype(np.float64), dtype)
    assert np.all(np.abs(r.astype(np.float64) - own) <= 2 * tol)
    # a sample of groups against the reference loop, one by one
    order = np.argsort(dense, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts.astype(np.int64))])
    for g in rng.choice(present.size, 50, replace=False):
        lg = l[order[starts[g] : starts[g + 1]]].astype(np.float64)
        ref = _ref_lse(lg, -2.0, None, np.zeros(lg.size, np.int64), 1)[0]
        assert abs(float(r[g]) - ref) <= tol[g], (g, r[g], ref)


@needs_numba
def test_labelled_risk_declines_what_it_cannot_take():
    n = kernels.MIN_ITEMS
    l = np.linspace(0.0, 1.0, n)
    ok = np.arange(n) % 5
    assert labelled_risk(l, 1.0, ok) is not None
    assert labelled_risk(l, 1.0, ok - 1) is None  # a negative label
    assert labelled_risk(l, 1.0, np.where(ok == 0, 2 * n + 1024, ok)) is None  # too wide
    assert labelled_risk(l, 1.0, ok.astype(np.float64)) is None  # not integers
    assert labelled_risk(l[:100], 1.0, ok[:100]) is None  # too short for the kernels
    wide = l.copy()
    wide[:2] = [-1e308, 1e308]
    assert labelled_risk(wide, 1.0, ok) is None  # the spread overflows
    bad = l.copy()
    bad[7] = np.nan
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        labelled_risk(bad, 1.0, ok)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("t", [-50.0, -2.0, -1e-8, 0.0, 1e-8, 1.0, 50.0])
def test_pooled_risk_matches_mpmath_or_declines(dtype, t):
    rng = np.random.default_rng(23)
    v = (rng.normal(size=3000) * 2 + 3).astype(dtype)
    mass = rng.integers(1, 40, v.size).astype(np.float64)
    r = pooled_risk(v, t, mass)
    with mpmath.workdps(50):
        ms = [mpmath.mpf(float(a)) for a in mass]
        vs = [mpmath.mpf(float(b)) for b in v]
        M = mpmath.fsum(ms)
        if t == 0.0:
            want = mpmath.fsum(a * b for a, b in zip(ms, vs, strict=True)) / M
        else:
            tt = mpmath.mpf(t)
            z = mpmath.fsum(a * mpmath.exp(tt * b) for a, b in zip(ms, vs, strict=True))
            want = mpmath.log(z / M) / tt
    eps = float(np.finfo(dtype).eps)
    assert r is not None and r.dtype == np.dtype(dtype) and r.shape == ()
    assert abs(float(r) - float(want)) <= 16 * eps * abs(float(want)), (float(r), float(want))
    # a risk near zero is not given to that bar by a shared shift of zero: declined
    near_zero = np.array([0.0] * 9 + [0.05])  # R = 0.0019 < 1 / (50 (RHO - 1))
    assert pooled_risk(near_zero, -50.0, np.ones(10)) is None
    assert pooled_risk(np.array([-1e308, 1e308]), 1.0, np.ones(2)) is None


@needs_numba
@pytest.mark.parametrize(
    "labels_of",
    [
        lambda d: d,  # dense
        lambda d: d * 3 // 2 + (d % 2),  # gaps
        lambda d: (d * 3 // 2).astype(np.uint32),  # unsigned
        lambda d: d - 1,  # a negative label: the tree route
        lambda d: np.where(d == 2, 10**12, d),  # too wide: the tree route
        lambda d: d.astype(np.float64),  # float labels: the tree route
        lambda d: d.tolist(),  # a list
    ],
)
@pytest.mark.parametrize("tilts", [(1.0, -2.0), (-np.inf, 2.0), (0.0, 0.0), (np.inf, -50.0)])
def test_hierarchical_risk_labelled_route_matches_the_tree(labels_of, tilts):
    rng = np.random.default_rng(9)
    n = kernels.MIN_ITEMS + 333
    dense = np.concatenate([_zipf_codes(n - 2000, 2000, rng), np.arange(2000)])
    labels = labels_of(dense)
    l = 3 * rng.exponential(size=n)
    got = tl.hierarchical_risk(l, labels, tilts)
    want, _ = hierarchy_eval(l, None, build_tree(dense, n), tilts, np, route="tree")
    assert got.shape == () and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-13)


@needs_numba
def test_hierarchical_risk_labelled_route_builds_no_tree(monkeypatch):
    rng = np.random.default_rng(1)
    n = kernels.MIN_ITEMS + 1
    labels = rng.integers(0, 50_000, n)
    l = rng.exponential(size=n).astype(np.float32)
    want = tl.hierarchical_risk(l, labels, (1.0, -2.0), weights=np.ones(n, np.float32))

    def no_tree(*args, **kwargs):
        raise AssertionError("the labelled route built a tree")

    monkeypatch.setattr(_hierarchy, "build_tree", no_tree)
    got = tl.hierarchical_risk(l, labels, (1.0, -2.0))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6)
    half = tl.hierarchical_risk(l.astype(np.float16), labels, (1.0, -2.0))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, want, rtol=2e-3)
    bad = l.copy()
    bad[3] = np.inf
    with pytest.raises(ValueError, match="`losses` contains"):
        tl.hierarchical_risk(bad, labels, (1.0, -2.0))
    with pytest.raises(ValueError, match="`tilts` must have 2 entries"):
        tl.hierarchical_risk(l, labels, (1.0, -2.0, 3.0))
    monkeypatch.undo()
    nan = tl.hierarchical_risk(bad, labels, (1.0, -2.0), check_finite=False)
    assert np.isnan(nan)


@needs_numba
def test_hierarchical_risk_labelled_route_does_not_depend_on_threads():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import numba

    rng = np.random.default_rng(12)
    n = 4 * kernels.MIN_ITEMS
    labels = rng.integers(0, kernels.MAX_LANED_GROUPS + 999, n)
    l = 3 * rng.exponential(size=n)
    for tilts in [(1.0, -2.0), (-3.0, 0.5)]:
        many = tl.hierarchical_risk(l, labels, tilts)
        before = numba.get_num_threads()
        try:
            numba.set_num_threads(1)
            with threadpoolctl.threadpool_limits(1):
                one = tl.hierarchical_risk(l, labels, tilts)
        finally:
            numba.set_num_threads(before)
        assert one.tobytes() == many.tobytes()


# ---------------------------------------------------------------------------------------
# the compiled kernels and their fallback


def _kernel_inputs(G, skew, dtype, rng):
    n = kernels.MIN_ITEMS + 77
    codes = _zipf_codes(n, G, rng, a=2.0) if skew else rng.integers(0, G, n)
    return codes.astype(np.int64), rng.normal(size=n).astype(dtype)


@pytest.mark.parametrize("G", [3, 1000, kernels.MAX_LANED_GROUPS + 5])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("skew", [False, True])
def test_kernels_match_bincount(G, dtype, skew):
    rng = np.random.default_rng(G)
    codes, v = _kernel_inputs(G, skew, dtype, rng)
    w = rng.random(v.shape).astype(dtype)
    np.testing.assert_array_equal(kernels.segment_counts(codes, G), np.bincount(codes, minlength=G))
    ref = np.bincount(codes, weights=v.astype(np.float64), minlength=G)
    got = kernels.segment_sums(codes, v, G)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-9)
    refw = np.bincount(codes, weights=(v * w).astype(np.float64), minlength=G)
    np.testing.assert_allclose(
        kernels.segment_sums(codes, v, G, weights=w), refw, rtol=1e-12, atol=1e-9
    )
    flags = np.zeros(G, dtype=bool)
    flags[::3] = True
    np.testing.assert_array_equal(kernels.members_of(codes, flags), np.flatnonzero(flags[codes]))
    assert kernels.int_range(codes) == (int(codes.min()), int(codes.max()))
    cnt, sums = kernels.segment_counts_sums(codes, v, G)
    assert cnt.dtype == sums.dtype == np.float64
    np.testing.assert_array_equal(cnt, np.bincount(codes, minlength=G))
    np.testing.assert_allclose(sums, ref, rtol=1e-12, atol=1e-9)
    # the same additions in the same order as the sums alone
    np.testing.assert_array_equal(sums, kernels.segment_sums(codes, v, G))
    size = int(np.bincount(codes, minlength=G)[flags].sum())
    np.testing.assert_array_equal(
        kernels.members_of(codes, flags, size), np.flatnonzero(flags[codes])
    )


def test_kernels_fall_back_on_bincount(monkeypatch):
    rng = np.random.default_rng(0)
    codes, v = _kernel_inputs(50, True, "float64", rng)
    want_s = kernels.segment_sums(codes, v, 50)
    monkeypatch.setattr(kernels, "use_kernels", lambda n: False)
    np.testing.assert_array_equal(
        kernels.segment_counts(codes, 50), np.bincount(codes, minlength=50)
    )
    np.testing.assert_allclose(kernels.segment_sums(codes, v, 50), want_s, rtol=1e-12)
    cnt, sums = kernels.segment_counts_sums(codes, v, 50)
    np.testing.assert_array_equal(cnt, np.bincount(codes, minlength=50))
    np.testing.assert_allclose(sums, want_s, rtol=1e-12)
    flags = np.arange(50) % 2 == 0
    np.testing.assert_array_equal(kernels.members_of(codes, flags), np.flatnonzero(flags[codes]))
    l = np.abs(v) * 3
    seg = Segments.from_codes(codes, 50)
    r, _ = shared_shift_risk(l, -2.0, None, seg)
    np.testing.assert_allclose(r, _ref_lse(l, -2.0, None, codes, 50), rtol=1e-13)


@needs_numba
@pytest.mark.parametrize("c", [0.0, 3.0])
@pytest.mark.parametrize("mode", ["mean", "q", "s"])
def test_finish_kernels_match_their_numpy_fallback(monkeypatch, c, mode):
    rng = np.random.default_rng(8)
    counts = rng.integers(0, 4, 5000).astype(np.float64)  # empty groups included
    sums = rng.exponential(size=5000) * counts
    d = rng.normal(size=5000) * 3
    d[::97] = np.nan
    d[::89] = -800.0  # below the floor
    d[::83] = 1e-7  # near zero
    t = None if mode == "mean" else -2.0
    k = 0.5 if mode == "s" else 0.0
    floor = -700.0 if mode == "s" else None
    got = [kernels.present_means(counts, sums), d.copy()]
    got.append(kernels.accept_shared_shift(got[1], t, c, k, 8.0, floor))
    monkeypatch.setattr(kernels, "_numba_found", lambda: False)
    want = [kernels.present_means(counts, sums), d.copy()]
    want.append(kernels.accept_shared_shift(want[1], t, c, k, 8.0, floor))
    for a, b in zip(got[0], want[0], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got[1], want[1])  # the risks, NaN where NaN
    np.testing.assert_array_equal(got[2], want[2])
    assert 0 < got[2].size < d.size


@needs_numba
def test_kernels_do_not_depend_on_threads():
    import numba

    rng = np.random.default_rng(1)
    codes, v = _kernel_inputs(700, True, "float64", rng)
    before = numba.get_num_threads()
    try:
        out = []
        for k in sorted({1, before}):
            numba.set_num_threads(k)
            out.append(kernels.segment_sums(codes, v, 700))
    finally:
        numba.set_num_threads(before)
    for o in out[1:]:
        np.testing.assert_array_equal(o, out[0])


# ---------------------------------------------------------------------------------------
# sort-free codes


@pytest.mark.parametrize(
    "labels",
    [
        np.array([3, 3, 0, 7, 7, 7, 2]),  # gaps: renumbered without a sort
        np.array([1, 0, 2, 1], dtype=np.uint8),
        np.array([5, 10**12, 5]),  # a range too wide to count: np.unique
        np.array([-1, 4, -1]),
        np.array(["b", "a", "b"]),
    ],
)
def test_codes_and_counts_match_unique(labels):
    codes, counts = _codes_and_counts(labels)
    _, inv, cnt = np.unique(labels, return_inverse=True, return_counts=True)
    assert codes.dtype == np.int64
    np.testing.assert_array_equal(codes, inv.reshape(-1))
    np.testing.assert_array_equal(counts, cnt)


def test_tree_counts_are_seeded_and_match():
    labels = np.array([4, 4, 9, 0, 9, 9])
    tree = build_tree(labels, labels.size)
    seg = tree.levels[0]
    assert seg.counts.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(seg.codes, [1, 1, 2, 0, 2, 2])


@pytest.mark.parametrize("t", TILTS)
def test_extreme_magnitudes_across_groups_match_mpmath(t):
    # groups near 1e300, near 1e-300, near -1e10 and a single loss: every shift shared by
    # all of them is far from most groups, so the repair decides the result
    l = np.array([1e300, 2e300, 1e-300, 3e-300, -1e10, -1e10 + 5.0, 0.5, 1.5e300])
    codes = np.array([0, 0, 1, 1, 2, 2, 3, 0])
    seg = Segments.from_codes(codes)
    r, repaired = shared_shift_risk(l, t, None, seg)
    ref = _ref_mp(l, t, None, codes, 4)
    np.testing.assert_allclose(r, ref, rtol=64 * np.finfo(np.float64).eps)
    if abs(t) >= 1e-8:
        assert repaired.size > 0


def test_codes_and_counts_large_labels_with_gaps():
    rng = np.random.default_rng(4)
    labels = 3 * rng.integers(0, 5000, kernels.MIN_ITEMS + 5)  # every third label used
    codes, counts = _codes_and_counts(labels)
    _, inv, cnt = np.unique(labels, return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(codes, inv.reshape(-1))
    np.testing.assert_array_equal(counts, cnt)
    l = rng.exponential(size=labels.size)
    np.testing.assert_allclose(
        tl.hierarchical_risk(l, labels, (1.0, -2.0)),
        hierarchy_eval(l, None, build_tree(inv, l.size), (1.0, -2.0), np, route="tree")[0],
        rtol=1e-13,
    )


@pytest.mark.parametrize("n", [50, kernels.MIN_ITEMS + 13])  # NumPy, and the kernel
def test_nest_parents_against_a_dictionary(n):
    rng = np.random.default_rng(n)
    inner = rng.integers(0, 400, n).astype(np.int64)
    inner[inner == 7] = 8  # an inner code without items: parent -1
    outer = (inner * 7919 % 31).astype(np.int64)  # a function of the inner code: nested
    parent, bad = kernels.nest_parents(inner, outer, 400)
    want = {int(g): int(o) for g, o in zip(inner, outer, strict=True)}
    assert bad == -1
    assert parent.tolist() == [want.get(g, -1) for g in range(400)]
    # one item moved to another outer group: the returned item breaks the nesting
    shared = np.flatnonzero(np.bincount(inner, minlength=400)[inner] >= 2)
    for i in shared[[0, shared.size // 2, -1]]:  # items whose inner group has others
        broken = outer.copy()
        broken[i] = (broken[i] + 1) % 31
        parent, bad = kernels.nest_parents(inner, broken, 400)
        assert bad >= 0
        others = broken[inner == inner[bad]]
        assert np.unique(others).size > 1  # its inner group spans several outer groups


@pytest.mark.parametrize("n", [60, kernels.MIN_ITEMS + 29])
def test_tree_sample_layouts_compose_the_levels(n):
    # the sample layout of each level is the composition of the levels below it, and its
    # codes and counts are those of np.unique of that level's labels
    rng = np.random.default_rng(n)
    inner = 5 * rng.integers(0, 300, n)  # integer labels with gaps
    middle = inner // 35
    outer = np.array(["a", "b", "c"])[middle % 3]  # strings outside
    tree = build_tree([outer, middle, inner], n)
    codes = tree.levels[0].codes
    for lev, layout, labels in zip(
        tree.levels, tree.sample_layouts, [inner, middle, outer], strict=True
    ):
        if layout is not tree.levels[0]:
            codes = lev.codes[codes]
        _, inv, cnt = np.unique(labels, return_inverse=True, return_counts=True)
        np.testing.assert_array_equal(layout.codes, codes)
        np.testing.assert_array_equal(layout.codes, inv.reshape(-1))
        np.testing.assert_array_equal(layout.counts, cnt)


def test_levels_that_do_not_nest_name_a_label():
    inner = np.array([0, 1, 1, 2, 2, 2])
    outer = np.array([0, 0, 1, 1, 1, 1])  # inner label 1 lies in outer groups 0 and 1
    with pytest.raises(ValueError, match=r"not nested: a group of level 1 \(label 1\)"):
        build_tree([outer, inner], 6)

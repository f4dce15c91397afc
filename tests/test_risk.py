"""Tests of tiltlab.risk against 50-digit mpmath references and closed forms."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _contract import reference_hierarchy, reference_tilted
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.testing import assert_close

mpmath.mp.dps = 50

TILTS = [
    -1e8,
    -1e4,
    -50.0,
    -2.0,
    -1.0,
    -1e-3,
    -1e-9,
    -1e-14,
    0.0,
    1e-14,
    1e-9,
    1e-3,
    0.7,
    3.0,
    50.0,
    1e4,
    1e8,
]


# ---------------------------------------------------------------------------
# references


def _mp(v):
    return v if isinstance(v, mpmath.mpf) else mpmath.mpf(float(v))


def ref_risk(values, t, counts=None, prior=None):
    """50-digit tilted risk; ``counts`` lets N be huge with few distinct values (each
    value's prior mass times its count)."""
    k = len(values)
    mass = [_mp(1 if prior is None else prior[i]) * (1 if counts is None else counts[i])
            for i in range(k)]  # fmt: skip
    return reference_tilted([_mp(v) for v in values], t, mass)[0]


def ref_weights(values, t, prior=None):
    w = reference_tilted(
        [_mp(v) for v in values], t, None if prior is None else [_mp(q) for q in prior]
    )[1]
    return np.array([float(v) for v in w])


def ref_hier(values, levels, tilts, prior=None):
    """Nested tilted risk in mpmath; ``levels`` are label lists outermost first."""
    return reference_hierarchy(values, levels, tilts, prior)[0]


def to_xp(xp, a, dtype=None):
    a = np.asarray(a)
    out = xp.asarray(a)
    if dtype is not None:
        out = xp.astype(out, getattr(xp, dtype))
    return out


# ---------------------------------------------------------------------------
# accuracy


@pytest.mark.parametrize("spread", [1.0, 1e3, 1e6])
def test_risk_matches_mpmath_every_tilt(xp, spread):
    rng = np.random.default_rng(int(spread))
    l = rng.uniform(-0.3, 1.0, size=200) * spread
    x = to_xp(xp, l)
    got = tl.tilted_risk(x, to_xp(xp, TILTS))
    want = np.array([float(ref_risk(l, t)) for t in TILTS])
    scale = np.max(np.abs(l))
    assert_close(got, want, xp=xp, dtype=x.dtype, rtol=0, atol=1e-12 * scale)
    # scalar tilts give the same as the grid, element by element
    for t, w in zip(TILTS, want, strict=False):
        assert abs(float(to_numpy(tl.tilted_risk(x, t))) - w) <= 1e-12 * scale


def test_risk_large_n_mpmath(xp):
    # N = 1e6 made of a few distinct values, so the 50-digit reference is cheap
    vals = np.array([0.0, 0.25, 3.0, 7.5, 1e3])
    counts = [400_000, 300_000, 200_000, 99_990, 10]
    rng = np.random.default_rng(1)
    l = rng.permutation(np.repeat(vals, counts))
    x = to_xp(xp, l)
    ts = [-1e8, -5.0, -1e-12, 0.0, 1e-12, 0.01, 5.0, 1e8]
    got = tl.tilted_risk(x, to_xp(xp, ts))
    want = np.array([float(ref_risk(vals, t, counts=counts)) for t in ts])
    assert_close(got, want, xp=xp, rtol=0, atol=1e-12 * 1e3)


def test_risk_float32(xp):
    rng = np.random.default_rng(3)
    l = rng.uniform(0, 1e3, size=300).astype(np.float32)
    x = to_xp(xp, l)
    got = tl.tilted_risk(x, to_xp(xp, np.array(TILTS, dtype=np.float32)))
    want = np.array([float(ref_risk(l.astype(np.float64), float(np.float32(t)))) for t in TILTS])
    assert_close(got, want, xp=xp, dtype=x.dtype, rtol=0, atol=2e-5 * 1e3)


def test_weights_match_mpmath(xp):
    rng = np.random.default_rng(4)
    l = rng.normal(size=50) * 10
    prior = rng.uniform(0.1, 2.0, size=50)
    x, p = to_xp(xp, l), to_xp(xp, prior)
    for t in [-1e3, -1.0, -1e-10, 0.0, 1e-10, 0.5, 30.0, 1e6]:
        got = tl.tilted_weights(x, t, weights=p)
        assert_close(got, ref_weights(l, t, prior), xp=xp, rtol=1e-12, atol=1e-300)
        r = tl.tilted_risk(x, t, weights=p)
        assert abs(float(to_numpy(r)) - float(ref_risk(l, t, prior=prior))) <= 1e-12 * 30


def test_weights_are_gradient_of_risk():
    # dR/dl_i = w_i: an independent check through mpmath numerical differentiation
    l = [0.3, -1.2, 2.5, 0.9]
    for t in [-2.0, 0.7, 5.0]:
        w = tl.tilted_weights(np.array(l), t)
        for i in range(len(l)):

            def f(v, i=i, t=t):
                ll = list(l)
                ll[i] = v
                return ref_risk(ll, t)

            assert abs(float(mpmath.diff(f, l[i])) - w[i]) < 1e-13


def test_grid_weights_shape_and_values(xp):
    l = np.array([[0.0, 1.0, 2.0], [5.0, 5.0, -1.0]])
    ts = np.array([-np.inf, -1.0, 0.0, 2.0, np.inf])
    w = tl.tilted_weights(to_xp(xp, l), to_xp(xp, ts))
    assert tuple(w.shape) == (5, 2, 3)
    for k, t in enumerate(ts):
        for b in range(2):
            assert_close(w[k, b, :], ref_weights(l[b], t), xp=xp, rtol=1e-13, atol=1e-300)


# ---------------------------------------------------------------------------
# special values, axis, keepdims, dtypes


def test_special_values_with_prior(xp):
    l = np.array([5.0, 1.0, 3.0, -2.0, 9.0])
    p = np.array([1.0, 2.0, 1.0, 0.0, 0.0])  # zero prior on -2 and 9: outside the support
    x, q = to_xp(xp, l), to_xp(xp, p)
    assert_close(tl.tilted_risk(x, np.inf, weights=q), 5.0, xp=xp)
    assert_close(tl.tilted_risk(x, -np.inf, weights=q), 1.0, xp=xp)
    assert_close(tl.tilted_risk(x, 0.0, weights=q), (5 + 2 + 3) / 4, xp=xp)
    assert_close(tl.tilted_weights(x, 0.0, weights=q), p / 4, xp=xp)
    # huge finite tilts approach the extremes of the support, never the excluded samples
    assert abs(float(to_numpy(tl.tilted_risk(x, 1e8, weights=q))) - 5.0) < 1e-7
    assert abs(float(to_numpy(tl.tilted_risk(x, -1e8, weights=q))) - 1.0) < 1e-7


#: finite priors whose total overflows: the uniform prior at the float maximum, and
#: unequal weights near it (float64, and float32 near 3.4e38)
HUGE_PRIORS = {
    "float64": ([0.1, 0.5, 2.0, 3.0], [[1e308] * 4, [1.7e308, 5e307, 1e308, 1.2e308]]),
    "float32": ([0.1, 0.5, 2.0, 3.0], [[1e38] * 4, [3.3e38, 1e37, 2e38, 3e38]]),
}


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_prior_whose_total_overflows(xp, dtype_name):
    values, priors = HUGE_PRIORS[dtype_name]
    dtype = getattr(xp, dtype_name)
    x = xp.asarray(np.array(values), dtype=dtype)
    l = to_numpy(x).astype(np.float64)  # the losses as the dtype holds them
    eps = float(np.finfo(dtype_name).eps)
    n, spread = len(values), float(np.ptp(l))
    for prior in priors:
        q = xp.asarray(np.array(prior), dtype=dtype)
        pq = to_numpy(q).astype(np.float64)  # finite in the dtype, their sum is not
        with np.errstate(over="ignore"):
            assert np.all(np.isfinite(pq)) and not np.isfinite(pq.astype(dtype_name).sum())
        for t in [-np.inf, -50.0, -1.0, 0.0, 1e-300, 1e-9, 1.0, 50.0, np.inf]:
            t_held = float(np.asarray(t, dtype=dtype_name))  # the tilt in the losses' dtype
            want_r, want_w = reference_tilted(list(l), t_held, list(pq))
            # the prior normalised: n + 2 roundings; exp(t (l - c)): (2 |t| spread + 1)
            # more; the risk's log and division carry them to |R| <= max |l|. Weights
            # below the normal range keep that many of its ulps (absolutely)
            k = 0.0 if math.isinf(t) else abs(t) * spread
            rtol = (n + 4 + 2 * k) * eps
            r = tl.tilted_risk(x, t, weights=q)
            w = tl.tilted_weights(x, t, weights=q)
            assert_close(
                r, float(want_r), xp=xp, dtype=dtype, rtol=0, atol=rtol * max(abs(v) for v in l)
            )
            assert_close(
                w,
                [float(v) for v in want_w],
                xp=xp,
                dtype=dtype,
                rtol=rtol,
                atol=rtol * float(np.finfo(dtype_name).smallest_normal),
            )
        # two groups of two samples: the prior mass of each is positive and finite; the
        # bound above at each level, added
        ts = (1.0, -2.0)
        want_h = float(ref_hier(list(l), [[0, 0, 1, 1]], list(ts), prior=list(pq)))
        got_h = tl.hierarchical_risk(x, [0, 0, 1, 1], ts, weights=q)
        k = sum(abs(t) for t in ts) * spread
        atol = (2 * (n + 4) + 2 * k) * eps * max(abs(v) for v in l)
        assert_close(got_h, want_h, xp=xp, dtype=dtype, rtol=0, atol=atol)


def test_ties_at_infinity(xp):
    x = to_xp(xp, [1.0, 3.0, 3.0, 0.0, 0.0, 0.0])
    assert_close(tl.tilted_weights(x, np.inf), [0, 0.5, 0.5, 0, 0, 0], xp=xp)
    assert_close(tl.tilted_weights(x, -np.inf), [0, 0, 0, 1 / 3, 1 / 3, 1 / 3], xp=xp)
    # with a prior the limit is the prior restricted to the tie
    q = to_xp(xp, [1.0, 1.0, 3.0, 1.0, 1.0, 1.0])
    assert_close(tl.tilted_weights(x, np.inf, weights=q), [0, 0.25, 0.75, 0, 0, 0], xp=xp)


def test_axis_keepdims_batch(xp):
    rng = np.random.default_rng(5)
    l = rng.normal(size=(4, 7, 3))
    x = to_xp(xp, l)
    r = tl.tilted_risk(x, 1.3, axis=1)
    want = np.array([[float(ref_risk(l[i, :, j], 1.3)) for j in range(3)] for i in range(4)])
    assert_close(r, want, xp=xp, rtol=1e-13)
    rk = tl.tilted_risk(x, 1.3, axis=1, keepdims=True)
    assert tuple(rk.shape) == (4, 1, 3)
    rg = tl.tilted_risk(x, to_xp(xp, [1.3, -2.0]), axis=1, keepdims=True)
    assert tuple(rg.shape) == (2, 4, 1, 3)
    w = tl.tilted_weights(x, 1.3, axis=1)
    assert tuple(w.shape) == (4, 7, 3)
    assert_close(xp.sum(w, axis=1), np.ones((4, 3)), xp=xp)
    wg = tl.tilted_weights(x, to_xp(xp, [1.3, -2.0]), axis=0)
    assert tuple(wg.shape) == (2, 4, 7, 3)
    assert_close(wg[1, :, 2, 1], ref_weights(l[:, 2, 1], -2.0), xp=xp, rtol=1e-13)


def test_integer_and_float32_dtypes(xp):
    xi = xp.asarray([1, 2, 3])
    r = tl.tilted_risk(xi, 1.0)
    assert xp.isdtype(r.dtype, "real floating")
    assert_close(r, float(ref_risk([1, 2, 3], 1.0)), xp=xp, rtol=1e-6)
    x32 = xp.asarray(np.array([1.0, 2.0], dtype=np.float32))
    assert tl.tilted_risk(x32, 2.0).dtype == xp.float32
    assert tl.tilted_weights(x32, 2.0).dtype == xp.float32
    assert tl.tilted_risk(x32, xp.asarray(np.array([1.0, 2.0]))).dtype == xp.float32


def test_never_nan_for_finite_input(xp):
    # extreme spreads and tilts: finite results, within [min, max], no warnings
    l = np.array([-1e6, 0.0, 1e-300, 1e6])
    ts = np.array([-np.inf, -1e300, -1e8, -1e-300, 0.0, 5e-324, 1e-300, 1e8, 1e300, np.inf])
    r = to_numpy(tl.tilted_risk(to_xp(xp, l), to_xp(xp, ts)))
    assert np.all(np.isfinite(r))
    assert np.all((r >= -1e6) & (r <= 1e6))
    assert np.all(np.diff(r) >= 0)
    w = to_numpy(tl.tilted_weights(to_xp(xp, l), to_xp(xp, ts)))
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-14)


def test_lower_bound_for_positive_tilt():
    # R(t) >= max - log(1/p_k)/t with k the sample of largest loss
    rng = np.random.default_rng(6)
    for _ in range(20):
        l = rng.normal(size=30)
        p = rng.uniform(0.01, 1, size=30)
        p /= p.sum()
        k = int(np.argmax(l))
        for t in [0.1, 1.0, 10.0, 1e3]:
            r = tl.tilted_risk(l, t, weights=p)
            assert r >= l[k] + np.log(p[k]) / t - 1e-12


# ---------------------------------------------------------------------------
# hierarchical


def _labels():
    # uneven groups, arbitrary (string) labels
    outer = ["a"] * 6 + ["b"] * 3 + ["c"] * 1 + ["d"] * 5
    inner = [
        "a1",
        "a1",
        "a2",
        "a2",
        "a2",
        "a3",
        "b1",
        "b1",
        "b2",
        "c1",
        "d1",
        "d1",
        "d2",
        "d2",
        "d2",
    ]
    return outer, inner


@pytest.mark.parametrize(
    "tilts",
    [
        (1.5, -2.0),
        (-3.0, 0.0),
        (0.0, 4.0),
        (np.inf, -1.0),
        (2.0, -np.inf),
        (-np.inf, np.inf),
        (1e4, 1e-12),
    ],
)
def test_hierarchical_two_levels_mpmath(xp, tilts):
    rng = np.random.default_rng(7)
    outer, _ = _labels()
    l = rng.uniform(0, 3, size=len(outer))
    prior = rng.uniform(0.2, 1.0, size=len(outer))
    codes = np.unique(outer, return_inverse=True)[1]
    got = tl.hierarchical_risk(to_xp(xp, l), codes, tilts, weights=to_xp(xp, prior))
    want = float(ref_hier(list(l), [outer], list(tilts), prior=list(prior)))
    assert_close(got, want, xp=xp, rtol=0, atol=1e-12 * 3)


@pytest.mark.parametrize("tilts", [(2.0, -1.0, 0.5), (-1.0, 0.0, 3.0), (0.5, 0.5, 0.5)])
def test_hierarchical_depth3_mpmath(xp, tilts):
    rng = np.random.default_rng(8)
    outer, inner = _labels()
    l = rng.uniform(0, 2, size=len(outer))
    got = tl.hierarchical_risk(to_xp(xp, l), [np.array(outer), np.array(inner)], tilts)
    want = float(ref_hier(list(l), [outer, inner], list(tilts)))
    assert_close(got, want, xp=xp, rtol=0, atol=1e-12 * 2)


def test_hierarchical_weights_are_gradient():
    # dJ/dl_x = w_x, checked by 50-digit numerical differentiation of the reference
    outer, inner = _labels()
    rng = np.random.default_rng(9)
    l = list(rng.uniform(0, 2, size=len(outer)))
    for levels, tilts in [([outer], [1.5, -2.0]), ([outer, inner], [2.0, -1.0, 0.5])]:
        groups = [np.array(v) for v in levels]
        w = tl.hierarchical_weights(np.array(l), groups if len(groups) > 1 else groups[0], tilts)
        np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-14)
        for i in range(len(l)):

            def f(v, i=i, levels=levels, tilts=tilts):
                ll = list(l)
                ll[i] = v
                return ref_hier(ll, levels, tilts)

            assert abs(float(mpmath.diff(f, l[i])) - w[i]) < 1e-12


def test_hierarchical_identities(xp):
    rng = np.random.default_rng(10)
    outer, _ = _labels()
    codes = np.unique(outer, return_inverse=True)[1]
    l = rng.uniform(0, 3, size=len(outer))
    x = to_xp(xp, l)
    for t in [-4.0, -0.3, 0.0, 0.8, 6.0, np.inf]:
        # (t, t) is the sample-level risk; weights agree too
        assert_close(
            tl.hierarchical_risk(x, codes, (t, t)), tl.tilted_risk(l, t), xp=xp, rtol=1e-13
        )
        assert_close(
            tl.hierarchical_weights(x, codes, (t, t)),
            tl.tilted_weights(l, t),
            xp=xp,
            rtol=1e-12,
            atol=1e-300,
        )
    # tau = 0 tilts the group means
    means = np.array([l[codes == g].mean() for g in range(codes.max() + 1)])
    sizes = np.bincount(codes)
    assert_close(
        tl.hierarchical_risk(x, codes, (2.0, 0.0)),
        float(ref_risk(means, 2.0, prior=sizes)),
        xp=xp,
        rtol=1e-13,
    )
    # t = 0: mass-weighted mean of the group tilted risks
    gr = np.array([float(ref_risk(l[codes == g], -1.5)) for g in range(codes.max() + 1)])
    assert_close(
        tl.hierarchical_risk(x, codes, (0.0, -1.5)),
        float((sizes * gr).sum() / 15),
        xp=xp,
        rtol=1e-13,
    )


def test_hierarchical_batch_axis(xp):
    rng = np.random.default_rng(11)
    l = rng.uniform(0, 1, size=(3, 8))
    g = np.array([0, 0, 1, 1, 1, 2, 2, 2])
    r = tl.hierarchical_risk(to_xp(xp, l), g, (1.0, -1.0))
    assert tuple(r.shape) == (3,)
    for b in range(3):
        assert (
            abs(float(to_numpy(r[b])) - float(ref_hier(list(l[b]), [list(g)], [1.0, -1.0]))) < 1e-13
        )
    w = tl.hierarchical_weights(to_xp(xp, l), g, (1.0, -1.0))
    assert tuple(w.shape) == (3, 8)


# ---------------------------------------------------------------------------
# property-based


finite_losses = hnp.arrays(
    np.float64,
    st.integers(1, 30),
    elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
)
tilt_values = st.floats(-1e4, 1e4, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(l=finite_losses, t1=tilt_values, t2=tilt_values)
def test_property_bounds_monotone(l, t1, t2):
    lo, hi = sorted((t1, t2))
    r_lo, r_hi = tl.tilted_risk(l, lo), tl.tilted_risk(l, hi)
    tol = 1e-12 * max(1.0, float(np.max(np.abs(l))))
    assert l.min() - tol <= r_lo <= l.max() + tol
    assert r_lo <= r_hi + tol
    w = tl.tilted_weights(l, t1)
    assert abs(w.sum() - 1) < 1e-12 and np.all(w >= 0)


@settings(max_examples=40, deadline=None)
@given(l=finite_losses, t=tilt_values, data=st.data())
def test_property_hierarchy_collapses(l, t, data):
    g = np.array(data.draw(st.lists(st.integers(0, 3), min_size=l.size, max_size=l.size)))
    tol = 1e-11 * max(1.0, float(np.max(np.abs(l))))
    assert abs(tl.hierarchical_risk(l, g, (t, t)) - tl.tilted_risk(l, t)) <= tol
    w = tl.hierarchical_weights(l, g, (t, -t))
    assert abs(w.sum() - 1) < 1e-12


# ---------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"losses": [1.0, float("nan")]}, ValueError, "`losses` contains NaN"),
        ({"losses": [1.0, float("inf")]}, ValueError, "`losses` contains infinite"),
        ({"losses": []}, ValueError, "`losses` must not be empty"),
        ({"losses": 3.0}, ValueError, "`losses` must have at least one dimension"),
        ({"t": float("nan")}, ValueError, "`t` must not be NaN"),
        ({"t": [[1.0]]}, ValueError, "`t` must be a scalar or a 1-d"),
        ({"t": "x"}, TypeError, "`t`"),
        ({"t": None}, TypeError, "`t`"),
        ({"weights": [1.0, -1.0, 1.0]}, ValueError, "`weights` must be non-negative"),
        ({"weights": [0.0, 0.0, 0.0]}, ValueError, "`weights` must not be all zero"),
        ({"weights": [1.0, 1.0]}, ValueError, "`weights` has length 2"),
        ({"weights": [1.0, float("nan"), 1.0]}, ValueError, "`weights` contains NaN"),
        ({"axis": 3}, ValueError, "`axis`=3 is out of range"),
        ({"losses": [1 + 2j, 3.0, 1.0]}, TypeError, "complex"),
    ],
)
def test_bad_input(xp, kwargs, exc, match):
    args = {"losses": [1.0, 2.0, 3.0], "t": 1.0}
    args.update(kwargs)
    if not isinstance(args["losses"], float) and not any(
        isinstance(v, complex) for v in args["losses"]
    ):
        if len(args["losses"]) or xp.__name__ != "array_api_strict":
            args["losses"] = xp.asarray(np.asarray(args["losses"], dtype=np.float64))
    with pytest.raises(exc, match=match):
        r = tl.tilted_risk(args.pop("losses"), args.pop("t"), **args)
        if hasattr(r, "dask"):  # Dask: values are validated when the lazy result computes
            r.compute()


def test_nonfinite_opt_in():
    # opting out of the check returns IEEE results instead of raising
    with np.errstate(all="ignore"):
        r = tl.tilted_risk(np.array([1.0, np.inf]), 0.0, check_finite=False)
    assert r == np.inf


def test_mixed_backends_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="`losses` and `weights` come from two different"):
        tl.tilted_risk(np.ones(3), 1.0, weights=torch.ones(3, dtype=torch.float64))
    # tilts are parameters: taken from any library (see tests/test_hardening.py)
    r = tl.tilted_risk(np.ones(3), torch.asarray([1.0, 2.0]))
    assert isinstance(r, np.ndarray) and r.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("groups", "tilts", "weights", "exc", "match"),
    [
        ([0, 0, 1], (1.0,), None, ValueError, "`tilts` must have 2 entries"),
        ([0, 0, 1], (1.0, 2.0, 3.0), None, ValueError, "`tilts` must have 2 entries"),
        ([0, 0, 1], (1.0, float("nan")), None, ValueError, r"`tilts\[1\]` must not be NaN"),
        ([0, 1], (1.0, 2.0), None, ValueError, "length 3"),
        ([[0, 0, 1], [0, 1, 1]], (1.0, 2.0, 3.0), None, ValueError, "not nested"),
        ([0, 0, 1], (1.0, 2.0), [1.0, 1.0, 0.0], ValueError, "empty group"),
        ([0, 0, 1], 1.0, None, TypeError, "`tilts` must be a sequence"),
        ([0, 0, 1], (1.0, "a"), None, TypeError, r"`tilts\[1\]`"),
    ],
)
def test_hierarchical_bad_input(groups, tilts, weights, exc, match):
    g = [np.array(v) for v in groups] if isinstance(groups[0], list) else np.array(groups)
    with pytest.raises(exc, match=match):
        tl.hierarchical_risk(np.array([1.0, 2.0, 3.0]), g, tilts, weights=weights)


def test_grid_chunking_matches_mpmath(xp, monkeypatch):
    # force one tilt per block: the chunked path must give the reference values too
    import tiltlab.risk.sample as risk_module

    monkeypatch.setattr(risk_module, "_GRID_CHUNK", 1)
    rng = np.random.default_rng(12)
    l = rng.uniform(0, 5, size=40)
    got = tl.tilted_risk(to_xp(xp, l), to_xp(xp, TILTS))
    want = np.array([float(ref_risk(l, t)) for t in TILTS])
    assert_close(got, want, xp=xp, rtol=0, atol=5e-12)

"""The tilted accumulator: block states and their merge against 50-digit references."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _matrix import backend_grid

from tiltlab._compat import to_numpy
from tiltlab.accumulator import (
    NonFiniteLosses,
    block_state,
    finalize_risk,
    merge,
    merge_all,
    normalized_sums,
)

mpmath.mp.dps = 50


def _mp_risk(l, p, t):
    """R(t) with 50 digits (independent of the code under test)."""
    l = [mpmath.mpf(float(v)) for v in l]
    p = [mpmath.mpf(1)] * len(l) if p is None else [mpmath.mpf(float(v)) for v in p]
    P = mpmath.fsum(p)
    z = mpmath.fsum(pi * mpmath.exp(t * li) for pi, li in zip(p, l, strict=True)) / P
    return mpmath.log(z) / t


def _mp_wsum(l, p, t, v):
    l = [mpmath.mpf(float(x)) for x in l]
    p = [mpmath.mpf(1)] * len(l) if p is None else [mpmath.mpf(float(x)) for x in p]
    m = max(l) if t > 0 else min(l)
    e = [pi * mpmath.exp(t * (li - m)) for pi, li in zip(p, l, strict=True)]
    num = mpmath.fsum(ei * mpmath.mpf(float(vi)) for ei, vi in zip(e, v, strict=True))
    return num / mpmath.fsum(e)


SPLITS = {
    "one block": lambda n: [n],
    "blocks of one": lambda n: [1] * n,
    "uneven": lambda n: [1, 2, n - 6, 3],
    "all mass first": lambda n: [n - 1, 1],
}

TILTS = [1e8, -1e8, 1e4, -3.0, -1e-3, 1e-7, 1e-14, -1e-14, 2.5]


def _states(xp, l, p, t, sizes, v=None):
    out, i = [], 0
    for k in sizes:
        lb = xp.asarray(l[i : i + k])
        pb = None if p is None else xp.asarray(p[i : i + k])
        vb = None if v is None else xp.asarray(v[i : i + k])

        def sums(pe, vb=vb):
            return () if vb is None else (xp.sum(pe * vb),)

        out.append(block_state(lb, pb, t, xp, sums=sums))
        i += k
    return out


#: every split at every tilt on NumPy; on the other backends (the same code on another
#: namespace; Dask builds a graph per block, a second or more for the blocks of one) each
#: split and each tilt at least once (``_matrix.backend_grid``; 72 tests instead of 180,
#: all of them with ``TILTLAB_FULL_MATRIX=1``)
@pytest.mark.parametrize(
    ("xp", "split", "t"), backend_grid({"split": list(SPLITS), "t": TILTS}), indirect=["xp"]
)
def test_merge_matches_mpmath(xp, split, t):
    rng = np.random.default_rng(1)
    n = 12
    l = np.round(rng.exponential(3.0, n), 3)
    l[3] = l[7] = l.max() + 1.0  # a tie at the maximum
    l[5] = l[9] = l.min() - 0.5  # and at the minimum
    v = rng.standard_normal(n)
    states = _states(xp, l, None, t, SPLITS[split](n), v)
    # left fold and balanced tree
    st = states[0]
    for other in states[1:]:
        st = merge(st, other)
    tree = merge_all(list(states))
    ref = float(_mp_risk(l, None, t))
    scale = float(np.max(np.abs(l)))
    for s in (st, tree):
        r = float(to_numpy(finalize_risk(s, xp, xp.float64)))
        assert abs(r - ref) <= 1e-13 * scale, (r, ref)
        (wv,) = normalized_sums(s)
        assert abs(float(to_numpy(wv)) - float(_mp_wsum(l, None, t, v))) <= 1e-13 * max(
            1.0, float(np.max(np.abs(v)))
        )


@pytest.mark.parametrize("t", [-2.0, 1e-9, 40.0])
def test_merge_with_prior_weights(xp, t):
    rng = np.random.default_rng(2)
    l = rng.normal(5.0, 2.0, 10)
    p = rng.random(10)
    p[2] = 0.0
    l[2] = 1e6  # off the support: must not matter
    states = _states(xp, l, p, t, [3, 1, 6])
    r = float(to_numpy(finalize_risk(merge_all(states), xp, xp.float64)))
    keep = p > 0
    ref = float(_mp_risk(l[keep], p[keep], t))
    assert abs(r - ref) <= 1e-13 * 10


def test_spread_regimes_switch_between_blocks(xp):
    # each block is in the small-|t| regime, the merged set is not
    t = 0.9
    l = np.array([0.0, 0.5, 1.0, 1.1, 1.9, 2.0])
    states = _states(xp, l, None, t, [3, 3])
    assert states[0].q is not None and states[1].q is not None
    st = merge(states[0], states[1])
    assert st.q is None
    r = float(to_numpy(finalize_risk(st, xp, xp.float64)))
    assert abs(r - float(_mp_risk(l, None, t))) <= 1e-15 * 4


def test_float32_state(xp):
    rng = np.random.default_rng(3)
    l = rng.exponential(2.0, 1000).astype(np.float32)
    for t in (-1e-6, 3.0, -50.0):
        states = _states(xp, l, None, t, [100] * 10)
        st = merge_all(states)
        r = finalize_risk(st, xp, xp.float32)
        assert r.dtype == xp.float32
        assert abs(float(to_numpy(r)) - float(_mp_risk(l, None, t))) <= 2e-6 * float(l.max())


def test_tiny_tilt_uses_mean(xp):
    l = np.array([1.0, 2.0, 4.0])
    st = merge_all(_states(xp, l, None, 1e-200, [1, 2]))
    assert st.lsum is not None
    assert float(to_numpy(finalize_risk(st, xp, xp.float64))) == pytest.approx(7 / 3, rel=1e-15)


def test_nonfinite_block_raises(xp):
    with pytest.raises(NonFiniteLosses, match="`losses`"):
        block_state(xp.asarray([1.0, math.nan]), None, 1.0, xp)
    with pytest.raises(ValueError, match="`losses`"):
        block_state(xp.asarray([1.0, math.inf]), None, -1.0, xp)


def test_merge_rejects_two_tilts():
    a = block_state(np.array([1.0]), None, 1.0, np)
    b = block_state(np.array([1.0]), None, 2.0, np)
    with pytest.raises(ValueError, match="two tilts"):
        merge(a, b)


# ---------------------------------------------------------------------------------------
# the reduction object (TiltState.from_block / merge / risk), sample and group form


def _mp_state_risk(l, p, t):
    """R(t) with 50 digits, t = 0 included (the prior-weighted mean)."""
    if t == 0:
        p = [1.0] * len(l) if p is None else p
        pairs = zip(p, l, strict=True)
        num = mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b)) for a, b in pairs)
        return num / mpmath.fsum(mpmath.mpf(float(a)) for a in p)
    keep = [i for i in range(len(l)) if p is None or p[i] > 0]
    lk = [mpmath.mpf(float(l[i])) for i in keep]
    pk = [mpmath.mpf(1)] * len(keep) if p is None else [mpmath.mpf(float(p[i])) for i in keep]
    if abs(t) * float(max(lk) - min(lk)) < 1e-20:
        # 50 digits cannot resolve log(1 + O(t)): the cumulant series is exact there
        P = mpmath.fsum(pk)
        mean = mpmath.fsum(a * b for a, b in zip(pk, lk, strict=True)) / P
        k2 = mpmath.fsum(a * (b - mean) ** 2 for a, b in zip(pk, lk, strict=True)) / P
        k3 = mpmath.fsum(a * (b - mean) ** 3 for a, b in zip(pk, lk, strict=True)) / P
        return mean + t * k2 / 2 + t * t * k3 / 6
    return _mp_risk([l[i] for i in keep], None if p is None else [p[i] for i in keep], t)


def _blocks_of(xp, l, p, sizes, dtype):
    i, out = 0, []
    for k in sizes:
        lb = xp.asarray(np.asarray(l[i : i + k], dtype=dtype))
        pb = None if p is None else xp.asarray(np.asarray(p[i : i + k], dtype=dtype))
        out.append((lb, pb))
        i += k
    return out


REDUCTION_TILTS = [0.0, 1e8, -1e8, 1e-14, -1e-14, 1e-200, 3.0, -0.7]
REDUCTION_SPLITS = {"one block": [13], "blocks of one": [1] * 13, "uneven": [2, 7, 1, 3]}


#: every split, tilt and prior on NumPy; on the other backends each tilt at least once and
#: each split with and without a prior (``_matrix.backend_grid``; 80 tests instead of
#: 240, all of them with ``TILTLAB_FULL_MATRIX=1``)
@pytest.mark.parametrize(
    ("xp", "split", "t", "prior"),
    backend_grid(
        {"split": list(REDUCTION_SPLITS), "t": REDUCTION_TILTS, "prior": [False, True]},
        full=[("split", "prior")],
    ),
    indirect=["xp"],
)
def test_reduction_object_matches_mpmath(xp, split, t, prior):
    from tiltlab.accumulator import TiltState

    rng = np.random.default_rng(7)
    l = np.round(rng.normal(2.0, 3.0, 13), 4)
    p = None
    if prior:
        p = rng.random(13)
        p[[0, 5, 12]] = 0.0  # zero prior weight: off the support
    blocks = _blocks_of(xp, l, p, REDUCTION_SPLITS[split], np.float64)
    states = []
    for lb, pb in blocks:
        if pb is not None and not bool(np.any(to_numpy(pb) > 0)):
            continue  # a block without support has no state
        states.append(TiltState.from_block(lb, t, pb))
    ref = float(_mp_state_risk(l, p, t))
    scale = float(np.max(np.abs(l)))
    # every merge order gives the same risk (associative and commutative up to rounding)
    orders = [list(range(len(states))), list(reversed(range(len(states))))]
    orders.append(list(np.random.default_rng(3).permutation(len(states))))
    for order in orders:
        st = states[order[0]]
        for k in order[1:]:
            st = st.merge(states[k])
        r = st.risk(xp, xp.float64)
        assert r.dtype == xp.float64
        assert abs(float(to_numpy(r)) - ref) <= 4e-15 * scale, (order, float(to_numpy(r)), ref)
    # finalize gives the risk and the normalised sums together
    r2, sums = merge_all(states).finalize(xp, xp.float64)
    assert sums == ()
    assert abs(float(to_numpy(r2)) - ref) <= 4e-15 * scale


@pytest.mark.parametrize("t", [0.0, 2.0, -1e-14, 1e-200, -40.0])
def test_reduction_float32(xp, t):
    from tiltlab.accumulator import TiltState

    rng = np.random.default_rng(11)
    l = rng.exponential(2.0, 300).astype(np.float32)
    blocks = _blocks_of(xp, l, None, [1, 150, 49, 100], np.float32)
    st = merge_all([TiltState.from_block(lb, t) for lb, _ in blocks])
    r = st.risk(xp, xp.float32)
    assert r.dtype == xp.float32
    ref = float(_mp_state_risk(l.astype(np.float64), None, t))
    assert abs(float(to_numpy(r)) - ref) <= 4e-6 * float(l.max())


@pytest.mark.parametrize("t", [0.0, 1e-310, 1e-300, 1e-200, 1e-8, 5.0, -3.0])
def test_reduction_group_form_matches_mpmath(xp, t):
    """The group form: per-group risks of uneven groups, a chunk split that leaves
    groups out of some blocks, merged in two orders, against 50 digits."""
    from tiltlab.accumulator import GroupState, TiltState
    from tiltlab.segments import Segments

    rng = np.random.default_rng(5)
    n, G = 40, 5
    codes = np.sort(rng.integers(0, G, n))  # sorted: the first block misses the last groups
    l = np.round(rng.normal(0.0, 4.0, n), 3)
    l[codes == 3] = l[codes == 3] * 1e-3  # a group with a tiny spread
    p = rng.random(n)
    p[::7] = 0.0
    cuts = [0, 9, 10, 31, n]
    states = []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        seg = Segments.from_codes(codes[a:b], G)
        st = TiltState.from_block(xp.asarray(l[a:b]), t, xp.asarray(p[a:b]), segments=seg)
        assert isinstance(st, GroupState)
        states.append(st.to_host())
    for order in (states, states[::-1]):
        st = order[0]
        for other in order[1:]:
            st = st.merge(other)
        R = np.asarray(st.risk(np, np.float64))
        for g in range(G):
            on = codes == g
            ref = float(_mp_state_risk(list(l[on]), list(p[on]), t))
            assert abs(R[g] - ref) <= 4e-15 * max(1.0, float(np.max(np.abs(l[on])))), (g, R[g])


def test_reduction_extra_sums_are_normalised(xp):
    from tiltlab.accumulator import TiltState

    l = np.array([0.5, 2.0, -1.0, 3.5, 0.0])
    v = np.array([1.0, -2.0, 0.5, 4.0, 3.0])
    t = -1.3
    blocks = [(xp.asarray(l[a:b]), xp.asarray(v[a:b])) for a, b in ((0, 1), (1, 4), (4, 5))]
    st = merge_all(
        [
            TiltState.from_block(lb, t, sums=lambda pe, vb=vb: (xp.sum(pe * vb),))
            for lb, vb in blocks
        ]
    )
    (wv,) = st.normalized_sums()
    assert abs(float(to_numpy(wv)) - float(_mp_wsum(l, None, t, v))) <= 1e-15 * 4


def test_reduction_huge_spread_tiny_tilt():
    # the spread overflows (2e308) while the tilt is tiny: the exponents are halved first
    from tiltlab.accumulator import TiltState

    l = np.array([1e308, -1e308])
    for t in (1e-310, 1e-308, -1e-309):
        a = TiltState.from_block(l[:1], t)
        b = TiltState.from_block(l[1:], t)
        ref = _mp_state_risk(list(l), None, t)
        for st in (TiltState.from_block(l, t), a.merge(b), b.merge(a)):
            r = float(st.risk())
            assert abs(r - float(ref)) <= 1e-12 * abs(float(ref)), (t, r, float(ref))

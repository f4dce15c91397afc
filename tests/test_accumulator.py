"""The tilted accumulator: block states and their merge against 50-digit references."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

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


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("t", TILTS)
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

"""The CUDA scalar functions (``tiltlab/_cupy/tilt.cuh``) on the CPU: the header built as
host C and called through ctypes, point by point against the array-API losses of
:mod:`tiltlab.losses`, 50-digit mpmath and :class:`tiltlab.accumulator.TiltState`."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _contract import reference_loss, reference_tilted
from cuda_host import host

from tiltlab._cupy import source
from tiltlab._cupy.engine import has_c_code
from tiltlab.accumulator import TiltState
from tiltlab.losses import LOSS_NAMES, get_loss

mpmath.mp.dps = 50

DTYPES = [np.float32, np.float64]
Z_GRID = [
    -1e4,
    -745.0,
    -88.0,
    -40.0,
    -3.5,
    -1.0,
    -1e-3,
    -1e-20,
    0.0,
    1e-20,
    1e-3,
    0.5,
    1.0,
    2.75,
    17.0,
    40.0,
    88.0,
    745.0,
    1e4,
]
LABELS = {"squared": [-2.5, 0.0, 1.0, 3.0], "logistic": [0.0, 1.0]}


def _mp_loss(name, z, y):
    # the defining formulas (the reference module takes the digits their cancellations
    # need: softplus(z) - z at z = 1e4 takes some 4400)
    with mpmath.workdps(60):
        return reference_loss(name, z, y)


def _close(got, want, eps, scale=0.0, floor=1e-300):
    """``got`` within a few roundings of ``want`` (relative), or of ``scale``, or within
    ``floor`` (the smallest normal number: subnormal results carry absolute errors)."""
    want = float(want)
    tol = 8 * eps * (abs(want) + scale) + floor
    return abs(got - want) <= tol or (math.isinf(want) and got == want)


def test_every_registered_loss_has_c_code_or_is_refused():
    # a loss added to the registry appears in the kernel, or the engine refuses it
    assert set(source.C_LOSSES) <= set(LOSS_NAMES)
    for name in LOSS_NAMES:
        assert has_c_code(get_loss(name)) == (name in source.C_LOSSES)
    # every scalar loss of the table has C code; the multinomial loss (vector-valued) not
    assert set(source.C_LOSSES) == set(LOSS_NAMES) - {"multinomial"}

    class Shifted(type(get_loss("squared"))):  # same name, other values: refused
        def _value(self, z, y, xp):
            return super()._value(z, y, xp) + 1.0

    assert not has_c_code(Shifted())
    with pytest.raises(ValueError, match="`loss`: no C code for 'multinomial'"):
        source.vg_source("multinomial", np.float64, 3)


def test_the_loss_parameter_reaches_the_build():
    assert source.loss_key(get_loss("pinball", quantile=0.25)) == ("pinball", 0.25)
    assert source.loss_key("huber") == ("huber", 0.0)
    src = source.vg_source(get_loss("huber", delta=1.35), np.float32, 8)
    assert "#define TL_PARAM 1.35\n" in src and "#define TL_LOSS tl_loss_huber\n" in src
    assert "#define TL_PARAM" not in source.vg_source(get_loss("poisson"), np.float32, 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["squared", "logistic"])
def test_losses_match_mpmath_and_the_array_api_losses(name, dtype):
    h = host(dtype)
    eps, tiny = float(np.finfo(dtype).eps), float(np.finfo(dtype).tiny)
    loss = get_loss(name)
    for y in LABELS[name]:
        zs = np.array(Z_GRID, dtype=dtype)
        ys = np.full_like(zs, y)
        ref = loss.derivatives(zs, ys)  # the array-API loss, same dtype
        for k, z in enumerate(zs):
            got = h.loss(name, float(z), float(ys[k]))
            want = _mp_loss(name, float(z), float(ys[k]))
            for j in range(3):
                # the first derivative of the logistic loss is s - y: relative to 1
                scale = 1.0 if (name == "logistic" and j == 1) else 0.0
                assert _close(got[j], want[j], eps, scale, tiny), (name, z, y, j, got[j])
                np.testing.assert_allclose(
                    got[j], float(ref[j][k]), rtol=4 * eps, atol=4 * eps * scale + tiny
                )


def _mp_risk(losses, t):
    return reference_tilted([float(v) for v in losses], t)[0]


TILTS = [-1e8, -40.0, -2.0, -1e-3, -1e-9, -1e-300, 0.0, 1e-300, 1e-12, 1e-3, 0.7, 5.0, 300.0, 1e8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", TILTS)
def test_state_risk_matches_tiltstate_and_mpmath(t, dtype):
    h = host(dtype)
    eps = float(np.finfo(dtype).eps)
    rng = np.random.default_rng(int(abs(t) * 1e3) % 97)
    l = (rng.standard_normal(61) * 3.0 + 1.0).astype(dtype)
    # blocks of different sizes, one of them empty, merged in a scrambled order
    cuts = [0, 7, 7, 30, 44, 61]
    parts = [h.of(l[a:b], t) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    order = [3, 0, 2, 4, 1]
    whole = h.empty()
    for i in order:
        whole = h.merge(whole, parts[i], t)[0]
    got = h.risk(whole, t)
    want = _mp_risk(l, t)
    ref = float(TiltState.from_block(l, t).risk())
    scale = float(np.max(np.abs(l)))
    assert _close(got, want, eps, scale), (got, float(want))
    assert abs(got - ref) <= 16 * eps * scale
    assert whole.mass == 61 and whole.hi == l.max() and whole.lo == l.min()


def _same(a, b):
    """Two state rows equal field by field (a dropped ``q`` is NaN in both)."""
    return np.array_equal(np.array(a), np.array(b), equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_empty_state_is_the_identity(dtype):
    h = host(dtype)
    e = h.empty()
    assert h.is_empty(e) and h.row(e) == (0.0, -math.inf, math.inf, 0.0, 0.0, 0.0, 0.0)
    assert math.isnan(h.risk(e, 1.0)) and h.finite(e)
    for t in (-3.0, 1e-300, 2.0, math.inf):
        a = h.of([1.5, -2.0, 4.0], t)
        for m, fa, fb in (h.merge(a, e, t), h.merge(e, a, t)):
            assert _same(h.row(m), h.row(a))
            assert sorted((fa, fb)) == [0.0, 1.0]  # a's sums kept, none taken from e
        ee, fa, fb = h.merge(e, e, t)
        assert h.is_empty(ee) and not any(math.isnan(v) for v in h.row(ee))
    # the empty state as the old kernel wrote it for unused groups (an infinite shift,
    # mass 0) is empty too: no inf * 0 when it is merged
    for t, c in ((2.0, -math.inf), (-2.0, math.inf)):
        old = h.state(c=c, hi=-math.inf, lo=math.inf, s=0.0, q=0.0, lsum=0.0, mass=0.0)
        a = h.of([3.0, 3.0], t)
        m = h.merge(old, a, t)[0]
        assert _same(h.row(m), h.row(a)) and h.risk(m, t) == 3.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "t", [-1e8, -5.0, -1e-9, -1e-300, 1e-300, 1e-9, 1e-3, 5.0, 1e8, math.inf, -math.inf]
)
@pytest.mark.parametrize("value", [0.0, 0.6931471805599453, -7.25, 1e30])
def test_all_equal_losses(t, value, dtype):
    # theta = 0 gives every sample the same loss: the risk is that loss, the shares equal
    h = host(dtype)
    v = float(np.asarray(value, dtype=dtype))
    parts = [h.of([v] * k, t) for k in (3, 0, 5, 1)]
    whole = h.empty()
    for p in parts:
        whole = h.merge(whole, p, t)[0]
    assert h.risk(whole, t) == v
    shares = [h.share(p, whole, t) for p in parts]
    assert shares[1] == 0.0
    # a part's share is the factor of its sums: exp(0) / 9 samples
    assert all(
        s == pytest.approx(1.0 / 9.0, rel=4 * float(np.finfo(dtype).eps))
        for s in (shares[0], shares[2], shares[3])
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_infinite_tilts_and_nonfinite_losses(dtype):
    h = host(dtype)
    l = [0.5, 3.0, -1.0, 3.0]
    assert h.risk(h.of(l, math.inf), math.inf) == 3.0
    assert h.risk(h.of(l, -math.inf), -math.inf) == -1.0
    whole = h.of(l, math.inf)
    assert whole.s == 2.0  # the two largest losses share the weight
    for bad in (math.nan, math.inf, -math.inf):
        for t in (2.0, -2.0):
            st = h.of([1.0, bad, 2.0], t)
            assert not h.finite(st)
            assert not h.finite(h.merge(h.of([0.0], t), st, t)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_moves_are_exact(dtype):
    # the online state (the shift moved at each new extreme) against one pass at the
    # final shift, with the small-tilt sums q and the mean-regime sums lsum
    h = host(dtype)
    eps = float(np.finfo(dtype).eps)
    l = np.linspace(-2.0, 2.0, 41).astype(dtype)
    for t in (1e-3, -1e-3, 0.4, -3.0):
        st = h.of(l, t)
        ref = TiltState.from_block(l.astype(np.float64), t)
        c = float(l.max() if t > 0 else l.min())
        assert st.c == c
        assert st.s == pytest.approx(float(ref.s), rel=64 * eps)
        if ref.q is not None:
            assert st.q == pytest.approx(float(ref.q), rel=64 * eps)
        assert st.lsum == pytest.approx(float(np.sum(l.astype(np.float64) - c)), rel=64 * eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [-30.0, -1e-9, 0.0, 1e-12, 1e-3, 2.5])
def test_weighted_state_matches_tiltstate_with_a_prior(t, dtype):
    # the top level of a hierarchy: group risks weighted by their masses
    h = host(dtype)
    eps = float(np.finfo(dtype).eps)
    rng = np.random.default_rng(7)
    l = (rng.standard_normal(40) * 2).astype(dtype)
    p = rng.integers(1, 50, 40).astype(dtype)
    st = h.empty()
    for v, w in zip(l, p, strict=True):
        h.push_w(st, float(v), float(w), t)
    ref = TiltState.from_block(l.astype(np.float64), t, prior=p.astype(np.float64))
    assert st.mass == float(p.sum())
    got = h.risk(st, t)
    scale = float(np.max(np.abs(l)))
    assert abs(got - float(ref.risk())) <= 32 * eps * scale
    pm = [mpmath.mpf(float(w)) for w in p]
    lm = [mpmath.mpf(float(v)) for v in l]
    if abs(t) * float(max(lm) - min(lm)) < 1e-30:
        mean = mpmath.fsum(w * v for w, v in zip(pm, lm, strict=True)) / mpmath.fsum(pm)
        var = mpmath.fsum(w * (v - mean) ** 2 for w, v in zip(pm, lm, strict=True)) / mpmath.fsum(
            pm
        )
        want = mean + t * var / 2
    else:
        want = (
            mpmath.log(
                mpmath.fsum(w * mpmath.exp(t * v) for w, v in zip(pm, lm, strict=True))
                / mpmath.fsum(pm)
            )
            / t
        )
    assert _close(got, want, eps, scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1.0, -1.0, 0.25, -4.0, 1e-30])
def test_q_is_kept_exactly_while_the_range_is_small(t, dtype):
    # q (the expm1 sums) is kept while |t| (hi - lo) <= 1 and NaN after, as
    # TiltState drops it; each sample's factor e = exp(t (l - c)) is within a few ulp
    # of 50 digits on both sides of the switch (expm1(u) + 1 below it, exp above)
    h = host(dtype)
    eps = float(np.finfo(dtype).eps)
    losses = [0.0, 0.5, -0.5, 0.75, -0.25, 2.0, -3.0, 0.1]
    c = max(losses) if t > 0 else min(losses)
    st = h.empty()
    h.push(st, c, t)  # the shift first: every later add keeps it
    seen = [c]
    for v in losses:
        e = h.add(st, v, t)
        seen.append(v)
        want = mpmath.exp(mpmath.mpf(t) * (mpmath.mpf(v) - mpmath.mpf(c)))
        assert abs(e - float(want)) <= 4 * eps * float(want), (v, e, float(want))
        small = abs(t) * (max(seen) - min(seen)) <= 1.0
        assert math.isnan(st.q) != small, (seen, st.q)
        terms = [mpmath.mpf(t) * (mpmath.mpf(x) - mpmath.mpf(c)) for x in seen]
        s_ref = float(sum(mpmath.exp(u) for u in terms))
        assert st.s == pytest.approx(s_ref, rel=16 * eps)
        if small:
            q_ref = float(sum(mpmath.expm1(u) for u in terms))
            assert abs(st.q - q_ref) <= 16 * eps * max(abs(q_ref), float(np.finfo(dtype).tiny))
    ref = TiltState.from_block(np.array(seen, dtype=np.float64), t)
    assert (ref.q is None) == math.isnan(st.q)
    assert h.risk(st, t) == pytest.approx(float(ref.risk()), rel=64 * eps, abs=64 * eps)


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_drops_q_when_the_merged_range_is_large(dtype):
    h = host(dtype)
    t = 1.0
    a = h.of([0.0, 0.6], t)
    b = h.of([0.9, 1.0], t)
    far = h.of([1.7, 1.8], t)
    assert not any(math.isnan(x.q) for x in (a, b, far))  # each range <= 1
    kept = h.merge(a, b, t)[0]  # range 1.0: kept, the sum of the moved parts
    want = float(sum(mpmath.expm1(mpmath.mpf(x) - 1) for x in (0.0, 0.6, 0.9, 1.0)))
    assert kept.q == pytest.approx(want, rel=16 * float(np.finfo(dtype).eps))
    dropped = h.merge(a, far, t)[0]  # range 1.8
    assert math.isnan(dropped.q) and h.finite(dropped)
    assert h.risk(dropped, t) == pytest.approx(
        float(TiltState.from_block(np.array([0.0, 0.6, 1.7, 1.8]), t).risk()),
        rel=16 * float(np.finfo(dtype).eps),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1.0, -1.0])
def test_a_shift_beyond_the_state_keeps_each_factor_exact(t, dtype):
    # lanes that share one shift hold states whose shift lies beyond their own losses
    # (another lane's extreme): a new loss's factor exp(t (l - c)) is then far below 1
    # even when the state's own losses span less than 1 / |t|, and must stay accurate
    # relative to itself (expm1(u) + 1 would round it away); such a state drops q, and
    # its risk (and that of any merge holding it) takes the exp sums
    h = host(dtype)
    eps = float(np.finfo(dtype).eps)
    st = h.of([0.0, 0.1], t)
    far = 30.0 if t > 0 else -30.0
    h.move(st, far, t)  # the shift of a lane whose neighbour met a loss of 30
    e = h.add(st, 0.05, t)
    want = float(mpmath.exp(mpmath.mpf(t) * (mpmath.mpf(float(dtype(0.05))) - far)))
    # u = t (l - c) rounds in the dtype: exp(u) carries |u| of those roundings
    assert abs(e - want) <= (4 + abs(far)) * eps * want, (e, want)
    assert math.isnan(st.q)
    near = h.of([far], t)  # the neighbour, whose loss is the shift
    whole = h.merge(st, near, t)[0]
    ref = TiltState.from_block(np.array([0.0, 0.1, float(dtype(0.05)), far]), t)
    assert h.risk(whole, t) == pytest.approx(float(ref.risk()), rel=16 * eps)
    # the lane's own state, finished alone, still gives its own risk
    own = TiltState.from_block(np.array([0.0, 0.1, float(dtype(0.05))]), t)
    assert h.risk(st, t) == pytest.approx(float(own.risk()), rel=16 * eps, abs=16 * eps)

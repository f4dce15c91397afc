"""The tilted state's algebra: the empty state is the merge's identity, the merge commutes
and associates to rounding, and the finish of a merged state is the finish of the state
of the concatenated block, against 50-digit references (``_contract.reference_state``),
for all-equal losses, t = 0, +-inf, tiny and huge tilts, spreads up to 1e6 and empty or
unused blocks, on every backend."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _contract import CASES, TILTS, reference_state

from tiltlab._compat import to_numpy
from tiltlab.accumulator import GroupState, TiltState
from tiltlab.segments import Segments

DTYPES = ["float64", "float32"]


def _tol(losses, dtype, n_merges=4):
    eps = float(np.finfo(dtype).eps)
    return (16 + 4 * n_merges) * eps * max(max(abs(v) for v in losses), 1e-300)


def _state(xp, losses, t, dtype, at=0, n=None):
    """The state of ``losses`` with a sum that scatters the weights to positions
    ``at, at + 1, ...`` of a vector of length ``n`` (the per-sample weights)."""
    n = len(losses) if n is None else n
    l = xp.asarray(np.asarray(losses, dtype=dtype))

    def sums(pe):
        idx = np.arange(at, at + len(losses))
        onehot = xp.asarray((idx[:, None] == np.arange(n)[None, :]).astype(dtype))
        return (xp.sum(pe[:, None] * onehot, axis=0),)

    return TiltState.from_block(l, t, sums=sums, xp=xp)


def _risk(st):
    return float(np.asarray(to_numpy(st.risk())))


def _weights(st):
    return np.asarray(to_numpy(st.normalized_sums()[0]), dtype=np.float64)


def _cast(losses, dtype):
    return np.asarray(losses, dtype=dtype).astype(np.float64).tolist()


@pytest.mark.parametrize("t", TILTS, ids=repr)
@pytest.mark.parametrize("case", list(CASES))
def test_empty_state_is_the_identity(xp, case, t):
    st = _state(xp, CASES[case], t, "float64")
    empty = TiltState.empty(t)
    assert empty.is_empty and not st.is_empty
    assert empty.merge(st) is st and st.merge(empty) is st
    assert empty.merge(TiltState.empty(t)).is_empty
    assert math.isnan(float(empty.risk()))


@pytest.mark.parametrize("t", TILTS, ids=repr)
def test_blocks_without_samples_or_mass_are_empty(xp, t):
    l = xp.asarray(np.array([1.0, 2.0]))
    assert TiltState.from_block(l[:0], t, xp=xp).is_empty
    unused = TiltState.from_block(l, t, xp.asarray(np.zeros(2)), xp=xp)  # an unused lane
    assert unused.is_empty and math.isnan(float(np.asarray(to_numpy(unused.risk()))))
    used = TiltState.from_block(l, t, xp=xp)
    assert unused.merge(used) is used


@pytest.mark.skip_xp_backend(
    "dask",
    reason="Dask reaches the state chunk by chunk as NumPy (the 'dask chunks' engine of "
    "test_contract.py); a lazy state costs a compute per block, too slow for this grid",
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", TILTS, ids=repr)
@pytest.mark.parametrize("case", list(CASES))
def test_merge_commutes_associates_and_finishes_as_the_concatenation(xp, case, t, dtype):
    losses = CASES[case]
    n = len(losses)
    cast = _cast(losses, dtype)
    cuts = [(0, 2), (2, 3), (3, n - 2), (n - 2, n)]
    a, b, c, d = (_state(xp, losses[i:j], t, dtype, at=i, n=n) for i, j in cuts)
    whole = _state(xp, losses, t, dtype)
    ref_risk, ref_w = reference_state(cast, t)
    tol = _tol(cast, dtype)
    orders = {
        "left fold": a.merge(b).merge(c).merge(d),
        "right fold": a.merge(b.merge(c.merge(d))),
        "tree": a.merge(b).merge(c.merge(d)),
        "reversed": d.merge(c).merge(b.merge(a)),
        "with empties": TiltState.empty(t)
        .merge(b)
        .merge(a)
        .merge(TiltState.empty(t))
        .merge(d.merge(c)),
        "concatenated": whole,
    }
    wtol = 64 * float(np.finfo(dtype).eps)
    for name, st in orders.items():
        assert abs(_risk(st) - float(ref_risk)) <= tol, (name, _risk(st), float(ref_risk))
        w = _weights(st)
        ref = np.array([float(x) for x in ref_w])
        cond = 1.0 + (0.0 if t == 0 or math.isinf(t) else abs(t) * (max(cast) - min(cast)))
        # weights below exp(-1/eps) relative carry the exponent's rounding |t| eps spread
        ok = np.abs(w - ref) <= wtol * cond * ref + float(np.finfo(dtype).smallest_normal)
        assert ok.all(), (name, w[~ok][:3], ref[~ok][:3])


@pytest.mark.parametrize("t", [0.0, 1e-300, 1e-12, 2.5, 1e8, math.inf, -math.inf])
def test_group_states_merge_group_by_group_with_empty_groups(xp, t):
    """A group state whose blocks leave groups empty (unused lanes of a group layout):
    per group, the merge equals the 50-digit risk of that group's losses; a group with
    no samples anywhere stays empty (NaN); the empty group state is the identity."""
    l1 = np.array([1.0, 3.0, 2.0, 2.0])
    c1 = np.array([0, 0, 2, 2])  # group 1 empty in this block, group 3 everywhere
    l2 = np.array([5.0, 0.5, 1e6])
    c2 = np.array([1, 0, 1])
    G = 4
    st1 = GroupState.from_block(xp.asarray(l1), t, segments=Segments.from_codes(c1, G), xp=xp)
    st2 = GroupState.from_block(xp.asarray(l2), t, segments=Segments.from_codes(c2, G), xp=xp)
    empty = TiltState.empty(t, n_groups=G)
    assert isinstance(empty, GroupState) and empty.is_empty
    assert empty.merge(st1) is st1
    merged = st1.merge(st2)
    with np.errstate(invalid="ignore"):  # lazy backends divide 0 / 0 (the empty group) here
        risks = np.asarray(to_numpy(merged.risk()), dtype=np.float64)
    groups = np.concatenate([c1, c2])
    values = np.concatenate([l1, l2])
    for g in range(G):
        members = values[groups == g].tolist()
        if not members:
            assert math.isnan(risks[g])
            continue
        ref = float(reference_state(members, t)[0])
        assert abs(risks[g] - ref) <= _tol(members, "float64"), (g, risks[g], ref)


def test_merge_refuses_states_of_two_layouts_or_tilts():
    l = np.array([1.0, 2.0])
    st = TiltState.from_block(l, 1.0)
    groups = TiltState.from_block(l, 1.0, segments=Segments.from_codes([0, 1], 2))
    with pytest.raises(ValueError, match="layouts"):
        st.merge(groups)
    with pytest.raises(ValueError, match="two tilts"):
        st.merge(TiltState.from_block(l, 2.0))
    with pytest.raises(ValueError, match="NaN"):
        TiltState.empty(math.nan)


@pytest.mark.parametrize("t", [math.inf, -math.inf])
def test_infinite_tilt_is_the_extreme_with_tied_prior_weights(t):
    """Regression: at t = +-inf the block state was 0 * inf = NaN (its risk NaN, with a
    warning); it is the limit: the extreme, with the prior restricted to its ties."""
    l = np.array([1.0, 4.0, 0.5, 4.0, 0.5])
    p = np.array([1.0, 1.0, 3.0, 3.0, 0.0])  # the last tie at the minimum is off the support
    st = TiltState.from_block(l, t, p, sums=lambda pe: (pe,))
    extreme, ties = (4.0, [0, 1, 0, 1, 0]) if t > 0 else (0.5, [0, 0, 1, 0, 1])
    assert float(st.risk()) == extreme
    w = np.asarray(ties, dtype=float) * p
    np.testing.assert_array_equal(st.normalized_sums()[0], w / w.sum())


@pytest.mark.parametrize("split", [1, 2])
def test_mean_state_of_spread_beyond_float_max(xp, split):
    # t = 0 with losses spanning more than the float maximum: the block's differences to
    # its shift (and the merge's moves) overflow unless taken in halves; with the unit
    # weight 1 / N the sum of the weighted differences, 1.37e308, is finite
    unit = 1.0 / 3.0
    values = [1.7e308, -1.7e308, -1e308]
    want = float(reference_state(values, 0.0)[0])
    l = xp.asarray(np.array(values))
    whole = TiltState.from_block(l, 0.0, xp=xp, unit=unit)
    a = TiltState.from_block(l[:split], 0.0, xp=xp, unit=unit)
    b = TiltState.from_block(l[split:], 0.0, xp=xp, unit=unit)
    seg = Segments.from_codes([0, 0, 1])
    groups = TiltState.from_block(l, 0.0, segments=seg, xp=xp, unit=unit)
    # a sum of 3 halved differences and its move: (3 + 4) eps of the largest |loss|
    tol = 7 * float(np.finfo(np.float64).eps) * 1.7e308
    for st in (whole, a.merge(b), b.merge(a), groups.collapse()):
        r = float(to_numpy(st.risk()))
        assert abs(r - want) <= tol, (r, want)
    g = to_numpy(groups.risk())
    assert abs(float(g[0])) <= tol and float(g[1]) == -1e308, g

"""The packed tilted state (tiltlab.accumulator.packed) against 50-digit references: each
field of a block, merges in any order and grouping equal to one pass over the union, the
finish, the effective sample size, groups, on every array library."""

from __future__ import annotations

import functools
import itertools
import math
import random

import mpmath
import numpy as np
import pytest
from _contract import CASES, DPS, TILTS, eps, reference_state, state_tolerance, tiny
from _matrix import backend_grid

from tiltlab._compat import to_numpy
from tiltlab.accumulator import packed

DTYPES = ["float32", "float64"]


@functools.cache
def _ref_fields_cached(losses: tuple, t: float) -> dict:
    return _ref_fields(list(losses), t)


def _ref_fields(losses: list[float], t: float) -> dict:
    """hi, lo, mass, s, q, lsum, s2 of one pass over ``losses`` (unit prior), 50 digits."""
    with mpmath.workdps(DPS):
        l = [mpmath.mpf(v) for v in losses]
        hi, lo = max(l), min(l)
        c = hi if t > 0 else lo
        out = {"hi": hi, "lo": lo, "mass": mpmath.mpf(len(l))}
        out["lsum"] = mpmath.fsum(v - c for v in l)
        if t == 0:
            out.update(s=out["mass"], q=mpmath.mpf(0), s2=out["mass"])
        elif math.isinf(t):
            ties = mpmath.mpf(sum(1 for v in l if v == c))
            out.update(s=ties, q=mpmath.mpf(0), s2=ties)
        else:
            u = [mpmath.mpf(t) * (v - c) for v in l]
            out["s"] = mpmath.fsum(mpmath.exp(x) for x in u)
            out["q"] = mpmath.fsum(mpmath.expm1(x) for x in u)
            out["s2"] = mpmath.fsum(mpmath.exp(2 * x) for x in u)
        return out


def _field_ok(got: float, want, losses: list[float], t: float, dtype, n_merges: int) -> bool:
    """Each field is a sum of terms of one sign; a term carries the rounding of its
    exponent ``t (l - c)`` (``eps |u|`` relative) and of the shift difference, each merge a
    few more roundings."""
    u_max = 0.0 if t == 0 or math.isinf(t) else abs(t) * (max(losses) - min(losses))
    spread = max(abs(v) for v in losses)
    e = eps(dtype)
    tol = (8 + 4 * n_merges) * e * (1.0 + u_max) * (abs(float(want)) + len(losses) * spread)
    return abs(mpmath.mpf(got) - want) <= tol + len(losses) * tiny(dtype)


def _tilt(t, xp, dtype, array_tilt):
    if not array_tilt:
        return packed.fit_tilt(t, getattr(np, dtype), np)
    return xp.asarray(t, dtype=getattr(xp, dtype))


def _groupings(n: int, seed: int):
    """Random orders and trees of ``n`` parts: a list of (order, tree) where the tree
    merges neighbours in a random pattern."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    return order, rng


def _merge_randomly(states, t, xp, rng):
    """Merge states by repeatedly merging a random run of neighbours (any grouping)."""
    states = list(states)
    while len(states) > 1:
        i = rng.randrange(len(states) - 1)
        k = rng.randint(2, min(3, len(states) - i))
        merged = packed.merge(xp.stack(states[i : i + k]), t, xp)
        states[i : i + k] = [merged]
    return states[0]


#: every dtype, case, tilt and form of the tilt on NumPy; on the other backends a covering
#: design in which each meets every case at every tilt (``_matrix.backend_grid``)
@pytest.mark.parametrize(
    ("xp", "dtype", "case", "t", "array_tilt"),
    backend_grid(
        {"dtype": DTYPES, "case": list(CASES), "t": TILTS, "array_tilt": [False, True]},
        full=[("case", "t")],
    ),
    indirect=["xp"],
)
def test_merges_in_any_order_and_grouping_follow_the_references(xp, dtype, case, t, array_tilt):
    losses = CASES[case]
    cast = [float(v) for v in np.asarray(losses, dtype=dtype).tolist()]
    tt = _tilt(t, xp, dtype, array_tilt)
    xdtype = getattr(xp, dtype)
    sizes = [0, 3, 1, 0, len(cast) - 6, 2]
    parts, at = [], 0
    for k in sizes:
        parts.append(xp.asarray(cast[at : at + k], dtype=xdtype))
        at += k
    states = [packed.block(p, None, tt, xp) for p in parts]
    order, rng = _groupings(len(states), seed=len(cast) + int(array_tilt))
    merged = _merge_randomly([states[i] for i in order], tt, xp, rng)
    one_pass = packed.block(xp.asarray(cast, dtype=xdtype), None, tt, xp)
    # an array tilt is rounded to the dtype (1e-300 is 0 in float32)
    t = float(np.asarray(t, dtype=dtype)) if array_tilt else t
    ref = _ref_fields_cached(tuple(cast), t)
    for state, n_merges in ((merged, len(states)), (one_pass, 0)):
        assert state.shape == (packed.N_FIELDS, 1)
        got = to_numpy(state)[:, 0].astype(np.float64)
        for name, value in zip(packed.FIELDS, got.tolist(), strict=True):
            assert _field_ok(value, ref[name], cast, t, dtype, n_merges), (name, value, ref[name])
        risk, present, _ = packed.finish(state, tt, xp)
        ref_risk, _ = reference_state(cast, t)
        tol = state_tolerance([np.asarray(cast, dtype=dtype)] * max(n_merges, 1), t, dtype)
        r = float(to_numpy(risk)[0])
        assert abs(r - float(ref_risk)) <= tol, (r, float(ref_risk), tol)
        assert bool(to_numpy(present)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_grouping_of_four_parts_gives_one_state(dtype):
    # all 5 binary trees over 4 parts, in all 24 orders: one state, to a few roundings
    losses = np.asarray(CASES["both signs"], dtype=dtype)
    t = 0.25
    parts = [losses[:2], losses[2:3], losses[3:6], losses[6:]]
    states = [packed.block(p, None, t, np) for p in parts]

    def m(*sts):
        return packed.merge(np.stack(sts), t, np)

    trees = [
        lambda a, b, c, d: m(m(m(a, b), c), d),
        lambda a, b, c, d: m(m(a, m(b, c)), d),
        lambda a, b, c, d: m(m(a, b), m(c, d)),
        lambda a, b, c, d: m(a, m(m(b, c), d)),
        lambda a, b, c, d: m(a, m(b, m(c, d))),
    ]
    one = packed.block(losses, None, t, np)
    for perm in itertools.permutations(states):
        for tree in trees:
            got = tree(*perm)
            np.testing.assert_allclose(got, one, rtol=64 * eps(dtype), atol=0)
            np.testing.assert_allclose(m(*perm), one, rtol=64 * eps(dtype), atol=0)


@pytest.mark.parametrize("t", [0.0, 1e-9, 0.7, -2.0, math.inf, -math.inf], ids=str)
def test_groups_and_absent_groups(xp, t):
    # three groups, the middle one without samples in the first batch and in all of them
    losses = [0.5, 2.0, 9.0, 1.0, 4.0, 3.0]
    codes = [0, 2, 2, 0, 3, 3]
    n_groups = 4
    mask = np.zeros((len(losses), n_groups))
    mask[np.arange(len(losses)), codes] = 1.0
    x = xp.asarray(losses, dtype=xp.float64)
    m = xp.asarray(mask, dtype=xp.float64)
    st = packed.block(x, m, t, xp)
    halves = xp.stack([packed.block(x[:3], m[:3, :], t, xp), packed.block(x[3:], m[3:, :], t, xp)])
    merged = packed.merge(halves, t, xp)
    for state in (st, merged):
        risk, present, _ = packed.finish(state, t, xp)
        assert to_numpy(present).tolist() == [True, False, True, True]
        assert np.all(np.isfinite(to_numpy(state)))  # an absent group: finite extremes
        for g in (0, 2, 3):
            group = [v for v, c in zip(losses, codes, strict=True) if c == g]
            want = float(reference_state(group, t)[0])
            assert abs(float(to_numpy(risk)[g]) - want) <= 64 * eps("float64") * 9.0
        assert float(to_numpy(risk)[1]) == 0.0
        assert math.isnan(float(to_numpy(packed.ess_fraction(state, xp))[1]))


@pytest.mark.parametrize("t", [0.0, 1e-6, 0.5, -3.0, math.inf], ids=str)
def test_effective_sample_size_against_its_definition(xp, t):
    losses = [0.25, 3.5, 1.0, 7.75, 2.0, 7.75]
    st = packed.block(xp.asarray(losses, dtype=xp.float64), None, t, xp)
    with mpmath.workdps(DPS):
        _, w = reference_state(losses, t)
        want = 1 / (len(losses) * mpmath.fsum(x * x for x in w))
    got = float(to_numpy(packed.ess_fraction(st, xp))[0])
    assert abs(got - float(want)) <= 32 * eps("float64") * (
        1 + 7.75 * (abs(t) if t != math.inf else 0)
    )


def test_the_field_check_can_fail():
    ref = _ref_fields([0.0, 1.0, 2.0], 0.5)
    assert _field_ok(float(ref["s"]), ref["s"], [0.0, 1.0, 2.0], 0.5, "float64", 0)
    assert not _field_ok(
        float(ref["s"]) * (1 + 1e-10), ref["s"], [0.0, 1.0, 2.0], 0.5, "float64", 0
    )


def test_the_merge_and_finish_compile_without_graph_breaks():
    torch = pytest.importorskip("torch")
    from tiltlab._compat import library_namespace

    xp = library_namespace(torch.empty(0))

    def step(a, b, t):
        st = packed.merge(
            xp.stack([packed.block(a, None, t, xp), packed.block(b, None, t, xp)]), t, xp
        )
        return packed.finish(st, t, xp)[0]

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    a = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64)
    b = torch.tensor([2.0, 3.0], dtype=torch.float64)
    for t in (0.0, 1e-12, 2.0, -math.inf):
        tt = torch.tensor(t, dtype=torch.float64)
        want = float(reference_state([0.0, 1.0, 4.0, 2.0, 3.0], t)[0])
        assert abs(float(compiled(a, b, tt)[0]) - want) <= 32 * eps("float64") * 4.0


@pytest.mark.parametrize("t", [1e-12, 0.1, 2.5, -3.0], ids=str)
def test_the_fields_mean_what_the_compiled_kernels_states_mean(t):
    # the compiled CPU kernels store (shift, hi, lo, mass, s, q, lsum, bad, av) per chunk:
    # hi to lsum are the packed state's rows 0 to 5 (q only where |t| (hi - lo) <= 1)
    pytest.importorskip("numba")
    from tiltlab._cpu_kernels import FusedProblem

    losses = np.asarray(CASES["spread"])  # >= 0: the absolute loss at z = l, y = 0
    fp = FusedProblem("absolute", losses[:, None], np.zeros(losses.shape[0]), n_chunks=1)
    kernel = fp.block_states(np.ones(1), t)
    ours = packed.block(losses, None, t, np)[:, 0]
    names = ["hi", "lo", "mass", "s", "lsum"]
    if abs(t) * (losses.max() - losses.min()) <= 1.0:
        names.append("q")
    for name in names:
        want = float(getattr(kernel, name)[0])
        got = float(ours[packed.FIELDS.index(name)])
        assert abs(got - want) <= 64 * eps("float64") * (abs(want) + losses.sum()), name
    assert float(kernel.shift[0]) == float(packed.shift(ours[:, None], t, np)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("near", [True, False])
def test_normaliser_term_on_every_backend(xp, dtype, near):
    """``expm1(u)`` near t = 0, else ``exp(u)``, against 50 digits, in the input's
    namespace and dtype, with and without writing over ``u``."""
    u_host = [-1.0, -0.3, -1e-6, -1e-12, 0.0] if near else [-700.0 / 8, -5.0, -0.5, 0.0]
    dt = getattr(xp, dtype)
    for overwrite in (False, True):
        u = xp.asarray(u_host, dtype=dt)
        out = packed.normaliser_term(u, near, xp, overwrite=overwrite)
        assert out.dtype == dt and type(out) is type(xp.asarray(u_host, dtype=dt))
        got = to_numpy(out).astype(float)
        with mpmath.workdps(DPS):
            for g, v in zip(got, u_host, strict=True):
                x = mpmath.mpf(float(np.asarray(v, dtype=dtype)))
                want = mpmath.expm1(x) if near else mpmath.exp(x)
                assert abs(g - want) <= 2 * eps(dtype) * abs(want) + tiny(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1e-3, 0.7, -2.0], ids=str)
def test_moved_sums_on_every_backend(xp, dtype, t):
    """A block's sums moved from its own shift to another equal the sums formed at that
    shift (50 digits), in the input's namespace and dtype; ``None`` sums stay ``None``."""
    losses = [0.0, 0.25, 1.0, 1.5]
    dt = getattr(xp, dtype)
    st = packed.block(xp.asarray(losses, dtype=dt), None, t, xp)
    mass, s, q, lsum = (st[packed.FIELDS.index(k), ...] for k in ("mass", "s", "q", "lsum"))
    c_k = max(losses) if t > 0 else min(losses)
    c = c_k + (0.5 if t > 0 else -0.5)  # beyond every loss on the tilt's side
    f, fm = packed.exponent_terms(xp.asarray(t * (c_k - c), dtype=dt), xp, squares=False)
    s_c, q_c, l_c = packed.moved_sums(f, fm, c_k - c, mass, s, q, lsum)
    for x in (s_c, q_c, l_c):
        assert x.dtype == dt
    with mpmath.workdps(DPS):
        u = [mpmath.mpf(t) * (mpmath.mpf(v) - mpmath.mpf(c)) for v in losses]
        want = {
            "s": mpmath.fsum(mpmath.exp(x) for x in u),
            "q": mpmath.fsum(mpmath.expm1(x) for x in u),
            "lsum": mpmath.fsum(mpmath.mpf(v) - mpmath.mpf(c) for v in losses),
        }
    for name, got in (("s", s_c), ("q", q_c), ("lsum", l_c)):
        # sums of four terms of one sign, each carrying the roundings of its exponent
        assert _field_ok(float(to_numpy(got)[0]), want[name], losses, t, dtype, 1), name
    assert packed.moved_sums(f, fm, c_k - c, mass, s)[1:] == (None, None)


# (prev, batch, t, lam): tilts at which t * (batch - prev) is subnormal or zero, from a
# subnormal t or from a normal t and a small gap; on both sides of u = 0
_SUBNORMAL_UPDATES = [
    (1.375, 0.95, 1e-320, 0.1),
    (1.375, 0.95, -1e-320, 0.1),
    (1.375, 0.95, 5e-324, 0.1),
    (0.0, 1.0, 1e-310, 0.5),
    (2.0, 0.5, -2e-310, 0.25),
    (0.0, 1e-10, 1e-300, 0.5),
    (0.0, -1e-10, -1e-300, 0.5),
    (1.375, 0.95, 1e-42, 0.1),  # subnormal in float32 only
    (0.0, 1e-10, 1e-30, 0.5),  # u subnormal in float32 only
    (0.5, 0.75, 1e-30, 0.3),  # ordinary
]


@pytest.mark.skip_xp_backend("dask", reason="a graph per case: over the time budget")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("array_tilt", [False, True])
def test_running_update_at_tilts_where_the_product_is_subnormal(xp, dtype, array_tilt):
    """``(1/t) log((1-lam) e^{t prev} + lam e^{t batch})`` against 50 digits where
    ``t (batch - prev)`` is subnormal or zero (t subnormal in the dtype or in float64):
    the t -> 0 limit ``prev + lam (batch - prev)`` to rounding, as a Python tilt and as a
    0-d tilt of the losses' dtype."""
    dt = getattr(xp, dtype)
    for prev, batch, t, lam in _SUBNORMAL_UPDATES:
        p, b = xp.asarray([prev], dtype=dt), xp.asarray([batch], dtype=dt)
        tilt = xp.asarray(t, dtype=dt) if array_tilt else t
        t_used = float(to_numpy(tilt)) if array_tilt else t
        if t_used == 0.0:  # below the dtype's range: not this test's case
            continue
        out = packed.running_update(p, b, tilt, lam, xp)
        assert out.dtype == dt
        got = float(to_numpy(out)[0])
        with mpmath.workdps(DPS):
            pv, bv = (mpmath.mpf(float(to_numpy(x)[0])) for x in (p, b))
            tv, lv = mpmath.mpf(t_used), mpmath.mpf(lam)
            inner = (1 - lv) * mpmath.expm1(tv * pv) + lv * mpmath.expm1(tv * bv)
            want = mpmath.log1p(inner) / tv
            step = lv * abs(bv - pv)
        # three roundings: the gap, its product with lam, the sum
        tol = 2 * eps(dtype) * (abs(want) + step)
        assert abs(got - want) <= tol, (prev, batch, t, lam, got, float(want))

"""Losses near the float maximum, and the synchronisation-free path for torch.compile/vmap."""

from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest
from _contract import reference_hierarchy, reference_tilted

import tiltlab as tl
from tiltlab._compat import to_numpy

mpmath.mp.dps = 50


def _mp_risk(l, t):
    return reference_tilted([float(v) for v in l], t)[0]


HUGE = [
    [1e308, 1.5e308, 1.7e308],
    [-1.7e308, 1.7e308, 0.0],
    [1.7e308, 1.7e308],
]


@pytest.mark.parametrize("values", HUGE)
@pytest.mark.parametrize("t", [-np.inf, -1.0, -1e-300, 0.0, 1e-300, 1e-305, 1.0, np.inf])
def test_losses_near_float_max_are_finite_and_exact(xp, xp_name, values, t):
    # warnings are errors in this suite: no RuntimeWarning may escape either, except on
    # Dask, whose worker threads do not see NumPy's error state (the values are still exact)
    l = xp.asarray(np.array(values))
    with warnings.catch_warnings():
        if xp_name == "dask.array":
            warnings.simplefilter("ignore", RuntimeWarning)
        r = float(to_numpy(tl.tilted_risk(l, t)))
        w = to_numpy(tl.tilted_weights(l, t))
    want = float(_mp_risk(values, t))
    assert np.isfinite(r)
    assert r == pytest.approx(want, rel=1e-12, abs=1e-12 * 1.7e308)
    assert np.all(np.isfinite(w)) and w.sum() == pytest.approx(1.0, rel=1e-12)


def test_near_float_max_on_a_grid_and_batched(xp, xp_name):
    values = np.array([[1e308, 1.5e308, 1.7e308], [1.0, 2.0, 3.0]])
    ts = np.array([-1.0, 0.0, 1.0])
    with warnings.catch_warnings():
        if xp_name == "dask.array":  # worker threads do not see NumPy's error state
            warnings.simplefilter("ignore", RuntimeWarning)
        r = to_numpy(tl.tilted_risk(xp.asarray(values), xp.asarray(ts)))
    for i, t in enumerate(ts):
        for j in range(2):
            assert r[i, j] == pytest.approx(float(_mp_risk(values[j], t)), rel=1e-12)


@pytest.fixture
def torch():
    """PyTorch, for the tests of its compiled and vmapped paths (the other tests of this
    file run without it)."""
    return pytest.importorskip("torch")


@pytest.mark.filterwarnings("ignore:Dynamo detected a call")
def test_torch_compile_fullgraph_without_checks(torch):
    l = torch.linspace(0.0, 5.0, 101, dtype=torch.float64)

    def f(x):
        return tl.tilted_risk(x, 2.0, check_finite=False)

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert float(compiled(l)) == pytest.approx(float(_mp_risk(l.tolist(), 2.0)), rel=1e-13)

    def g(x):
        return tl.tilted_weights(x, -1.5, check_finite=False)

    w = torch.compile(g, fullgraph=True, backend="eager")(l)
    assert float(w.sum()) == pytest.approx(1.0, rel=1e-13)


@pytest.mark.slow
def test_torch_compile_after_new_imports(torch, tmp_path):
    # a compiled call of tilted_risk after an earlier compilation and then the import of
    # another array library: array-api-compat's type tests (a look-up in sys.modules)
    # made dynamo fail there ("dictionary changed size during iteration"); tiltlab now
    # recognises torch tensors by their type. A new process, so that nothing earlier in
    # the test session decides the modules loaded.
    import subprocess
    import sys

    pytest.importorskip("dask.array")
    code = """
import numpy as np, torch, tiltlab as tl
from tiltlab.torch import TiltedLoss
loss_fn = torch.compile(TiltedLoss(t=1.0), fullgraph=True, backend="aot_eager")
loss_fn(torch.tensor([0.1, 0.5, 0.3], dtype=torch.float32))
import dask.array as da  # modules imported after the first compilation
tl.tilted_risk(da.from_array(np.linspace(0.0, 1.0, 10), chunks=5), 1.0).compute()
l = torch.linspace(0.0, 5.0, 101, dtype=torch.float64)
f = torch.compile(lambda x: tl.tilted_risk(x, 2.0, check_finite=False), fullgraph=True,
                  backend="eager")
w = torch.compile(lambda x: tl.tilted_weights(x, -1.5, check_finite=False), fullgraph=True,
                  backend="eager")
print(float(f(l)), float(w(l).sum()))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    value, total = map(float, out.stdout.split())
    ref = _mp_risk(torch.linspace(0.0, 5.0, 101, dtype=torch.float64).tolist(), 2.0)
    assert value == pytest.approx(float(ref), rel=1e-13)
    assert total == pytest.approx(1.0, rel=1e-13)


def test_torch_vmap_without_checks(torch):
    batch = torch.rand(4, 50, dtype=torch.float64) * 3
    out = torch.func.vmap(lambda x: tl.tilted_risk(x, 1.5, check_finite=False))(batch)
    for i in range(4):
        assert float(out[i]) == pytest.approx(float(_mp_risk(batch[i].tolist(), 1.5)), rel=1e-13)
    # and gradients through it (autograd of the sync-free kernel)
    x = batch[0].clone().requires_grad_(True)
    tl.tilted_risk(x, 1.5, check_finite=False).backward()
    want = to_numpy(tl.tilted_weights(batch[0], 1.5))
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)


# ---------------------------------------------------------------------------------------
# tiny tilts with spreads beyond the float maximum; t = 0 means near it


def _mp_series_or_risk(values, t):
    """50-digit R(t) (the reference's expm1/log1p form resolves log(1 + O(t)))."""
    return _mp_risk(values, t)


@pytest.mark.parametrize("values", [[1e308, -1e308], [1.5e308, -1.2e308, 3.0e307]])
@pytest.mark.parametrize("t", [1e-310, -1e-310, 1e-308, 3e-309, -1e-307])
def test_tiny_tilt_with_overflowing_spread(xp, xp_name, values, t):
    l = xp.asarray(np.array(values))
    with warnings.catch_warnings():
        if xp_name == "dask.array":  # worker threads do not see NumPy's error state
            warnings.simplefilter("ignore", RuntimeWarning)
        r = float(to_numpy(tl.tilted_risk(l, t)))
        w = to_numpy(tl.tilted_weights(l, t))
    want = float(_mp_series_or_risk(values, t))
    assert r == pytest.approx(want, rel=1e-10), (r, want)
    assert np.all(np.isfinite(w)) and w.sum() == pytest.approx(1.0, rel=1e-12)


def test_tiny_tilt_example_from_the_numerics_page():
    # the exact value is (1/t) log cosh(t 1e308) = 4.99991...e305
    r = float(tl.tilted_risk(np.array([1e308, -1e308]), 1e-310))
    assert r == pytest.approx(float(_mp_risk([1e308, -1e308], mpmath.mpf(1e-310))), rel=1e-10)


@pytest.mark.parametrize("tilts", [(0.0, 0.0), (1.0, 0.0), (0.0, -2.0), (-1.0, 0.0)])
def test_hierarchical_t0_means_near_float_max(xp, xp_name, tilts):
    rng = np.random.default_rng(0)
    values = rng.uniform(1.4e308, 1.7e308, 600)
    groups = np.repeat(np.arange(3), 200)
    l = xp.asarray(values)
    with warnings.catch_warnings():
        if xp_name == "dask.array":
            warnings.simplefilter("ignore", RuntimeWarning)
        r = float(to_numpy(tl.hierarchical_risk(l, groups, tilts)))
    # reference: the group risks at the inner tilt, combined at the outer tilt (equal sizes)
    inner = [_mp_risk(list(values[groups == g]), tilts[1]) for g in range(3)]
    want = float(_mp_risk([float(m) for m in inner], tilts[0]))
    assert np.isfinite(r)
    assert r == pytest.approx(want, rel=1e-12)


SPREAD_BEYOND_MAX = [
    ([1.7e308, -1.7e308, 1e308], [0, 0, 1]),
    # group 0's mean lies more than the float maximum above its smallest loss
    ([1.7e308, 1.7e308, -1.7e308, -1e308], [0, 0, 0, 1]),
]


@pytest.mark.parametrize("case", SPREAD_BEYOND_MAX)
@pytest.mark.parametrize("tilts", [(0.0, 0.0), (1e-300, 0.0), (-1e-300, 0.0), (np.inf, 0.0),
                                   (-np.inf, 0.0)])
@pytest.mark.parametrize("route", ["auto", "tree"])
def test_hierarchical_t0_group_spread_beyond_float_max(xp, xp_name, case, tilts, route):
    # group 0 spans more than the float maximum: its mean is formed in halves
    from tiltlab.risk.hierarchy import build_tree, hierarchy_eval

    values, groups = case[0], np.array(case[1])
    want_r, want_w = reference_hierarchy(values, [groups], tilts)
    want_r, want_w = float(want_r), np.array([float(v) for v in want_w])
    l = xp.asarray(np.array(values))
    with warnings.catch_warnings():
        if xp_name == "dask.array":  # worker threads do not see NumPy's error state
            warnings.simplefilter("ignore", RuntimeWarning)
        if route == "auto":
            r = to_numpy(tl.hierarchical_risk(l, groups, tilts))
            w = to_numpy(tl.hierarchical_weights(l, groups, tilts))
        else:
            with np.errstate(over="ignore", under="ignore"):
                tree = build_tree(groups, len(values))
                r, w = (to_numpy(v) for v in hierarchy_eval(l, None, tree, tilts, xp))
    # each level's mean of n halved differences, weighted by masses <= 1, rounds every
    # term and partial sum once and is doubled exactly: (n + 2) eps of the largest |loss|
    # per level, two levels
    eps, n, top = float(np.finfo(np.float64).eps), len(values), max(abs(v) for v in values)
    assert np.isfinite(r)
    assert abs(float(r) - want_r) <= 2 * (n + 2) * eps * top, (float(r), want_r)
    assert np.allclose(w, want_w, rtol=4 * n * eps, atol=0.0), (w, want_w)


def test_dask_t0_mean_near_float_max_many_samples():
    da = pytest.importorskip("dask.array")
    values = np.full(1000, 1.7e308)
    values[::2] = 1.0e308
    r = float(tl.tilted_risk(da.from_array(values, chunks=100), 0.0).compute())
    assert r == pytest.approx(1.35e308, rel=1e-14)


# spreads beyond the float maximum of the losses' own dtype (float32 near 3.4e38), which
# float64 host arithmetic holds


@pytest.mark.parametrize("t", [1e-38, -1e-38, 3e-39, 1e-37, 1e-40])
def test_float32_spread_beyond_float32_max(xp, xp_name, t):
    values = np.array([3e38, -3e38, 1e38], dtype=np.float32)
    exact = [float(v) for v in values]
    t = float(np.float32(t))  # a tilt the losses' dtype holds exactly (subnormal at 1e-40)
    want_r, want_w = reference_tilted(exact, t)
    want_w = np.array([float(v) for v in want_w])
    l = xp.asarray(values)
    with warnings.catch_warnings():
        if xp_name == "dask.array":  # worker threads do not see NumPy's error state
            warnings.simplefilter("ignore", RuntimeWarning)
        r = to_numpy(tl.tilted_risk(l, t))
        w = to_numpy(tl.tilted_weights(l, t))
        # one sample per group: the groups' risks are the losses, the top level tilts them
        hr = to_numpy(tl.hierarchical_risk(l, [0, 1, 2], (t, 1.0)))
        hw = to_numpy(tl.hierarchical_weights(l, [0, 1, 2], (t, 1.0)))
    assert r.dtype == w.dtype == hw.dtype == np.float32
    # u_i = t (l_i - c) carries a relative rounding of 2 eps, so exp(u_i) one of
    # (2 k + 1) eps with k = |t| (hi - lo); the sum of n terms of one sign adds n eps. The
    # risk c + log(s / n) / t then errs by (2 k + n + 1) eps / |t| = (2 + (n + 1) / k) eps
    # spread (in the expm1/log1p form, with |q / n| <= k, by (n + 3) eps spread), plus eps
    # |R|; a weight by twice the relative error of its exponential and the sum
    eps = float(np.finfo(np.float32).eps)
    n, spread = len(exact), max(exact) - min(exact)
    k = abs(t) * spread
    atol = (2.0 + (n + 3) * max(1.0, 1.0 / k) + 1.0) * eps * spread
    rtol = 2.0 * (2.0 * k + n + 2.0) * eps
    for got in (r, hr):
        assert abs(float(got) - float(want_r)) <= atol, (got, float(want_r))
    for got in (w, hw):
        assert np.all(np.abs(got - want_w) <= rtol * want_w), (got, want_w)


# tilts beyond float32's range at any level of a hierarchy: rounded to the losses'
# precision first, as every risk function does (1e300 is +inf there, 1e-50 is 0)

HUGE_TILTS = [(1e300, 1.0), (-1e39, 1.0), (1.0, 1e300), (1.0, -1e39), (1e39, 0.0),
              (0.0, -1e300), (1e300, -1e300), (-2.0, 1e-50)]
F32_LOSSES = np.array([0.5, 2.0, 1.0, 3.0, -1.0], dtype=np.float32)
F32_GROUPS = np.array([0, 0, 1, 1, 1])


def _f32_hierarchy_reference(tilts):
    """The 50-digit risk and weights at the tilts as float32 holds them."""
    with np.errstate(over="ignore", under="ignore"):
        held = [float(np.float32(t)) for t in tilts]
    r, w = reference_hierarchy([float(v) for v in F32_LOSSES], [F32_GROUPS], held)
    return float(r), np.array([float(v) for v in w])


def _f32_hierarchy_bounds():
    """Absolute bound on the risk and relative bound on the weights of the float32
    hierarchy of ``F32_LOSSES``: at each of the two levels the tilted reduction errs by
    at most (3 + (n + 3)) eps spread in its risk and 2 (2 k + n + 2) eps in a weight,
    with k = |t| spread <= spread (tilts of magnitude at most 2, or infinite: exact
    extremes), n = 5 samples and a spread of 4."""
    eps = float(np.finfo(np.float32).eps)
    n, spread = F32_LOSSES.size, float(F32_LOSSES.max() - F32_LOSSES.min())
    k = 2.0 * spread
    return 2 * (3 + (n + 3)) * eps * spread, 2 * 2 * (2 * k + n + 2) * eps


@pytest.mark.parametrize("tilts", HUGE_TILTS)
def test_float32_hierarchy_tilts_beyond_float32_range(xp, xp_name, tilts):
    want_r, want_w = _f32_hierarchy_reference(tilts)
    atol, rtol = _f32_hierarchy_bounds()
    l = xp.asarray(F32_LOSSES)
    with warnings.catch_warnings():
        if xp_name == "dask.array":  # worker threads do not see NumPy's error state
            warnings.simplefilter("ignore", RuntimeWarning)
        r = to_numpy(tl.hierarchical_risk(l, F32_GROUPS, tilts))
        w = to_numpy(tl.hierarchical_weights(l, F32_GROUPS, tilts))
    assert r.dtype == w.dtype == np.float32
    assert abs(float(r) - want_r) <= atol, (float(r), want_r)
    assert np.all(np.abs(w - want_w) <= rtol * want_w + 1e-45), (w, want_w)


@pytest.mark.slow  # compiles the float32 labelled kernels; the small case runs in push
@pytest.mark.parametrize("tilts", HUGE_TILTS)
def test_float32_hierarchy_tilts_beyond_float32_range_large(tilts):
    # every sample repeated 2^14 times: the group risks and masses are those of the five
    # samples (the compiled labelled route), each weight the five samples' over 2^14
    reps = 1 << 14
    want_r, want_w = _f32_hierarchy_reference(tilts)
    atol, rtol = _f32_hierarchy_bounds()
    # a sum of 2^14 equal terms adds at most 2^14 eps to each level's normaliser
    atol += 2 * reps * float(np.finfo(np.float32).eps) * 4.0
    rtol += 2 * reps * float(np.finfo(np.float32).eps)
    l, g = np.repeat(F32_LOSSES, reps), np.repeat(F32_GROUPS, reps)
    r = tl.hierarchical_risk(l, g, tilts)
    w = tl.hierarchical_weights(l, g, tilts)
    assert r.dtype == w.dtype == np.float32
    assert abs(float(r) - want_r) <= atol, (float(r), want_r)
    want_w = np.repeat(want_w / reps, reps)
    assert np.all(np.abs(w - want_w) <= rtol * want_w + 1e-45), (w[::reps], want_w[::reps])


# ---------------------------------------------------------------------------------------
# autograd through the tilt at and near zero (PyTorch)


@pytest.mark.parametrize("t0", [0.0, 1e-300, 1e-17, -1e-17, 1e-16, -5e-16, 1e-15, 1e-12, 1e-9])
def test_autograd_dr_dt_near_zero(t0):
    torch = pytest.importorskip("torch")
    values = np.array([0.0, 1.0, 4.0, 2.5, -1.5])
    l = torch.tensor(values, dtype=torch.float64)
    t = torch.tensor(t0, dtype=torch.float64, requires_grad=True)
    r = tl.tilted_risk(l, t)
    (g,) = torch.autograd.grad(r, t)
    # dR/dt = k2 / 2 + t k3 / 3 + O(t^2) (cumulants), from 50-digit arithmetic
    m = [mpmath.mpf(float(v)) for v in values]
    mean = mpmath.fsum(m) / len(m)
    k2 = mpmath.fsum((v - mean) ** 2 for v in m) / len(m)
    k3 = mpmath.fsum((v - mean) ** 3 for v in m) / len(m)
    assert float(g) == pytest.approx(float(k2 / 2 + t0 * k3 / 3), rel=1e-12)
    # and central finite differences of the value at a resolvable step
    h = 1e-4
    fd = (float(tl.tilted_risk(values, t0 + h)) - float(tl.tilted_risk(values, t0 - h))) / (2 * h)
    assert float(g) == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("t0", [0.0, 1e-17, -1e-16, 1e-15])
def test_autograd_weights_dt_near_zero(t0):
    torch = pytest.importorskip("torch")
    values = np.array([0.0, 1.0, 4.0, 2.5])
    p = np.array([0.1, 0.4, 0.3, 0.2])
    l = torch.tensor(values, dtype=torch.float64)
    t = torch.tensor(t0, dtype=torch.float64, requires_grad=True)
    w = tl.tilted_weights(l, t, weights=torch.tensor(p, dtype=torch.float64))
    jac = [float(torch.autograd.grad(w[i], t, retain_graph=True)[0]) for i in range(4)]
    # dw_i/dt at t = 0 is p_i (l_i - sum_j p_j l_j)
    want = p * (values - np.sum(p * values))
    np.testing.assert_allclose(jac, want, rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------
# check_finite=False with NaN losses: NaN on every backend and at every tilt


@pytest.mark.parametrize("t", [0.0, 1.0, -1.0, 1e-300, np.inf, -np.inf])
def test_unchecked_nan_losses_give_nan(xp, t):
    l = xp.asarray(np.array([1.0, np.nan, 2.0, 0.5]))
    r = to_numpy(tl.tilted_risk(l, t, check_finite=False))
    w = to_numpy(tl.tilted_weights(l, t, check_finite=False))
    h = to_numpy(tl.hierarchical_risk(l, [0, 0, 1, 1], (t, t), check_finite=False))
    hw = to_numpy(tl.hierarchical_weights(l, [0, 0, 1, 1], (t, t), check_finite=False))
    assert np.isnan(r) and np.all(np.isnan(w)) and w.shape == (4,)
    assert np.isnan(h) and np.all(np.isnan(hw)) and hw.shape == (4,)
    # a grid of tilts: every entry NaN
    rg = to_numpy(tl.tilted_risk(l, xp.asarray(np.array([0.0, 2.0])), check_finite=False))
    assert rg.shape == (2,) and np.all(np.isnan(rg))


def test_checked_nan_losses_still_raise(xp):
    l = xp.asarray(np.array([1.0, np.nan]))
    for fn in (tl.tilted_risk, tl.tilted_weights):
        with pytest.raises(ValueError, match="`losses` contains NaN"):
            out = fn(l, 1.0)
            to_numpy(out)  # lazy backends raise when computed


# ---------------------------------------------------------------------------------------
# 16-bit losses


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_torch_half_losses(dtype_name):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype_name)
    values = np.array([0.5, 1.0, 3.0, 2.0])
    l = torch.tensor(values, dtype=dt)
    exact = np.asarray(l.to(torch.float64))  # the losses as the half type holds them
    for t in (0.0, 1.0, -2.0, np.inf):
        r = tl.tilted_risk(l, t)
        w = tl.tilted_weights(l, t)
        assert r.dtype == dt and w.dtype == dt
        want = float(_mp_risk(list(exact), t))
        assert float(r) == pytest.approx(want, rel=float(torch.finfo(dt).eps))
    h = tl.hierarchical_risk(l, [0, 0, 1, 1], (1.0, 1.0))
    assert h.dtype == dt
    assert float(h) == pytest.approx(
        float(_mp_risk(list(exact), 1.0)), rel=float(torch.finfo(dt).eps)
    )


def test_numpy_float16_accumulates_in_float32():
    values = np.full(4096, 0.1, dtype=np.float16)
    values[0] = 10.0
    r = tl.tilted_risk(values, 1e-3)
    assert r.dtype == np.float16
    want = float(_mp_risk([float(v) for v in values], 1e-3))
    assert float(r) == pytest.approx(want, rel=1e-3)

"""Hierarchies on CuPy, on the CPU: the tree's kernels (``tiltlab/_cupy/kernels.cu``)
run as host C++ under the emulation of CUDA threads (``tests/cuda_emu.h``), driven by
the backend's Python code through the recording stand-in for CuPy. Risks and weights of
nested levels are checked against a 50-digit mpmath evaluation of the nested definition
and against NumPy's ``hierarchical_risk`` / ``hierarchical_weights``; the objective's
value and gradient against the NumPy objective. Empty groups, one-member groups, tilts 0,
+-inf and tiny, equal losses and priors included."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
from _contract import reference_hierarchy, reference_tilted
from cuda_fake import FakeArray, Recorder, fake_cupy
from cuda_host import host_has_fma, run_emulated

import tiltlab as tl
from tiltlab._cupy import hierarchy, source

#: each kernel variant is built as host C++ (seconds) and the grids are large: the full
#: tier (the push tier runs the emulated engines' contract rows, the NVRTC builds and the
#: host-read budgets)
pytestmark = pytest.mark.slow

FULL = os.environ.get("TILTLAB_FULL_MATRIX") == "1"


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(r, run=run_emulated, sms=1))
    monkeypatch.setattr(source, "_MODULES", {})
    return r


@pytest.fixture(params=["rounded", "fused"])
def rec_fma(request, monkeypatch):
    """The stand-in, with the kernels built twice: every operation rounded, and with
    products and sums contracted into fused multiply-adds (NVRTC's default)."""
    if request.param == "fused" and not host_has_fma():
        pytest.skip("no fused multiply-add on this CPU")
    r = Recorder()
    contract = request.param == "fused"

    def run(code, name, grid, block, args):
        run_emulated(code, name, grid, block, args, contract=contract)

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(r, run=run, sms=1))
    monkeypatch.setattr(source, "_MODULES", {})
    return r


def _tree(rng, n, sizes, empty=True, singletons=True):
    """Codes per level (innermost first) for ``n`` samples and ``sizes`` groups per level:
    every group of a level reaches a random group of the next; with ``empty`` the last
    group of each level gets no item, with ``singletons`` one group holds one sample."""
    codes = []
    items = n
    for g in sizes:
        used = g - 1 if empty and g > 1 else g
        c = rng.integers(0, used, items)
        c[:used] = rng.permutation(used)[: min(used, items)] if items >= used else c[:used]
        codes.append(c.astype(np.int64))
        items = g
    if singletons and n > 2 and sizes[0] > 2:
        codes[0][codes[0] == 1] = 0
        codes[0][n - 1] = 1  # group 1 of level 0: one sample
    return codes


def _labels(codes):
    """The samples' labels per level, outermost first (NumPy's ``groups`` argument)."""
    out, c = [], codes[0]
    for k in range(len(codes)):
        if k:
            c = codes[k][c]
        out.append(c.copy())
    return out[::-1]


def _mp_tilted(vals, masses, t):
    return reference_tilted(vals, t, masses)[0]


def _mp_risk(l, codes, tilts, prior=None):
    """The nested definition at 50 digits (the reference module's): ``codes[0]`` maps the
    samples to the finest groups, ``codes[k]`` the groups of level ``k`` to those above."""
    labels, lab = [], np.arange(len(l))
    for c in codes:
        lab = np.asarray(c)[lab]
        labels.append(lab)
    return float(reference_hierarchy(l, labels[::-1], tilts, prior)[0])


def _run(rec, l, codes, sizes, tilts, dtype, prior=None):
    host_prior = None if prior is None else prior.astype(np.float64)
    dev_prior = None if prior is None else FakeArray(prior.astype(dtype), rec)
    tree = hierarchy.DeviceTree.from_codes(codes, sizes, dtype, dev_prior, host_prior)
    L = FakeArray(l.astype(dtype), rec)
    out, _ = hierarchy.tree_eval(L, tree, tilts)
    out_w, w = hierarchy.tree_eval(L, tree, tilts, weights=True)
    return out._a.copy(), out_w._a.copy(), w._a.copy()


TILTS_2 = [
    (1.0, -2.0),
    (0.0, 3.0),
    (-2.0, 0.0),
    (1e-9, 1e-300),
    (40.0, -40.0),
    (math.inf, 1.0),
    (1.0, -math.inf),
    (-math.inf, math.inf),
]
TILTS_3 = [(0.5, -1.0, 2.0), (0.0, math.inf, 1e-7), (-3.0, 0.0, -math.inf), (1e-12, 5.0, 0.0)]
CASES = [(t, (7,)) for t in TILTS_2] + [(t, (9, 4)) for t in TILTS_3]
if not FULL:
    CASES = CASES[::2]
CASES.append(((1.0, -0.5, 2.0, 1e-9), (12, 5, 2)))  # three levels


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("tilts", "sizes"), CASES)
@pytest.mark.parametrize("with_prior", [False, True])
def test_tree_risk_and_weights(rec, dtype, tilts, sizes, with_prior):
    rng = np.random.default_rng(len(sizes) * 7 + int(with_prior))
    n = 300
    l = rng.standard_normal(n) * 2
    codes = _tree(rng, n, sizes)
    prior = rng.random(n) + 0.1 if with_prior else None
    if with_prior:
        prior[5] = 0.0  # a sample without mass (its weight is 0)
    r, r_w, w = _run(rec, l, codes, sizes, tilts, dtype, prior)
    eps = float(np.finfo(dtype).eps)
    want = _mp_risk(l.astype(dtype).astype(np.float64), codes, tilts, prior)
    scale = float(np.max(np.abs(l)))
    assert r[1] == 0 and r_w[1] == 0  # the status: every loss finite
    assert abs(float(r[0]) - want) <= 64 * eps * scale, (float(r[0]), want)
    assert abs(float(r_w[0]) - want) <= 64 * eps * scale  # atomics: not bit-reproducible
    groups = _labels(codes)
    ref_w = tl.hierarchical_weights(
        l.astype(dtype).astype(np.float64), groups, tilts, weights=prior
    )
    ref_r = float(
        tl.hierarchical_risk(l.astype(dtype).astype(np.float64), groups, tilts, weights=prior)
    )
    assert abs(ref_r - want) <= 64 * 1e-16 * scale  # NumPy and mpmath agree
    big = max([1.0] + [abs(t) * 2 * scale for t in tilts if math.isfinite(t)])
    np.testing.assert_allclose(w, ref_w, rtol=64 * eps * big, atol=64 * eps * big / n)
    assert abs(float(np.sum(w, dtype=np.float64)) - 1.0) <= 64 * eps * big
    if with_prior:
        assert w[5] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tilts", [(2.0, -1.0, 3.0), (0.0, 1e-9, -math.inf)])
def test_equal_losses(rec, dtype, tilts):
    # every loss the same: the risk is that loss at every tilt, the weights the masses
    rng = np.random.default_rng(3)
    n, sizes = 200, (10, 3)
    codes = _tree(rng, n, sizes)
    l = np.full(n, 1.375)
    r, _, w = _run(rec, l, codes, sizes, tilts, dtype)
    assert float(r[0]) == 1.375
    want = tl.hierarchical_weights(l, _labels(codes), tilts)
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(w, want, rtol=16 * eps)


def test_one_level_against_scipy_logsumexp(rec):
    # one level: R_g = logsumexp(t l_g - log n_g) / t, J = logsumexp(tau R - log(N/n_g)) / tau
    from scipy.special import logsumexp

    rng = np.random.default_rng(5)
    n, G = 500, 12
    codes = [rng.integers(0, G, n)]
    l = rng.standard_normal(n)
    tau, t = -1.5, 2.5
    r, _, _ = _run(rec, l, codes, (G,), (tau, t), np.float64)
    R = np.array(
        [logsumexp(t * l[codes[0] == g]) / t - np.log(np.sum(codes[0] == g)) / t for g in range(G)]
    )
    P = np.bincount(codes[0], minlength=G) / n
    want = logsumexp(tau * R, b=P) / tau
    assert abs(float(r[0]) - want) <= 64e-16 * float(np.max(np.abs(l)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_losses_set_the_status(rec, bad):
    rng = np.random.default_rng(1)
    n, sizes = 100, (6, 2)
    codes = _tree(rng, n, sizes)
    l = rng.standard_normal(n)
    l[17] = bad
    r, _, _ = _run(rec, l, codes, sizes, (1.0, 2.0, -1.0), np.float64)
    assert r[1] == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sizes", [(2,), (3, 2)])
@pytest.mark.parametrize("t", [0.0, 1.0, -1.0, 1e-300, math.inf, -math.inf])
def test_nonfinite_losses_give_nan(rec_fma, dtype, sizes, t):
    # the risk is NaN (not -inf: a NaN formed as inf - inf becomes -inf once the compiler
    # fuses the product that overflows to inf into the subtraction) and the status is set
    l = np.array([1.0, np.nan, 2.0, 0.5, 0.25, 3.0])
    codes = [np.array([0, 0, 1, 1, 0, 1])]
    if len(sizes) == 2:
        codes = [np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1])]
    r, r_w, w = _run(rec_fma, l, codes, sizes, (t,) * (len(sizes) + 1), dtype)
    assert np.isnan(r[0]) and r[1] == 1 and np.isnan(r_w[0]) and r_w[1] == 1


@pytest.mark.parametrize("tilts", [(0.0, 0.0), (1.0, 0.0), (0.0, -2.0), (-1.0, 0.0), (2.0, 1e-300)])
def test_losses_near_the_largest_float(rec_fma, tilts):
    # under the uniform prior each sample's mass is 1 / N: the sums of the gaps to a
    # group's shift stay below the largest gap (unit masses overflowed here, 200 gaps of
    # up to 3e307 each)
    rng = np.random.default_rng(0)
    values = rng.uniform(1.4e308, 1.7e308, 600)
    codes = [np.repeat(np.arange(3), 200)]
    r, r_w, w = _run(rec_fma, values, codes, (3,), tilts, np.float64)
    want = _mp_risk(values, codes, tilts)
    assert r[1] == 0 and r_w[1] == 0
    # a group's mean adds 200 rounded terms, the top 3: a relative error of a few hundred
    # ulps at most (2.2e-16 each), well inside 1e-12
    assert abs(float(r[0]) - want) <= 1e-12 * want
    assert abs(float(np.sum(w)) - 1.0) <= 1e-12


def test_public_risk_near_the_largest_float_and_of_nan(rec_fma):
    # through the public functions: a finite answer for finite losses near the largest
    # float, NaN (shape ()) for a NaN loss without the check, and the library's error with it
    from tiltlab._cupy import reductions

    rng = np.random.default_rng(0)
    values = rng.uniform(1.4e308, 1.7e308, 600)
    groups = np.repeat(np.arange(3), 200)
    r = reductions.hierarchical_risk(FakeArray(values, rec_fma), groups, (0.0, 0.0))
    assert r is None or r.shape == ()
    if r is not None:
        want = float(tl.hierarchical_risk(values, groups, (0.0, 0.0)))
        assert abs(float(r._a) - want) <= 1e-12 * want
    l = np.array([1.0, np.nan, 2.0, 0.5])
    r = reductions.hierarchical_risk(
        FakeArray(l, rec_fma), [0, 0, 1, 1], (1.0, 1.0), check_finite=False
    )
    assert r.shape == () and np.isnan(r._a)
    with pytest.raises(ValueError, match="`losses` contains"):
        reductions.hierarchical_risk(FakeArray(l, rec_fma), [0, 0, 1, 1], (1.0, 1.0))


def test_tree_eval_reads_and_uploads_nothing(rec):
    rng = np.random.default_rng(2)
    n, sizes = 50, (5, 2)
    codes = _tree(rng, n, sizes)
    tree = hierarchy.DeviceTree.from_codes(codes, sizes, np.float64)
    assert len(rec.uploads) == 2  # the codes of every level, the masses of every group
    rec.uploads.clear()
    L = FakeArray(rng.standard_normal(n), rec)
    hierarchy.tree_eval(L, tree, (1.0, 1.0, 1.0), weights=True)
    assert rec.reads == [] and rec.uploads == []
    D = len(sizes)
    assert len(rec.launches) == 3 * D + 1 + D


def _problem(rec, loss, X, y, labels, tilts, l2, prior=None):
    """What the engine reads of a hierarchical problem, over device stand-ins."""
    from types import SimpleNamespace

    from tiltlab.losses import get_loss
    from tiltlab.risk import build_tree

    n, d = X.shape
    return SimpleNamespace(
        is_linear=True,
        groups=labels,
        tree=build_tree(labels, n),
        weights=prior,
        prior=None if prior is None else FakeArray(prior / prior.sum(), rec),
        loss=get_loss(loss),
        X=FakeArray(X, rec),
        y=FakeArray(y, rec),
        tilts=tuple(tilts),
        shape=(d,),
        l2=l2,
        dtype=X.dtype,
        cache={},
    )


def _glm_data(rng, loss, n, d, dtype):
    """``(X, theta, y)``: Gaussian rows, a parameter of unit scale and labels of the loss
    (a noisy linear response, or Bernoulli(0.3) classes)."""
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    if loss in ("squared", "pinball"):
        y = (X.astype(np.float64) @ theta + rng.standard_normal(n)).astype(dtype)
    elif loss == "poisson":  # counts of mean exp(z)
        y = rng.poisson(np.exp(X.astype(np.float64) @ theta)).astype(dtype)
    else:
        y = (rng.random(n) < 0.3).astype(dtype)
    return X, theta, y


OBJECTIVE_CASES = [
    ("logistic", 400, 3, (1.0, -2.0), 0.0, False),
    ("squared", 300, 40, (0.0, 2.0, -1.0), 0.3, True),
    ("logistic", 250, 5, (-math.inf, 1e-9, 3.0), 0.0, False),
    ("squared", 200, 1, (2.0, math.inf), 0.5, True),
    # losses of the table beyond squared and logistic (the loss's parameter in the build)
    ("poisson", 300, 4, (1.0, -2.0), 0.1, True),
    ("pinball", 250, 6, (-1.0, 0.0, 2.0), 0.0, False),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("loss", "n", "d", "tilts", "l2", "with_prior"), OBJECTIVE_CASES)
def test_objective_value_and_gradient(rec, loss, n, d, tilts, l2, with_prior, dtype):
    from tiltlab._cupy.engine import FUSED_CUDA
    from tiltlab.objective.engines import Context

    rng = np.random.default_rng(n + d)
    X, theta, y = _glm_data(rng, loss, n, d, dtype)
    D = len(tilts) - 1
    sizes = (12, 3)[:D]
    labels = _labels(_tree(rng, n, sizes, empty=False))
    prior = rng.random(n) + 0.5 if with_prior else None
    problem = _problem(rec, loss, X, y, labels, tilts, l2, prior)
    assert FUSED_CUDA.applies(problem)
    passes = []
    ctx = Context(count=passes.append, update=lambda p: None)
    out = FUSED_CUDA.value_and_gradient(problem, FakeArray(theta, rec), ctx)
    assert out is not None and passes == [2]
    value, grad = (a._a for a in out)
    assert value.dtype == dtype and grad.dtype == dtype and grad.shape == (d,)
    f64 = np.float64
    ref = tl.TiltedObjective(
        loss, X.astype(f64), y.astype(f64), groups=labels, tilts=tilts, weights=prior, l2=l2
    )
    want_v, want_g = ref.value_and_gradient(theta.astype(f64))
    eps = float(np.finfo(dtype).eps)
    z = X.astype(f64) @ theta.astype(f64)
    scale = 1.0 + float(np.max(np.abs(z))) + float(np.max(np.abs(y)))
    big = max([1.0] + [abs(t) * scale for t in tilts if math.isfinite(t)])
    np.testing.assert_allclose(float(value), float(want_v), rtol=0, atol=64 * d * eps * scale**2)
    gscale = float(np.max(np.abs(want_g))) + scale * float(np.max(np.abs(X)))
    np.testing.assert_allclose(grad, want_g, rtol=0, atol=64 * d * eps * gscale * big)


HVP_CASES = [c for c in OBJECTIVE_CASES if c[0] != "pinball"] + [  # pinball: d2 = 0 a.e.
    ("logistic", 300, 6, (0.5, 3.0, -2.0), 0.0, True),
    ("squared", 500, 3, (-1.0, 0.0, 1.5), 0.1, False),
]


def _hvp_bound(loss, X, y, theta, v, tilts, l2):
    """A bound of the terms the Hessian-vector product sums: with the weights summing to
    1, |sum_i c_i x_i| <= max|x| (max|l'' u| + max|l'| sum|t| 2 max|l' u|) + l2 max|v|."""
    z, u = X @ theta, X @ v
    if loss == "squared":
        d1, d2 = 2 * (z - y), np.full_like(z, 2.0)
    elif loss == "poisson":
        d1, d2 = np.exp(z) - y, np.exp(z)
    else:
        s = 1 / (1 + np.exp(-z))
        d1, d2 = s - y, s * (1 - s)
    spread = np.abs(d1).max() * sum(abs(t) for t in tilts) * 2 * np.abs(d1 * u).max()
    return np.abs(X).max() * (np.abs(d2 * u).max() + spread) + l2 * np.abs(v).max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("loss", "n", "d", "tilts", "l2", "with_prior"), HVP_CASES)
def test_objective_value_and_hvp(rec, loss, n, d, tilts, l2, with_prior, dtype):
    # the value and the Hessian-vector product on the device tree against the NumPy
    # objective in float64 (its generic engine: segment sums over the host tree's
    # layouts), and the product against central differences of the NumPy gradient
    from tiltlab._cupy.engine import FUSED_CUDA
    from tiltlab.objective.engines import Context

    rng = np.random.default_rng(n + d + 1)
    X, theta, y = _glm_data(rng, loss, n, d, dtype)
    v = rng.standard_normal(d).astype(dtype)
    D = len(tilts) - 1
    labels = _labels(_tree(rng, n, (12, 3)[:D], empty=False))
    prior = rng.random(n) + 0.5 if with_prior else None
    problem = _problem(rec, loss, X, y, labels, tilts, l2, prior)
    passes = []
    ctx = Context(count=passes.append, update=lambda p: None)
    f64 = np.float64
    ref = tl.TiltedObjective(
        loss, X.astype(f64), y.astype(f64), groups=labels, tilts=tilts, weights=prior, l2=l2
    )
    eps = float(np.finfo(dtype).eps)
    z = X.astype(f64) @ theta.astype(f64)
    scale = 1.0 + float(np.max(np.abs(z))) + float(np.max(np.abs(y)))
    value = FUSED_CUDA.value(problem, FakeArray(theta, rec), ctx)
    assert value is not None and value._a.dtype == dtype
    want_v = float(ref.value(theta.astype(f64)))
    np.testing.assert_allclose(float(value._a), want_v, rtol=0, atol=64 * d * eps * scale**2)
    prod = FUSED_CUDA.hvp(problem, FakeArray(theta, rec), FakeArray(v, rec), ctx)
    if not all(math.isfinite(t) for t in tilts):
        assert prod is None  # no Hessian at an infinite tilt (the generic path raises)
        return
    assert prod is not None and passes == [1, 2]
    got = prod._a
    assert got.dtype == dtype and got.shape == (d,)
    want = ref.hvp(theta.astype(f64), v.astype(f64))
    # each coefficient carries a few roundings (a mean per level, a difference of means),
    # and the product with X^T adds them: 16 eps of the bound of the summed terms (the
    # errors measured lie 300-1000 times below it)
    bound = _hvp_bound(loss, X.astype(f64), y.astype(f64), theta.astype(f64), v.astype(f64),
                       tilts, l2)  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=0, atol=16 * eps * bound)
    # central differences of the float64 gradient: error O(h^2) from the third derivative
    h = 1e-5
    vf = v.astype(f64)
    gp = ref.value_and_gradient(theta.astype(f64) + h * vf)[1]
    gm = ref.value_and_gradient(theta.astype(f64) - h * vf)[1]
    fd = (gp - gm) / (2 * h)
    np.testing.assert_allclose(want, fd, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(fd))))


def test_objective_declines_nonfinite_losses(rec):
    from tiltlab._cupy.engine import FUSED_CUDA
    from tiltlab.objective.engines import Context

    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 3))
    X[7, 2] = np.inf
    y = rng.standard_normal(64)
    labels = [np.arange(64) % 4]
    problem = _problem(rec, "squared", X, y, labels, (1.0, 1.0), 0.0)
    ctx = Context(count=lambda k: None, update=lambda p: None)
    assert FUSED_CUDA.value_and_gradient(problem, FakeArray(np.ones(3), rec), ctx) is None
    assert len(rec.reads) == 1


def _assert_public_results(r, w, l, groups, tilts):
    """The device risk ``r`` and weights ``w`` of the losses ``l`` (its dtype) against
    NumPy's float64 ``hierarchical_risk`` and ``hierarchical_weights``: 64 ulps of the
    largest loss for the risk; for the weights, relative to the largest exponent
    ``|t| * 2 max|l|`` they are formed from. Returns NumPy's risk."""
    l64 = l.astype(np.float64)
    eps = float(np.finfo(l.dtype).eps)
    scale = float(np.max(np.abs(l64)))
    want = float(tl.hierarchical_risk(l64, groups, tilts))
    assert abs(float(r._a) - want) <= 64 * eps * scale, (float(r._a), want)
    big = max([1.0] + [abs(t) * 2 * scale for t in tilts if math.isfinite(t)])
    np.testing.assert_allclose(
        w._a,
        tl.hierarchical_weights(l64, groups, tilts),
        rtol=64 * eps * big,
        atol=64 * eps * big / l.shape[0],
    )
    return want


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tilts", [(1.0, -2.0, 0.5), (0.0, math.inf, 1e-9), (-3.0, 2.0, -math.inf)])
def test_public_functions_with_nested_labels(rec, dtype, tilts):
    # hierarchical_risk / hierarchical_weights of CuPy losses with nested label arrays of
    # any kind (here strings outside, integers inside, one a one-member group): the tree
    # is built on the host, uploaded, evaluated on the device; one read (the status)
    from tiltlab._cupy import reductions

    rng = np.random.default_rng(11)
    n = 240
    inner = rng.integers(0, 15, n)
    inner[n - 1] = 15  # a group of one sample
    outer = np.array(["a", "b", "c", "d"])[inner % 4]
    groups = [outer, inner]
    l = (rng.standard_normal(n) * 2).astype(dtype)
    L = FakeArray(l, rec)
    r = reductions.hierarchical_risk(L, groups, tilts)
    assert len(rec.reads) == 1 and len(rec.uploads) == 2
    rec.reads.clear()
    w = reductions.hierarchical_weights(L, groups, tilts)
    assert len(rec.reads) == 1
    assert r._a.dtype == dtype and r.shape == () and w._a.dtype == dtype and w.shape == (n,)
    _assert_public_results(r, w, l, groups, tilts)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_public_weights_of_nonfinite_losses(rec, bad):
    from tiltlab._cupy import reductions

    l = np.linspace(0.0, 1.0, 50)
    l[3] = bad
    groups = [np.arange(50) % 2, np.arange(50) % 10]
    with pytest.raises(ValueError, match="`losses` contains"):
        reductions.hierarchical_weights(FakeArray(l, rec), groups, (1.0, 1.0, 1.0))
    w = reductions.hierarchical_weights(
        FakeArray(l, rec), groups, (1.0, 1.0, 1.0), check_finite=False
    )
    assert np.all(np.isnan(w._a))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_levels_beyond_the_shared_memory_groups(rec, dtype):
    # a level with more groups than a block gathers in shared memory takes the global
    # atomics; the level above it (few groups) the shared ones
    rng = np.random.default_rng(4)
    n, sizes = 3000, (hierarchy.SHARED_GROUPS + 200, 30)
    codes = _tree(rng, n, sizes)
    l = rng.standard_normal(n) * 2
    tilts = (-1.0, 0.5, 3.0)
    r, _, w = _run(rec, l, codes, sizes, tilts, dtype)
    l64 = l.astype(dtype).astype(np.float64)
    eps = float(np.finfo(dtype).eps)
    want = _mp_risk(l64, codes, tilts)
    assert r[1] == 0 and abs(float(r[0]) - want) <= 64 * eps * float(np.max(np.abs(l)))
    ref_w = tl.hierarchical_weights(l64, _labels(codes), tilts)
    big = 6 * float(np.max(np.abs(l)))
    np.testing.assert_allclose(w, ref_w, rtol=64 * eps * big, atol=64 * eps * big / n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("tilts", "depth"),
    [((1.0, -2.0, 0.5), 2), ((0.0, math.inf, 1e-9), 2), ((2.0, -1.0, 0.0, 3.0), 3)],
)
def test_nested_device_labels_build_the_tree_on_the_device(rec, dtype, tilts, depth):
    # nested CuPy integer labels (with unused labels: empty groups): the tree is built on
    # the device, nothing uploaded; reads: the labels' ranges, the nesting test, the status
    from tiltlab._cupy import reductions

    rng = np.random.default_rng(depth)
    n = 400
    inner = rng.integers(0, 30, n) * 2  # even labels only: the odd ones are empty groups
    levels = [inner, inner % 12, inner % 4][:depth][::-1]  # outermost first, nested
    l = (rng.standard_normal(n) * 2).astype(dtype)
    L = FakeArray(l, rec)
    G = [FakeArray(a.astype(np.int64), rec) for a in levels]
    r = reductions.hierarchical_risk(L, G, tilts)
    assert rec.uploads == [] and len(rec.reads) == 3
    assert "tilted_level_parent" in rec.launches and "tilted_level_nested" in rec.launches
    rec.reads.clear()
    w = reductions.hierarchical_weights(L, G, tilts)
    assert rec.uploads == [] and len(rec.reads) == 3
    assert r.shape == () and w.shape == (n,)
    want = _assert_public_results(r, w, l, levels, tilts)
    l64 = l.astype(np.float64)
    scale = float(np.max(np.abs(l64)))
    assert abs(want - _mp_risk(l64, _codes_of_levels(levels), tilts)) <= 64e-16 * scale


def _codes_of_levels(levels):
    """Codes per level, innermost first, of nested label arrays given outermost first."""
    from tiltlab.risk import build_tree

    return [lev.codes for lev in build_tree(levels, len(levels[0])).levels]


def test_device_labels_that_do_not_nest_raise(rec):
    from tiltlab._cupy import reductions

    inner = np.arange(40) % 8
    outer = np.arange(40) % 3  # inner group 0 holds samples of outer groups 0, 1 and 2
    L = FakeArray(np.linspace(0.0, 1.0, 40), rec)
    with pytest.raises(ValueError, match="not nested"):
        reductions.hierarchical_risk(
            L, [FakeArray(outer, rec), FakeArray(inner, rec)], (1.0, 1.0, 1.0)
        )
    # with host labels the host's check says the same
    with pytest.raises(ValueError, match="not nested"):
        tl.hierarchical_risk(np.linspace(0.0, 1.0, 40), [outer, inner], (1.0, 1.0, 1.0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("case", "reads"),
    [("negative", 3), ("sparse", 4), ("boolean", 3), ("one sparse level", 3)],
)
def test_negative_sparse_and_boolean_device_labels_build_the_tree_on_the_device(
    rec, dtype, case, reads
):
    # labels that are not codes in [0, 2 N + 1024): shifted by the smallest label where
    # their span is narrow, numbered on the device (cupy.unique, which reads the number of
    # labels) where it is wide; nothing uploaded. Reads: the ranges, the count of each
    # numbered level, the nesting test (two levels or more), the status
    from tiltlab._cupy import reductions

    rng = np.random.default_rng(5)
    n = 120
    inner = rng.integers(0, 10, n)
    levels = {
        "negative": [inner % 3 - 1, inner - 7],
        "sparse": [inner % 3, inner * 1000 + 7 * n],
        "boolean": [inner % 2 == 0, inner],
        "one sparse level": [inner.astype(np.int64) * 10**12 - 5],
    }[case]
    tilts = (1.5, -0.5, 2.0)[-len(levels) - 1 :]
    l = (rng.standard_normal(n) * 2).astype(dtype)
    L = FakeArray(l, rec)
    G = [FakeArray(a, rec) for a in levels]
    r = reductions.hierarchical_risk(L, G, tilts)
    assert rec.uploads == [] and len(rec.reads) == reads, rec.reads
    assert ("unique" in rec.launches) == ("sparse" in case)
    w = reductions.hierarchical_weights(L, G, tilts)
    want = _assert_public_results(r, w, l, levels, tilts)
    l64 = l.astype(np.float64)
    scale = float(np.max(np.abs(l64)))
    assert abs(want - _mp_risk(l64, _codes_of_levels(levels), tilts)) <= 64e-16 * scale


def test_device_labels_of_other_kinds_take_the_host_tree(rec):
    # a host label array, labels of another length, or float labels are not served
    from tiltlab._cupy import reductions

    n = 120
    inner = np.arange(n) % 10
    L = FakeArray(np.zeros(n), rec)
    assert reductions.device_labels_tree([inner % 3, inner], L) is None
    assert reductions.device_labels_tree([FakeArray(inner[:-1], rec)], L) is None
    assert reductions.device_labels_tree([FakeArray(inner + 0.5, rec)], L) is None
    assert rec.reads == [] and rec.uploads == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("loss", "n", "d", "tilts", "l2", "with_prior"), HVP_CASES)
def test_objective_linearize(rec, loss, n, d, tilts, l2, with_prior, dtype):
    # the linearisation on the device tree: value, gradient, losses and weights at theta
    # against the float64 NumPy objective, and each product against the NumPy product
    # (bounded as in test_objective_value_and_hvp); after the one read at theta the
    # products read nothing and launch neither the loss nor the tree's risk passes
    from tiltlab._cupy.engine import FUSED_CUDA
    from tiltlab._cupy.hierarchical_engine import device_tree
    from tiltlab.objective.engines import Context

    rng = np.random.default_rng(n + d + 2)
    X, theta, y = _glm_data(rng, loss, n, d, dtype)
    labels = _labels(_tree(rng, n, (12, 3)[: len(tilts) - 1], empty=False))
    prior = rng.random(n) + 0.5 if with_prior else None
    problem = _problem(rec, loss, X, y, labels, tilts, l2, prior)
    passes = []
    ctx = Context(count=passes.append, update=lambda p: None)
    device_tree(problem)  # built once per problem (a prior is read then)
    del rec.reads[:]
    lin = FUSED_CUDA.linearize(problem, FakeArray(theta, rec), ctx)
    if not all(math.isfinite(t) for t in tilts):
        assert lin is None  # no Hessian at an infinite tilt (the generic path raises)
        return
    assert lin is not None and passes == [2] and len(rec.reads) == 1
    f64 = np.float64
    ref = tl.TiltedObjective(
        loss, X.astype(f64), y.astype(f64), groups=labels, tilts=tilts, weights=prior, l2=l2
    )
    want = ref.linearize(theta.astype(f64))
    eps = float(np.finfo(dtype).eps)
    z = X.astype(f64) @ theta.astype(f64)
    scale = 1.0 + float(np.max(np.abs(z))) + float(np.max(np.abs(y)))
    big = max([1.0] + [abs(t) * scale for t in tilts])
    for got in (lin.value, lin.gradient, lin.losses, lin.weights):
        assert got._a.dtype == dtype
    np.testing.assert_allclose(
        float(lin.value._a), float(want.value), rtol=0, atol=64 * d * eps * scale**2
    )
    gscale = float(np.max(np.abs(want.gradient))) + scale * float(np.max(np.abs(X)))
    np.testing.assert_allclose(
        lin.gradient._a, want.gradient, rtol=0, atol=64 * d * eps * gscale * big
    )
    np.testing.assert_allclose(lin.losses._a, want.losses, rtol=0, atol=16 * d * eps * scale**2)
    np.testing.assert_allclose(lin.weights._a, want.weights, rtol=64 * d * eps * big, atol=0)
    del rec.launches[:]
    for seed in range(2):
        v = np.random.default_rng(seed).standard_normal(d).astype(dtype)
        got = lin.hvp(FakeArray(v, rec))._a
        assert got.dtype == dtype and got.shape == (d,)
        want_p = want.hvp(v.astype(f64))
        bound = _hvp_bound(loss, X.astype(f64), y.astype(f64), theta.astype(f64), v.astype(f64),
                           tilts, l2)  # fmt: skip
        np.testing.assert_allclose(got, want_p, rtol=0, atol=16 * eps * bound)
    assert len(rec.reads) == 1 and passes == [2, 2, 2]
    kernels = {k for k in rec.launches if k.startswith("tilted")}
    assert "tilted_loss_d12" not in kernels and "tilted_level_extremes" not in kernels

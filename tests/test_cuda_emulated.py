"""The CuPy backend end to end on the CPU: the engine's and the reductions' Python code
drive the recording stand-in for CuPy, whose launches run the real kernels
(``tiltlab/_cupy/kernels.cu`` with ``tilt.cuh``) compiled as host C++ over a small
emulation of CUDA threads, warps and blocks (``tests/cuda_emu.h``). Checked against the
NumPy objective and risk functions (an independent code path)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from _contract import objective_errors, reference_objective
from cuda_fake import FakeArray, Recorder, fake_cupy
from cuda_host import run_emulated

import tiltlab as tl
from tiltlab._cupy import engine as cuda_engine
from tiltlab._cupy import reductions, source
from tiltlab.losses import get_loss

#: each kernel variant is built as host C++ (seconds) and the grids are large: the full
#: tier (the push tier runs the emulated engines' contract rows, the NVRTC builds and the
#: host-read budgets)
pytestmark = pytest.mark.slow


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    # one multiprocessor: grids of a few blocks, so that the emulation stays small
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(r, run=run_emulated, sms=1))
    monkeypatch.setattr(source, "_MODULES", {})
    return r


def _data(loss, n, d, dtype, zero_theta, seed=0):
    rng = np.random.default_rng(seed + d)
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (
        np.zeros(d, dtype) if zero_theta else (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    )
    z = X.astype(np.float64) @ theta
    kind = get_loss(loss).label_kind
    if kind == "real":
        y = (z + rng.standard_normal(n)).astype(dtype)
    elif kind == "nonnegative":  # counts of mean exp(z), zeros included
        y = rng.poisson(np.exp(z)).astype(dtype)
    else:
        y = (rng.random(n) < 0.3).astype(dtype)
    return X, y, theta


#: the loss of each case (parameters away from their defaults: TL_PARAM reaches the kernel)
LOSSES = {"huber": {"delta": 0.7}, "pinball": {"quantile": 0.8}}


CASES = [
    # (loss, n, d): d picks the lanes per row (1, 4, 32) and the features per lane; n
    # against the number of row groups leaves groups unused or gives each several steps
    ("logistic", 700, 1),
    ("squared", 50, 3),
    ("logistic", 300, 40),
    ("squared", 150, 130),
    # every other scalar loss of the table, one launch shape each
    ("absolute", 90, 3),
    ("huber", 120, 40),
    ("hinge", 80, 1),
    ("squared_hinge", 100, 5),
    ("poisson", 150, 3),
    ("pinball", 110, 40),
]


#: (t, zero_theta) pairs: all six with ``TILTLAB_FULL_MATRIX=1`` (the GPU check script
#: sets it), else three that keep theta = 0 (all losses equal: the unused lanes' shift) at
#: a tiny and a large tilt and a spread of losses at a negative one
TILT_CASES = [
    (t, zero)
    for t in (-3.0, 1e-9, 40.0)
    for zero in (False, True)
    if os.environ.get("TILTLAB_FULL_MATRIX") == "1"
    or (t, zero) in ((-3.0, False), (1e-9, True), (40.0, True))
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("t", "zero_theta"), TILT_CASES)
@pytest.mark.parametrize(("loss", "n", "d"), CASES)
def test_fused_value_and_gradient(rec, loss, n, d, t, dtype, zero_theta):
    X, y, theta = _data(loss, n, d, dtype, zero_theta)
    l2 = 0.25
    loss = get_loss(loss, **LOSSES.get(loss, {}))
    out = cuda_engine.value_and_gradient(
        FakeArray(X, rec), FakeArray(y, rec), FakeArray(theta, rec), t, loss, l2
    )
    assert out is not None
    value, grad = (a._a for a in out)
    assert value.dtype == dtype and grad.dtype == dtype and grad.shape == (d,)
    ref = tl.TiltedObjective(loss, X.astype(np.float64), y.astype(np.float64), t=t, l2=l2)
    want_v, want_g = ref.value_and_gradient(theta.astype(np.float64))
    eps = float(np.finfo(dtype).eps)
    # rounding of z = x . theta (d terms) and of the sums, relative to the losses' scale
    z = X.astype(np.float64) @ theta.astype(np.float64)
    scale = 1.0 + float(np.max(np.abs(z))) + float(np.max(np.abs(y)))
    np.testing.assert_allclose(float(value), float(want_v), rtol=0, atol=64 * d * eps * scale**2)
    gscale = float(np.max(np.abs(want_g))) + scale * float(np.max(np.abs(X)))
    np.testing.assert_allclose(grad, want_g, rtol=0, atol=64 * d * eps * gscale * max(1.0, abs(t)))
    if zero_theta and loss.name == "logistic":
        assert float(value) == pytest.approx(np.log(2.0), rel=8 * eps)
    assert len(rec.reads) == 1 and len(rec.launches) == 3


#: (loss, dtype) of the reference checks: two in the push tier (each a host C++ build of
#: the kernels, the builds the contract's rows use), the other two in the full tier
LOSS_DTYPES = [
    ("logistic", np.float64),
    ("squared", np.float32),
    pytest.param("logistic", np.float32, marks=pytest.mark.slow),
    pytest.param("squared", np.float64, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("t", [-2.0, -1e-9, 1e-200, 1e-3, 0.5, 30.0])
@pytest.mark.parametrize(("loss", "dtype"), LOSS_DTYPES)
@pytest.mark.parametrize("zero_theta", [False, True])
@pytest.mark.parametrize("n", [37, 300])
def test_fused_kernels_match_the_reference(rec, loss, t, dtype, zero_theta, n):
    """The three kernels of a value and gradient (``tilted_vg``, its finish, the gradient
    product) against the 50-digit objective, at sizes that leave most row groups unused
    (37 rows) or give each several steps (300), and at ``theta = 0``, where every loss is
    equal and groups without rows once kept an infinite shift that the finish multiplied
    by a zero mass (NaN on a GPU)."""
    X, y, theta = _data(loss, n, 3, dtype, zero_theta, seed=3)
    out = cuda_engine.value_and_gradient(
        FakeArray(X, rec), FakeArray(y, rec), FakeArray(theta, rec), t, loss, 0.0
    )
    assert out is not None
    value, grad = (a._a for a in out)
    assert value.dtype == dtype and grad.dtype == dtype
    ref = reference_objective(loss, X, y, theta, [t])
    bad = objective_errors({"value": value, "grad": grad}, ref, dtype, n, 3)
    assert not bad, bad
    if zero_theta and loss == "logistic":
        assert float(value) == pytest.approx(np.log(2.0), rel=4 * float(np.finfo(dtype).eps))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_declines_nonfinite_losses(rec, dtype):
    X, y, theta = _data("squared", 64, 3, dtype, False)
    X[5, 1] = np.inf
    out = cuda_engine.value_and_gradient(
        FakeArray(X, rec), FakeArray(y, rec), FakeArray(theta, rec), 2.0, "squared"
    )
    assert out is None and len(rec.reads) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n_rows", "d"), [(1, 1), (33, 31), (100, 70), (257, 130)])
def test_the_gradient_product_sums_every_row_once(dtype, n_rows, d):
    # tilted_vg_grad: the blocks' shares times their gradient sums, 32 features a block,
    # each warp every 32nd row; against a sum in float64 over rows of mixed signs
    rng = np.random.default_rng(n_rows + d)
    f = rng.standard_normal(n_rows).astype(dtype)
    acc = rng.standard_normal((n_rows, d)).astype(dtype)
    grad = np.full(d, np.nan, dtype=dtype)
    src = source.vg_source("squared", dtype, d)
    blocks = -(-d // 32)
    run_emulated(
        src,
        "tilted_vg_grad",
        blocks,
        32 * cuda_engine.GRAD_WARPS,
        [f, acc, np.int64(n_rows), np.int32(d), grad],
    )
    want = f.astype(np.float64) @ acc.astype(np.float64)
    bound = np.abs(f.astype(np.float64)) @ np.abs(acc.astype(np.float64))
    eps = float(np.finfo(dtype).eps)
    assert np.all(np.abs(grad - want) <= n_rows * eps * bound)


def _check_risk_and_weights(rec, l, t):
    """tilted_risk and tilted_weights of ``l`` on the emulated device against the
    library's float64 NumPy evaluation, one status read per call."""
    reads = len(rec.reads)
    r = reductions.tilted_risk(FakeArray(l, rec), t)
    w = reductions.tilted_weights(FakeArray(l, rec), t)
    eps = float(np.finfo(l.dtype).eps)
    want_r = float(tl.tilted_risk(l.astype(np.float64), t))
    want_w = tl.tilted_weights(l.astype(np.float64), t)
    scale = float(np.max(np.abs(l)))
    assert r._a.dtype == l.dtype and w._a.dtype == l.dtype
    assert abs(float(r._a) - want_r) <= 16 * eps * scale
    # exp(u) carries |u| roundings; below the smallest normal number only absolute ones
    tiny = float(np.finfo(l.dtype).tiny)
    np.testing.assert_allclose(
        w._a, want_w, rtol=32 * eps * max(1.0, abs(t) * scale), atol=4 * tiny
    )
    assert len(rec.reads) == reads + 2  # one status read per call


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t", [-40.0, -1e-6, 1e-300, 1e-3, 0.5, 200.0])
@pytest.mark.parametrize("n", [1, 3000])
def test_risk_and_weights(rec, dtype, t, n):
    _check_risk_and_weights(rec, (np.random.default_rng(n).standard_normal(n) * 3).astype(dtype), t)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t", [-3.0, 1e-3, 0.7])
def test_risk_and_weights_over_several_grid_strides(rec, monkeypatch, dtype, t):
    # three blocks: each thread takes many losses, a grid's stride apart, and the blocks
    # end with different counts
    monkeypatch.setattr(reductions, "MAX_BLOCKS", 3)
    n = 3 * reductions.BLOCK_THREADS * 8 * 2 + 1001
    _check_risk_and_weights(rec, np.random.default_rng(7).gamma(2.0, 0.3, n).astype(dtype), t)


@pytest.mark.parametrize("t", [2.0, -2.0])
def test_risk_of_nonfinite_losses_unchecked(rec, t):
    l = np.linspace(0.0, 1.0, 500)
    l[77] = np.nan
    r = reductions.tilted_risk(FakeArray(l, rec), t, check_finite=False)
    assert np.isnan(r._a) and rec.reads == []
    w = reductions.tilted_weights(FakeArray(l, rec), t, check_finite=False)
    assert np.all(np.isnan(w._a))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_risk_and_weights_report_nonfinite_losses(rec, bad):
    # the status read once; the library's error names the argument
    l = np.linspace(0.0, 1.0, 500)
    l[123] = bad
    with pytest.raises(ValueError, match="`losses` contains"):
        reductions.tilted_risk(FakeArray(l, rec), 2.0)
    with pytest.raises(ValueError, match="`losses` contains"):
        reductions.tilted_weights(FakeArray(l, rec), -2.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("tau", "t"),
    [(1.0, 1.0), (-2.0, 5.0), (0.0, -3.0), (3.0, 0.0), (1e-9, 1e-300), (np.inf, -np.inf)],
)
@pytest.mark.parametrize(("n", "labels"), [(1, 1), (600, 7), (900, 40), (2500, 1200)])
def test_hierarchical_risk(rec, dtype, tau, t, n, labels):
    rng = np.random.default_rng(labels)
    l = (rng.standard_normal(n) * 2).astype(dtype)
    # labels with gaps (unused codes are empty groups)
    g = (rng.integers(0, labels, n) * 3).astype(np.int64)
    r = reductions.hierarchical_risk(FakeArray(l, rec), FakeArray(g, rec), (tau, t))
    assert r is not None and r._a.dtype == dtype and r.shape == ()
    want = float(tl.hierarchical_risk(l.astype(np.float64), g, (tau, t)))
    eps = float(np.finfo(dtype).eps)
    assert abs(float(r._a) - want) <= 64 * eps * float(np.max(np.abs(l))), (float(r._a), want)
    assert len(rec.reads) == 2 and rec.uploads == []  # the labels' range, the status
    assert [k for k in rec.launches if k.startswith("tilted")] == [
        "tilted_level_count",
        "tilted_tree_init",
        "tilted_level_extremes",
        "tilted_level_sums",
        "tilted_tree_top",
    ]


def test_hierarchical_risk_other_labels_and_tilts_take_the_tree(rec):
    # what the one-level integer route does not serve (negative or float labels, host
    # labels) goes through the tree built on the host (such labels are host arrays here:
    # the stand-in's arrays cannot be read by array-api-compat's conversion, which device
    # labels go through); more tilts than levels are the NumPy path's error; non-finite
    # losses raise, or give NaN when unchecked
    l = np.linspace(0.0, 1.0, 64)
    g = np.arange(64) % 4
    L, G = FakeArray(l, rec), FakeArray(g, rec)
    for labels, tilts in (
        (-g, (1.0, 1.0)),
        (g * 1.0, (1.0, 1.0)),
        (g, (1.0, np.inf)),
        (G, (1.0, np.inf)),
        (g, (-2.0, 1.0)),
    ):
        r = reductions.hierarchical_risk(L, labels, tilts)
        want = float(tl.hierarchical_risk(l, g, tilts))
        assert abs(float(r._a) - want) <= 1e-14, (tilts, float(r._a), want)
    with pytest.raises(ValueError, match="`tilts`"):
        reductions.hierarchical_risk(L, g, (1.0, 1.0, 1.0))
    bad = l.copy()
    bad[9] = np.nan
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        reductions.hierarchical_risk(FakeArray(bad, rec), G, (1.0, 1.0))
    r = reductions.hierarchical_risk(FakeArray(bad, rec), G, (1.0, 1.0), check_finite=False)
    assert np.isnan(r._a)
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        reductions.hierarchical_risk(FakeArray(bad, rec), G, (1.0, np.inf))
    rec.reads.clear()
    r = reductions.hierarchical_risk(FakeArray(bad, rec), g, (1.0, np.inf), check_finite=False)
    assert np.isnan(r._a) and rec.reads == []  # NaN on the device, nothing read

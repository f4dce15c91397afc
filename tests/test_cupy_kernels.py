"""The CuPy backend's kernels against the generic array-API path and NumPy (runs only
with a GPU; their scalar functions and host logic are tested on the CPU by
``test_cuda_scalar.py``, ``test_cuda_emulated.py``, ``test_cuda_budget.py`` and
``test_cuda_nvrtc.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab as tl

cupy = pytest.importorskip("cupy")
try:  # pragma: no cover - depends on the machine
    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("cupy: no GPU", allow_module_level=True)
except Exception:  # pragma: no cover
    pytest.skip("cupy: no GPU", allow_module_level=True)

from tiltlab._cupy.engine import FUSED_CUDA  # noqa: E402
from tiltlab.losses import get_loss  # noqa: E402

#: every test here runs CuPy kernels on a device (``benchmarks/gpu_check.sh``: ``-m gpu``)
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("d", [1, 3, 16, 33, 128, 300])
@pytest.mark.parametrize("t", [-2.0, 1e-9, 0.5, 40.0])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_matches_generic_cupy(loss, d, t, dtype):
    _check_fused_matches_generic(loss, d, t, dtype)


#: the other scalar losses of the table (parameters off their defaults), fewer shapes
OTHER_LOSSES = {
    "absolute": {},
    "huber": {"delta": 0.7},
    "hinge": {},
    "squared_hinge": {},
    "poisson": {},
    "pinball": {"quantile": 0.8},
}


@pytest.mark.parametrize("loss", sorted(OTHER_LOSSES))
@pytest.mark.parametrize("d", [3, 128])
@pytest.mark.parametrize("t", [-2.0, 0.5])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_serves_every_scalar_loss(loss, d, t, dtype):
    _check_fused_matches_generic(loss, d, t, dtype)


def _check_fused_matches_generic(name, d, t, dtype):
    rng = np.random.default_rng(d)
    n = 5003
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    loss = get_loss(name, **OTHER_LOSSES.get(name, {}))
    if loss.label_kind == "binary":
        y = (rng.random(n) < 0.3) * 1.0
    elif loss.label_kind == "nonnegative":
        y = rng.poisson(np.exp(X.astype(np.float64) @ theta)) * 1.0
    else:
        y = X @ theta + rng.standard_normal(n)
    y = y.astype(dtype)
    obj = tl.TiltedObjective(loss, cupy.asarray(X), cupy.asarray(y), t=t)
    assert FUSED_CUDA.applies(obj.problem)
    vf, gf = obj.value_and_gradient(cupy.asarray(theta))
    obj.fused = False
    vg, gg = obj.value_and_gradient(cupy.asarray(theta))
    # and the NumPy path on the host
    vn, gn = tl.TiltedObjective(
        loss, X.astype(np.float64), y.astype(np.float64), t=t
    ).value_and_gradient(theta.astype(np.float64))
    assert isinstance(gf, cupy.ndarray) and gf.dtype == np.dtype(dtype)
    assert vf.dtype == np.dtype(dtype)
    rtol = 1e-11 if dtype == "float64" else 2e-4
    np.testing.assert_allclose(float(vf), float(vg), rtol=rtol)
    np.testing.assert_allclose(float(vf), float(vn), rtol=rtol)
    scale = float(np.max(np.abs(gn)))
    np.testing.assert_allclose(cupy.asnumpy(gf), cupy.asnumpy(gg), atol=rtol * scale)
    np.testing.assert_allclose(cupy.asnumpy(gf), gn, atol=rtol * scale * 10)


def test_fused_declines_unsupported_cases():
    X = cupy.ones((10, 2))
    y = cupy.zeros(10)

    def applies(obj):
        return FUSED_CUDA.applies(obj.problem)

    assert applies(tl.TiltedObjective("squared", X, y, t=1.0))
    assert not applies(tl.TiltedObjective("squared", X, y, t=0.0))
    assert applies(tl.TiltedObjective("huber", X, y, t=1.0))  # every scalar loss
    labels = cupy.arange(10, dtype=cupy.int64) % 2
    assert not applies(tl.TiltedObjective("multinomial", X, labels, t=1.0))
    assert not applies(tl.TiltedObjective("squared", X, y, t=1.0, weights=cupy.ones(10)))
    assert not applies(tl.TiltedObjective("squared", cupy.asfortranarray(X), y, t=1.0))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("t", [-3.0, 1e-9, 2.0])
def test_fused_at_theta_zero(dtype, t):
    # every loss equal: the value is log 2, the gradient the mean of (1/2 - y) x
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 7)).astype(dtype)
    y = (rng.random(1000) < 0.3).astype(dtype)
    obj = tl.TiltedObjective("logistic", cupy.asarray(X), cupy.asarray(y), t=t)
    v, g = obj.value_and_gradient(cupy.zeros(7, dtype=dtype))
    rtol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(float(v), np.log(2.0), rtol=rtol)
    np.testing.assert_allclose(cupy.asnumpy(g), ((0.5 - y) @ X) / 1000, rtol=rtol * 100, atol=rtol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("t", [-40.0, -1e-6, 1e-300, 1e-3, 0.5, 200.0])
@pytest.mark.parametrize("n", [1, 1000, 300_001])
def test_risk_and_weights_match_numpy(dtype, t, n):
    l = np.random.default_rng(n).standard_normal(n).astype(dtype) * 3
    lc = cupy.asarray(l)
    r = tl.tilted_risk(lc, t)
    w = tl.tilted_weights(lc, t)
    assert isinstance(r, cupy.ndarray) and r.dtype == l.dtype and r.shape == ()
    assert isinstance(w, cupy.ndarray) and w.dtype == l.dtype
    rtol = 1e-12 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(
        float(r), float(tl.tilted_risk(l.astype(np.float64), t)), rtol=rtol, atol=rtol * 3
    )
    np.testing.assert_allclose(
        cupy.asnumpy(w), tl.tilted_weights(l.astype(np.float64), t), rtol=rtol * 10, atol=1e-30
    )
    bad = lc.copy()
    bad[n // 2] = np.nan
    with pytest.raises(ValueError, match="losses"):
        tl.tilted_risk(bad, t)
    assert np.isnan(float(tl.tilted_risk(bad, t, check_finite=False)))


def test_fused_in_a_solver():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 5))
    y = X @ np.arange(5.0) + 0.1 * rng.standard_normal(2000)
    y[:100] += 20
    res_gpu = tl.minimize(
        tl.TiltedObjective("squared", cupy.asarray(X), cupy.asarray(y), t=-2.0), method="lbfgs"
    )
    res_cpu = tl.minimize(tl.TiltedObjective("squared", X, y, t=-2.0), method="lbfgs")
    np.testing.assert_allclose(cupy.asnumpy(res_gpu.x), res_cpu.x, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tilts", [(1.0, 1.0), (-2.0, 5.0), (0.0, -3.0), (2.0, 1e-9)])
def test_hierarchical_risk_matches_numpy(dtype, tilts):
    rng = np.random.default_rng(1)
    n = 200_003
    l = (rng.standard_normal(n) * 2).astype(dtype)
    g = rng.integers(0, 1000, n)
    r = tl.hierarchical_risk(cupy.asarray(l), cupy.asarray(g), tilts)
    assert isinstance(r, cupy.ndarray) and r.dtype == l.dtype and r.shape == ()
    want = float(tl.hierarchical_risk(l.astype(np.float64), g, tilts))
    rtol = 1e-12 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(float(r), want, rtol=rtol, atol=rtol * 4)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "tilts", [(1.0, -1.0, 2.0), (0.0, 3.0, 1e-9), (-np.inf, 1.0, 0.0), (2.0, 0.5, np.inf)]
)
@pytest.mark.parametrize("with_prior", [False, True])
def test_nested_hierarchical_risk_and_weights_match_numpy(dtype, tilts, with_prior):
    rng = np.random.default_rng(2)
    n = 200_003
    l = (rng.standard_normal(n) * 2).astype(dtype)
    inner = rng.integers(0, 1000, n)
    groups = [inner % 37, inner]
    p = rng.random(n) + 0.1 if with_prior else None
    pc = None if p is None else cupy.asarray(p.astype(dtype))
    r = tl.hierarchical_risk(cupy.asarray(l), groups, tilts, weights=pc)
    w = tl.hierarchical_weights(cupy.asarray(l), groups, tilts, weights=pc)
    assert isinstance(r, cupy.ndarray) and r.dtype == l.dtype and r.shape == ()
    assert isinstance(w, cupy.ndarray) and w.dtype == l.dtype and w.shape == (n,)
    l64 = l.astype(np.float64)
    want_r = float(tl.hierarchical_risk(l64, groups, tilts, weights=p))
    want_w = tl.hierarchical_weights(l64, groups, tilts, weights=p)
    rtol = 1e-12 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(float(r), want_r, rtol=rtol, atol=rtol * 4)
    np.testing.assert_allclose(cupy.asnumpy(w), want_w, rtol=50 * rtol, atol=rtol / n)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_hierarchical_objective_on_the_device_matches_numpy(dtype, levels, loss):
    rng = np.random.default_rng(3)
    n, d = 50_003, 16
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    y = X @ theta + rng.standard_normal(n) if loss == "squared" else (rng.random(n) < 0.3) * 1.0
    y = y.astype(dtype)
    inner = rng.integers(0, 1000, n)
    groups = inner if levels == 1 else [inner % 50, inner]
    tilts = (1.0, -2.0) if levels == 1 else (1.0, 0.0, -2.0)
    obj = tl.TiltedObjective(
        loss, cupy.asarray(X), cupy.asarray(y), groups=groups, tilts=tilts, l2=0.1
    )
    assert FUSED_CUDA.applies(obj.problem)
    vf, gf = obj.value_and_gradient(cupy.asarray(theta))
    obj.value_and_gradient(cupy.asarray(theta))  # the second call: the tree reused
    keys = [k for k in obj.problem.cache if k and k[0] == "cuda-tree"]
    assert len(keys) == 1
    vn, gn = tl.TiltedObjective(
        loss, X.astype(np.float64), y.astype(np.float64), groups=groups, tilts=tilts, l2=0.1
    ).value_and_gradient(theta.astype(np.float64))
    rtol = 1e-10 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(float(vf), float(vn), rtol=rtol)
    np.testing.assert_allclose(
        cupy.asnumpy(gf), gn, rtol=rtol, atol=rtol * float(np.max(np.abs(gn)))
    )

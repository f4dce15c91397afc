"""The fused CuPy kernel against the generic array-API path (runs only with a GPU)."""

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

from tiltlab import _cupy_kernels  # noqa: E402


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("d", [1, 3, 16, 33, 128, 300])
@pytest.mark.parametrize("t", [-2.0, 1e-9, 0.5, 40.0])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_matches_generic_cupy(loss, d, t, dtype):
    rng = np.random.default_rng(d)
    n = 5003
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    y = X @ theta + rng.standard_normal(n) if loss == "squared" else (rng.random(n) < 0.3) * 1.0
    y = y.astype(dtype)
    obj = tl.TiltedObjective(loss, cupy.asarray(X), cupy.asarray(y), t=t)
    assert _cupy_kernels.supported(obj)
    vf, gf = obj.value_and_gradient(cupy.asarray(theta))
    obj.fused = False
    vg, gg = obj.value_and_gradient(cupy.asarray(theta))
    # and the NumPy path on the host
    vn, gn = tl.TiltedObjective(loss, X.astype(np.float64), y.astype(np.float64),
                                t=t).value_and_gradient(theta.astype(np.float64))
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
    assert not _cupy_kernels.supported(tl.TiltedObjective("squared", X, y, t=0.0))
    assert not _cupy_kernels.supported(tl.TiltedObjective("huber", X, y, t=1.0))
    assert not _cupy_kernels.supported(
        tl.TiltedObjective("squared", X, y, t=1.0, weights=cupy.ones(10)))
    assert not _cupy_kernels.supported(
        tl.TiltedObjective("squared", cupy.asfortranarray(X), y, t=1.0))


def test_fused_in_a_solver():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 5))
    y = X @ np.arange(5.0) + 0.1 * rng.standard_normal(2000)
    y[:100] += 20
    res_gpu = tl.minimize(tl.TiltedObjective("squared", cupy.asarray(X), cupy.asarray(y),
                                             t=-2.0), method="lbfgs")
    res_cpu = tl.minimize(tl.TiltedObjective("squared", X, y, t=-2.0), method="lbfgs")
    np.testing.assert_allclose(cupy.asnumpy(res_gpu.x), res_cpu.x, rtol=1e-6, atol=1e-8)

"""Losses near the float maximum, and the synchronisation-free path for torch.compile/vmap."""

from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest

import tiltlab as tl
from tiltlab._compat import to_numpy

mpmath.mp.dps = 50


def _mp_risk(l, t):
    l = [mpmath.mpf(float(v)) for v in l]
    if t == 0:
        return mpmath.fsum(l) / len(l)
    if mpmath.isinf(t):
        return max(l) if t > 0 else min(l)
    m = max(l) if t > 0 else min(l)
    z = mpmath.fsum(mpmath.exp(t * (v - m)) for v in l) / len(l)
    return m + mpmath.log(z) / t


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
    if xp_name == "dask.array" and t == 0.0 and values[0] < 0:
        pytest.skip("Dask's lazy t = 0 reduction sums losses relative to the minimum; a spread "
                    "beyond the float maximum (losses of both signs near 1.7e308) overflows it")
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


torch = pytest.importorskip("torch")


@pytest.mark.filterwarnings("ignore:Dynamo detected a call")
def test_torch_compile_fullgraph_without_checks():
    l = torch.linspace(0.0, 5.0, 101, dtype=torch.float64)

    def f(x):
        return tl.tilted_risk(x, 2.0, check_finite=False)

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert float(compiled(l)) == pytest.approx(float(_mp_risk(l.tolist(), 2.0)), rel=1e-13)

    def g(x):
        return tl.tilted_weights(x, -1.5, check_finite=False)

    w = torch.compile(g, fullgraph=True, backend="eager")(l)
    assert float(w.sum()) == pytest.approx(1.0, rel=1e-13)


def test_torch_vmap_without_checks():
    batch = torch.rand(4, 50, dtype=torch.float64) * 3
    out = torch.func.vmap(lambda x: tl.tilted_risk(x, 1.5, check_finite=False))(batch)
    for i in range(4):
        assert float(out[i]) == pytest.approx(float(_mp_risk(batch[i].tolist(), 1.5)), rel=1e-13)
    # and gradients through it (autograd of the sync-free kernel)
    x = batch[0].clone().requires_grad_(True)
    tl.tilted_risk(x, 1.5, check_finite=False).backward()
    want = to_numpy(tl.tilted_weights(batch[0], 1.5))
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)

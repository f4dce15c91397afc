"""tiltlab on Dask at the edges of its inputs.

References are independent of the code under test: the tilted risk in 50-digit mpmath,
the eager NumPy objective and solvers, and the definition of ``nfev``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
mp = pytest.importorskip("mpmath")


@pytest.fixture(autouse=True)
def _synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def _risk_mp(l, p, t):
    """The tilted risk of losses ``l`` under prior ``p`` in 50-digit arithmetic."""
    with mp.workdps(50):
        p = [mp.mpf(float(x)) for x in p]
        total = mp.fsum(p)
        t = mp.mpf(t)
        z = mp.fsum(pi / total * mp.exp(t * mp.mpf(float(li))) for li, pi in zip(l, p, strict=True))
        return float(mp.log(z) / t)


def _weights_mp(l, p, t):
    with mp.workdps(50):
        t = mp.mpf(t)
        e = [mp.mpf(float(pi)) * mp.exp(t * mp.mpf(float(li)))
             for li, pi in zip(l, p, strict=True)]
        total = mp.fsum(e)
        return np.array([float(x / total) for x in e])


# ---------------------------------------------------------------------------------------
# prior weights far below the normal range


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tiny_prior_weights(dtype):
    # subnormal weights (float64's smallest, float32's 1e-40 range): the risk and weights
    # are those of the normalised prior; products with the raw weights underflowed
    tiny = 5e-324 if dtype == np.float64 else 1e-40
    l = np.arange(1.0, 7.0).astype(dtype)
    w = np.full(6, tiny, dtype=dtype)
    w[0] *= 2
    L, W = da.from_array(l, chunks=2), da.from_array(w, chunks=2)
    eps = np.finfo(dtype).eps
    want = _risk_mp(l, w, 1.0)  # the weights as the dtype holds them
    got = tl.tilted_risk(L, 1.0, weights=W).compute()
    assert got.dtype == dtype
    # condition of log-sum-exp in the losses: 1 (relative to max |l| = 6)
    assert abs(float(got) - want) <= 8 * eps * 6.0
    wt = np.asarray(tl.tilted_weights(L, 1.0, weights=W).compute())
    assert wt.dtype == dtype
    np.testing.assert_allclose(wt, _weights_mp(l, w, 1.0), rtol=16 * eps, atol=0)
    g = np.array([0, 0, 1, 1, 2, 2])
    hier = tl.hierarchical_risk(L, da.from_array(g, chunks=2), (1.0, 2.0), weights=W).compute()
    R = [_risk_mp(l[g == k], w[g == k], 2.0) for k in range(3)]
    P = [float(w[g == k].astype(np.float64).sum()) for k in range(3)]
    assert abs(float(hier) - _risk_mp(R, P, 1.0)) <= 16 * eps * 6.0


# ---------------------------------------------------------------------------------------
# empty losses of unknown size


def test_empty_losses_of_unknown_size_name_losses():
    L = da.from_array(np.arange(6.0), chunks=2)
    empty = L[L > 100.0]  # unknown chunk sizes, no sample
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_risk(empty, 1.0).compute()
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_risk(empty, [0.0, math.inf]).compute()
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_weights(empty, 0.5).compute()
    with pytest.raises(ValueError, match="`losses` must not be empty"):
        tl.tilted_risk(empty, da.asarray(2.0)).compute()
    # zero prior mass still names the weights
    with pytest.raises(ValueError, match="`weights` must not be all zero"):
        tl.tilted_risk(L, 1.0, weights=da.zeros(6, chunks=2)).compute()

"""Tilt paths: statistics under the prior weights, warm starts on every method."""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab as tl
from tiltlab._compat import to_numpy


def _weighted_problem(seed=0, n=40):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=n)]
    y = X @ np.array([0.5, -1.0]) + 0.2 * rng.normal(size=n)
    y[:4] += 8.0  # outliers, carrying almost no prior weight
    w = rng.uniform(0.5, 2.0, size=n)
    w[:4] = 1e-3
    w[4] = 0.0  # one sample outside the prior's support, with a large loss
    y[4] += 50.0
    return X, y, w


def test_path_stats_use_the_prior_weights(xp):
    X, y, w = _weighted_problem()
    obj = tl.TiltedObjective("squared", xp.asarray(X), xp.asarray(y), weights=xp.asarray(w))
    ts = [-1.0, 0.0, 0.5]
    path = tl.tilt_path(obj, ts, tol=1e-10)
    q = w / w.sum()
    for k in range(len(ts)):
        theta = to_numpy(path.x).astype(np.float64)[k]
        ell = (X @ theta - y) ** 2  # the squared loss (no factor 1/2), by hand
        mean = sum(qi * li for qi, li in zip(q, ell, strict=True))
        var = sum(qi * (li - mean) ** 2 for qi, li in zip(q, ell, strict=True))
        kept = [li for qi, li in zip(q, ell, strict=True) if qi > 0]
        np.testing.assert_allclose(path.stats["mean"][k], mean, rtol=1e-10)
        np.testing.assert_allclose(path.stats["variance"][k], var, rtol=1e-9)
        np.testing.assert_allclose(path.stats["max"][k], max(kept), rtol=1e-12)
        np.testing.assert_allclose(path.stats["min"][k], min(kept), rtol=1e-12)
    # at t = 0 the objective is the weighted ERM value: the weighted mean of the losses
    np.testing.assert_allclose(path.stats["mean"][1], path.stats["risk"][1], rtol=1e-10)


def test_path_stats_unweighted_are_plain_moments():
    X, y, _ = _weighted_problem(1)
    obj = tl.TiltedObjective("squared", X, y)
    path = tl.tilt_path(obj, [0.0, 1.0])
    for k in range(2):
        ell = (X @ np.asarray(path.x[k]) - y) ** 2
        np.testing.assert_allclose(path.stats["mean"][k], np.mean(ell), rtol=1e-12)
        np.testing.assert_allclose(path.stats["variance"][k], np.var(ell), rtol=1e-10)
        assert path.stats["max"][k] == pytest.approx(np.max(ell), rel=1e-12)

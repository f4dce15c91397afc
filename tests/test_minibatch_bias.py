"""The bias of the minibatch estimators at a fixed model (statistical, fixed seeds).

Per-sample "gradients" are fixed random vectors a_i; the exact full-data tilted gradient is
g = sum_i tilted_weights(l, t)_i a_i. Each estimator sees K independent uniform batches;
the relative error of the mean batch gradient, ||mean_k g_k - g|| / ||g||, is its bias plus
a Monte Carlo noise of about sqrt(trace Cov / K) / ||g|| (the "floor"). Margins are wide:
the checks are that the bias is clearly there at small batches (several floors), that it
falls with the batch size, and that the estimators built to remove it do.
"""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab
from tiltlab.minibatch import MinibatchTilt

N, D, K = 4000, 3, 3000


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    losses = rng.uniform(0.0, 2.0, size=N)  # bounded: every moment of exp(t l) is finite
    grads = rng.normal(size=(N, D)) + losses[:, None]  # correlated with the loss
    return losses, grads


def _error(problem, t, tilt, batch_size, seed, sampler=None, burn_in=50):
    losses, grads = problem
    exact = tiltlab.tilted_weights(losses, t) @ grads
    rng = np.random.default_rng(seed)
    draws = (
        iter(sampler)
        if sampler is not None
        else (rng.choice(N, size=batch_size, replace=False) for _ in range(K + burn_in))
    )
    est = []
    for k, idx in enumerate(draws):
        idx = np.asarray(idx)
        w = tilt.weights(losses[idx])
        if k >= burn_in:
            est.append(w @ grads[idx])
    est = np.array(est)
    norm = np.linalg.norm(exact)
    error = np.linalg.norm(est.mean(axis=0) - exact) / norm
    floor = np.sqrt(np.trace(np.cov(est.T)) / len(est)) / norm
    return error, floor


@pytest.mark.slow  # a statistical run of many batches
@pytest.mark.parametrize("t", [2.0, -2.0])
def test_plug_in_bias_falls_with_batch_size(problem, t):
    small, floor_small = _error(problem, t, MinibatchTilt(t, lam=1.0), 4, seed=1)
    large, floor_large = _error(problem, t, MinibatchTilt(t, lam=1.0), 256, seed=2)
    assert small > 4 * floor_small  # a real bias, not noise
    assert large < small / 4
    assert large < 4 * floor_large + small / 16  # about 1/B: gone into the noise at 256


@pytest.mark.slow  # a statistical run of many batches
def test_running_normaliser_removes_most_of_the_bias(problem):
    t = 2.0
    plug_in, _ = _error(problem, t, MinibatchTilt(t, lam=1.0), 4, seed=3)
    running, floor = _error(problem, t, MinibatchTilt(t, lam=0.01), 4, seed=3)
    assert running < plug_in / 3


@pytest.mark.slow  # a statistical run of many batches
def test_mlmc_bias_is_that_of_its_largest_level(problem):
    t = 2.0
    plug_in, _ = _error(problem, t, MinibatchTilt(t, lam=1.0), 4, seed=4)
    tilt = MinibatchTilt(t, estimator="mlmc", base_batch_size=2, max_level=5)
    sampler = tilt.batch_sampler(N, num_batches=K + 50, seed=5)  # batches of 4 ... 64
    mlmc, floor = _error(problem, t, tilt, None, seed=5, sampler=sampler)
    assert mlmc < plug_in / 3
    assert mlmc < 4 * floor + plug_in / 8


def test_variational_is_unbiased_at_the_exact_eta(problem):
    t = 2.0
    losses, _ = problem
    tilt = MinibatchTilt(t, estimator="variational", lam=1e-12)
    eta = float(tiltlab.tilted_risk(losses, t))
    tilt.load_state_dict({"step": 1, "estimator": "variational", "eta": np.asarray(eta)})
    error, floor = _error(problem, t, tilt, 4, seed=6, burn_in=0)
    assert error < 4 * floor

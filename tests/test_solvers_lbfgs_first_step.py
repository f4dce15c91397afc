"""L-BFGS starts as SciPy's L-BFGS-B does and then follows its iterates.

SciPy's L-BFGS-B (an independent implementation of the same method: compact
representation, Moré-Thuente search with the same constants) takes a first step of unit
length along the steepest descent direction; with the same first step, the two runs
visit the same points on a smooth problem. Losses with kinks keep a first step of at
most ``min(1, 1/||g||)``, with which the weak Wolfe bisection resolves them.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize as scipy_minimize
from scipy.special import expit

import tiltlab as tl


def _logistic(seed=0, n=500, d=8):
    rng = np.random.default_rng(seed)
    X = np.c_[rng.normal(size=(n, d)), np.ones(n)]
    w = rng.normal(size=d + 1)
    y = (rng.random(n) < expit(X @ w)).astype(float)
    return X, y


def _scipy_path(obj, x0, iters):
    def fg(th):
        f, g = obj.value_and_gradient(th)
        return float(f), np.asarray(g, dtype=np.float64)

    path = []
    scipy_minimize(
        fg, x0, jac=True, method="L-BFGS-B", callback=lambda xk: path.append(np.copy(xk)),
        options={"maxiter": iters, "maxcor": 10, "gtol": 0.0, "ftol": 0.0},
    )  # fmt: skip
    return path


@pytest.mark.parametrize("l2", [0.0, 1e-3])
def test_iterates_follow_scipy_lbfgsb(l2):
    X, y = _logistic()
    obj = tl.TiltedObjective("logistic", X, y, l2=l2)
    ref = _scipy_path(obj, np.zeros(X.shape[1]), 6)
    assert len(ref) == 6
    ours = []
    tl.minimize(
        obj, method="lbfgs", tol=0.0, max_iter=6, callback=lambda s: ours.append(np.copy(s.x))
    )
    assert len(ours) == 6
    # the first step: unit length along -grad(0), as SciPy takes it
    g0 = np.asarray(obj.gradient(np.zeros(X.shape[1])))
    step = ours[0] / (-g0 / np.linalg.norm(g0))
    np.testing.assert_allclose(step, 1.0, rtol=1e-12)
    for k, (a, b) in enumerate(zip(ours, ref, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, err_msg=f"iterate {k + 1}")


def test_first_step_on_a_loss_with_kinks_is_at_most_the_gradient():
    rng = np.random.default_rng(1)
    X = np.c_[rng.normal(size=(60, 3)), np.ones(60)] * 0.1
    y = X @ np.array([10.0, -10.0, 5.0, 20.0]) + 0.1 * rng.normal(size=60)
    obj = tl.TiltedObjective("absolute", X, y)
    assert not obj.loss.smooth
    g0 = np.asarray(obj.gradient(np.zeros(4)))
    assert np.linalg.norm(g0) < 0.5  # a unit-length step would be a step of over 2
    trials = []
    evaluate = obj.value_and_gradient
    obj.value_and_gradient = lambda th: (trials.append(np.copy(th)), evaluate(th))[1]
    tl.minimize(obj, method="lbfgs", max_iter=1)
    # trials[0] is the start; the first trial point is -g: a step of length ||g||
    np.testing.assert_allclose(trials[1], -g0, rtol=1e-12)

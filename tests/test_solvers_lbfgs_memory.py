"""L-BFGS memory: the compact-representation direction against the two-loop recursion.

The solver keeps its correction pairs in a ring of buffer rows and the small host
matrices as moving windows of preallocated buffers. These tests check that bookkeeping
(filling, wrapping around, skipping a pair of non-positive curvature, resetting) against
an independent computation of the same direction: the two-loop recursion of Nocedal and
Wright (Algorithm 7.4) on the pairs that should be stored, in plain NumPy. The NumPy fast
path and the general array-API path are both run, and a short run is pinned against
SciPy's L-BFGS-B (an independent implementation) with a memory small enough to wrap.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy.optimize import minimize as scipy_minimize
from scipy.special import expit

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.solvers import lbfgs as lbfgs_module
from tiltlab.solvers.lbfgs import _Pairs


def _two_loop(S, Y, g):
    """``-H g`` of the L-BFGS matrix with ``H0 = (s.y / y.y) I`` of the newest pair."""
    q = np.array(g, dtype=np.float64)
    if not S:
        return -q
    history = []
    for s, y in zip(reversed(S), reversed(Y), strict=True):
        rho = 1.0 / (y @ s)
        a = rho * (s @ q)
        q = q - a * y
        history.append((rho, a, s, y))
    r = (S[-1] @ Y[-1]) / (Y[-1] @ Y[-1]) * q
    for rho, a, s, y in reversed(history):
        r = r + s * (a - rho * (y @ r))
    return -r


def _sequence(n, p=7, seed=0):
    """Points and gradients of a strictly convex quadratic (every pair is accepted)."""
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(p, p))
    A = B @ B.T + p * np.eye(p)
    b = rng.normal(size=p)
    xs = [rng.normal(size=p) for _ in range(n)]
    return [(x, A @ x - b, 0.5 * x @ A @ x - b @ x) for x in xs]


@pytest.mark.slow  # 3 s on Dask: the full tier (the NumPy paths are checked below)
@pytest.mark.parametrize("memory", [1, 3, 5])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_direction_matches_the_two_loop_recursion(xp, memory, dtype):
    seq = _sequence(12)
    # a step of negative curvature (y = -s) in the middle: it must be skipped
    x5, g5, f5 = seq[5]
    seq[6] = (seq[6][0], g5 - (seq[6][0] - x5), f5)
    dt = getattr(xp, dtype)
    tol = 1e-10 if dtype == "float64" else 2e-4

    def arr(v):
        return xp.asarray(np.asarray(v, dtype=dtype), dtype=dt)

    x_prev, g_prev, f_prev = seq[0]
    pairs = _Pairs(xp, arr(g_prev), memory, 1e-12)
    pairs.gg = float(g_prev @ g_prev)
    S, Y = [], []
    for x, g, f in seq[1:]:
        fh, gn = pairs.update(arr(x), arr(x_prev), arr(g), arr(g_prev), arr(f))
        s = np.asarray(x, dtype=dtype) - np.asarray(x_prev, dtype=dtype)
        y = np.asarray(g, dtype=dtype) - np.asarray(g_prev, dtype=dtype)
        s, y = s.astype(np.float64), y.astype(np.float64)
        if s @ y > 0:
            S, Y = [*S, s][-memory:], [*Y, y][-memory:]
        assert pairs.k == len(S)
        np.testing.assert_allclose(fh, f, rtol=tol)
        np.testing.assert_allclose(gn, np.linalg.norm(g), rtol=tol)
        d, slope = pairs.direction(arr(g))
        assert d.dtype == dt
        d = to_numpy(d).astype(np.float64)
        ref = _two_loop(S, Y, np.asarray(np.asarray(g, dtype=dtype), dtype=np.float64))
        np.testing.assert_allclose(d, ref, rtol=tol, atol=tol * np.linalg.norm(ref))
        np.testing.assert_allclose(slope, g @ ref, rtol=10 * tol)
        # the pairs it exports are the ones the recursion used, oldest first
        ES, EY = pairs.export()
        assert len(ES) == len(S)
        for a, b in zip(ES + EY, S + Y, strict=True):
            np.testing.assert_allclose(to_numpy(a).astype(np.float64), b, rtol=tol)
        x_prev, g_prev = x, g
    pairs.reset()
    d, slope = pairs.direction(arr(g_prev))
    np.testing.assert_allclose(to_numpy(d).astype(np.float64), -g_prev, rtol=tol)


def test_pickled_pairs_give_the_same_direction():
    seq = _sequence(9)
    pairs = _Pairs(tl.TiltedObjective("squared", np.eye(7), np.ones(7)).xp, seq[0][1], 3, 1e-12)
    for (x0, g0, _), (x, g, f) in zip(seq, seq[1:], strict=False):
        pairs.update(x, x0, g, g0, f)
    back = pickle.loads(pickle.dumps(pairs))
    d0, s0 = pairs.direction(seq[-1][1])
    d1, s1 = back.direction(seq[-1][1])
    np.testing.assert_array_equal(d0, d1)
    assert s0 == s1


def _logistic(seed=0, n=400, d=6):
    rng = np.random.default_rng(seed)
    X = np.c_[rng.normal(size=(n, d)), np.ones(n)]
    y = (rng.random(n) < expit(X @ rng.normal(size=d + 1))).astype(float)
    return X, y


def _iterates(obj, n, **kw):
    out = []
    tl.minimize(obj, method="lbfgs", tol=0.0, max_iter=n,
                callback=lambda s: out.append(np.array(s.x, copy=True)), **kw)  # fmt: skip
    return out


def test_numpy_fast_path_matches_the_general_path(monkeypatch):
    X, y = _logistic()
    obj = tl.TiltedObjective("logistic", X, y, t=2.0, l2=1e-3)
    fast = _iterates(obj, 25, memory=3)
    init = _Pairs._init_host

    def general(self):
        init(self)
        self.host_arrays = False

    monkeypatch.setattr(lbfgs_module._Pairs, "_init_host", general)
    slow = _iterates(obj, 25, memory=3)
    assert len(fast) == len(slow) == 25
    for k, (a, b) in enumerate(zip(fast, slow, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13, err_msg=f"iterate {k + 1}")


@pytest.mark.parametrize("memory", [2, 3])
def test_iterates_follow_scipy_with_a_wrapping_memory(memory):
    X, y = _logistic(seed=3)
    obj = tl.TiltedObjective("logistic", X, y, l2=1e-3)

    def fg(th):
        f, g = obj.value_and_gradient(th)
        return float(f), np.asarray(g, dtype=np.float64)

    ref = []
    scipy_minimize(
        fg, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B",
        callback=lambda xk: ref.append(np.copy(xk)),
        options={"maxiter": 12, "maxcor": memory, "gtol": 0.0, "ftol": 0.0},
    )  # fmt: skip
    ours = _iterates(obj, 12, memory=memory)
    assert len(ref) == len(ours) == 12  # the memory wraps around several times
    for k, (a, b) in enumerate(zip(ours, ref, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, err_msg=f"iterate {k + 1}")

"""Ritz pairs of the tangent solves and the L-BFGS seeding of tilt paths: the pairs are
exact curvature pairs (against dense Hessians), their Ritz values are eigenvalues (against
``numpy.linalg.eigvalsh``), and seeded paths solve what cold solves solve."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tiltlab as tl
from tiltlab._compat import array_namespace, to_numpy
from tiltlab.solvers import _continuation
from tiltlab.solvers._continuation import Continuation, PathPoint, ritz_pairs, tangent


def _host(a):
    return to_numpy(a).astype(np.float64)


def _logistic(n=200, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1)) * np.linspace(0.2, 3.0, d - 1)]
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ rng.normal(size=d)))).astype(float)
    return X, y


def _solve(obj):
    return tl.minimize(obj, method="newton", tol=1e-13).x


@pytest.mark.slow  # 5 s on Dask: the full tier (the tests below run in the push tier)
@pytest.mark.parametrize("t", [2.0, -0.5])
def test_tangent_pairs_are_curvature_pairs_of_the_dense_hessian(xp, t):
    X, y = _logistic()
    obj = tl.TiltedObjective("logistic", xp.asarray(X), xp.asarray(y), t=t, l2=1e-3)
    x = _solve(obj)
    tan = tangent(obj, x, rtol=1e-14, max_iter=50, pairs=3)
    assert tan is not None and tan.pairs is not None
    S, Y = tan.pairs
    assert len(S) == len(Y) == 3
    for s in (*S, *Y):
        assert array_namespace(s) is array_namespace(x)
        assert s.dtype == obj.dtype and s.shape == (5,)
    H = _host(tl.TiltedObjective("logistic", X, y, t=t, l2=1e-3).hessian(_host(x)))
    lam = np.linalg.eigvalsh(H)
    for s, yv in zip(S, Y, strict=True):
        s, yv = _host(s), _host(yv)
        np.testing.assert_allclose(yv, H @ s, rtol=0, atol=1e-10 * np.linalg.norm(yv))
    # the conjugate-gradient solve spans R^5 here: the Ritz values are the three lowest
    # eigenvalues of H, the lowest last
    ritz = [float(_host(s) @ _host(yv) / (_host(s) @ _host(s))) for s, yv in zip(S, Y, strict=True)]
    np.testing.assert_allclose(ritz, lam[:3][::-1], rtol=1e-9)
    # the tangent itself is unchanged by keeping the pairs
    plain = tangent(obj, x, rtol=1e-14, max_iter=50)
    assert plain.pairs is None and plain.n_products == tan.n_products
    np.testing.assert_allclose(_host(plain.d), _host(tan.d), rtol=0, atol=1e-14)


def test_ritz_pairs_on_a_subspace_match_a_projected_eigenproblem():
    rng = np.random.default_rng(4)
    Q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    H = Q @ np.diag([1e-3, 0.1, 1.0, 3.0, 10.0, 1e3]) @ Q.T
    a, b = rng.normal(size=6), 1e-6 * rng.normal(size=6)  # directions of unequal scale
    S = [a, b, 2.0 * a - 3e5 * b, 0.0 * a, a]  # a plane; dependent and zero directions
    s_out, y_out = ritz_pairs(S, [H @ v for v in S], 5)
    assert len(s_out) == 2  # the plane's two Ritz pairs, no spurious ones
    basis, _ = np.linalg.qr(np.c_[a, b])
    want = np.linalg.eigvalsh(basis.T @ H @ basis)[::-1]
    got = [float(s @ yv / (s @ s)) for s, yv in zip(s_out, y_out, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-8)
    for s, yv in zip(s_out, y_out, strict=True):
        np.testing.assert_allclose(yv, H @ s, rtol=0, atol=1e-9 * np.linalg.norm(yv))
        # in the plane: the residual against the basis is rounding
        assert np.linalg.norm(s - basis @ (basis.T @ s)) <= 1e-9 * np.linalg.norm(s)
    # one pair asked: the lowest Ritz value
    s1, y1 = ritz_pairs(S, [H @ v for v in S], 1)
    assert len(s1) == 1
    np.testing.assert_allclose(s1[0] @ y1[0] / (s1[0] @ s1[0]), want[-1], rtol=1e-8)
    assert ritz_pairs([], [], 3) is None


def test_ritz_pairs_float32():
    X, y = _logistic(seed=1)
    obj = tl.TiltedObjective("logistic", X.astype(np.float32), y.astype(np.float32), t=1.0)
    x = tl.minimize(obj, method="newton").x
    tan = tangent(obj, x, rtol=1e-5, max_iter=50, pairs=2)
    S, Y = tan.pairs
    H = np.asarray(obj.hessian(x), dtype=np.float64)
    for s, yv in zip(S, Y, strict=True):
        assert s.dtype == np.float32 and yv.dtype == np.float32
        s, yv = s.astype(np.float64), yv.astype(np.float64)
        np.testing.assert_allclose(yv, H @ s, rtol=0, atol=1e-4 * np.linalg.norm(yv))


def test_tangent_over_the_budget_keeps_no_pairs(monkeypatch):
    X, y = _logistic()
    obj = tl.TiltedObjective("logistic", X, y, t=1.0, l2=1e-3)
    x = _solve(obj)
    monkeypatch.setattr(_continuation, "PAIR_BUDGET", 2 * 5 * 3)  # three directions
    tan = tangent(obj, x, rtol=1e-14, max_iter=50, pairs=3)
    assert tan.n_products > 3 and tan.pairs is None
    monkeypatch.undo()
    full = tangent(obj, x, rtol=1e-14, max_iter=50, pairs=3)
    np.testing.assert_allclose(tan.d, full.d, rtol=0, atol=1e-14)


def test_continuation_hands_the_pairs_to_lbfgs_only():
    X, y = _logistic()
    obj = tl.TiltedObjective("logistic", X, y, t=1.0, l2=1e-3)
    res = tl.minimize(obj, method="lbfgs", tol=1e-12)
    cont = Continuation("lbfgs", {"memory": 4}, True)
    branch = [PathPoint(0.5, res.x, res.x * 0.0, pairs=([res.x], [res.x]))]
    point = cont.point(obj, 1.0, res, more=True, branch=branch)
    assert branch[-1].pairs is None  # the older point's pairs are dropped
    assert point.pairs is not None and len(point.pairs[0]) == 4
    assert cont.solver_options(None, point) == {"pairs": point.pairs}
    assert cont.point(obj, 1.0, res, more=False).pairs is None
    # a user's pairs or state win; other methods and the secant keep the solver state
    for method, opts, tangents in [
        ("lbfgs", {"pairs": ([], [])}, True),
        ("lbfgs", {"warm_state": None}, True),
        ("newton", {}, True),
        ("lbfgs", {}, False),
    ]:
        other = Continuation(method, opts, tangents)
        pt = other.point(obj, 1.0, res, more=True)
        assert pt.pairs is None
        expected = {} if other.user_warm else {"warm_state": "state"}
        assert other.solver_options("state", pt) == expected


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_seeded_lbfgs_path_equals_cold_solves(dtype, monkeypatch):
    X, y = _logistic(n=300, d=6, seed=3)
    obj = tl.TiltedObjective("logistic", X.astype(dtype), y.astype(dtype), l2=1e-3)
    ts = np.r_[np.linspace(-1.0, 0.0, 4), np.linspace(0.7, 8.0, 8)]
    tol = 1e-10 if dtype == np.float64 else None
    path = tl.tilt_path(obj, ts, method="lbfgs", memory=5, tol=tol)
    assert path.success, [r.message for r in path.results]
    assert path.x.dtype == dtype
    ref_obj = tl.TiltedObjective("logistic", X, y, l2=1e-3)
    atol = 1e-7 if dtype == np.float64 else 2e-3
    for k, t in enumerate(ts):
        ref = _solve(ref_obj.with_tilt(float(t)))
        np.testing.assert_allclose(_host(path.x[k]), ref, rtol=0, atol=atol)
    # the same path without the seeds: the same solutions, other iterations
    monkeypatch.setattr(Continuation, "SEED_PAIRS", False)
    plain = tl.tilt_path(obj, ts, method="lbfgs", memory=5, tol=tol)
    # (float32: the unseeded path stops up to 5e-3 away at t = -1, within its tolerance)
    atol = 1e-7 if dtype == np.float64 else 1e-2
    np.testing.assert_allclose(_host(plain.x), _host(path.x), rtol=0, atol=atol)
    assert [r.nit for r in plain.results] != [r.nit for r in path.results]


def test_a_warm_solve_whose_line_search_fails_goes_on_with_a_fresh_memory(monkeypatch):
    """A seeded L-BFGS run that stops with a failed line search is continued from its
    last point without the seeded pairs; the tilt's result then converges to the cold
    solution and reports both runs' iterations, evaluations, passes and history."""
    from tiltlab.solvers import path as path_module

    real = path_module.minimize
    calls = []

    def failing_when_seeded(obj, x0, **kw):
        calls.append(sorted(kw))
        if "pairs" not in kw:
            return real(obj, x0, **kw)
        # a warm run cut short and marked as a failed line search
        res = real(obj, x0, **{**kw, "max_iter": 2})
        status = tl.Status.LINE_SEARCH_FAILED
        return dataclasses.replace(res, status=status, success=False, message=status.describe())

    monkeypatch.setattr(path_module, "minimize", failing_when_seeded)
    X, y = _logistic(seed=3)
    obj = tl.TiltedObjective("logistic", X, y, t=0.0, l2=1e-3)
    path = tl.tilt_path(obj, [0.0, 1.0, 2.0], method="lbfgs", tol=1e-10)
    assert any("pairs" in c for c in calls), "the path never seeded a run"
    assert path.success
    for t, r in zip(path.ts, path.results, strict=True):
        cold = _solve(obj.with_tilt(float(t)))
        np.testing.assert_allclose(r.x, cold, rtol=0, atol=1e-7)
        assert r.nfev >= len(r.history["fun"])  # at least one evaluation per iterate
        assert np.all(np.diff(r.history["n_passes"]) >= 0)
        assert r.n_passes == pytest.approx(r.history["n_passes"][-1], rel=0, abs=1e-9)
    seeded = [r for r, t in zip(path.results, path.ts, strict=True) if t > 0]
    assert all(r.nit > 2 for r in seeded)  # the cut-short run's 2 iterations plus more

"""float32 solvers: the README example converges, on every backend, at float64's cost.

A regression: with float64's tolerance a float32 run could not stop (L-BFGS made 2,000
iterations, Newton and gd reported a failed line search with x as good as float32
allows). The reference is an independent float64 SciPy solve.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize as sp_minimize
from scipy.special import logsumexp

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.solvers import Status

METHODS = ["lbfgs", "gd", "agd", "newton"]


def _readme_data():
    X = np.c_[np.ones(50), np.linspace(0, 1, 50)]
    y = 2 * X[:, 1] + 1
    y[:5] += 10  # five gross outliers
    return X, y


def _scipy_tilted_lsq(X, y, t):
    """float64 reference: (1/t) log mean exp(t r^2) minimised by SciPy's L-BFGS-B."""

    def fg(th):
        r = X @ th - y
        a = t * r * r
        f = (logsumexp(a) - np.log(a.size)) / t
        w = np.exp(a - logsumexp(a))
        return f, X.T @ (w * 2 * r)

    res = sp_minimize(
        fg,
        np.zeros(X.shape[1]),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-13, "ftol": 1e-16, "maxiter": 10_000},
    )
    return res.x


def _f32(xp, a):
    return xp.asarray(a.astype(np.float32))


_DASK_SLOW = "each Dask evaluation builds a graph (~0.25 s): gd/agd's hundreds take minutes"


@pytest.mark.parametrize("method", METHODS)
def test_readme_example_float32_every_backend(xp, method):
    if "dask" in xp.__name__ and method in ("gd", "agd"):
        pytest.skip(_DASK_SLOW)
    X, y = _readme_data()
    obj = tl.TiltedObjective("squared", _f32(xp, X), _f32(xp, y), t=-2.0)
    ref = _scipy_tilted_lsq(X, y, -2.0)
    res = tl.minimize(obj, method=method)
    assert res.success, res.message
    assert res.status in (Status.CONVERGED, Status.PRECISION)
    assert res.x.dtype == obj.X.dtype and type(res.x) is type(obj.X)
    x = to_numpy(res.x).astype(np.float64)
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e-3)
    # every field describes x
    np.testing.assert_allclose(to_numpy(res.jac), to_numpy(obj.gradient(res.x)), atol=1e-6)


@pytest.mark.parametrize(
    ("t", "method"),
    [
        # gradient descent at t = 2 takes thousands of steps in both precisions (seconds):
        # the full tier
        pytest.param(t, m, marks=pytest.mark.slow) if (t, m) == (2.0, "gd") else (t, m)
        for t in (-2.0, 2.0)
        for m in METHODS
    ],
)
def test_float32_costs_what_float64_costs(method, t):
    # a regression: 2,000 iterations and 159,020 passes in float32 against 26 in float64
    X, y = _readme_data()
    runs = {}
    for dt in (np.float32, np.float64):
        obj = tl.TiltedObjective("squared", X.astype(dt), y.astype(dt), t=t)
        runs[dt] = tl.minimize(obj, method=method, max_iter=20_000)
    r32, r64 = runs[np.float32], runs[np.float64]
    assert r32.success and r64.success, (r32.message, r64.message)
    assert r32.nit <= 1.2 * r64.nit + 3, (r32.nit, r64.nit)
    assert r32.n_passes <= 2.0 * r64.n_passes + 80, (r32.n_passes, r64.n_passes)


@pytest.mark.parametrize("method", METHODS)
def test_readme_tilt_path_float32(xp, method):
    if not xp.__name__.endswith("numpy") and method != "lbfgs":
        pytest.skip("one method per non-NumPy backend keeps the suite fast")
    if "dask" in xp.__name__:
        pytest.skip(_DASK_SLOW + " (the Dask minimize test covers the backend)")
    X, y = _readme_data()
    obj = tl.TiltedObjective("squared", _f32(xp, X), _f32(xp, y))
    ts = [-2.0, -1.0, 0.0, 1.0, 2.0]
    path = tl.tilt_path(obj, ts, method=method)
    assert path.success, [r.message for r in path.results]
    for t, r in zip(ts, path.results, strict=True):
        assert r.status in (Status.CONVERGED, Status.PRECISION)
        ref = _scipy_tilted_lsq(X, y, t) if t != 0 else np.linalg.lstsq(X, y, rcond=None)[0]
        # relative gradient 2.4e-5 times the condition number (large at t = 2 for gd)
        np.testing.assert_allclose(
            to_numpy(r.x).astype(np.float64), ref, rtol=0, atol=5e-4 * max(1, np.abs(ref).max())
        )


@pytest.mark.parametrize("method", ["gd", "newton", "lbfgs", "agd"])
def test_float32_tight_tolerance_stops_at_working_precision(method):
    # a tolerance float32 cannot reach: stop quickly, report success at working precision
    rng = np.random.default_rng(0)
    X, y = _readme_data()
    y = y + 0.1 * rng.normal(size=y.size)
    obj = tl.TiltedObjective("squared", X.astype(np.float32), y.astype(np.float32), t=-2.0)
    res = tl.minimize(obj, method=method, tol=1e-12, max_iter=5000)
    assert res.status is Status.PRECISION, res.message
    assert res.success and "working precision" in res.message
    assert res.nit < 1000
    g0 = np.linalg.norm(obj.gradient(obj.zeros()))
    gn = np.linalg.norm(res.jac)
    assert gn <= np.sqrt(np.finfo(np.float32).eps) * g0
    # the reported gradient describes x: strong convexity bounds the error by |g| / mu
    ref = _scipy_tilted_lsq(X, y, -2.0)
    H = tl.TiltedObjective("squared", X, y, t=-2.0).hessian(ref)
    mu = np.linalg.eigvalsh(H)[0]
    assert np.linalg.norm(res.x.astype(np.float64) - ref) <= 2 * gn / mu + 1e-5


def test_default_tolerance_depends_on_dtype():
    from tiltlab.solvers._minimize import default_tol

    assert default_tol(np.finfo(np.float64).eps) == 1e-8
    eps32 = float(np.finfo(np.float32).eps)
    assert default_tol(eps32) == pytest.approx(eps32 ** (2 / 3), rel=1e-12)

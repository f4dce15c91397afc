"""Tests of tiltlab.minimize_dro against independent references: the KL-DRO problem
solved jointly in (theta, log t) by SciPy on a NumPy objective written here, and the CVaR
problem as SciPy/HiGHS linear programs and an SLSQP epigraph form written here."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.optimize import minimize as sp_minimize
from scipy.special import expit, logsumexp

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.testing import assert_close


def _logistic_data(n=120, d=3, seed=0, flip=0.1):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    y = (X @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0).astype(float)
    f = rng.random(n) < flip
    y[f] = 1.0 - y[f]
    return X, y


def _regression_data(n=80, d=3, seed=1):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    return X, X @ rng.normal(size=d) + rng.standard_t(2, size=n)


def _np_losses(kind, X, y, theta):
    z = X @ theta
    if kind == "logistic":
        return np.logaddexp(0.0, z) - y * z
    if kind == "squared":
        return (z - y) ** 2
    raise AssertionError(kind)


def _np_grad_z(kind, X, y, theta):
    z = X @ theta
    return expit(z) - y if kind == "logistic" else 2.0 * (z - y)


# ---------------------------------------------------------------------------
# KL: the reference minimises R_t(theta) + r / t jointly in (theta, s = log t)


def _kl_reference(kind, X, y, r, p=None, l2=0.0):
    n, d = X.shape
    logp = np.log(np.full(n, 1.0 / n) if p is None else p / p.sum())

    def f(v):
        theta, s = v[:d], v[d]
        t = math.exp(s)
        ell = _np_losses(kind, X, y, theta)
        a = t * ell + logp
        lz = logsumexp(a)
        w = np.exp(a - lz)
        val = lz / t + r / t + 0.5 * l2 * theta @ theta
        g_theta = X.T @ (w * _np_grad_z(kind, X, y, theta)) + l2 * theta
        g_s = (w @ ell) - lz / t - r / t  # t * dR/dt - r / t
        return val, np.r_[g_theta, g_s]

    best = None
    for s0 in (-2.0, 0.0, 2.0):
        res = sp_minimize(f, np.r_[np.zeros(d), s0], jac=True, method="L-BFGS-B",
                          options={"ftol": 1e-15, "gtol": 1e-11, "maxiter": 5000})  # fmt: skip
        if best is None or res.fun < best.fun:
            best = res
    return best.fun, math.exp(best.x[d])


@pytest.mark.parametrize("kind, r", [("logistic", 0.02), ("logistic", 0.3), ("squared", 0.1)])
def test_kl_matches_joint_reference(kind, r):
    X, y = _logistic_data() if kind == "logistic" else _regression_data()
    obj = tl.TiltedObjective(kind, X, y)
    res = tl.minimize_dro(obj, kl=r)
    want, t_want = _kl_reference(kind, X, y, r)
    assert res.success, res.message
    assert_close(res.fun, want, rtol=1e-9)
    assert res.t == pytest.approx(t_want, rel=1e-4)  # the value is flat in t at its minimum
    # the worst case: the tilted weights at KL divergence r, and fun its expected loss
    w = to_numpy(res.weights)
    ell = to_numpy(obj.losses(res.x))
    assert float(np.sum(w * np.log(w * X.shape[0]))) == pytest.approx(r, rel=1e-9)
    assert float(w @ ell) == pytest.approx(float(res.fun), rel=1e-12)
    assert set(res.history) >= {"t", "fun", "nit", "n_passes", "time"}


def test_kl_prior_weights_and_ridge():
    X, y = _logistic_data(seed=3)
    p = np.random.default_rng(4).uniform(0.2, 2.0, size=X.shape[0])
    obj = tl.TiltedObjective("logistic", X, y, weights=p, l2=0.05)
    res = tl.minimize_dro(obj, kl=0.2)
    want, _ = _kl_reference("logistic", X, y, 0.2, p=p, l2=0.05)
    assert_close(res.fun, want, rtol=1e-9)


def test_kl_zero_radius_is_erm():
    X, y = _logistic_data(seed=5)
    obj = tl.TiltedObjective("logistic", X, y, t=3.0)  # the tilt is ignored
    res = tl.minimize_dro(obj, kl=0.0)
    erm = tl.minimize(obj.with_tilt(0.0))
    assert res.t == 0.0
    assert_close(res.fun, erm.fun, rtol=1e-10)


def test_kl_beyond_every_tilt_is_the_min_max():
    # r above log(N): every worst case is the max; the min-max of the absolute loss is an LP
    X, y = _regression_data(n=15, seed=6)
    obj = tl.TiltedObjective("squared", X, y)
    res = tl.minimize_dro(obj, kl=math.log(15) + 1.0)
    assert res.t == math.inf
    n, d = X.shape
    c = np.r_[np.zeros(d), 1.0]  # min m s.t. |x theta - y| <= m  (squared: m^2)
    A = np.r_[np.c_[X, -np.ones(n)], np.c_[-X, -np.ones(n)]]
    lp = linprog(c, A_ub=A, b_ub=np.r_[y, -y], bounds=[(None, None)] * (d + 1), method="highs")
    minmax = lp.fun**2
    ell = to_numpy(obj.losses(res.x))
    spread = float(np.max(ell) - np.min(ell))
    t_end = 1e4 / spread
    # TERM at t is within log(N)/t of the max; the fit is no better than the min-max
    assert minmax - 1e-9 <= float(res.fun) <= minmax + 2 * math.log(n) / t_end * 10
    # the fields describe x: beyond log N every worst case is the largest loss
    assert "min-max limit" in res.message
    assert float(res.fun) == pytest.approx(float(np.max(ell)), rel=1e-12)
    w = to_numpy(res.weights)
    assert abs(w.sum() - 1) < 1e-12 and float(w @ ell) == pytest.approx(float(np.max(ell)))


@pytest.mark.parametrize("method", ["newton", "agd"])
def test_kl_other_inner_methods(method):
    # "newton": TERM fits inside a root search over t; "agd": the eliminated tilt
    X, y = _logistic_data(seed=13)
    res = tl.minimize_dro(tl.TiltedObjective("logistic", X, y), kl=0.05, method=method,
                          max_iter=20000)  # fmt: skip
    want, t_want = _kl_reference("logistic", X, y, 0.05)
    assert res.success, res.message
    assert_close(res.fun, want, rtol=1e-9)
    assert res.t == pytest.approx(t_want, rel=1e-3)


def test_kl_history_follows_the_fit():
    X, y = _logistic_data(seed=14)
    res = tl.minimize_dro(tl.TiltedObjective("logistic", X, y), kl=0.1)
    h = res.history
    assert len(h["t"]) == len(h["fun"]) == len(h["nit"]) >= 2
    assert h["t"][-1] == pytest.approx(res.t, rel=1e-6)
    assert h["fun"][-1] == pytest.approx(float(res.fun), rel=1e-10)
    assert all(np.diff(h["n_passes"]) >= 0) and all(np.diff(h["fun"]) <= 1e-12)


# ---------------------------------------------------------------------------
# CVaR: linear programs (absolute, hinge), an SLSQP epigraph form (smooth losses)


def _cvar_lp(kind, X, y, alpha, p=None):
    n, d = X.shape
    p = np.full(n, 1.0 / n) if p is None else p / p.sum()
    c = np.r_[np.zeros(d), 1.0, p / alpha]  # theta, eta, u >= 0
    one, eye = np.ones((n, 1)), np.eye(n)
    if kind == "absolute":  # u >= +-(x theta - y) - eta
        A = np.r_[np.c_[X, -one, -eye], np.c_[-X, -one, -eye]]
        b = np.r_[y, -y]
    else:  # hinge, s = 2y - 1: u >= 1 - s x theta - eta, u >= -eta
        s = 2 * y - 1
        A = np.r_[np.c_[-s[:, None] * X, -one, -eye], np.c_[np.zeros((n, d)), -one, -eye]]
        b = np.r_[-np.ones(n), np.zeros(n)]
    res = linprog(c, A_ub=A, b_ub=b, bounds=[(None, None)] * (d + 1) + [(0, None)] * n,
                  method="highs")  # fmt: skip
    assert res.status == 0
    return res.fun


@pytest.mark.parametrize("kind", ["absolute", "hinge"])
@pytest.mark.parametrize("alpha", [0.05, 0.3])
def test_cvar_piecewise_linear_matches_lp(kind, alpha):
    X, y = _regression_data(n=150) if kind == "absolute" else _logistic_data(n=150, flip=0.15)
    res = tl.minimize_dro(tl.TiltedObjective(kind, X, y), cvar=alpha)
    assert res.success, res.message
    assert_close(res.fun, _cvar_lp(kind, X, y, alpha), rtol=1e-6)
    w = to_numpy(res.weights)
    assert w.max() <= 1 / (alpha * X.shape[0]) * (1 + 1e-12) and abs(w.sum() - 1) < 1e-12


def _heavy_tailed_data(n=200, seed=11):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, 2))]
    return X, X @ np.array([1.0, 2.0, -1.0]) + rng.standard_t(3, size=n)


@pytest.mark.parametrize("method", ["lbfgs", "gd", "agd"])
@pytest.mark.parametrize("alpha", [0.05, 0.5, 1.0])
def test_cvar_status_claims_only_what_the_lp_confirms(method, alpha):
    # the exact optimum is a linear program (HiGHS); the fit's value is the exact CVaR at
    # its x, never below it (to the LP's own tolerances, 1e-7 relative)
    X, y = _heavy_tailed_data()
    want = _cvar_lp("absolute", X, y, alpha)
    res = tl.minimize_dro(tl.TiltedObjective("absolute", X, y), cvar=alpha, method=method)
    gap = float(res.fun) - want
    assert gap >= -1e-7 * abs(want)
    if res.status is tl.Status.CONVERGED:
        # the stated smoothing bound plus the last solve's error: a gradient test at
        # tol = 1e-8 relative to the gradient scale, times distances of order |x| ~ 2
        bound = float(re.search(r"within ([0-9.e+-]+) of the minimum", res.message)[1])
        assert bound <= 1e-8 * abs(want)
        assert gap <= bound + 1e-7 * abs(want), (gap, res.message)
    else:
        assert res.status is tl.Status.VALUE_CONVERGED and res.success
        assert "accuracy is not certified" in res.message
    if method == "lbfgs":
        assert res.status is tl.Status.CONVERGED, res.message


@pytest.mark.parametrize("kind", ["absolute", "hinge", "pinball"])
def test_cvar_one_of_a_kinked_loss_is_the_mean(kind):
    # alpha = 1 is the mean of the losses: least absolute deviations, the hinge's mean and
    # the median's pinball loss (half the absolute loss) are linear programs
    X, y = _heavy_tailed_data() if kind != "hinge" else _logistic_data(n=150, flip=0.15)
    want = _cvar_lp("hinge" if kind == "hinge" else "absolute", X, y, 1.0)
    want *= 0.5 if kind == "pinball" else 1.0
    res = tl.minimize_dro(tl.TiltedObjective(kind, X, y), cvar=1.0)
    assert res.success, res.message
    assert_close(res.fun, want, rtol=1e-7)  # the LP's own tolerances
    assert_close(res.weights, np.full(X.shape[0], 1 / X.shape[0]), rtol=1e-12)


def test_cvar_prior_weights_match_lp():
    X, y = _regression_data(n=100, seed=7)
    p = np.random.default_rng(8).uniform(0.2, 2.0, size=X.shape[0])
    res = tl.minimize_dro(tl.TiltedObjective("absolute", X, y, weights=p), cvar=0.2)
    assert_close(res.fun, _cvar_lp("absolute", X, y, 0.2, p=p), rtol=1e-6)


def _cvar_slsqp(kind, X, y, alpha):
    n, d = X.shape

    def fun(v):
        return v[d] + np.sum(v[d + 1 :]) / (alpha * n)

    def jac(v):
        return np.r_[np.zeros(d), 1.0, np.full(n, 1.0 / (alpha * n))]

    def cons(v):  # u_i - l_i(theta) + eta >= 0
        return v[d + 1 :] - _np_losses(kind, X, y, v[:d]) + v[d]

    def cons_jac(v):
        g = _np_grad_z(kind, X, y, v[:d])
        return np.c_[-g[:, None] * X, np.ones(n), np.eye(n)]

    v0 = np.r_[np.zeros(d), 0.0, _np_losses(kind, X, y, np.zeros(d)) + 1.0]
    res = sp_minimize(fun, v0, jac=jac, method="SLSQP",
                      constraints=[{"type": "ineq", "fun": cons, "jac": cons_jac}],
                      bounds=[(None, None)] * (d + 1) + [(0, None)] * n,
                      options={"ftol": 1e-14, "maxiter": 1000})  # fmt: skip
    assert res.success, res.message
    return res.fun


@pytest.mark.parametrize("kind, alpha", [("logistic", 0.1), ("logistic", 0.4), ("squared", 0.2)])
def test_cvar_smooth_losses_match_slsqp(kind, alpha):
    X, y = _logistic_data(n=60, seed=9, flip=0.2) if kind == "logistic" else _regression_data(60)
    res = tl.minimize_dro(tl.TiltedObjective(kind, X, y), cvar=alpha)
    assert res.success, res.message
    assert_close(res.fun, _cvar_slsqp(kind, X, y, alpha), rtol=1e-6)


def test_cvar_one_is_the_mean():
    X, y = _logistic_data(seed=10)
    obj = tl.TiltedObjective("logistic", X, y)
    res = tl.minimize_dro(obj, cvar=1.0)
    assert_close(res.fun, tl.minimize(obj).fun, rtol=1e-10)
    assert_close(res.weights, np.full(X.shape[0], 1 / X.shape[0]), rtol=1e-14)


# ---------------------------------------------------------------------------
# backends, float32


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_backends(xp, dtype_name):
    X, y = _regression_data(n=60, seed=11)
    dtype = getattr(xp, dtype_name)
    obj = tl.TiltedObjective("absolute", xp.asarray(X, dtype=dtype), xp.asarray(y, dtype=dtype))
    rtol = 1e-6 if dtype_name == "float64" else 2e-4
    if "dask" not in xp.__name__:  # Dask's CVaR fit: ~400 graphs, test_dask_cvar_matches_the_lp
        res = tl.minimize_dro(obj, cvar=0.25)
        assert res.success, res.message
        assert_close(res.fun, _cvar_lp("absolute", X, y, 0.25), xp=xp, dtype=dtype, rtol=rtol)
        assert res.weights.shape == (60,)
    Xl, yl = _logistic_data(n=80, seed=12)
    obj = tl.TiltedObjective("logistic", xp.asarray(Xl, dtype=dtype), xp.asarray(yl, dtype=dtype))
    res = tl.minimize_dro(obj, kl=0.1)
    assert res.success, res.message
    want, _ = _kl_reference("logistic", Xl, yl, 0.1)
    assert_close(res.fun, want, xp=xp, dtype=dtype, rtol=1e-9 if dtype_name == "float64" else 1e-4)


# ---------------------------------------------------------------------------
# bad input


def test_bad_arguments():
    X, y = _logistic_data(n=20)
    obj = tl.TiltedObjective("logistic", X, y)
    with pytest.raises(TypeError, match="exactly one of `kl`"):
        tl.minimize_dro(obj)
    with pytest.raises(TypeError, match="exactly one of `kl`"):
        tl.minimize_dro(obj, kl=0.1, cvar=0.1)
    with pytest.raises(ValueError, match="`kl`"):
        tl.minimize_dro(obj, kl=-1.0)
    with pytest.raises(ValueError, match="`cvar`"):
        tl.minimize_dro(obj, cvar=0.0)
    with pytest.raises(ValueError, match="`method`"):
        tl.minimize_dro(obj, kl=0.1, method="stochastic")
    for spec in ({"kl": 0.5}, {"kl": 0.0}, {"cvar": 0.3}, {"cvar": 1.0}):
        for method in ("newton", "lbfgs") if "kl" in spec else ("lbfgs",):
            for tol in (-1.0, np.inf, np.nan):
                with pytest.raises(ValueError, match="`tol` must be a finite non-negative"):
                    tl.minimize_dro(obj, method=method, tol=tol, **spec)
    with pytest.raises(TypeError, match="`objective`"):
        tl.minimize_dro("logistic", kl=0.1)
    groups = np.arange(20) % 2
    hier = tl.TiltedObjective("logistic", X, y, groups=groups, tilts=[1.0, 0.0])
    with pytest.raises(TypeError, match="sample-level"):
        tl.minimize_dro(hier, kl=0.1)


# ---------------------------------------------------------------------------
# Dask: one graph per evaluation


@pytest.mark.parametrize(
    "kind",
    ["kl", pytest.param("cvar", marks=pytest.mark.slow)],  # cvar: ~400 graphs
)
def test_dask_one_graph_per_evaluation(kind, monkeypatch):
    da = pytest.importorskip("dask.array")
    from _dask_runs import SchedulerRuns

    import tiltlab.solvers._cvar as cvar_module
    import tiltlab.solvers.dro as dro_module


    cls = dro_module._JointKL if kind == "kl" else cvar_module._SmoothedCVaR
    runs = []
    inner = cls.value_and_gradient

    def counted(self, phi):
        with SchedulerRuns() as c:
            out = inner(self, phi)
        runs.append(c.n)
        return out

    monkeypatch.setattr(cls, "value_and_gradient", counted)
    X, y = _logistic_data(n=300, seed=15) if kind == "kl" else _regression_data(n=300, seed=15)
    obj = tl.TiltedObjective(
        "logistic" if kind == "kl" else "absolute",
        da.from_array(X, chunks=(100, 3)),
        da.from_array(y, chunks=100),
    )
    with SchedulerRuns() as total:
        res = tl.minimize_dro(obj, **{kind: 0.1})
    assert res.success, res.message
    assert len(runs) >= 5 and set(runs) == {1}
    # besides the evaluations: the start, the warm-up TERM fit of a tied start (one graph
    # per evaluation as well), the end; for CVaR one loss vector per smoothing stage
    extra = res.nfev + 12 if kind == "kl" else len(res.history["mu"]) + 4
    assert total.n <= len(runs) + extra
    want = (_kl_reference("logistic", X, y, 0.1)[0] if kind == "kl"
            else _cvar_lp("absolute", X, y, 0.1))  # fmt: skip
    assert_close(res.fun, want, xp=da, rtol=1e-6)


def test_kl_parameter_space_loss():
    # a loss written as a callable of theta (the parameter-space engine): squared
    # residuals of a linear model, against the joint reference of the same losses
    from tiltlab.losses.custom import CallableLoss

    X, y = _regression_data(n=60, seed=16)

    def fun(th, X, y):
        return (X @ th - y) ** 2

    def grad(th, X, y):
        return 2.0 * (X @ th - y)[:, None] * X

    obj = tl.TiltedObjective(CallableLoss(fun, grad), X=X, y=y)
    res = tl.minimize_dro(obj, kl=0.1, theta0=np.zeros(3))
    want, t_want = _kl_reference("squared", X, y, 0.1)
    assert res.success, res.message
    assert_close(res.fun, want, rtol=1e-9)
    assert res.t == pytest.approx(t_want, rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_dask_cvar_matches_the_lp(dtype_name):
    da = pytest.importorskip("dask.array")
    X, y = _regression_data(n=60, seed=11)
    dtype = np.dtype(dtype_name)
    obj = tl.TiltedObjective(
        "absolute", da.from_array(X.astype(dtype), chunks=(20, 3)), da.from_array(y.astype(dtype))
    )
    res = tl.minimize_dro(obj, cvar=0.25)
    assert res.success, res.message
    rtol = 1e-6 if dtype_name == "float64" else 2e-4
    assert_close(np.asarray(res.fun), _cvar_lp("absolute", X, y, 0.25), rtol=rtol)
    assert res.weights.shape == (60,)


# ---------------------------------------------------------------------------
# evaluations counted


class _Counting(tl.TiltedObjective):
    """An objective counting its evaluations (``with_tilt`` copies share the count)."""

    def _tally(self):
        self.calls[0] += 1

    def value(self, theta):
        self._tally()
        return super().value(theta)

    def value_and_gradient(self, theta):
        self._tally()
        return super().value_and_gradient(theta)

    def losses(self, theta):
        self._tally()
        return super().losses(theta)

    def hvp(self, theta, v):
        self._tally()
        return super().hvp(theta, v)

    def hessian(self, theta):
        self._tally()
        return super().hessian(theta)


@pytest.mark.parametrize(
    "kind, method",
    [("kl", "lbfgs"), ("kl", "newton"), ("cvar", "gd"), ("cvar", "lbfgs"), ("mean", "lbfgs")],
)
def test_nfev_counts_every_evaluation(kind, method, monkeypatch):
    import tiltlab.solvers._cvar as cvar_module
    import tiltlab.solvers.dro as dro_module

    calls = [0]
    # the robust objectives the fits minimise evaluate the data themselves: counted too
    for cls, names in (
        (dro_module._ProjectedKL, ("value_and_gradient", "at")),
        (cvar_module._SmoothedCVaR, ("value_and_gradient",)),
    ):
        for name in names:
            inner = getattr(cls, name)

            def counted(self, *args, _inner=inner):
                calls[0] += 1
                return _inner(self, *args)

            monkeypatch.setattr(cls, name, counted)
    if kind == "kl":
        X, y = _logistic_data(n=100, seed=3)
        obj = _Counting("logistic", X, y)
        spec = {"kl": 0.2}
    else:
        X, y = _regression_data(n=100, seed=3)
        obj = _Counting("absolute", X, y)
        spec = {"cvar": 1.0 if kind == "mean" else 0.3}
    obj.calls = calls
    res = tl.minimize_dro(obj, method=method, **spec)
    assert res.nfev == calls[0] > res.nit

"""Results describe the returned x, success == status.success,
bad arguments are named, callbacks stop on any true value."""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab as tl
from tiltlab.solvers import Status


def _logistic(seed=0, n=120, d=4):
    rng = np.random.default_rng(seed)
    X = np.c_[np.ones(n), rng.normal(size=(n, d - 1))]
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ rng.normal(size=d)))).astype(float)
    return X, y


@pytest.fixture(scope="module")
def objs():
    X, y = _logistic(0)
    Xv, yv = _logistic(9)
    # a small training set and a validation set: validation bottoms out early
    return tl.TiltedObjective("logistic", X[:30], y[:30], t=1.0), tl.TiltedObjective(
        "logistic", Xv, yv, t=1.0
    )


def test_validation_result_describes_the_returned_x(objs):
    obj, val = objs
    res = tl.minimize(obj, method="lbfgs", validation=val, tol=1e-10)
    best = int(np.argmin(res.history["validation"]))
    assert best < len(res.history["validation"]) - 1  # the best is not the last iterate
    assert res.status is Status.EARLY_STOPPED and res.success
    assert "chosen by validation" in res.message
    f, g = obj.value_and_gradient(res.x)
    assert float(res.fun) == float(f)
    np.testing.assert_array_equal(res.jac, g)
    assert res.nit == res.best_iteration == best
    assert res.n_iter_run == len(res.history["fun"]) - 1 > res.nit
    assert f"fun={float(f):.6g}" in repr(res)
    # the gradient at x is not small: the status must not claim convergence
    assert np.linalg.norm(g) > 1e-3


def test_success_agrees_with_status_everywhere(objs):
    obj, val = objs
    runs = [
        tl.minimize(obj, method="gd", step="fixed", lr=1e-3, max_iter=5),
        tl.minimize(obj, method="lbfgs", callback=lambda s: s.nit >= 2),
        tl.minimize(obj, method="lbfgs", max_passes=3),
        tl.minimize(obj, method="stochastic", seed=0, max_iter=50),
        tl.minimize(obj, method="stochastic", seed=0, max_iter=50, validation=val),
        tl.minimize(obj, method="lbfgs"),
        tl.minimize(obj, method="gd", validation=val, patience=2),
    ]
    for r in runs:
        assert r.success == r.status.success, (r.status, r.success)
    assert not runs[0].success and runs[0].status is Status.MAX_ITER
    assert runs[1].status is Status.CALLBACK and not runs[1].success
    assert runs[3].status is Status.COMPLETED and runs[3].success
    # a stochastic run's fun and jac are evaluated at its x
    f, g = obj.value_and_gradient(runs[3].x)
    assert float(runs[3].fun) == float(f)
    np.testing.assert_array_equal(runs[3].jac, g)


@pytest.mark.parametrize("stop", [np.True_, 1, np.array(True), "yes"])
def test_callback_truthiness_stops(objs, stop):
    obj, _ = objs
    res = tl.minimize(obj, method="lbfgs", callback=lambda s: stop)
    assert res.status is Status.CALLBACK and res.nit == 1


@pytest.mark.parametrize("stop", [np.False_, 0, None])
def test_callback_false_values_continue(objs, stop):
    obj, _ = objs
    res = tl.minimize(obj, method="lbfgs", callback=lambda s: stop)
    assert res.status is Status.CONVERGED


def test_bad_arguments_are_named(objs):
    obj, val = objs
    with pytest.raises(TypeError, match="`objective` must be a tiltlab.TiltedObjective"):
        tl.minimize(np.zeros(3))
    with pytest.raises(TypeError, match="`validation` must be a tiltlab.TiltedObjective"):
        tl.minimize(obj, validation=np.zeros(3))
    X, y = _logistic(1, d=3)
    with pytest.raises(ValueError, match="`validation` must have the objective's parameter"):
        tl.minimize(obj, validation=tl.TiltedObjective("logistic", X, y))
    cases = [
        ({"max_passes": -1}, ValueError, "`max_passes`"),
        ({"max_passes": "3"}, TypeError, "`max_passes`"),
        ({"patience": 0, "validation": val}, ValueError, "`patience`"),
        ({"patience": -2, "validation": val}, ValueError, "`patience`"),
        ({"patience": 1.5, "validation": val}, TypeError, "`patience`"),
        ({"max_iter": 2.5}, TypeError, "`max_iter`"),
        ({"max_iter": -1}, ValueError, "`max_iter`"),
        ({"max_iter": True}, TypeError, "`max_iter`"),
        ({"seed": "1", "method": "stochastic"}, TypeError, "`seed`"),
        ({"seed": 1.5, "method": "stochastic"}, TypeError, "`seed`"),
        ({"seed": -1, "method": "stochastic"}, ValueError, "`seed`"),
        ({"tol": "1e-8"}, TypeError, "`tol`"),
        ({"tol": -1.0}, ValueError, "`tol`"),
        ({"atol": np.nan}, ValueError, "`atol`"),
        ({"tol": np.inf}, ValueError, "`tol` must be a finite"),
        ({"atol": np.inf}, ValueError, "`atol` must be a finite"),
        ({"tol": np.float32("inf")}, ValueError, "`tol` must be a finite"),
        ({"callback": 3}, TypeError, "`callback`"),
    ]
    for kw, exc, name in cases:
        with pytest.raises(exc, match=name):
            tl.minimize(obj, **kw)
    assert tl.minimize(obj, max_iter=2.0).nit <= 2  # an integral float is an integer


def test_tilt_path_rejects_bad_ts(objs):
    obj, _ = objs
    with pytest.raises(TypeError, match="`ts`.*string"):
        tl.tilt_path(obj, "12")
    with pytest.raises(TypeError, match="`ts`"):
        tl.tilt_path(obj, ["1", "2"])
    with pytest.raises(ValueError, match="`ts` must be a non-empty 1-d"):
        tl.tilt_path(obj, [[1.0, 2.0]])
    with pytest.raises(ValueError, match="`ts` must be a non-empty 1-d"):
        tl.tilt_path(obj, [])


def test_warm_started_path_uses_a_fixed_scale():
    # a regression: the tolerance was relative to the warm start's (already small) gradient,
    # so a warm-started path did more iterations than cold solves
    X = np.c_[np.ones(50), np.linspace(0, 1, 50)]
    y = 2 * X[:, 1] + 1
    y[:5] += 10
    obj = tl.TiltedObjective("squared", X, y)
    ts = np.linspace(-2, 2, 20)
    for method in ("lbfgs", "newton"):
        cold = sum(tl.minimize(obj.with_tilt(float(t)), method=method).nit for t in ts)
        path = tl.tilt_path(obj, ts, method=method)
        assert path.success
        warm = sum(r.nit for r in path.results)
        assert warm <= 0.5 * cold, (method, warm, cold)
        # a start at the solution is already converged
        again = tl.minimize(obj.with_tilt(2.0), path.x[-1], method=method)
        assert again.nit == 0 and again.status is Status.CONVERGED


class _Counting(tl.TiltedObjective):
    """An objective that counts its own evaluations (copies by ``with_tilt`` share the
    count): values, values with gradients, Hessian products (of linearisations too),
    dense Hessians and loss vectors."""

    def _tally(self, key):
        self.calls[key] = self.calls.get(key, 0) + 1

    def value(self, theta):
        self._tally("value")
        return super().value(theta)

    def value_and_gradient(self, theta):  # ``gradient`` comes here too
        self._tally("value_and_gradient")
        return super().value_and_gradient(theta)

    def hvp(self, theta, v):
        self._tally("hvp")
        return super().hvp(theta, v)

    def hessian(self, theta):  # a scalar loss's Hessian is one evaluation, no products
        self._tally("hessian")
        return super().hessian(theta)

    def losses(self, theta):
        self._tally("losses")
        return super().losses(theta)

    def linearize(self, theta):
        self._tally("linearize")
        lin = super().linearize(theta)
        products = lin.hvp

        def counted(v):
            self._tally("linear hvp")
            return products(v)

        lin.hvp = counted
        return lin


def counting(*args, **kwargs):
    obj = _Counting(*args, **kwargs)
    obj.calls = {}
    return obj


@pytest.mark.parametrize(
    "method, options",
    [
        ("gd", {}),
        ("gd", {"step": "fixed"}),  # the step from power iteration on Hessian products
        ("agd", {}),
        ("lbfgs", {}),
        ("newton", {"hessian": "dense"}),
        ("newton", {"hessian": "cg"}),
        ("stochastic", {"seed": 0, "max_iter": 300, "eval_every": 7}),
    ],
)
@pytest.mark.parametrize("warm", [False, True])
def test_nfev_counts_every_evaluation(method, options, warm):
    X, y = _logistic(3, n=200)
    obj = counting("logistic", X, y, t=1.0)
    theta0 = np.full(4, 0.1) if warm else None
    val = tl.TiltedObjective("logistic", *_logistic(9), t=1.0)  # not the objective: not counted
    res = tl.minimize(obj, theta0, method=method, validation=val, **options)
    assert res.nfev == sum(obj.calls.values()) > res.nit + 1, (res.nfev, obj.calls)


def test_nfev_of_gradient_descent_counts_its_line_search_trials():
    rng = np.random.default_rng(0)
    X = np.c_[np.ones(100), rng.normal(size=100)]
    y = (X[:, 1] + rng.normal(size=100) > 0).astype(float)
    obj = counting("logistic", X, y)
    res = tl.minimize(obj, method="gd")
    assert res.nfev == obj.calls["value_and_gradient"] == sum(obj.calls.values())


@pytest.mark.parametrize("method", ["lbfgs", "gd", "agd", "newton", "stochastic"])
def test_warm_state_of_another_shape_is_named(method):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    kw = {"seed": 0, "max_iter": 50} if method == "stochastic" else {}
    first = tl.minimize(tl.TiltedObjective("squared", X, y), method=method, **kw)
    with pytest.raises(ValueError, match=r"`warm_state`.*shape \(2,\).*shape \(3,\)"):
        tl.minimize(
            tl.TiltedObjective("squared", X[:, :2], y),
            method=method,
            warm_state=first.solver_state,
            **kw,
        )


@pytest.mark.parametrize("options", [{"step": "fixed", "lr": 1e-2}, {"step": "rule", "C1": 1.0}])
def test_a_diverging_fixed_step_is_reported_as_diverged(options):
    rng = np.random.default_rng(0)
    X = np.c_[np.ones(200), rng.normal(size=(200, 3))] * 10
    obj = tl.TiltedObjective("squared", X, X @ np.ones(4), t=0.5)
    # the step exceeds 2 / L at the start, L the largest eigenvalue of the Hessian there:
    # gradient descent with it moves away from the minimiser of the local quadratic
    lr = options.get("lr") or 1.0 / options["C1"]
    assert lr * np.linalg.eigvalsh(obj.hessian(np.zeros(4))).max() > 2
    res = tl.minimize(obj, method="gd", **options)
    assert res.status is Status.DIVERGED and not res.success
    assert "line search" not in res.message and "lower the step size" in res.message
    assert float(res.fun) > 2 * res.history["fun"][0]
    # adaptive steps on the same problem converge
    for method in ("agd", "gd"):
        assert tl.minimize(obj, method=method).success

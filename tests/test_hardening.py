"""Regression tests for input handling (column targets, weights, tilts from any library,
strings, pickles...).

Each section names the case it guards. References are independent of the code under
test: plain NumPy float64 formulas written here, or the same call on NumPy inputs where
the point is that a foreign parameter is converted (not how the value is computed).
"""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest

import tiltlab as tl
from tiltlab import bounds
from tiltlab._compat import to_numpy
from tiltlab.losses import LOSS_NAMES, CallableLoss, FairPCALoss, get_loss
from tiltlab.testing import assert_close, assert_namespace

LINEAR_LOSSES = ["squared", "absolute", "huber", "logistic", "hinge", "squared_hinge"]


def _ref_risk(l: np.ndarray, t: float, p: np.ndarray | None = None) -> float:
    """Tilted risk of a 1-d float64 vector by the textbook formula (small |t| only)."""
    l = np.asarray(l, dtype=np.float64)
    p = np.full(l.size, 1.0 / l.size) if p is None else np.asarray(p, np.float64) / np.sum(p)
    if t == 0:
        return float(np.sum(p * l))
    if np.isinf(t):
        on = p > 0
        return float(np.max(l[on]) if t > 0 else np.min(l[on]))
    c = np.max(l) if t > 0 else np.min(l)
    return float(c + np.log(np.sum(p * np.exp(t * (l - c)))) / t)


def _data(rng, n=12, d=3, kind="real"):
    X = rng.normal(size=(n, d))
    if kind == "real":
        y = X @ np.arange(1.0, d + 1) + 0.1 * rng.normal(size=n)
    else:
        y = (rng.random(n) < 0.5).astype(np.float64)
    return X, y


# ---------------------------------------------------------------------------
# a column `y` is rejected for every loss


@pytest.mark.parametrize("loss", LINEAR_LOSSES)
def test_column_y_rejected_by_objective(loss):
    rng = np.random.default_rng(0)
    kind = "real" if get_loss(loss).label_kind == "real" else "binary"
    X, y = _data(rng, kind=kind)
    with pytest.raises(ValueError, match=r"`y` must be 1-d .* got shape \(12, 1\).*reshape"):
        tl.TiltedObjective(loss, X, y[:, None], t=1.0)
    # the 1-d targets work and give a scalar objective
    assert np.ndim(tl.TiltedObjective(loss, X, y, t=1.0).value(np.zeros(3))) == 0


def test_column_y_rejected_multinomial():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(9, 2))
    y = np.arange(9) % 3
    with pytest.raises(ValueError, match="`y`"):
        tl.TiltedObjective("multinomial", X, y[:, None])


@pytest.mark.parametrize("loss", LINEAR_LOSSES)
def test_column_y_rejected_by_loss_values(loss):
    # the loss itself refuses to broadcast (N,) predictors against (N, 1) targets
    lo = get_loss(loss)
    z = np.linspace(-1.0, 1.0, 5)
    y = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="`y` has shape"):
        lo.value(z, y[:, None])
    with pytest.raises(ValueError, match="`y` has shape"):
        lo.derivatives(z, y[:, None])
    assert lo.value(z, y).shape == (5,)


def test_column_y_rejected_on_backend(xp):
    rng = np.random.default_rng(2)
    X, y = _data(rng)
    with pytest.raises(ValueError, match="`y` must be 1-d"):
        tl.TiltedObjective("squared", xp.asarray(X), xp.asarray(y[:, None]))


# ---------------------------------------------------------------------------
# full-shape weights follow `axis`


def _colwise(L, W, t):
    """Reference along axis 0 of 2-d L with full-shape weights W."""
    return np.array([_ref_risk(L[:, j], t, W[:, j]) for j in range(L.shape[1])])


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5)])
def test_full_shape_weights_follow_axis(xp, shape):
    rng = np.random.default_rng(3)
    L = rng.random(shape)
    W = rng.random(shape) + 0.05
    for t in (0.0, 1.7, -2.5):
        want = _colwise(L, W, t)
        got = tl.tilted_risk(xp.asarray(L), t, axis=0, weights=xp.asarray(W))
        assert_close(got, want, xp=xp, rtol=1e-12)
        # the same through axis=1 of the transposed problem
        got_t = tl.tilted_risk(xp.asarray(L.T), t, axis=1, weights=xp.asarray(W.T))
        assert_close(got_t, want, xp=xp, rtol=1e-12)
        # weights: w_ij = W_ij exp(t L_ij) / column sum
        e = W * np.exp(t * L)
        assert_close(
            tl.tilted_weights(xp.asarray(L), t, axis=0, weights=xp.asarray(W)),
            e / e.sum(axis=0, keepdims=True),
            xp=xp,
            rtol=1e-12,
        )
    # a grid of tilts keeps the tilt axis first
    grid = tl.tilted_weights(xp.asarray(L), np.array([0.0, 1.0]), axis=0, weights=xp.asarray(W))
    assert tuple(grid.shape) == (2, *shape)
    # tail fraction: weighted share at or above a
    a = 0.5
    want_q = (W * (L >= a)).sum(axis=0) / W.sum(axis=0)
    assert_close(
        bounds.tail_fraction(xp.asarray(L), a, axis=0, weights=xp.asarray(W)), want_q, xp=xp
    )


def test_full_shape_weights_wrong_orientation_rejected():
    L = np.ones((5, 3))
    with pytest.raises(ValueError, match=r"`weights` must be 1-d .* \(5, 3\); got \(3, 5\)"):
        tl.tilted_risk(L, 1.0, axis=0, weights=np.ones((3, 5)))
    with pytest.raises(ValueError, match="`weights`"):
        tl.tilted_weights(L, 1.0, axis=0, weights=np.ones((3, 5)))
    with pytest.raises(ValueError, match="`weights`"):
        bounds.tail_fraction(L, 1.0, axis=0, weights=np.ones((3, 5)))
    with pytest.raises(ValueError, match="`weights`"):
        tl.tilted_risk(L, 1.0, weights=np.ones(()))


def test_full_shape_weights_axis_every_bounds_function():
    # every bounds function with `axis` and `weights` agrees between axis=0 on (N, B)
    # and axis=-1 on the transposed (B, N) problem (square N = B so a transpose would pass)
    rng = np.random.default_rng(4)
    L = rng.random((4, 4)) + 0.1
    W = rng.random((4, 4)) + 0.05
    calls = {
        "tail_fraction": lambda l, ax, w: bounds.tail_fraction(l, 0.5, axis=ax, weights=w),
        "value_at_risk": lambda l, ax, w: bounds.value_at_risk(l, 0.6, axis=ax, weights=w),
        "superquantile": lambda l, ax, w: bounds.superquantile(l, 0.6, axis=ax, weights=w),
        "tilted_tail_bound": lambda l, ax, w: bounds.tilted_tail_bound(
            l, 0.9, 2.0, axis=ax, weights=w
        ),
        "chernoff_bound": lambda l, ax, w: bounds.chernoff_bound(l, 0.9, 2.0, axis=ax, weights=w),
        "entropic_value_at_risk": lambda l, ax, w: bounds.entropic_value_at_risk(
            l, 0.6, axis=ax, weights=w
        ),
        "kl_dro_dual": lambda l, ax, w: bounds.kl_dro_dual(l, 2.0, axis=ax, weights=w)[0],
    }
    for name, f in calls.items():
        a0 = np.asarray(f(L, 0, W))
        a1 = np.asarray(f(L.T.copy(), -1, W.T.copy()))
        np.testing.assert_allclose(a0, a1, rtol=1e-12, err_msg=name)
        # and it is not what the transposed weights would give
        wrong = np.asarray(f(L.T.copy(), -1, W.copy()))
        assert not np.allclose(a0, wrong), name
    # kl_divergence already took p along `axis`; keep it that way
    q = rng.random((4, 4)) + 0.1
    np.testing.assert_allclose(
        bounds.kl_divergence(q, W, axis=0), bounds.kl_divergence(q.T.copy(), W.T.copy()), rtol=1e-12
    )


# ---------------------------------------------------------------------------
# tilts (and thresholds) from any library


def test_numpy_tilts_with_other_backends(xp):
    l_np = np.array([0.0, 1.0, 4.0, 2.5])
    l = xp.asarray(l_np)
    for t in (np.float64(2.0), np.float32(-0.5), np.array(1.5), 3, 0.25):
        got = tl.tilted_risk(l, t)
        assert_close(got, _ref_risk(l_np, float(t)), xp=xp, dtype=l.dtype, rtol=1e-13)
    grid = np.array([-np.inf, 0.0, np.inf])
    assert_close(tl.tilted_risk(l, grid), [0.0, 1.875, 4.0], xp=xp, rtol=1e-15)
    assert_close(tl.tilted_weights(l, grid)[1, ...], np.full(4, 0.25), xp=xp)
    for t in np.linspace(-1.0, 1.0, 3):  # a loop over a NumPy grid
        assert_close(tl.tilted_risk(l, t), _ref_risk(l_np, float(t)), xp=xp, rtol=1e-13)
    # bounds: tilts, thresholds and floors are parameters too
    b = bounds.tilted_tail_bound(l, np.float64(3.0), np.array([0.0, 1.0]), floor=np.float64(0.0))
    assert_namespace(b, xp)
    want = bounds.tilted_tail_bound(l_np, 3.0, np.array([0.0, 1.0]))
    assert_close(b, want, xp=xp, rtol=1e-13)
    assert_close(
        bounds.chernoff_bound(l, np.array([3.0]), np.float64(1.0)),
        bounds.chernoff_bound(l_np, np.array([3.0]), 1.0),
        xp=xp,
        rtol=1e-13,
    )
    assert_close(bounds.kl_dro_dual(l, np.float64(1.0))[0], _ref_risk(l_np, 1.0), xp=xp, rtol=1e-13)
    assert_close(
        bounds.k_loss_bound(l, 3, np.float64(1.0)),
        bounds.k_loss_bound(l_np, 3, 1.0),
        xp=xp,
        rtol=1e-13,
    )
    assert_close(
        tl.hierarchical_risk(l, [0, 0, 1, 1], np.array([1.0, 2.0])),
        tl.hierarchical_risk(l_np, [0, 0, 1, 1], (1.0, 2.0)),
        xp=xp,
        rtol=1e-13,
    )


def test_tilt_from_another_library_float32():
    torch = pytest.importorskip("torch")
    l = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float32)
    r = tl.tilted_risk(l, np.float64(2.0))
    assert r.dtype == torch.float32
    assert abs(float(r) - _ref_risk([0.0, 1.0, 4.0], 2.0)) < 1e-5
    # and a torch tilt with NumPy losses comes back in NumPy
    r = tl.tilted_risk(np.array([0.0, 1.0, 4.0]), torch.tensor([0.0, 2.0]))
    assert isinstance(r, np.ndarray) and r.dtype == np.float64


def test_same_library_tilt_keeps_autograd():
    torch = pytest.importorskip("torch")
    l = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64)
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    tl.tilted_risk(l, t).backward()
    # dR/dt = (E_w[l] - R) / t with w the tilted weights
    w = np.exp(0.7 * np.array([0.0, 1.0, 4.0]))
    w /= w.sum()
    want = (w @ np.array([0.0, 1.0, 4.0]) - _ref_risk([0.0, 1.0, 4.0], 0.7)) / 0.7
    assert abs(float(t.grad) - want) < 1e-12


def test_data_from_two_libraries_still_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="`losses` and `weights` come from two different"):
        tl.tilted_risk(torch.ones(3, dtype=torch.float64), 1.0, weights=np.ones(3))
    with pytest.raises(TypeError, match="two different"):
        bounds.tail_fraction(torch.ones(3, dtype=torch.float64), 0.5, weights=np.ones(3))


# ---------------------------------------------------------------------------
# strings are not numbers


@pytest.mark.parametrize(
    "call",
    [
        lambda: tl.tilted_risk(np.ones(3), "2"),
        lambda: tl.tilted_risk(np.ones(3), ["1", "2"]),
        lambda: tl.tilted_risk(np.ones(3), np.array(["1", "2"])),
        lambda: tl.tilted_risk(np.ones(3), b"2"),
        lambda: tl.tilted_risk(np.ones(3), True),
        lambda: tl.tilted_risk(np.ones(3), np.array([True, False])),
        lambda: tl.tilted_risk(np.ones(3), 1 + 2j),
        lambda: tl.tilted_risk(np.ones(3), None),
        lambda: tl.tilted_weights(np.ones(3), "2"),
        lambda: tl.hierarchical_risk(np.ones(4), [0, 0, 1, 1], ("1", "2")),
        lambda: tl.hierarchical_risk(np.ones(4), [0, 0, 1, 1], "12"),
        lambda: tl.hierarchical_weights(np.ones(4), [0, 0, 1, 1], (1.0, "2")),
        lambda: bounds.tilted_tail_bound(np.ones(3), 2.0, "1"),
        lambda: bounds.tilted_tail_bound(np.ones(3), "2", 1.0),
        lambda: bounds.tilted_tail_bound(np.ones(3), 2.0, 1.0, floor="0"),
        lambda: bounds.tail_fraction(np.ones(3), "0.5"),
        lambda: bounds.chernoff_bound(np.ones(3), 2.0, "1"),
        lambda: bounds.kl_dro_dual(np.ones(3), "1"),
    ],
)
def test_strings_rejected(call):
    with pytest.raises(TypeError, match="`(t|tilts|tilts\\[\\d\\]|a|floor)`"):
        call()


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: tl.tilted_risk(["1", "2"], 0.0), "losses"),
        (lambda: tl.tilted_risk("12", 0.0), "losses"),
        (lambda: tl.tilted_risk([1.0, None], 0.0), "losses"),
        (lambda: tl.tilted_weights([1.0, 2.0], 0.0, weights=["1", "1"]), "weights"),
        (lambda: tl.hierarchical_risk(["1", "2"], [0, 1], (0.0, 0.0)), "losses"),
        (lambda: tl.TiltedObjective("squared", [["1", "2"]], [1.0]), "X"),
        (lambda: tl.TiltedObjective("squared", np.eye(2), ["1", "2"]), "y"),
        (lambda: bounds.quantile_curves(None, "1"), "a"),
        (lambda: bounds.kl_divergence(["0.5", "0.5"]), "q"),
        (lambda: tl.diagnostics.weight_entropy(["1", "2"]), "weights"),
        (lambda: bounds.min_tail_fraction(np.zeros((3, 2)), 1.0, weights=["1"] * 3), "weights"),
    ],
)
def test_string_data_rejected(call, name):
    # NumPy would parse these strings as numbers; tiltlab refuses them
    with pytest.raises(TypeError, match=f"`{name}`"):
        call()


def test_objective_strings_rejected():
    X, y = np.eye(3), np.ones(3)
    with pytest.raises(TypeError, match="`t`"):
        tl.TiltedObjective("squared", X, y, t="-2")
    with pytest.raises(TypeError, match="`l2`"):
        tl.TiltedObjective("squared", X, y, l2="0.1")
    with pytest.raises(TypeError, match=r"`tilts\[0\]`"):
        tl.TiltedObjective("squared", X, y, groups=[0, 0, 1], tilts=("1", "2"))
    obj = tl.TiltedObjective("squared", X, y, t=1.0)
    with pytest.raises(TypeError, match="`t`"):
        obj.t = "2"
    with pytest.raises(TypeError, match="`t`"):
        obj.with_tilt("2")
    with pytest.raises(TypeError, match="`t`"):
        obj.t = np.array([1.0, 2.0])
    assert obj.t == 1.0  # unchanged by the failed assignments
    hobj = tl.TiltedObjective("squared", X, y, groups=[0, 0, 1], tilts=(1.0, 2.0))
    with pytest.raises(TypeError, match=r"`tilts\[1\]`"):
        hobj.tilts = (1.0, "2")
    # numbers of any library are fine
    torch = pytest.importorskip("torch")
    obj.t = torch.tensor(2.5)
    assert obj.t == 2.5 and isinstance(obj.t, float)
    obj.t = np.float32(-np.inf)
    assert obj.t == -np.inf


# ---------------------------------------------------------------------------
# l2, group labels, check_finite advice


def test_l2_and_check_finite_validation():
    X, y = np.eye(3), np.ones(3)
    for bad in (-1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="`l2`"):
            tl.TiltedObjective("squared", X, y, l2=bad)
    for bad in (None, True, [0.1, 0.2]):
        with pytest.raises(TypeError, match="`l2`"):
            tl.TiltedObjective("squared", X, y, l2=bad)
    assert tl.TiltedObjective("squared", X, y, l2=np.float32(0.5)).l2 == 0.5
    with pytest.raises(TypeError, match="`check_finite`"):
        tl.TiltedObjective("squared", X, y, check_finite="no")


@pytest.mark.parametrize(
    "groups",
    [[0, None, 1, 1], [None, None, None, None], np.array([0, 1, None, 1], dtype=object)],
)
def test_none_group_labels_rejected(groups):
    with pytest.raises(ValueError, match="`groups` contains None"):
        tl.hierarchical_risk(np.ones(4), groups, (1.0, 1.0))
    with pytest.raises(ValueError, match="`groups` contains None"):
        tl.TiltedObjective("squared", np.eye(4), np.ones(4), groups=groups, tilts=(1.0, 1.0))


def test_bad_group_labels_rejected():
    with pytest.raises(ValueError, match=r"`groups\[1\]` contains None"):
        tl.hierarchical_risk(np.ones(4), [[0, 0, 1, 1], [0, 1, None, 3]], (1.0, 1.0, 1.0))
    with pytest.raises(TypeError, match="`groups` labels must be mutually sortable"):
        tl.hierarchical_risk(np.ones(4), np.array([0, "a", 1, 1], dtype=object), (1.0, 1.0))
    with pytest.raises(ValueError, match="`groups`.*NaN"):
        tl.hierarchical_risk(np.ones(4), [0.0, np.nan, 1.0, 1.0], (1.0, 1.0))
    # string labels are fine
    r = tl.hierarchical_risk(np.array([1.0, 2.0, 3.0, 4.0]), ["a", "a", "b", "b"], (0.0, 0.0))
    assert float(r) == 2.5


def test_check_finite_advice_is_true(xp):
    rng = np.random.default_rng(5)
    X, y = _data(rng)
    y[2] = np.nan
    with pytest.raises(ValueError, match="`y` contains NaN.*check_finite=False"):
        tl.TiltedObjective("squared", xp.asarray(X), xp.asarray(y))
    X2 = X.copy()
    X2[0, 0] = np.inf
    with pytest.raises(ValueError, match="`X` contains infinite.*check_finite=False"):
        tl.TiltedObjective("squared", xp.asarray(X2), xp.asarray(y))
    # the advice works: the objective is built; NaN data give a NaN sample loss
    obj = tl.TiltedObjective("squared", xp.asarray(X), xp.asarray(y), check_finite=False)
    ell = to_numpy(obj.losses(xp.asarray(np.zeros(3))))
    assert np.isnan(ell[2]) and np.all(np.isfinite(np.delete(ell, 2)))
    # tilted_risk's advice works too
    with pytest.raises(ValueError, match="check_finite=False"):
        to_numpy(tl.tilted_risk(xp.asarray([1.0, np.inf]), 0.0))  # Dask: raises when computed
    # where no such switch exists the message does not offer one
    with pytest.raises(ValueError, match=r"`weights` contains NaN values; pass finite values$"):
        to_numpy(tl.tilted_risk(xp.asarray([1.0, 2.0]), 0.0, weights=xp.asarray([np.nan, 1.0])))
    with pytest.raises(ValueError, match=r"`a` contains infinite values; pass finite values$"):
        bounds.tail_fraction(xp.asarray([1.0, 2.0]), np.inf)


# ---------------------------------------------------------------------------
# pickling


def _quartic(th, X, y):
    return (X @ th - y) ** 4


def _quartic_grad(th, X, y):
    return 4 * ((X @ th - y) ** 3)[:, None] * X


def _roundtrips():
    out = {"pickle": lambda o: pickle.loads(pickle.dumps(o)), "deepcopy": copy.deepcopy}
    try:
        import cloudpickle

        out["cloudpickle"] = lambda o: cloudpickle.loads(cloudpickle.dumps(o))
    except ImportError:  # pragma: no cover
        pass
    try:
        import joblib

        def via_joblib(o):
            buf = io.BytesIO()
            joblib.dump(o, buf)
            buf.seek(0)
            return joblib.load(buf)

        out["joblib"] = via_joblib
    except ImportError:  # pragma: no cover
        pass
    return out


@pytest.mark.parametrize("hier", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_objective_pickles(xp, hier, weighted):
    rng = np.random.default_rng(6)
    X, y = _data(rng, n=10, kind="binary")
    kw = {"groups": np.arange(10) % 3, "tilts": (0.5, -1.0)} if hier else {"t": 1.5}
    if weighted:
        kw["weights"] = xp.asarray(rng.random(10) + 0.1)
    obj = tl.TiltedObjective("logistic", xp.asarray(X), xp.asarray(y), l2=0.1, **kw)
    th = xp.asarray(rng.normal(size=3))
    v0, g0 = obj.value_and_gradient(th)
    lazy = "dask" in xp.__name__  # every evaluation recomputes the graph: keep it short
    h0 = None if lazy else obj.hessian(th)
    trips = _roundtrips()
    if lazy or xp.__name__ != "array_api_compat.numpy":
        trips = {k: trips[k] for k in ("pickle", "deepcopy")}
    for name, rt in trips.items():
        new = rt(obj)
        assert new.xp is obj.xp, name
        assert new.tilts == obj.tilts and new.l2 == obj.l2
        v1, g1 = new.value_and_gradient(th)
        assert_namespace(v1, xp, dtype=v0.dtype)
        np.testing.assert_array_equal(to_numpy(v1), to_numpy(v0), err_msg=name)
        np.testing.assert_array_equal(to_numpy(g1), to_numpy(g0), err_msg=name)
        if h0 is not None:
            np.testing.assert_array_equal(to_numpy(new.hessian(th)), to_numpy(h0), err_msg=name)
        # the copy is independent of the original
        new.t = 7.0
        assert obj.t != 7.0


@pytest.mark.parametrize("name", sorted(LOSS_NAMES))
def test_losses_pickle(name):
    lo = get_loss(name)
    for rt in _roundtrips().values():
        new = rt(lo)
        assert type(new) is type(lo) and new.name == lo.name


def test_callable_and_fair_pca_losses_pickle():
    rng = np.random.default_rng(7)
    X, y = _data(rng)
    cl = CallableLoss(_quartic, _quartic_grad)
    obj = tl.TiltedObjective(cl, X, y, t=0.5)
    th = np.full(3, 0.3)
    for rt in _roundtrips().values():
        np.testing.assert_array_equal(rt(obj).gradient(th), obj.gradient(th))
    fp = FairPCALoss([rng.normal(size=(8, 3)), rng.normal(size=(5, 3))], 2)
    U = np.eye(3)[:, :2].ravel()
    for rt in _roundtrips().values():
        new = rt(fp)
        np.testing.assert_array_equal(new.fun(U), fp.fun(U))
        np.testing.assert_array_equal(new.grad(U), fp.grad(U))


def test_fair_pca_pickles_on_backend(xp):
    rng = np.random.default_rng(8)
    fp = FairPCALoss([xp.asarray(rng.normal(size=(8, 3))), xp.asarray(rng.normal(size=(5, 3)))], 2)
    obj = tl.TiltedObjective(fp, t=1.0)
    U = xp.asarray(np.eye(3)[:, :2].reshape(-1))
    new = pickle.loads(pickle.dumps(obj))
    assert new.loss._xp is fp._xp
    np.testing.assert_array_equal(to_numpy(new.value(U)), to_numpy(obj.value(U)))


def test_results_and_paths_pickle():
    rng = np.random.default_rng(9)
    X, y = _data(rng)
    obj = tl.TiltedObjective("squared", X, y, t=1.0)
    res = tl.minimize(obj)
    path = tl.tilt_path(obj, [-1.0, 0.0, 1.0])
    for rt in _roundtrips().values():
        r2 = rt(res)
        np.testing.assert_array_equal(r2.x, res.x)
        assert r2.status == res.status and r2.fun == res.fun
        p2 = rt(path)
        np.testing.assert_array_equal(p2.x, path.x)
        np.testing.assert_array_equal(p2.objective.value(p2.x[0]), path.objective.value(path.x[0]))


# ---------------------------------------------------------------------------
# scalar results: 0-d arrays of the input's library, never NumPy scalars


def test_scalar_results_are_zero_d_arrays_on_numpy():
    import tiltlab as tl
    from tiltlab import bounds

    l = np.array([1.0, 2.0, 3.0, 5.0])
    X = np.c_[np.ones(6), np.arange(6.0)]
    obj = tl.TiltedObjective("squared", X, np.arange(6.0), t=1.0)
    theta = np.zeros(2)
    results = {
        "tilted_risk t=1": tl.tilted_risk(l, 1.0),
        "tilted_risk t=0": tl.tilted_risk(l, 0.0),
        "tilted_risk t=inf": tl.tilted_risk(l, np.inf),
        "hierarchical_risk": tl.hierarchical_risk(l, np.array([0, 0, 1, 1]), (1.0, 0.0)),
        "value": obj.value(theta),
        "value_and_gradient": obj.value_and_gradient(theta)[0],
        "tail_fraction": bounds.tail_fraction(l, 2.0),
        "superquantile": bounds.superquantile(l, 0.5),
        "value_at_risk": bounds.value_at_risk(l, 0.5),
        "kl_divergence": bounds.kl_divergence(np.full(4, 0.25), np.array([0.1, 0.2, 0.3, 0.4])),
    }
    for name, r in results.items():
        assert type(r) is np.ndarray and r.shape == (), (name, type(r))

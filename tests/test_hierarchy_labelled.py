"""The labelled route of one-level hierarchies: group risks under one shared shift, each
sample's weight as one gather (``tiltlab.accumulator.labelled_level``), used by
``hierarchy_eval``, ``hierarchical_weights`` and hierarchical objectives on NumPy.

References are independent of the code under test: 50-digit mpmath (small inputs), a
float64 per-group loop with ``scipy.special.logsumexp`` (large inputs), central finite
differences of the risk and of the objective, a hand-written class-level objective, and
the tree of group states (``route="tree"``) as a second algorithm.
"""

from __future__ import annotations

import numpy as np
import pytest
from _contract import reference_hierarchy
from scipy.special import logsumexp

import tiltlab as tl
from tiltlab import segments as kernels
from tiltlab._cpu_kernels import available
from tiltlab.accumulator import NonFiniteLosses, labelled_level
from tiltlab.risk import _labelled
from tiltlab.risk import hierarchy as _hierarchy
from tiltlab.risk.hierarchy import build_tree, hierarchy_eval
from tiltlab.testing import assert_close

TILTS = [0.0, 1e-8, -1e-8, 2.0, -2.0, 50.0, -50.0]
needs_numba = pytest.mark.skipif(not available(), reason="numba is not installed")


def _mp_reference(l, codes, tilts):
    """``(J, weights)`` of the one-level hierarchy in 50-digit arithmetic (float64 out)."""
    J, w = reference_hierarchy(l, [np.asarray(codes)], tuple(tilts))
    return float(J), np.array([float(v) for v in w])


def _check_weights(got, want, dtype):
    """Relative accuracy on the weights that are normal numbers of ``dtype`` (smaller
    ones, subnormal or zero, carry no relative accuracy on any route)."""
    fi = np.finfo(dtype)
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=1e3 * float(fi.tiny))
    assert abs(float(np.sum(got, dtype=np.float64)) - 1.0) < (
        1e-13 if dtype == np.float64 else 1e-5
    )


class _TreeSpy:
    """Counts the calls of the tree route's level function."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = _hierarchy.group_level

        def spy(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(_hierarchy, "group_level", spy)


def _small_problem(dtype, rng, n=40):
    # groups of sizes 1, 1, 2, 5, 11 and the rest, labels shuffled
    codes = np.repeat(np.arange(6), [1, 1, 2, 5, 11, n - 20])
    codes = rng.permutation(codes)
    l = (3 * rng.exponential(size=n)).astype(dtype)
    return l, codes


# ---------------------------------------------------------------------------------------
# small inputs (NumPy reductions, the one-hot sums): every tilt at each level


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", TILTS)
@pytest.mark.parametrize("tau", TILTS)
def test_small_weights_and_risk_match_mpmath_and_the_tree(monkeypatch, dtype, t, tau):
    rng = np.random.default_rng(3)
    l, codes = _small_problem(dtype, rng)
    tree = build_tree(codes, l.size)
    tree_risk, tree_w = hierarchy_eval(l, None, tree, (t, tau), np, route="tree")
    spy = _TreeSpy(monkeypatch)
    risk, w = hierarchy_eval(l, None, tree, (t, tau), np)
    # the labelled route serves these tilts; at |tau| = 50 it declines the weights where
    # an exponential under its shift would leave the normal range (the losses spread over
    # about 15), and the tree serves
    if abs(tau) <= 2.0:
        assert spy.calls == 0
    assert risk.dtype == dtype and w.dtype == dtype and w.shape == l.shape
    J, ref = _mp_reference(l, codes, (t, tau))
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(float(risk), J, rtol=rtol)
    _check_weights(w, ref, dtype)
    np.testing.assert_allclose(float(risk), float(tree_risk), rtol=rtol)
    _check_weights(tree_w, ref, dtype)
    # the public function on list labels (a tree is built) gives the same weights
    pub = tl.hierarchical_weights(l, codes.tolist(), (t, tau))
    _check_weights(pub, ref, dtype)


@pytest.mark.parametrize("n, G", [(5000, 100), (3000, 3)])
def test_bincount_and_onehot_sums_agree_with_mpmath(n, G):
    rng = np.random.default_rng(8)
    codes = np.concatenate([rng.integers(0, G, n - G), np.arange(G)])
    l = rng.normal(size=n) * 2
    tree = build_tree(codes, n)
    onehot = _labelled._labelled_plan(tree)[3]
    assert (onehot is None) == (n * G > _labelled.ONEHOT_ENTRIES)
    for tilts in [(2.0, -2.0), (-50.0, 0.0), (0.0, 1e-8)]:
        risk, w = hierarchy_eval(l, None, tree, tilts, np)
        J, ref = _mp_reference(l, codes, tilts)
        np.testing.assert_allclose(float(risk), J, rtol=1e-12)
        _check_weights(w, ref, np.float64)


def test_weights_are_the_derivative_of_the_risk():
    # d J / d l_i = w_i (the hierarchical gradient lemma): central differences
    rng = np.random.default_rng(4)
    l, codes = _small_problem(np.float64, rng, n=30)
    h = 1e-6
    for tilts in [(2.0, -1.5), (-3.0, 0.5), (0.0, 2.0), (1.0, 0.0)]:
        w = tl.hierarchical_weights(l, codes, tilts)
        fd = np.empty_like(l)
        for i in range(l.size):
            up, down = l.copy(), l.copy()
            up[i] += h
            down[i] -= h
            fd[i] = (
                float(tl.hierarchical_risk(up, codes, tilts))
                - float(tl.hierarchical_risk(down, codes, tilts))
            ) / (2 * h)
        np.testing.assert_allclose(w, fd, rtol=1e-6, atol=2e-9)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_one_group_and_singleton_groups(dtype):
    rng = np.random.default_rng(6)
    l = (rng.normal(size=50) * 2).astype(dtype)
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    for t, tau in [(2.0, -3.0), (-50.0, 1e-8), (0.0, 2.0)]:
        # one group: the top tilt has nothing to weigh
        w = tl.hierarchical_weights(l, np.zeros(l.size, dtype=int), (t, tau))
        assert_close(w, tl.tilted_weights(l, tau), rtol=rtol, atol=1e-30)
        # every sample its own group: the inner tilt has nothing to weigh
        w = tl.hierarchical_weights(l, np.arange(l.size), (t, tau))
        assert_close(w, tl.tilted_weights(l, t), rtol=rtol, atol=1e-30)
        r = tl.hierarchical_risk(l, np.arange(l.size), (t, tau))
        assert_close(r, tl.tilted_risk(l, t), rtol=rtol)


# ---------------------------------------------------------------------------------------
# large inputs (compiled counts and sums; labels as codes without a tree)


def _tilted64(v, t, p=None):
    """The tilted risk of float64 values ``v`` with masses ``p`` (uniform by default):
    ``log1p`` of ``expm1`` sums relative to the smallest value where ``|t|`` times the
    spread is at most one (a log of a sum near one would lose the risk), SciPy's
    ``logsumexp`` otherwise."""
    p = np.full(v.size, 1.0 / v.size) if p is None else p / p.sum()
    if t == 0.0:
        return float(np.sum(p * v))
    if abs(t) * np.ptp(v) <= 1.0:
        c = v.min()
        return float(c + np.log1p(np.sum(p * np.expm1(t * (v - c)))) / t)
    return float(logsumexp(t * v, b=p) / t)


def _lse_reference(l, codes, tilts):
    """``(J, weights)`` in float64 by a loop over the groups with SciPy's logsumexp."""
    t, tau = tilts
    l = l.astype(np.float64)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    R, P, w = [], [], np.empty_like(l)
    for idx in np.split(order, bounds):
        lg = l[idx]
        R.append(_tilted64(lg, tau))
        w[idx] = 1.0 / idx.size if tau == 0.0 else np.exp(tau * lg - logsumexp(tau * lg))
        P.append(idx.size / l.size)
    R, P = np.array(R), np.array(P)
    J = _tilted64(R, t, P)
    W = P if t == 0.0 else P * np.exp(t * R - logsumexp(t * R, b=P))
    labels = codes[order][np.concatenate([[0], bounds])]
    per = np.zeros(int(codes.max()) + 1)
    per[labels] = W
    return J, w * per[codes]


def _zipf_labels(n, G, rng):
    p = 1.0 / np.arange(1, G + 1) ** 1.1
    codes = np.concatenate([rng.choice(G, size=n - G, p=p / p.sum()), np.arange(G)])
    return rng.permutation(codes * 3 // 2 + (codes % 2))  # unused labels between


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "tilts", [(1.0, -2.0), (-2.0, 50.0), (0.0, 1e-8), (50.0, 0.0), (2.0, 2.0), (-1e-8, -2.0)]
)
def test_large_labels_without_a_tree_match_the_reference(monkeypatch, dtype, tilts):
    rng = np.random.default_rng(9)
    n = kernels.MIN_ITEMS + 777
    labels = _zipf_labels(n, 2000, rng)
    l = np.minimum(rng.exponential(size=n), 10.0).astype(dtype)
    l[labels == 0] = 1e-3  # small risks: the shared shift repairs these groups

    def no_tree(*args, **kwargs):
        raise AssertionError("the labelled route builds no tree")

    with monkeypatch.context() as m:
        m.setattr(_hierarchy, "build_tree", no_tree)
        if dtype == np.float32 and abs(tilts[1]) == 50.0:
            m.undo()  # float32 exponentials leave the normal range: the tree serves
        w = tl.hierarchical_weights(l, labels, tilts)
    assert w.dtype == dtype and w.shape == l.shape
    J, ref = _lse_reference(l, labels, tilts)
    rtol = 1e-11 if dtype == np.float64 else 2e-5
    atol = 1e3 * float(np.finfo(dtype).tiny)
    np.testing.assert_allclose(w.astype(np.float64), ref, rtol=rtol, atol=atol)
    np.testing.assert_allclose(float(tl.hierarchical_risk(l, labels, tilts)), J, rtol=rtol)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_tree_repeated_evaluations_with_repaired_groups(dtype):
    # a tree evaluated again finds the repaired groups' samples from a sort (second call
    # on): every evaluation must agree with the reference and with the tree route
    rng = np.random.default_rng(12)
    n = kernels.MIN_ITEMS + 99
    _, codes = np.unique(_zipf_labels(n, 3000, rng), return_inverse=True)
    l = np.minimum(3 * rng.exponential(size=n), 20.0).astype(dtype)
    small = np.flatnonzero(np.bincount(codes) == 1)[:40]
    l[np.isin(codes, small)] = 2e-3
    tilts = (1.5, -2.0)
    level = labelled_level(l, tilts[1], codes, int(codes.max()) + 1, weights=True)
    assert level._parts[5].size > 0  # some groups are repaired
    tree = build_tree(codes, n)
    J, ref = _lse_reference(l, codes, tilts)
    _, tree_w = hierarchy_eval(l, None, tree, tilts, np, route="tree")
    rtol = 1e-11 if dtype == np.float64 else 2e-5
    for _ in range(3):
        risk, w = hierarchy_eval(l, None, tree, tilts, np)
        np.testing.assert_allclose(float(risk), J, rtol=rtol)
        atol = 1e3 * float(np.finfo(dtype).tiny)
        np.testing.assert_allclose(w.astype(np.float64), ref, rtol=rtol, atol=atol)
        np.testing.assert_allclose(w, tree_w, rtol=rtol, atol=atol)
    assert "members-sorted" in tree.levels[0]._cache
    # weights alone need fewer groups recomputed, and are as accurate
    only = labelled_level(
        l, tilts[1], codes, int(codes.max()) + 1, weights=True, weights_only=tilts[0]
    )
    assert only._parts[5].size < level._parts[5].size
    top = only.mass / n * np.exp(tilts[0] * only.risk.astype(np.float64))
    w = only.weights(top / top.sum())
    np.testing.assert_allclose(w.astype(np.float64), ref, rtol=rtol, atol=atol)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scale_by_group_kernel_rounds_each_product_once(dtype):
    rng = np.random.default_rng(13)
    n = kernels.MIN_ITEMS + 3
    codes = rng.integers(0, 5000, n)
    values = rng.random(n).astype(dtype)
    factors = rng.random(5000) * 1e-3
    want = (values.astype(np.float64) * factors[codes]).astype(dtype)  # one rounding
    got = kernels.scale_by_group(values.copy(), codes, factors)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------
# where the route declines, and bad input


@pytest.mark.parametrize(
    "dtype, tau, top",
    [(np.float64, -50.0, 18.0), (np.float32, -2.0, 60.0), (np.float32, 2.0, 60.0)],
)
def test_weights_take_the_other_end_of_the_exponent_range(monkeypatch, dtype, tau, top):
    # under the risks' shift (zero) the smallest exponents would not be normal numbers;
    # shifted so that the largest is at half the log of the largest number, all are
    rng = np.random.default_rng(14)
    l, codes = _small_problem(dtype, rng, n=60)
    l = (rng.uniform(0.0, top, l.size)).astype(dtype)
    l[0], l[1] = dtype(0.0), dtype(top)
    tree = build_tree(codes, l.size)
    spy = _TreeSpy(monkeypatch)
    for tilts in [(1.0, tau), (-2.0, tau), (0.0, tau)]:
        risk, w = hierarchy_eval(l, None, tree, tilts, np)
        assert spy.calls == 0
        J, ref = _mp_reference(l, codes, tilts)
        np.testing.assert_allclose(float(risk), J, rtol=1e-12 if dtype == np.float64 else 2e-5)
        _check_weights(w, ref, dtype)
        _check_weights(tl.hierarchical_weights(l, codes, tilts), ref, dtype)


def test_labelled_level_declines_weights_out_of_the_normal_range():
    rng = np.random.default_rng(2)
    l = rng.uniform(0.0, 100.0, 400)
    codes = np.arange(400) % 7
    # t * spread = 5000: exponentials under one shift would underflow
    assert labelled_level(l, 50.0, codes, 7, weights=True) is None
    assert labelled_level(l, 50.0, codes, 7) is not None  # the risks alone are fine
    assert labelled_level(np.array([-1e308, 1e308, 0.0]), 1.0, np.arange(3), 3) is None
    # the public functions still answer, by the tree
    J, ref = _mp_reference(l, codes, (2.0, 50.0))
    _check_weights(tl.hierarchical_weights(l, codes, (2.0, 50.0)), ref, np.float64)
    np.testing.assert_allclose(float(tl.hierarchical_risk(l, codes, (2.0, 50.0))), J, rtol=1e-12)


def test_infinite_tilts_and_priors_take_the_tree(monkeypatch):
    rng = np.random.default_rng(1)
    l, codes = _small_problem(np.float64, rng)
    tree = build_tree(codes, l.size)
    spy = _TreeSpy(monkeypatch)
    hierarchy_eval(l, None, tree, (np.inf, 1.0), np)
    assert spy.calls == 1
    p = np.full(l.size, 1.0 / l.size)
    hierarchy_eval(l, p, tree, (1.0, 1.0), np)
    assert spy.calls == 2


def test_unknown_route_is_rejected():
    l, codes = _small_problem(np.float64, np.random.default_rng(0))
    with pytest.raises(ValueError, match="`route`"):
        hierarchy_eval(l, None, build_tree(codes, l.size), (1.0, 1.0), np, route="fast")


def test_non_finite_losses_and_parameters_are_rejected():
    rng = np.random.default_rng(0)
    l, codes = _small_problem(np.float64, rng)
    l[3] = np.nan
    with pytest.raises(ValueError, match="`losses`"):
        tl.hierarchical_weights(l, codes, (1.0, 2.0))
    with pytest.raises(NonFiniteLosses):
        hierarchy_eval(l, None, build_tree(codes, l.size), (1.0, 2.0), np)
    X = rng.normal(size=(40, 3))
    y = (rng.random(40) < 0.5).astype(float)
    obj = tl.TiltedObjective("logistic", X, y, groups=codes, tilts=(1.0, 2.0))
    with pytest.raises(ValueError, match="`theta`"):
        obj.value_and_gradient(np.array([np.nan, 0.0, 0.0]))


# ---------------------------------------------------------------------------------------
# the hierarchical objective


class _ClassLevel:
    """Class-level TERM of the logistic loss written out in NumPy: the risk of each class
    at tilt ``tau`` (the mean at 0), tilted across classes at ``t``, plus a ridge term."""

    def __init__(self, X, y, t, tau, l2):
        self.X, self.y, self.t, self.tau, self.l2 = X, y, t, tau, l2

    def __call__(self, theta):
        z = self.X @ theta
        f = np.logaddexp(0.0, z) - self.y * z
        fp = 1.0 / (1.0 + np.exp(-z)) - self.y
        R, share, mass = [], np.empty_like(f), []
        for c in (0.0, 1.0):
            m = self.y == c
            R.append(_tilted64(f[m], self.tau))
            share[m] = (
                1.0 / m.sum()
                if self.tau == 0.0
                else np.exp(self.tau * f[m] - logsumexp(self.tau * f[m]))
            )
            mass.append(m.mean())
        R, mass = np.array(R), np.array(mass)
        W = mass * np.exp(self.t * R - logsumexp(self.t * R, b=mass))
        w = share * W[self.y.astype(int)]
        J = _tilted64(R, self.t, mass) + 0.5 * self.l2 * theta @ theta
        return J, self.X.T @ (w * fp) + self.l2 * theta


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("tilts", [(50.0, 0.0), (-2.0, 3.0), (5.0, -1e-8)])
def test_objective_matches_a_hand_written_class_level_objective(dtype, tilts):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(600, 6))
    y = (rng.random(600) < 0.3).astype(np.float64)
    theta = rng.normal(size=6) * 0.3
    obj = tl.TiltedObjective(
        "logistic", X.astype(dtype), y.astype(dtype), groups=y, tilts=tilts, l2=1e-4
    )
    J, g = _ClassLevel(X, y, *tilts, 1e-4)(theta)
    for _ in range(2):  # the second call reads the cached plan
        v, grad = obj.value_and_gradient(theta.astype(dtype))
        rtol = 1e-12 if dtype == np.float64 else 5e-5
        assert_close(v, np.asarray(J, dtype=dtype), rtol=rtol)
        assert_close(grad, g.astype(dtype), rtol=rtol, atol=10 * rtol * np.abs(g).max())
    if dtype == np.float64:  # the gradient is the derivative of the value
        h = 1e-6
        fd = [
            (float(obj.value(theta + h * e)) - float(obj.value(theta - h * e))) / (2 * h)
            for e in np.eye(6)
        ]
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)


@needs_numba
def test_large_objective_weights_match_the_reference():
    rng = np.random.default_rng(7)
    n = kernels.MIN_ITEMS + 5
    X = rng.normal(size=(n, 4))
    y = (rng.random(n) < 0.3).astype(np.float64)
    _, g = np.unique(_zipf_labels(n, 1000, rng), return_inverse=True)
    theta = rng.normal(size=4) * 0.5
    obj = tl.TiltedObjective("logistic", X, y, groups=g, tilts=(1.0, 1.0))
    z = X @ theta
    ell = np.logaddexp(0.0, z) - y * z
    J, w = _lse_reference(ell, g, (1.0, 1.0))
    for _ in range(2):
        np.testing.assert_allclose(obj.weights(theta), w, rtol=1e-11, atol=1e-300)
        v, grad = obj.value_and_gradient(theta)
        np.testing.assert_allclose(float(v), J, rtol=1e-12)
        fp = 1.0 / (1.0 + np.exp(-z)) - y
        np.testing.assert_allclose(grad, X.T @ (w * fp), rtol=1e-10, atol=1e-14)


# ---------------------------------------------------------------------------------------
# every backend (the labelled route is NumPy's; others take the tree)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_hierarchical_weights_on_every_backend(xp, dtype):
    rng = np.random.default_rng(10)
    l, codes = _small_problem(np.float64, rng)
    tilts = (2.0, -1.0)
    _, ref = _mp_reference(l.astype(dtype), codes, tilts)
    lx = xp.asarray(l.astype(dtype))
    w = tl.hierarchical_weights(lx, xp.asarray(codes), tilts)
    assert_close(
        w, ref, xp=xp, dtype=getattr(xp, dtype), rtol=1e-12 if dtype == "float64" else 2e-5
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_labelled_routes_decline_other_backends_and_serve_numpy(xp, xp_name, dtype):
    """The labelled routes are NumPy host routes: other backends get None (their caller
    takes the general route) instead of an AttributeError; NumPy gets the group risks,
    checked against ``logsumexp`` per group."""
    from tiltlab.accumulator import label_codes, labelled_risk, pooled_risk, shared_shift_risk
    from tiltlab.segments import Segments

    n = 1 << 16  # long enough for the compiled kernels
    rng = np.random.default_rng(5)
    l_np = rng.exponential(size=n).astype(dtype)
    g_np = rng.integers(0, 7, size=n)
    l, g = xp.asarray(l_np), xp.asarray(g_np)
    seg = Segments.from_codes(g_np, 7)
    calls = {
        "labelled_risk": lambda: labelled_risk(l, 2.0, g),
        "label_codes": lambda: label_codes(g, n),
        "labelled_level": lambda: labelled_level(l, 2.0, g, 7),
        "pooled_risk": lambda: pooled_risk(l, 2.0, xp.ones_like(l)),
        "shared_shift_risk": lambda: shared_shift_risk(l, 2.0, None, seg),
    }
    if xp_name != "numpy":
        for name, call in calls.items():
            assert call() is None, name
        return
    if not available():
        pytest.skip("numba not installed: the compiled labelled route is off")
    risk, counts = calls["labelled_risk"]()
    ref = [
        (logsumexp(2.0 * l_np[g_np == k].astype(np.float64)) - np.log(np.sum(g_np == k))) / 2
        for k in range(7)
    ]
    rtol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(risk, ref, rtol=rtol)
    np.testing.assert_array_equal(counts, np.bincount(g_np, minlength=7))
    assert risk.dtype == np.dtype(dtype)

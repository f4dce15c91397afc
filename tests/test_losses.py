"""Tests of tiltlab.losses against independent references.

References: closed forms evaluated with mpmath at 50 digits, explicit NumPy
formulas and matrices written here, central finite differences, and a NumPy SVD
for the fair-PCA loss.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from _contract import reference_loss

from tiltlab._compat import default_float, to_numpy
from tiltlab.losses import (
    LOSS_NAMES,
    CallableLoss,
    FairPCALoss,
    HuberLoss,
    Loss,
    MultinomialLoss,
    get_loss,
)
from tiltlab.testing import assert_close

mpmath.mp.dps = 50

SCALAR = ["squared", "absolute", "huber", "logistic", "hinge", "squared_hinge"]
BINARY = ["logistic", "hinge", "squared_hinge"]
DELTA = 0.7  # Huber threshold used throughout


def _arr(xp, a, dtype=None):
    a = np.asarray(a)
    if dtype is None:
        dtype = {"f": xp.float64, "i": xp.int64, "b": xp.bool}[a.dtype.kind]
    return xp.asarray(a, dtype=dtype)


def _loss(name):
    return get_loss(name, delta=DELTA) if name == "huber" else get_loss(name)


# ----------------------------------------------------------------------------------------
# independent references (mpmath, 50 digits)
# ----------------------------------------------------------------------------------------


def _mp_scalar(name, z, y):
    params = {"delta": DELTA} if name == "huber" else {}
    return reference_loss(name, float(z), float(y), **params)[0]


def _ref(name, z, y):
    return np.array([float(_mp_scalar(name, a, b)) for a, b in zip(z, y, strict=True)])


def _mp_d1(name, z, y):
    return np.array(
        [float(reference_loss(name, float(a), float(b))[1]) for a, b in zip(z, y, strict=True)]
    )


def _mp_multinomial(zrow, label):
    return reference_loss("multinomial", [float(v) for v in zrow], int(label))[0]


def _data(name):
    """Points for value checks, including tiny and large losses."""
    if name in BINARY:
        z = np.array([-3.0, -0.4, 0.0, 0.3, 0.9, 1.7, 40.0, -40.0, 25.0, -0.2])
        y = np.array([1, 0, 1, 1, 0, 1, 1, 0, 0, 1])
    else:
        z = np.array([-3.0, -0.4, 0.0, 0.3, 0.9, 1.7, 40.0, -40.0, 2.5, 1e-3])
        y = np.array([1.0, 0.5, -2.0, 0.25, 0.9, -1.3, 0.0, 7.0, 2.5, -1e-3])
    return z, y


def _smooth_data(name):
    """Points at least 0.1 away from every kink of the loss (for finite differences)."""
    z = np.array([-2.3, -0.6, 0.35, 0.45, 1.3, 2.7, -1.6, 0.05])
    if name in BINARY:
        y = np.array([1, 0, 1, 0, 1, 0, 0, 1])  # margins 1 - s z away from 0
    else:
        y = np.array([0.4, 0.9, -0.9, 1.6, 0.1, 0.2, -0.1, 0.7])  # |z - y| away from 0, DELTA
    return z, y


# ----------------------------------------------------------------------------------------
# registry and attributes
# ----------------------------------------------------------------------------------------


def test_registry_names_and_attributes():
    # poisson and pinball: tests/test_loss_table.py
    assert set(LOSS_NAMES) == set(SCALAR) | {"multinomial", "poisson", "pinball"}
    for name in LOSS_NAMES:
        loss = get_loss(name)
        assert isinstance(loss, Loss)
        assert loss.name == name
        assert loss.is_linear is True
        assert loss.convex is True
        assert loss.is_glm is (name in ("squared", "logistic"))
    assert get_loss("squared").n_outputs == 1
    assert get_loss("multinomial", n_classes=4).n_outputs == 4
    assert get_loss("Squared-Hinge").name == "squared_hinge"
    assert get_loss("huber", delta=2.5).delta == 2.5
    inst = HuberLoss(0.3)
    assert get_loss(inst) is inst


def test_get_loss_errors():
    with pytest.raises(ValueError, match="squared_hinge"):
        get_loss("cauchy")
    with pytest.raises(TypeError, match="params"):
        get_loss("squared", delta=1.0)
    with pytest.raises(TypeError, match="params"):
        get_loss(HuberLoss(), delta=1.0)
    with pytest.raises(TypeError, match="loss"):
        get_loss(3)
    with pytest.raises(ValueError, match="delta"):
        HuberLoss(delta=-1.0)
    with pytest.raises(ValueError, match="n_classes"):
        MultinomialLoss(n_classes=0)


# ----------------------------------------------------------------------------------------
# scalar-predictor losses
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCALAR)
def test_values_against_mpmath(xp, name):
    z, y = _data(name)
    loss = _loss(name)
    desired = _ref(name, z, y)
    got = loss.value(_arr(xp, z), _arr(xp, y))
    assert_close(got, desired, xp=xp, dtype=xp.float64, rtol=1e-14, atol=1e-300)
    v, d1, d2 = loss.derivatives(_arr(xp, z), _arr(xp, y))
    assert_close(v, desired, xp=xp, dtype=xp.float64, rtol=1e-14, atol=1e-300)
    assert d1.shape == d2.shape == v.shape


@pytest.mark.parametrize("name", SCALAR)
def test_derivatives_against_finite_differences(xp, name):
    z, y = _smooth_data(name)
    loss = _loss(name)
    yy = _arr(xp, y)

    def val(zz):
        return to_numpy(loss.value(_arr(xp, zz), yy))

    _, d1, d2 = loss.derivatives(_arr(xp, z), yy)
    h1, h2 = 1e-6, 1e-4
    fd1 = (val(z + h1) - val(z - h1)) / (2 * h1)
    fd2 = (val(z + h2) - 2 * val(z) + val(z - h2)) / h2**2
    assert_close(d1, fd1, xp=xp, dtype=xp.float64, rtol=1e-7, atol=1e-8)
    assert_close(d2, fd2, xp=xp, dtype=xp.float64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", SCALAR)
def test_hvp_z_against_finite_difference_of_d1(xp, name):
    z, y = _smooth_data(name)
    u = np.linspace(-1.5, 2.0, z.size)
    loss = _loss(name)
    yy = _arr(xp, y)
    h = 1e-6

    def d1(zz):
        return to_numpy(loss.derivatives(_arr(xp, zz), yy)[1])

    fd = (d1(z + h * u) - d1(z - h * u)) / (2 * h)
    got = loss.hvp_z(_arr(xp, z), yy, _arr(xp, u))
    assert_close(got, fd, xp=xp, dtype=xp.float64, rtol=1e-6, atol=1e-8)


def test_kink_conventions(xp):
    z = _arr(xp, [1.0, 2.0, -1.0])
    _, d1, d2 = get_loss("absolute").derivatives(z, _arr(xp, [1.0, 0.0, 0.0]))
    assert_close(d1, np.array([0.0, 1.0, -1.0]), xp=xp)
    assert_close(d2, np.zeros(3), xp=xp)
    # hinge: margin exactly 0 at z=1, y=1 -> subgradient 0; violated -> -s; d2 = 0
    _, d1, d2 = get_loss("hinge").derivatives(_arr(xp, [1.0, 0.5, 0.5]), _arr(xp, [1, 1, 0]))
    assert_close(d1, np.array([0.0, -1.0, 1.0]), xp=xp)
    assert_close(d2, np.zeros(3), xp=xp)
    _, d1, d2 = get_loss("squared_hinge").derivatives(
        _arr(xp, [1.0, 0.5, 0.5, 3.0]), _arr(xp, [1, 1, 0, 1])
    )
    assert_close(d1, np.array([0.0, -1.0, 3.0, 0.0]), xp=xp)
    assert_close(d2, np.array([0.0, 2.0, 2.0, 0.0]), xp=xp)
    # Huber: scikit-learn / scipy convention, linear beyond delta
    v, d1, d2 = HuberLoss(1.0).derivatives(_arr(xp, [0.5, 3.0, -3.0]), _arr(xp, [0.0, 0.0, 0.0]))
    assert_close(v, np.array([0.125, 2.5, 2.5]), xp=xp)
    assert_close(d1, np.array([0.5, 1.0, -1.0]), xp=xp)
    assert_close(d2, np.array([1.0, 0.0, 0.0]), xp=xp)


def test_huber_matches_scipy():
    from scipy.special import huber

    r = np.linspace(-3, 3, 41)
    got = HuberLoss(delta=1.3).value(r, np.zeros_like(r))
    np.testing.assert_allclose(got, huber(1.3, r), rtol=1e-15)


def test_logistic_extreme_predictors(xp):
    z = np.array([1e4, -1e4, 1e4, -1e4, 745.0, -745.0])
    y = np.array([1, 1, 0, 0, 1, 1])
    loss = get_loss("logistic")
    v, d1, d2 = loss.derivatives(_arr(xp, z), _arr(xp, y))
    for a in (v, d1, d2):
        assert np.all(np.isfinite(to_numpy(a)))
    desired_v = np.array([float(_mp_scalar("logistic", a, b)) for a, b in zip(z, y, strict=True)])
    assert_close(v, desired_v, xp=xp, rtol=1e-14, atol=1e-300)
    assert_close(v, np.array([0.0, 1e4, 1e4, 0.0, 0.0, 745.0]), xp=xp, rtol=1e-14, atol=1e-300)
    desired_d1 = np.array(
        [
            float(reference_loss("logistic", float(a), float(b))[1])
            for a, b in zip(z, y, strict=True)
        ]
    )
    assert_close(d1, desired_d1, xp=xp, rtol=1e-14, atol=1e-300)
    assert_close(d2, np.zeros(6), xp=xp, atol=1e-300)


def test_logistic_small_losses_keep_relative_precision(xp):
    z = np.array([30.0, 36.0, -33.0])
    y = np.array([1, 1, 0])
    _, d1, _ = get_loss("logistic").derivatives(_arr(xp, z), _arr(xp, y))
    desired = np.array(
        [
            float(reference_loss("logistic", float(a), float(b))[1])
            for a, b in zip(z, y, strict=True)
        ]
    )
    assert_close(d1, desired, xp=xp, rtol=1e-14)


@pytest.mark.parametrize("name", ["squared", "logistic"])
def test_glm_cumulant(xp, name):
    z, y = _smooth_data(name)
    loss = get_loss(name)
    A, dA, d2A = loss.cumulant(_arr(xp, z))
    T, c = loss.statistic(_arr(xp, y)), loss.offset(_arr(xp, y))
    # loss = A(z) - T(y) z + c(y), against the 50-digit reference
    assert_close(A - T * _arr(xp, z) + c, _ref(name, z, y), xp=xp, rtol=1e-13)
    if name == "squared":
        assert_close(A, z**2, xp=xp)
        assert_close(T, 2 * y, xp=xp)
    else:
        assert_close(A, np.logaddexp(0.0, z), xp=xp, rtol=1e-14)
        assert_close(T, y.astype(float), xp=xp)

    def a(zz):
        return to_numpy(loss.cumulant(_arr(xp, zz))[0])

    h = 1e-5
    assert_close(dA, (a(z + h) - a(z - h)) / (2 * h), xp=xp, rtol=1e-8)
    assert_close(d2A, (a(z + h) - 2 * a(z) + a(z - h)) / h**2, xp=xp, rtol=1e-4)


# ----------------------------------------------------------------------------------------
# multinomial
# ----------------------------------------------------------------------------------------


def _multi_data():
    rng = np.random.default_rng(3)
    z = rng.normal(scale=2.0, size=(7, 4))
    z[5] = [40.0, 0.0, -1.0, 0.5]  # dominant true class: tiny loss
    z[6] = [3.0, 3.0, -2.0, 3.0]  # tied maxima
    y = np.array([0, 3, 1, 2, 2, 0, 1])
    return z, y


def test_multinomial_value_against_mpmath(xp):
    z, y = _multi_data()
    loss = MultinomialLoss(n_classes=4)
    desired = np.array([float(_mp_multinomial(r, k)) for r, k in zip(z, y, strict=True)])
    assert_close(loss.value(_arr(xp, z), _arr(xp, y)), desired, xp=xp, rtol=1e-14)


def test_multinomial_gradient_and_hessian(xp):
    z, y = _multi_data()
    loss = MultinomialLoss()
    yy = _arr(xp, y)
    v, d1, d2 = loss.derivatives(_arr(xp, z), yy)
    assert d2 is None
    # gradient: explicit softmax - onehot, and central differences of the value
    e = np.exp(z - z.max(axis=1, keepdims=True))
    s = e / e.sum(axis=1, keepdims=True)
    onehot = np.eye(4)[y]
    assert_close(d1, s - onehot, xp=xp, rtol=1e-12, atol=1e-15)
    h = 1e-6
    fd = np.empty_like(z)
    for k in range(4):
        dz = np.zeros_like(z)
        dz[:, k] = h
        fd[:, k] = (
            to_numpy(loss.value(_arr(xp, z + dz), yy)) - to_numpy(loss.value(_arr(xp, z - dz), yy))
        ) / (2 * h)
    assert_close(d1, fd, xp=xp, rtol=1e-6, atol=1e-9)
    # hvp_z: explicit K x K matrices diag(s) - s s^T, and a difference of d1
    u = np.random.default_rng(4).normal(size=z.shape)
    H = np.stack([np.diag(si) - np.outer(si, si) for si in s])
    got = loss.hvp_z(_arr(xp, z), yy, _arr(xp, u))
    assert_close(got, np.einsum("nij,nj->ni", H, u), xp=xp, rtol=1e-12, atol=1e-15)
    fd = (
        to_numpy(loss.derivatives(_arr(xp, z + h * u), yy)[1])
        - to_numpy(loss.derivatives(_arr(xp, z - h * u), yy)[1])
    ) / (2 * h)
    assert_close(got, fd, xp=xp, rtol=1e-6, atol=1e-9)
    # the curvature bound holds
    assert np.linalg.eigvalsh(H).max() <= loss.curvature_bound + 1e-15


def test_multinomial_extreme_predictors(xp):
    z = np.array([[1e4, -1e4, 0.0], [1e4, -1e4, 0.0], [1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]])
    y = np.array([0, 1, 2, 1])
    loss = MultinomialLoss(n_classes=3)
    v, d1, _ = loss.derivatives(_arr(xp, z), _arr(xp, y))
    hv = loss.hvp_z(_arr(xp, z), _arr(xp, y), _arr(xp, np.ones_like(z)))
    for a in (v, d1, hv):
        assert np.all(np.isfinite(to_numpy(a)))
    desired = np.array([float(_mp_multinomial(r, k)) for r, k in zip(z, y, strict=True)])
    assert_close(v, desired, xp=xp, rtol=1e-14)
    assert_close(v, np.array([0.0, 2e4, 1e4, np.log(3.0)]), xp=xp, rtol=1e-14, atol=1e-300)
    d1_want = np.array([[0, 0, 0], [1, -1, 0], [1, 0, -1], [1 / 3, -2 / 3, 1 / 3]])
    assert_close(d1, d1_want, xp=xp, rtol=1e-14, atol=1e-300)


def test_multinomial_shapes_and_labels(xp):
    loss = MultinomialLoss(n_classes=3)
    z = _arr(xp, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="`y`"):
        loss.value(z, _arr(xp, [0, 3]))
    with pytest.raises(ValueError, match="`y`"):
        loss.value(z, _arr(xp, [-1, 0]))
    with pytest.raises(ValueError, match="`y`"):
        loss.value(z, _arr(xp, [0.5, 1.0]))
    with pytest.raises(ValueError, match="`z`"):
        loss.value(_arr(xp, np.zeros(3)), _arr(xp, [0, 1, 2]))
    with pytest.raises(ValueError, match="n_classes"):
        loss.value(_arr(xp, np.zeros((2, 4))), _arr(xp, [0, 1]))
    # integral floats are accepted as labels
    assert_close(loss.value(z, _arr(xp, [0.0, 2.0])), np.full(2, np.log(3.0)), xp=xp)
    assert MultinomialLoss().with_labels(_arr(xp, [0, 4, 1])).n_outputs == 5
    assert loss.with_labels(_arr(xp, [0, 2])) is loss


# ----------------------------------------------------------------------------------------
# dtypes, namespaces, validation
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SCALAR, "multinomial"])
def test_float32_stays_float32(xp, name):
    loss = _loss(name)
    if name == "multinomial":
        z, y = _multi_data()
        yy = _arr(xp, y)
    else:
        z, y = _smooth_data(name)
        yy = _arr(xp, y, xp.float32) if name not in BINARY else _arr(xp, y)
    z32 = _arr(xp, z, xp.float32)
    v, d1, d2 = loss.derivatives(z32, yy)
    hv = loss.hvp_z(z32, yy, _arr(xp, np.ones_like(z), xp.float32))
    for a in (v, d1, hv) + (() if d2 is None else (d2,)):
        assert a.dtype == xp.float32
    if name == "multinomial":
        z32n = z.astype(np.float32)
        desired = np.array([float(_mp_multinomial(r, k)) for r, k in zip(z32n, y, strict=True)])
    else:
        desired = _ref(name, z.astype(np.float32), np.asarray(y, dtype=np.float32))
    assert_close(loss.value(z32, yy), desired, xp=xp, dtype=xp.float32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SCALAR)
def test_integer_inputs_promoted(xp, name):
    z = np.array([-2, 0, 1, 3])
    y = np.array([1, 0, 1, 0]) if name in BINARY else np.array([0, 2, -1, 3])
    loss = _loss(name)
    dt = default_float(xp)
    v = loss.value(_arr(xp, z), _arr(xp, y))
    assert v.dtype == dt
    assert_close(v, _ref(name, z, y), xp=xp, dtype=dt)


def test_mixed_float_targets_promote(xp):
    v = get_loss("squared").value(_arr(xp, [1.0], xp.float32), _arr(xp, [0.5]))
    assert v.dtype == xp.float64
    v = get_loss("logistic").value(_arr(xp, [1.0], xp.float32), _arr(xp, [1.0]))
    assert v.dtype == xp.float32  # labels do not promote classification losses


@pytest.mark.parametrize("name", BINARY)
def test_bad_binary_labels(xp, name):
    loss = get_loss(name)
    with pytest.raises(ValueError, match="`y`"):
        loss.value(_arr(xp, [0.0, 1.0]), _arr(xp, [0, 2]))
    with pytest.raises(ValueError, match="`y`"):
        loss.derivatives(_arr(xp, [0.0, 1.0]), _arr(xp, [-1.0, 1.0]))
    # booleans are fine labels
    v = loss.value(_arr(xp, [0.0, 0.0]), _arr(xp, [True, False]))
    assert v.dtype == xp.float64


def test_shape_mismatch_and_mixed_backends(xp):
    with pytest.raises(ValueError, match="`y`"):
        get_loss("squared").value(_arr(xp, np.zeros(3)), _arr(xp, np.zeros(2)))
    with pytest.raises(ValueError, match="`u`"):
        get_loss("squared").hvp_z(
            _arr(xp, np.zeros(3)), _arr(xp, np.zeros(3)), _arr(xp, np.zeros(2))
        )
    if xp.__name__ != "array_api_compat.numpy":
        with pytest.raises(TypeError, match="`z`"):
            get_loss("squared").value(_arr(xp, np.zeros(3)), np.zeros(3))


def test_validate_false_skips_checks(xp):
    loss = get_loss("logistic")
    v = loss.value(_arr(xp, [0.0]), _arr(xp, [1]), validate=False)
    assert_close(v, np.array([np.log(2.0)]), xp=xp)


# ----------------------------------------------------------------------------------------
# callable losses
# ----------------------------------------------------------------------------------------


def test_callable_loss_plumbs_through(xp):
    rng = np.random.default_rng(1)
    Xn, thn = rng.normal(size=(6, 3)), rng.normal(size=3)
    yn = rng.normal(size=6)
    X, y, th = _arr(xp, Xn), _arr(xp, yn), _arr(xp, thn)

    def fun(theta, X, y):
        return (X @ theta - y) ** 4

    def grad(theta, X, y):
        return 4 * ((X @ theta - y) ** 3)[:, None] * X

    def hess(theta, X, y):
        return 12 * ((X @ theta - y) ** 2)[:, None, None] * (X[:, :, None] * X[:, None, :])

    loss = CallableLoss(fun, grad, hess, name="quartic")
    assert loss.is_linear is False and loss.has_hessian and loss.name == "quartic"
    assert get_loss(loss) is loss
    r = Xn @ thn - yn
    assert_close(loss.fun(th, X, y), r**4, xp=xp)
    assert_close(loss.grad(th, X, y), 4 * r[:, None] ** 3 * Xn, xp=xp)
    v, g = loss.value_and_grad(th, X, y)
    assert v.shape == (6,) and g.shape == (6, 3)
    H = 12 * r[:, None, None] ** 2 * np.einsum("ni,nj->nij", Xn, Xn)
    assert_close(loss.hess(th, X, y), H, xp=xp)
    vec = np.array([0.3, -1.0, 2.0])
    assert_close(loss.hvp(th, _arr(xp, vec), X, y), H @ vec, xp=xp)

    no_h = CallableLoss(fun, grad)
    with pytest.raises(NotImplementedError, match="hess"):
        no_h.hess(th, X, y)
    bad = CallableLoss(fun, lambda theta, X, y: X @ theta)
    with pytest.raises(ValueError, match="`grad`"):
        bad.grad(th, X, y)
    with pytest.raises(TypeError, match="`fun`"):
        CallableLoss(None, grad)


# ----------------------------------------------------------------------------------------
# fair PCA
# ----------------------------------------------------------------------------------------


def _pca_groups():
    rng = np.random.default_rng(7)
    a = rng.normal(size=(40, 5)) @ np.diag([3.0, 2.0, 1.0, 0.5, 0.2])
    b = rng.normal(size=(15, 5)) @ rng.normal(size=(5, 5)) + 0.3
    return [a, b]


def _fair_pca_reference(groups, U, k):
    out = []
    for Xg in groups:
        u, s, vt = np.linalg.svd(Xg, full_matrices=False)
        best = (u[:, :k] * s[:k]) @ vt[:k]
        resid = Xg - Xg @ U @ U.T
        out.append((np.sum(resid**2) - np.sum((Xg - best) ** 2)) / Xg.shape[0])
    return np.array(out)


def test_fair_pca_values(xp):
    groups = _pca_groups()
    k = 2
    loss = FairPCALoss([_arr(xp, g) for g in groups], k)
    assert (loss.n_groups, loss.n_features, loss.n_components, loss.n_params) == (2, 5, 2, 10)
    assert loss.is_linear is False and loss.convex is False
    rng = np.random.default_rng(0)
    for _ in range(3):
        Q, _ = np.linalg.qr(rng.normal(size=(5, k)))
        for U in (Q, rng.normal(size=(5, k))):  # orthonormal and general U
            got = loss.fun(_arr(xp, U.ravel()))
            want = _fair_pca_reference(groups, U, k)
            assert_close(got, want, xp=xp, rtol=1e-10, atol=1e-12)
            assert np.all(to_numpy(got) >= -1e-12)
    # zero for the group whose top-k right singular vectors are used
    for g, Xg in enumerate(groups):
        V = np.linalg.svd(Xg)[2][:k].T
        got = to_numpy(loss.fun(_arr(xp, V.ravel())))
        assert abs(got[g]) <= 1e-12 * np.sum(Xg**2) / Xg.shape[0]
        assert got[1 - g] > 0


def test_fair_pca_full_rank_is_zero(xp):
    groups = _pca_groups()
    loss = FairPCALoss([_arr(xp, g) for g in groups], 5)
    Q, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(5, 5)))
    assert_close(loss.fun(_arr(xp, Q.ravel())), np.zeros(2), xp=xp, atol=1e-12)


def test_fair_pca_gradient_hvp_hessian(xp):
    groups = _pca_groups()
    k = 2
    loss = FairPCALoss([_arr(xp, g) for g in groups], k)
    rng = np.random.default_rng(5)
    th = rng.normal(size=10)
    h = 1e-6
    fd = np.empty((2, 10))
    for j in range(10):
        e = np.zeros(10)
        e[j] = h
        fd[:, j] = (to_numpy(loss.fun(_arr(xp, th + e))) - to_numpy(loss.fun(_arr(xp, th - e)))) / (
            2 * h
        )
    g = loss.grad(_arr(xp, th))
    assert_close(g, fd, xp=xp, rtol=1e-6, atol=1e-6)
    v = rng.normal(size=10)
    hv = loss.hvp(_arr(xp, th), _arr(xp, v))
    fd_hv = (
        to_numpy(loss.grad(_arr(xp, th + h * v))) - to_numpy(loss.grad(_arr(xp, th - h * v)))
    ) / (2 * h)
    assert_close(hv, fd_hv, xp=xp, rtol=1e-6, atol=1e-6)
    H = loss.hess(_arr(xp, th))
    assert H.shape == (2, 10, 10)
    Hn = to_numpy(H)
    np.testing.assert_allclose(Hn, np.swapaxes(Hn, 1, 2), rtol=1e-12, atol=1e-12)
    assert_close(
        xp.sum(H * _arr(xp, v)[None, None, :], axis=-1), to_numpy(hv), xp=xp, rtol=1e-12, atol=1e-12
    )


def test_fair_pca_dtype_and_errors(xp):
    groups = _pca_groups()
    loss = FairPCALoss([_arr(xp, g, xp.float32) for g in groups], 1)
    th = _arr(xp, np.eye(5)[:, 0], xp.float32)
    assert loss.fun(th).dtype == xp.float32
    assert loss.grad(th).dtype == xp.float32
    assert loss.standard_pca_theta().dtype == xp.float32
    with pytest.raises(ValueError, match="theta"):
        loss.fun(_arr(xp, np.zeros(4), xp.float32))
    with pytest.raises(ValueError, match="n_components"):
        FairPCALoss([_arr(xp, g) for g in groups], 6)
    with pytest.raises(ValueError, match="groups_data"):
        FairPCALoss([_arr(xp, groups[0]), _arr(xp, groups[1][:, :4])], 1)


def test_fair_pca_standard_pca_is_optimal_for_pooled_data():
    groups = _pca_groups()
    pooled = np.concatenate(groups)
    loss = FairPCALoss([pooled], 2)
    th = loss.standard_pca_theta()
    np.testing.assert_allclose(loss.fun(th), [0.0], atol=1e-12)


def test_point_estimation_loss(xp):
    # closed forms: ||x_i - theta||^2, gradient 2 (theta - x_i), Hessian 2 I; and the
    # objective's gradient against central differences
    import tiltlab as tl
    from tiltlab.losses import PointEstimationLoss

    rng = np.random.default_rng(3)
    P = rng.normal(size=(7, 3))
    th = rng.normal(size=3)
    loss = PointEstimationLoss()
    Px, thx = xp.asarray(P), xp.asarray(th)
    assert_close(loss.fun(thx, Px), ((P - th) ** 2).sum(axis=1), xp=xp, rtol=1e-14)
    assert_close(loss.grad(thx, Px), 2 * (th - P), xp=xp, rtol=1e-14)
    assert_close(loss.hess(thx, Px), np.broadcast_to(2 * np.eye(3), (7, 3, 3)), xp=xp)
    obj = tl.TiltedObjective(loss, X=Px, t=-1.5)
    g = tl._compat.to_numpy(obj.gradient(thx))
    h = 1e-6
    fd = [
        (
            float(tl._compat.to_numpy(obj.value(xp.asarray(th + h * e))))
            - float(tl._compat.to_numpy(obj.value(xp.asarray(th - h * e))))
        )
        / (2 * h)
        for e in np.eye(3)
    ]
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="`X` must hold the samples"):
        loss.fun(thx, xp.asarray(P[:, :2]))


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_poisson_small_rates_far_below_the_prediction_stay_finite(xp, dtype_name):
    # y expm1(z - log y) overflowed once z - log y passed the dtype's exp range, although
    # exp(z) - y and the loss itself are finite: inf for a rate y = 1e-10 at z = 88 in
    # float32 (the loss is 1.65e38) or y = 1e-300 at z = 30 in float64 (1.07e13)
    points = {
        "float32": [(85.0, 0.01), (88.0, 1e-10), (60.0, 1e-30), (20.0, 0.5)],
        "float64": [(700.0, 1e-10), (30.0, 1e-300), (500.0, 1e-200), (20.0, 0.5)],
    }[dtype_name]
    dtype = getattr(xp, dtype_name)
    z = np.array([p[0] for p in points], dtype=dtype_name)
    y = np.array([p[1] for p in points], dtype=dtype_name)
    value, d1, d2 = get_loss("poisson").derivatives(_arr(xp, z, dtype), _arr(xp, y, dtype))
    with mpmath.workdps(50):
        zm = [mpmath.mpf(float(a)) for a in z]
        ym = [mpmath.mpf(float(b)) for b in y]  # the labels as stored in the dtype
        ref_v = [mpmath.exp(a) - b - b * (a - mpmath.log(b)) for a, b in zip(zm, ym, strict=True)]
        ref_d1 = [mpmath.exp(a) - b for a, b in zip(zm, ym, strict=True)]
        ref_d2 = [mpmath.exp(a) for a in zm]
    # exp(z) is the whole value to within 1e-6 here: its rounding (a few ulps of the
    # dtype) is the error, the subtracted terms cost no cancellation
    rtol = 8 * np.finfo(dtype_name).eps
    for got, ref in ((value, ref_v), (d1, ref_d1), (d2, ref_d2)):
        want = np.array([float(r) for r in ref])
        assert_close(got, want, xp=xp, dtype=dtype, rtol=rtol)


def test_poisson_refuses_infinite_targets(xp):
    # y = inf passed the `y >= 0` check and gave an infinite loss and d1 = -inf; the
    # label set of the loss is the finite non-negative numbers (as for the point contract)
    from tiltlab.losses.pointwise import valid_label

    assert not valid_label("poisson", float("inf"))
    loss = get_loss("poisson")
    for bad in (np.inf, np.nan, -1.0):
        with pytest.raises(ValueError, match="`y`"):
            loss.value(_arr(xp, [0.0, 0.0]), _arr(xp, [1.0, bad]))
    np.testing.assert_allclose(
        to_numpy(loss.value(_arr(xp, [0.0]), _arr(xp, [0.0]))), [1.0], rtol=1e-15
    )

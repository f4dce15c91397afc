"""Tests of tiltlab.objective (TiltedObjective) against independent references.

References: central finite differences of ``value`` (gradients) and of ``gradient``
(Hessians), written here; the aggregations ``tilted_risk``/``hierarchical_risk`` (tested
against mpmath in test_risk.py) applied to the per-sample losses; an explicit NumPy
construction of per-sample gradients and Hessians with the tilted Hessian lemma applied
recursively over the group tree; and PyTorch autograd of the objective written directly in
torch with ``logsumexp``.
"""

from __future__ import annotations

import tracemalloc
import warnings

import array_api_compat
import numpy as np
import pytest
from scipy.special import expit, logsumexp, softmax

import tiltlab
from tiltlab import TiltedObjective
from tiltlab._compat import device, to_numpy
from tiltlab.losses import CallableLoss, FairPCALoss, get_loss
from tiltlab.testing import assert_close, assert_namespace

LOSSES = ["squared", "absolute", "huber", "logistic", "hinge", "squared_hinge", "multinomial"]
K = 3  # classes of the multinomial problems
H_FD = 1e-6  # finite-difference step

# (t, l2, with a non-uniform prior): every tilt of the brief, with and without l2 and prior
SAMPLE_CASES = [
    (-3.0, 0.0, False),
    (-0.5, 0.2, True),
    (0.0, 0.2, False),
    (0.0, 0.0, True),
    (0.7, 0.0, True),
    (4.0, 0.2, False),
]
TWO_LEVEL_TILTS = [(0.0, 0.0), (2.0, -1.0), (-1.5, 0.0), (0.0, 3.0), (-2.0, -0.5), (1.0, 1.0)]
THREE_LEVEL_TILTS = [(1.0, -2.0, 0.5), (0.0, 2.0, -1.0), (-1.0, 0.0, 3.0)]


# ----------------------------------------------------------------------------------------
# problems (NumPy, float64), built so that no sample sits near a kink
# ----------------------------------------------------------------------------------------


def _problem(name: str, n: int = 15, d: int = 3, seed: int = 0):
    """(X, y, theta) with every sample at least 0.15 away from its loss's kink."""
    rng = np.random.default_rng(seed)
    if name == "multinomial":
        X = rng.normal(size=(n, d))
        theta = 0.8 * rng.normal(size=(d, K))
        y = rng.integers(0, K, size=n)
        y[:K] = np.arange(K)  # every class present: K = max(y) + 1
        return X, y, theta
    theta = 0.7 * rng.normal(size=d)
    if name in ("hinge", "squared_hinge"):
        theta = 2.0 * theta  # margins of both signs
        X = rng.normal(size=(8 * n, d))
        y = rng.integers(0, 2, size=8 * n)
        m = 1.0 - (2.0 * y - 1.0) * (X @ theta)
        keep = np.flatnonzero(np.abs(m) > 0.15)
        active = keep[m[keep] > 0][: n // 2 + 2]  # margin violated: non-zero loss
        rest = keep[m[keep] < 0][: n - active.size]
        idx = np.concatenate([active, rest])
        assert idx.size == n
        return X[idx], y[idx], theta
    X = rng.normal(size=(n, d))
    z = X @ theta
    sign = rng.choice([-1.0, 1.0], size=n)
    if name == "squared":
        y = z + 1.2 * rng.normal(size=n)
    elif name == "absolute":
        y = z - sign * rng.uniform(0.2, 2.0, size=n)
    elif name == "huber":  # delta = 1: residuals in the quadratic or in the linear part
        mag = np.where(rng.random(n) < 0.5, rng.uniform(0.1, 0.8, n), rng.uniform(1.2, 3.0, n))
        y = z - sign * mag
    elif name == "logistic":
        y = rng.integers(0, 2, size=n)
    else:  # pragma: no cover
        raise ValueError(name)
    return X, y, theta


def _prior(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.2, 1.0, size=n)


def _to(xp, a, dtype=None):
    a = np.asarray(a)
    if dtype is None:
        dtype = xp.float64 if a.dtype.kind == "f" else xp.int64
    return xp.asarray(a, dtype=dtype)


def _num(x) -> np.ndarray:
    return np.asarray(to_numpy(x), dtype=np.float64)


def _fd_grad(f, theta: np.ndarray, h: float = H_FD) -> np.ndarray:
    """Central differences of a scalar function of a NumPy array (any shape)."""
    flat = theta.reshape(-1)
    out = np.empty(flat.size)
    for j in range(flat.size):
        e = np.zeros_like(flat)
        e[j] = h
        out[j] = (f((flat + e).reshape(theta.shape)) - f((flat - e).reshape(theta.shape))) / (2 * h)
    return out.reshape(theta.shape)


def _fd_jac(g, theta: np.ndarray, h: float = H_FD) -> np.ndarray:
    """Central differences of a vector function: column j = d g / d theta_j (flat)."""
    flat = theta.reshape(-1)
    cols = []
    for j in range(flat.size):
        e = np.zeros_like(flat)
        e[j] = h
        gp = g((flat + e).reshape(theta.shape)).reshape(-1)
        gm = g((flat - e).reshape(theta.shape)).reshape(-1)
        cols.append((gp - gm) / (2 * h))
    return np.stack(cols, axis=1)


def _fd_dir(g, theta: np.ndarray, v: np.ndarray, h: float = H_FD) -> np.ndarray:
    """Central difference of a vector function along a direction ``v``."""
    return (g(theta + h * v) - g(theta - h * v)) / (2 * h)


def _scale(a: np.ndarray) -> float:
    return max(1.0, float(np.max(np.abs(a))))


def _backend(xp) -> str:
    return xp.__name__.replace("array_api_compat.", "")


#: backends on which the derivatives are checked along random directions instead of
#: coordinate by coordinate (array_api_strict is slow per call, every Dask call computes a
#: graph); NumPy and PyTorch get the full finite-difference Jacobians
DIRECTIONAL = ("array_api_strict", "dask.array")


def _is_dask(xp) -> bool:
    return _backend(xp) == "dask.array"


def _check_derivatives(xp, obj, theta_np, *, hessian: bool = True):
    """gradient vs FD of value; hessian vs FD of gradient; hvp == hessian @ v."""
    th = _to(xp, theta_np)

    def f(a):
        return float(_num(obj.value(_to(xp, a))))

    def g(a):
        return _num(obj.gradient(_to(xp, a)))

    val, grad = obj.value_and_gradient(th)
    assert_close(val, f(theta_np), xp=xp, dtype=xp.float64, rtol=1e-14, atol=1e-14)
    assert_close(obj.gradient(th), _num(grad), xp=xp, dtype=xp.float64, rtol=1e-14, atol=1e-14)
    assert tuple(grad.shape) == theta_np.shape
    rng = np.random.default_rng(5)
    dirs = [rng.normal(size=theta_np.shape) for _ in range(1 if _is_dask(xp) else 2)]
    full = _backend(xp) not in DIRECTIONAL
    if full:
        fd = _fd_grad(f, theta_np)
        assert_close(grad, fd, xp=xp, dtype=xp.float64, rtol=1e-6, atol=1e-7 * _scale(fd))
    else:
        for v in dirs:  # d/dh F(theta + h v) = grad . v
            fd = (f(theta_np + H_FD * v) - f(theta_np - H_FD * v)) / (2 * H_FD)
            want = float(np.sum(_num(grad) * v))
            assert abs(want - fd) <= 1e-6 * abs(fd) + 1e-7 * _scale(_num(grad)) * _scale(v)
    if not hessian:
        return
    H = obj.hessian(th)
    p = theta_np.size
    assert tuple(H.shape) == (p, p)
    if full:
        fdH = _fd_jac(g, theta_np)
        assert_close(H, fdH, xp=xp, dtype=xp.float64, rtol=1e-5, atol=1e-6 * _scale(fdH))
    for v in dirs:
        Hv = obj.hvp(th, _to(xp, v))
        assert tuple(Hv.shape) == theta_np.shape
        want = (_num(H) @ v.reshape(-1)).reshape(theta_np.shape)
        assert_close(Hv, want, xp=xp, dtype=xp.float64, rtol=1e-10, atol=1e-12 * _scale(want))
        if not full:
            fdv = _fd_dir(g, theta_np, v)
            assert_close(Hv, fdv, xp=xp, rtol=1e-5, atol=1e-6 * _scale(fdv))


def _dask_subset(xp, keep: bool) -> None:
    """Dask runs a representative subset: every call builds and computes a task graph."""
    if _is_dask(xp) and not keep:
        pytest.skip("dask: representative subset only (each call computes a graph, ~0.1 s)")


def _loss_obj(name, xp, X, y, **kw):
    loss = get_loss("huber", delta=1.0) if name == "huber" else name
    return TiltedObjective(loss, _to(xp, X), _to(xp, y), **kw)


# ----------------------------------------------------------------------------------------
# sample level: every loss, every tilt
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("t, l2, with_prior", SAMPLE_CASES)
@pytest.mark.parametrize("name", LOSSES)
def test_sample_level_derivatives_and_value(xp, name, t, l2, with_prior):
    _dask_subset(xp, name == "logistic" and t == -0.5)
    X, y, theta = _problem(name)
    p = _prior(X.shape[0]) if with_prior else None
    kw = {"weights": _to(xp, p)} if with_prior else {}
    obj = _loss_obj(name, xp, X, y, t=t, l2=l2, **kw)
    assert obj.shape == theta.shape
    _check_derivatives(xp, obj, theta)

    th = _to(xp, theta)
    ell = obj.losses(th)
    want = tiltlab.tilted_risk(ell, t, **kw) + 0.5 * l2 * float(np.sum(theta**2))
    assert_close(obj.value(th), _num(want), xp=xp, dtype=xp.float64, rtol=1e-13)
    assert_close(
        obj.weights(th), tiltlab.tilted_weights(ell, t, **kw), xp=xp, dtype=xp.float64, rtol=1e-13
    )


@pytest.mark.parametrize("name", ["squared", "logistic", "multinomial"])
def test_flat_theta_and_flat_v_accepted(xp, name):
    _dask_subset(xp, name == "multinomial")
    X, y, theta = _problem(name)
    obj = _loss_obj(name, xp, X, y, t=1.5)
    th, flat = _to(xp, theta), _to(xp, theta.reshape(-1))
    assert_close(obj.value(flat), _num(obj.value(th)), xp=xp, rtol=1e-15)
    assert tuple(obj.gradient(flat).shape) == (theta.size,)
    assert_close(obj.gradient(flat), _num(obj.gradient(th)).reshape(-1), xp=xp, rtol=1e-15)
    v = np.ones(theta.shape)
    assert_close(
        obj.hvp(flat, _to(xp, v.reshape(-1))),
        _num(obj.hvp(th, _to(xp, v))).reshape(-1),
        xp=xp,
        rtol=1e-14,
    )


def test_infinite_tilt_value_and_gradient(xp):
    X, y, theta = _problem("squared")
    for t in (np.inf, -np.inf):
        obj = _loss_obj("squared", xp, X, y, t=t)
        ell = (X @ theta - y) ** 2
        k = int(np.argmax(ell) if t > 0 else np.argmin(ell))
        assert_close(obj.value(_to(xp, theta)), ell[k], xp=xp, rtol=1e-14)
        assert_close(obj.gradient(_to(xp, theta)), 2 * (X[k] @ theta - y[k]) * X[k], xp=xp)
        with pytest.raises(ValueError, match="infinite tilt"):
            obj.hvp(_to(xp, theta), _to(xp, theta))


def test_infinite_tilt_hessian_raises_cleanly():
    X, y, _ = _problem("squared")
    obj = TiltedObjective("squared", X, y, t=np.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="infinite tilt"):
            obj.hessian(np.zeros(X.shape[1]))


# ----------------------------------------------------------------------------------------
# hierarchies
# ----------------------------------------------------------------------------------------


def _two_level_groups(n: int = 15) -> np.ndarray:
    # uneven sizes 1, 2, 4, 8 with arbitrary labels, shuffled
    labels = np.repeat([7, 3, 11, 5], [1, 2, 4, 8])
    return np.random.default_rng(3).permutation(labels)[:n]


def _three_level_groups(n: int = 15) -> list[np.ndarray]:
    # inner groups of sizes 1..5, nested in two outer groups {0, 1} (3 samples), {2, 3, 4}
    inner = np.repeat([10, 20, 30, 40, 50], [1, 2, 3, 4, 5])
    outer = np.where(inner <= 20, 1, 2)
    perm = np.random.default_rng(4).permutation(n)
    return [outer[perm], inner[perm]]


def _hier_case(xp, name, depth, tilts, l2=0.0, with_prior=False):
    X, y, theta = _problem(name)
    groups_np = [_two_level_groups()] if depth == 2 else _three_level_groups()
    groups = [_to(xp, g) for g in groups_np]
    groups = groups[0] if depth == 2 else groups
    p = _prior(X.shape[0]) if with_prior else None
    kw = {"weights": _to(xp, p)} if with_prior else {}
    obj = _loss_obj(name, xp, X, y, groups=groups, tilts=tilts, l2=l2, **kw)
    return obj, theta, groups, kw


@pytest.mark.parametrize(
    "depth, tilts", [(2, t) for t in TWO_LEVEL_TILTS] + [(3, t) for t in THREE_LEVEL_TILTS]
)
@pytest.mark.parametrize("name", ["squared", "logistic", "multinomial"])
def test_hierarchical_derivatives_and_value(xp, name, depth, tilts):
    _dask_subset(xp, name == "logistic" and tilts == (1.0, -2.0, 0.5))
    l2 = 0.3 if tilts[0] == 0 else 0.0
    with_prior = tilts[-1] < 0
    obj, theta, groups, kw = _hier_case(xp, name, depth, tilts, l2=l2, with_prior=with_prior)
    assert obj.is_hierarchical and obj.tilts == tuple(tilts) and obj.t == tilts[0]
    _check_derivatives(xp, obj, theta)

    th = _to(xp, theta)
    ell = obj.losses(th)
    want = tiltlab.hierarchical_risk(ell, groups, tilts, **kw)
    want = _num(want) + 0.5 * l2 * float(np.sum(theta**2))
    assert_close(obj.value(th), want, xp=xp, dtype=xp.float64, rtol=1e-13)
    assert_close(
        obj.weights(th),
        tiltlab.hierarchical_weights(ell, groups, tilts, **kw),
        xp=xp,
        dtype=xp.float64,
        rtol=1e-13,
    )


@pytest.mark.parametrize("t", [-2.0, 0.0, 1.5])
@pytest.mark.parametrize("name", ["squared", "logistic", "multinomial"])
def test_hierarchy_with_equal_tilts_is_sample_level(xp, name, t):
    _dask_subset(xp, False)
    # J(t, t) = R(t) (and (t, t, t) at depth 3): value, gradient and Hessian agree
    X, y, theta = _problem(name)
    flat = _loss_obj(name, xp, X, y, t=t)
    th = _to(xp, theta)
    for depth in (2, 3):
        hier, _, _, _ = _hier_case(xp, name, depth, (t,) * depth)
        assert_close(hier.value(th), _num(flat.value(th)), xp=xp, rtol=1e-13)
        assert_close(hier.gradient(th), _num(flat.gradient(th)), xp=xp, rtol=1e-11, atol=1e-13)
        assert_close(hier.hessian(th), _num(flat.hessian(th)), xp=xp, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------
# independent reference: explicit per-sample gradients and Hessians, tilted Hessian lemma
# ----------------------------------------------------------------------------------------


def _per_sample(name, X, y, theta):
    """Closed-form per-sample losses (N,), gradients (N, p) and Hessians (N, p, p)."""
    if name == "multinomial":
        Z = X @ theta
        S = softmax(Z, axis=1)
        E = np.eye(theta.shape[1])[y]
        ell = logsumexp(Z, axis=1) - Z[np.arange(len(y)), y]
        G = np.einsum("nj,nk->njk", X, S - E).reshape(len(y), -1)
        Sz = np.einsum("nk,kl->nkl", S, np.eye(theta.shape[1])) - np.einsum("nk,nl->nkl", S, S)
        H = np.stack([np.kron(np.outer(x, x), s) for x, s in zip(X, Sz, strict=True)])
        return ell, G, H
    z = X @ theta
    if name == "squared":
        ell, d1, d2 = (z - y) ** 2, 2 * (z - y), np.full_like(z, 2.0)
    elif name == "logistic":
        s = expit(z)
        ell, d1, d2 = np.logaddexp(0.0, z) - y * z, s - y, s * (1 - s)
    elif name == "huber":  # delta = 1
        r = z - y
        inside = np.abs(r) <= 1.0
        ell = np.where(inside, 0.5 * r**2, np.abs(r) - 0.5)
        d1, d2 = np.where(inside, r, np.sign(r)), inside.astype(float)
    else:  # pragma: no cover
        raise ValueError(name)
    return ell, d1[:, None] * X, d2[:, None, None] * X[:, :, None] * X[:, None, :]


def _tilted_node(values, grads, hessians, masses, tilt):
    """Tilt children (value, gradient, Hessian, prior mass) into their parent node.

    R = (1/t) log sum q_c exp(t R_c), v_c = q_c exp(t R_c) / sum (q = masses normalised),
    grad R = sum v_c G_c, hess R = sum v_c H_c + t sum v_c (G_c - G)(G_c - G)^T.
    """
    q = masses / masses.sum()
    if tilt == 0:
        v = q
        R = float(q @ values)
    else:
        a = tilt * values + np.log(q)
        v = np.exp(a - logsumexp(a))
        R = float(logsumexp(a) / tilt)
    G = v @ grads
    D = grads - G
    H = np.einsum("c,cij->ij", v, hessians) + tilt * (D.T * v) @ D
    return R, G, H, v


def _reference(name, X, y, theta, tilts, groups=(), prior=None, l2=0.0):
    """Value, gradient, Hessian and per-sample weights by recursion over the group tree."""
    ell, G, H = _per_sample(name, X, y, theta)
    n = len(y)
    p = np.full(n, 1.0 / n) if prior is None else prior / prior.sum()

    def node(idx, level):
        if level == len(groups):  # children are samples
            R, g, h, v = _tilted_node(ell[idx], G[idx], H[idx], p[idx], tilts[level])
            w = np.zeros(n)
            w[idx] = v
            return R, g, h, p[idx].sum(), w
        labels = groups[level][idx]
        kids = [node(idx[labels == lab], level + 1) for lab in np.unique(labels)]
        vals = np.array([k[0] for k in kids])
        R, g, h, v = _tilted_node(
            vals,
            np.stack([k[1] for k in kids]),
            np.stack([k[2] for k in kids]),
            np.array([k[3] for k in kids]),
            tilts[level],
        )
        w = sum(vc * k[4] for vc, k in zip(v, kids, strict=True))
        return R, g, h, p[idx].sum(), w

    R, g, h, _, w = node(np.arange(n), 0)
    th = theta.reshape(-1)
    return (
        R + 0.5 * l2 * th @ th,
        (g + l2 * th).reshape(theta.shape),
        h + l2 * np.eye(th.size),
        w,
    )


@pytest.mark.parametrize("t", [-3.0, -0.5, 0.0, 0.7, 4.0])
@pytest.mark.parametrize("name", ["squared", "logistic", "huber", "multinomial"])
def test_tilted_hessian_lemma_explicit(name, t):
    X, y, theta = _problem(name, n=20, d=4, seed=11)
    prior = _prior(20, seed=12)
    val, grad, hess, w = _reference(name, X, y, theta, [t], prior=prior, l2=0.1)
    obj = _loss_obj(name, np, X, y, t=t, weights=prior, l2=0.1)
    assert_close(obj.value(theta), val, rtol=1e-13)
    assert_close(obj.gradient(theta), grad, rtol=1e-11, atol=1e-13)
    assert_close(obj.hessian(theta), hess, rtol=1e-11, atol=1e-13)
    assert_close(obj.weights(theta), w, rtol=1e-12)
    v = np.random.default_rng(2).normal(size=theta.shape)
    assert_close(obj.hvp(theta, v), (hess @ v.reshape(-1)).reshape(theta.shape), rtol=1e-10)


@pytest.mark.parametrize(
    "depth, tilts", [(2, t) for t in TWO_LEVEL_TILTS] + [(3, t) for t in THREE_LEVEL_TILTS]
)
@pytest.mark.parametrize("name", ["squared", "logistic", "multinomial"])
def test_hierarchical_hessian_explicit(name, depth, tilts):
    X, y, theta = _problem(name)
    groups = [_two_level_groups()] if depth == 2 else _three_level_groups()
    prior = _prior(X.shape[0], seed=9)
    val, grad, hess, w = _reference(name, X, y, theta, list(tilts), groups, prior, l2=0.05)
    obj = _loss_obj(
        name,
        np,
        X,
        y,
        groups=groups if depth == 3 else groups[0],
        tilts=tilts,
        weights=prior,
        l2=0.05,
    )
    assert_close(obj.value(theta), val, rtol=1e-13)
    assert_close(obj.gradient(theta), grad, rtol=1e-11, atol=1e-13)
    assert_close(obj.hessian(theta), hess, rtol=1e-11, atol=1e-13)
    assert_close(obj.weights(theta), w, rtol=1e-12)
    v = np.random.default_rng(2).normal(size=theta.shape)
    assert_close(obj.hvp(theta, v), (hess @ v.reshape(-1)).reshape(theta.shape), rtol=1e-10)


@pytest.mark.parametrize("depth, tilts", [(2, (2.0, -1.0)), (3, THREE_LEVEL_TILTS[-1])])
@pytest.mark.parametrize("name", ["squared", "logistic"])
def test_hierarchical_hessian_on_every_backend(xp, name, depth, tilts):
    # the dense Hessian's group terms (one segment sum of the d columns per level) on
    # every array library against the explicit reference, in the input's namespace
    _dask_subset(xp, name == "logistic" and depth == 2)
    X, y, theta = _problem(name)
    groups = [_two_level_groups()] if depth == 2 else _three_level_groups()
    _, _, hess, _ = _reference(name, X, y, theta, list(tilts), groups, None, l2=0.05)
    obj = _loss_obj(
        name, xp, X, y, groups=groups if depth == 3 else groups[0], tilts=tilts, l2=0.05
    )
    H = obj.hessian(_to(xp, theta))
    assert_namespace(H, xp)
    assert_close(to_numpy(H), hess, rtol=1e-11, atol=1e-13)


# ----------------------------------------------------------------------------------------
# independent reference: torch autograd of the objective written in torch
# ----------------------------------------------------------------------------------------


def _torch_tilt(torch, values, logq, t):
    if t == 0:
        return torch.sum(torch.exp(logq) * values)
    return torch.logsumexp(t * values + logq, dim=0) / t


@pytest.mark.parametrize("case", ["t=-2", "t=0", "t=3", "groups(1.5,-1)", "groups(-1,0)"])
@pytest.mark.parametrize("name", ["squared", "logistic"])
def test_torch_autograd(name, case):
    torch = pytest.importorskip("torch")
    txp = array_api_compat.array_namespace(torch.zeros(1, dtype=torch.float64))
    X, y, theta = _problem(name, n=25, d=4, seed=21)
    prior = _prior(25, seed=22)
    l2 = 0.2
    Xt, yt = torch.tensor(X), torch.tensor(y, dtype=torch.float64)
    logp = torch.log(torch.tensor(prior / prior.sum()))

    def losses(th):
        z = Xt @ th
        if name == "squared":
            return (z - yt) ** 2
        return torch.nn.functional.softplus(z) - yt * z

    if case.startswith("t="):
        t = float(case[2:])
        kw = {"t": t}

        def objective(th):
            return _torch_tilt(torch, losses(th), logp, t) + 0.5 * l2 * torch.sum(th * th)

    else:
        tilts = tuple(float(s) for s in case[7:-1].split(","))
        labels = np.random.default_rng(23).permutation(np.repeat([0, 1, 2, 3], [2, 3, 7, 13]))
        kw = {"groups": torch.tensor(labels), "tilts": tilts}

        def objective(th):
            ell = losses(th)
            risks, masses = [], []
            for g in range(4):
                sel = torch.tensor(labels == g)
                lq = logp[sel] - torch.logsumexp(logp[sel], dim=0)
                risks.append(_torch_tilt(torch, ell[sel], lq, tilts[1]))
                masses.append(torch.logsumexp(logp[sel], dim=0))
            J = _torch_tilt(torch, torch.stack(risks), torch.stack(masses), tilts[0])
            return J + 0.5 * l2 * torch.sum(th * th)

    th = torch.tensor(theta, requires_grad=True)
    v = torch.tensor(np.random.default_rng(24).normal(size=theta.shape))
    F = objective(th)
    (g,) = torch.autograd.grad(F, th, create_graph=True)
    (hv,) = torch.autograd.grad(g @ v, th)

    obj = TiltedObjective(name, Xt, torch.tensor(y), weights=torch.tensor(prior), l2=l2, **kw)
    th0 = torch.tensor(theta)
    assert_close(obj.value(th0), F.detach().numpy(), xp=txp, dtype=torch.float64, rtol=1e-13)
    assert_close(obj.gradient(th0), g.detach().numpy(), xp=txp, rtol=1e-11, atol=1e-13)
    assert_close(obj.hvp(th0, v), hv.numpy(), xp=txp, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------
# non-linear losses (theta-space callables, fair PCA)
# ----------------------------------------------------------------------------------------


def _quartic_loss():
    """f_i = (x_i . theta - y_i)^4 / 4, written against the array API."""

    def fun(th, X, y):
        r = X @ th - y
        return 0.25 * r**4

    def grad(th, X, y):
        r = X @ th - y
        return (r**3)[:, None] * X

    def hess(th, X, y):
        r = X @ th - y
        return 3.0 * (r**2)[:, None, None] * (X[:, :, None] * X[:, None, :])

    return CallableLoss(fun, grad, hess, name="quartic", convex=True)


def _two_layer_loss(h: int, d: int):
    """f_i = (a . tanh(W x_i) - y_i)^2 / 2 with theta = [W.ravel(), a], in NumPy."""

    def parts(th, X):
        W, a = th[: h * d].reshape(h, d), th[h * d :]
        S = np.tanh(X @ W.T)  # (N, h)
        return W, a, S, S @ a

    def jac(a, S, X):  # d pred / d theta, (N, h*d + h)
        dW = (a * (1 - S**2))[:, :, None] * X[:, None, :]
        return np.concatenate([dW.reshape(len(X), -1), S], axis=1)

    def fun(th, X, y):
        _, _, _, pred = parts(th, X)
        return 0.5 * (pred - y) ** 2

    def grad(th, X, y):
        _, a, S, pred = parts(th, X)
        return (pred - y)[:, None] * jac(a, S, X)

    def hess(th, X, y):
        _, a, S, pred = parts(th, X)
        n, p = len(X), h * d + h
        J = jac(a, S, X)
        Hp = np.zeros((n, p, p))
        D = 1 - S**2
        for k in range(h):
            wk = slice(k * d, (k + 1) * d)
            # d2 pred / dW_k dW_k = a_k * (-2 s_k (1 - s_k^2)) x x^T
            c = a[k] * (-2.0 * S[:, k] * D[:, k])
            Hp[:, wk, wk] = c[:, None, None] * X[:, :, None] * X[:, None, :]
            # d2 pred / dW_k da_k = (1 - s_k^2) x
            Hp[:, wk, h * d + k] = D[:, k][:, None] * X
            Hp[:, h * d + k, wk] = D[:, k][:, None] * X
        return J[:, :, None] * J[:, None, :] + (pred - y)[:, None, None] * Hp

    return CallableLoss(fun, grad, hess, name="two_layer")


def _check_nonlinear(xp, obj, theta_np, twin=None):
    """gradient vs FD of value, hvp vs FD of gradient along a direction. The differences
    are taken of ``twin`` (the same objective on NumPy arrays) where given: on Dask each
    evaluation computes a task graph, and a difference quotient needs two per entry."""
    th = _to(xp, theta_np)
    fd_obj, fd_xp = (obj, xp) if twin is None else (twin, np)

    def f(a):
        return float(_num(fd_obj.value(_to(fd_xp, a))))

    def g(a):
        return _num(fd_obj.gradient(_to(fd_xp, a)))

    fd = _fd_grad(f, theta_np)
    assert_close(obj.gradient(th), fd, xp=xp, dtype=xp.float64, rtol=1e-6, atol=1e-7 * _scale(fd))
    rng = np.random.default_rng(6)
    for _ in range(2):
        v = rng.normal(size=theta_np.shape)
        want = _fd_dir(g, theta_np, v)
        assert_close(
            obj.hvp(th, _to(xp, v)),
            want,
            xp=xp,
            dtype=xp.float64,
            rtol=1e-5,
            atol=1e-6 * _scale(want),
        )


@pytest.mark.parametrize("t", [-3.0, 0.0, 2.0])
def test_callable_quartic(xp, t):
    _dask_subset(xp, t == -3.0)
    rng = np.random.default_rng(30)
    X, y = rng.normal(size=(12, 3)), rng.normal(size=12)
    theta = 0.5 * rng.normal(size=3)
    obj = TiltedObjective(_quartic_loss(), _to(xp, X), _to(xp, y), t=t, l2=0.1)
    twin = TiltedObjective(_quartic_loss(), X, y, t=t, l2=0.1) if _is_dask(xp) else None
    _check_nonlinear(xp, obj, theta, twin)
    ell = 0.25 * (X @ theta - y) ** 4
    want = float(tiltlab.tilted_risk(ell, t)) + 0.05 * theta @ theta
    assert_close(obj.value(_to(xp, theta)), want, xp=xp, rtol=1e-13)


def test_callable_shape_known_after_evaluation():
    rng = np.random.default_rng(30)
    X, y = rng.normal(size=(12, 3)), rng.normal(size=12)
    obj = TiltedObjective(_quartic_loss(), X, y, t=1.0)
    obj.value(np.zeros(3))
    assert obj.n_samples == 12 and obj.n_features == 3 and obj.shape == (3,)


@pytest.mark.parametrize("tilts", [None, (1.0, -2.0)])
@pytest.mark.parametrize("t", [-1.0, 0.0, 3.0])
def test_callable_two_layer_network(t, tilts):
    h, d, n = 2, 3, 14
    rng = np.random.default_rng(31)
    X, y = rng.normal(size=(n, d)), rng.normal(size=n)
    theta = rng.normal(size=h * d + h)
    kw = {"t": t} if tilts is None else {"groups": _two_level_groups(n), "tilts": (t, tilts[1])}
    obj = TiltedObjective(_two_layer_loss(h, d), X, y, **kw)
    _check_nonlinear(np, obj, theta)
    # the generic Hessian (columns of hvp) against finite differences of the gradient
    fdH = _fd_jac(obj.gradient, theta)
    assert_close(obj.hessian(theta), 0.5 * (fdH + fdH.T), rtol=1e-5, atol=1e-6 * _scale(fdH))


@pytest.mark.parametrize("t", [-2.0, 0.0, 3.0])
def test_fair_pca_objective(xp, t):
    _dask_subset(xp, t == 3.0)
    rng = np.random.default_rng(32)
    d, k = 4, 2
    data = [rng.normal(size=(m, d)) * s for m, s in [(6, 1.0), (9, 0.5), (13, 1.5)]]
    loss = FairPCALoss([_to(xp, a) for a in data], k)
    obj = TiltedObjective(loss, t=t, xp=xp)
    theta = np.linalg.qr(rng.normal(size=(d, k)))[0].reshape(-1) + 0.1 * rng.normal(size=d * k)
    twin = TiltedObjective(FairPCALoss(data, k), t=t) if _is_dask(xp) else None
    _check_nonlinear(xp, obj, theta, twin)
    # value = tilted risk of the per-group losses, computed here from the definition
    U = theta.reshape(d, k)
    ell = []
    for a in data:
        tail = np.sum(np.linalg.svd(a, compute_uv=False)[k:] ** 2)
        ell.append((np.sum((a - a @ U @ U.T) ** 2) - tail) / a.shape[0])
    want = tiltlab.tilted_risk(np.array(ell), t)
    assert_close(obj.value(_to(xp, theta)), want, xp=xp, rtol=1e-11)


def test_fair_pca_namespace_inferred_from_loss():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(33)
    loss = FairPCALoss([torch.tensor(rng.normal(size=(5, 3))) for _ in range(2)], 1)
    obj = TiltedObjective(loss, t=1.0)
    out = obj.value(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert isinstance(out, torch.Tensor)


# ----------------------------------------------------------------------------------------
# tilt changes, pass counting
# ----------------------------------------------------------------------------------------


def test_with_tilt_and_setters(xp):
    X, y, theta = _problem("logistic")
    obj = _loss_obj("logistic", xp, X, y, t=-1.0, l2=0.1)
    th = _to(xp, theta)
    v0 = float(_num(obj.value(th)))
    new = obj.with_tilt(2.0)
    assert new.X is obj.X and new.y is obj.y
    assert obj.t == -1.0 and new.t == 2.0 and new.l2 == 0.1
    v_new = float(_num(new.value(th)))
    assert v_new > v0  # the tilted risk increases with t (strictly: the losses differ)
    want = float(_num(_loss_obj("logistic", xp, X, y, t=2.0, l2=0.1).value(th)))
    assert_close(new.value(th), want, xp=xp, rtol=1e-15)
    assert_close(obj.value(th), v0, xp=xp, rtol=1e-15)  # the original is untouched
    obj.t = 2.0
    assert_close(obj.value(th), want, xp=xp, rtol=1e-15)
    assert_close(obj.gradient(th), _num(new.gradient(th)), xp=xp, rtol=1e-15)


def test_with_tilt_hierarchical(xp):
    _dask_subset(xp, False)
    obj, theta, groups, _ = _hier_case(xp, "squared", 3, (1.0, -2.0, 0.5))
    th = _to(xp, theta)
    v0 = float(_num(obj.value(th)))
    new = obj.with_tilt(tilts=(0.0, 1.0, 1.0))
    assert new.X is obj.X and new.tree is obj.tree
    assert new.tilts == (0.0, 1.0, 1.0) and obj.tilts == (1.0, -2.0, 0.5)
    ell = obj.losses(th)
    want = tiltlab.hierarchical_risk(ell, groups, (0.0, 1.0, 1.0))
    assert_close(new.value(th), _num(want), xp=xp, rtol=1e-13)
    assert_close(obj.value(th), v0, xp=xp, rtol=1e-15)
    obj.t = -1.0  # the outermost tilt
    assert obj.tilts == (-1.0, -2.0, 0.5)
    want = tiltlab.hierarchical_risk(ell, groups, (-1.0, -2.0, 0.5))
    assert_close(obj.value(th), _num(want), xp=xp, rtol=1e-13)
    obj.tilts = (2.0, 2.0, 2.0)
    assert_close(obj.value(th), _num(tiltlab.tilted_risk(ell, 2.0)), xp=xp, rtol=1e-13)
    with pytest.raises(ValueError, match="`tilts` must have 3 entries"):
        obj.tilts = (1.0, 2.0)


@pytest.mark.parametrize("name", ["squared", "multinomial"])
def test_n_passes(xp, name):
    X, y, theta = _problem(name)
    obj = _loss_obj(name, xp, X, y, t=-2.0)
    th = _to(xp, theta)
    # the one-pass engine reads X once per gradient (on Dask: one graph, tiltlab.distributed)
    per_grad = 1
    assert obj.n_passes == 0
    obj.value(th)
    assert obj.n_passes == 1
    obj.value_and_gradient(th)
    assert obj.n_passes == 1 + per_grad
    obj.gradient(th)
    assert obj.n_passes == 1 + 2 * per_grad
    obj.losses(th)
    assert obj.n_passes == 2 + 2 * per_grad
    assert obj.with_tilt(1.0).n_passes == 0
    # hierarchical objectives: one pass for the predictor, one for X^T c
    g = np.arange(X.shape[0]) % 3
    hobj = TiltedObjective(name, _to(xp, X), _to(xp, y), groups=g, tilts=(1.0, -1.0))
    hobj.value_and_gradient(th)
    # Dask: one graph per evaluation reads X once (tiltlab.distributed)
    assert hobj.n_passes == (1 if xp.__name__.endswith("dask.array") else 2)


def test_hvp_one_pass():
    X, y, theta = _problem("logistic")
    obj = TiltedObjective("logistic", X, y, t=-2.0)
    obj.hvp(theta, np.ones_like(theta))
    assert obj.n_passes == 1
    hobj = TiltedObjective("logistic", X, y, groups=np.arange(X.shape[0]) % 2, tilts=(1.0, 2.0))
    hobj.hvp(theta, np.ones_like(theta))
    assert hobj.n_passes == 2


# ----------------------------------------------------------------------------------------
# dtype, namespace, device
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("groups", [False, True])
@pytest.mark.parametrize("name", ["squared", "logistic", "multinomial"])
def test_float32_kept(xp, name, groups):
    _dask_subset(xp, name == "squared" and not groups)
    X, y, theta = _problem(name)
    y32 = _to(xp, y, xp.float32) if name == "squared" else _to(xp, y)
    X32 = _to(xp, X, xp.float32)
    kw = {"groups": _to(xp, _two_level_groups()), "tilts": (1.0, -0.5)} if groups else {"t": -1}
    obj = TiltedObjective(name, X32, y32, l2=0.1, **kw)
    ref = _loss_obj(
        name,
        np,
        X.astype(np.float32).astype(np.float64),
        y,
        l2=0.1,
        **{k: (to_numpy(v) if k == "groups" else v) for k, v in kw.items()},
    )
    dev = device(X32)
    th32 = _to(xp, theta, xp.float32)
    v32 = _to(xp, np.ones(theta.shape), xp.float32)
    th = theta.astype(np.float32).astype(np.float64)
    results = {
        "value": (obj.value(th32), ref.value(th)),
        "gradient": (obj.gradient(th32), ref.gradient(th)),
        "hvp": (obj.hvp(th32, v32), ref.hvp(th, np.ones(theta.shape))),
        "hessian": (obj.hessian(th32), ref.hessian(th)),
        "weights": (obj.weights(th32), ref.weights(th)),
        "losses": (obj.losses(th32), ref.losses(th)),
    }
    for key, (got, want) in results.items():
        assert_namespace(got, xp, dtype=xp.float32, dev=dev)
        assert_close(
            got, want, xp=xp, dtype=xp.float32, rtol=2e-4, atol=1e-5 * _scale(want), err_msg=key
        )
    # a float64 theta is computed in the objective's dtype
    assert_namespace(obj.gradient(_to(xp, theta)), xp, dtype=xp.float32, dev=dev)


def test_integer_X_promoted(xp):
    X = np.arange(12).reshape(6, 2) % 4
    y = np.linspace(-1, 1, 6)
    obj = TiltedObjective("squared", _to(xp, X, xp.int64), _to(xp, y), t=0.5)
    g = obj.gradient(_to(xp, np.array([0.1, -0.2])))
    assert_namespace(g, xp, dtype=xp.float64)


# ----------------------------------------------------------------------------------------
# extreme predictors
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [-3.0, 0.0, 4.0])
def test_logistic_extreme_predictors(xp, t):
    _dask_subset(xp, t == 4.0)
    rng = np.random.default_rng(40)
    X = 1e4 * rng.normal(size=(20, 3))
    y = rng.integers(0, 2, size=20)
    theta = np.array([0.5, -0.3, 0.8])
    z = X @ theta
    assert np.min(np.abs(z)) > 100 and np.max(np.abs(z)) > 1e4
    obj = TiltedObjective("logistic", _to(xp, X), _to(xp, y), t=t)
    th = _to(xp, theta)
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        val, grad = obj.value_and_gradient(th)
        hv = obj.hvp(th, _to(xp, np.ones(3)))
        w = obj.weights(th)
    for a in (val, grad, hv, w):
        assert np.all(np.isfinite(_num(a)))
    ell = np.logaddexp(0.0, z) - y * z  # exact here: |z| > 100
    assert_close(val, float(tiltlab.tilted_risk(ell, t)), xp=xp, rtol=1e-13)
    d1 = expit(z) - y
    wt = np.asarray(tiltlab.tilted_weights(ell, t))
    assert_close(grad, X.T @ (wt * d1), xp=xp, rtol=1e-10, atol=1e-10 * _scale(X.T @ (wt * d1)))


# ----------------------------------------------------------------------------------------
# memory of the linear-predictor gradient
# ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gradient_memory_linear_path():
    # 2e6 x 20 float64 = 320 MB; the gradient may allocate less than half of that (N-vectors
    # only, never an N x d temporary). Runs in ~2 s (1.5 s of it drawing X).
    n, d = 2_000_000, 20
    rng = np.random.default_rng(50)
    X = rng.standard_normal(size=(n, d))
    y = rng.standard_normal(size=n)
    obj = TiltedObjective("squared", X, y, t=-2.0)
    theta = 0.1 * rng.standard_normal(size=d)
    obj.gradient(theta)  # warm-up (lazy caches, first-call allocations)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        g = obj.gradient(theta)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert g.shape == (d,)
    assert peak < X.nbytes / 2, f"peak {peak / 1e6:.0f} MB for X of {X.nbytes / 1e6:.0f} MB"


# ----------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------


def _bad_cases():
    rng = np.random.default_rng(60)
    X, y = rng.normal(size=(6, 3)), rng.normal(size=6)
    g = np.array([0, 0, 1, 1, 1, 2])
    Xnan = X.copy()
    Xnan[1, 1] = np.nan
    return [
        ("X-1d", dict(X=X[0], y=y[:3]), ValueError, r"`X` must be 2-d"),
        ("X-3d", dict(X=X[None], y=y), ValueError, r"`X` must be 2-d"),
        ("X-empty", dict(X=X[:, :0], y=y), ValueError, r"`X` must not be empty"),
        ("X-nan", dict(X=Xnan, y=y), ValueError, r"`X` contains NaN"),
        ("X-complex", dict(X=X.astype(complex), y=y), TypeError, r"`X`"),
        ("y-length", dict(X=X, y=y[:5]), ValueError, r"`y` has 5 entries but `X` has 6"),
        ("y-missing", dict(X=X, y=None), ValueError, r"needs `X` and `y`"),
        (
            "tilts-no-groups",
            dict(X=X, y=y, tilts=(1.0, 2.0)),
            ValueError,
            r"`tilts` needs `groups`",
        ),
        (
            "groups-no-tilts",
            dict(X=X, y=y, groups=g),
            ValueError,
            r"`tilts` is required with `groups`",
        ),
        (
            "tilt-count-2",
            dict(X=X, y=y, groups=g, tilts=(1.0, 2.0, 3.0)),
            ValueError,
            r"`tilts` must have 2 entries",
        ),
        (
            "tilt-count-3",
            dict(X=X, y=y, groups=[g, g], tilts=(1.0, 2.0)),
            ValueError,
            r"`tilts` must have 3 entries",
        ),
        ("groups-length", dict(X=X, y=y, groups=g[:5], tilts=(1.0, 2.0)), ValueError, r"`groups`"),
        ("l2-negative", dict(X=X, y=y, l2=-0.1), ValueError, r"`l2` must be a finite non-negative"),
        ("l2-nan", dict(X=X, y=y, l2=np.nan), ValueError, r"`l2`"),
        ("weights-length", dict(X=X, y=y, weights=np.ones(5)), ValueError, r"`weights`"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_constructor_input(case):
    _, kw, exc, match = case
    X, y = kw.pop("X"), kw.pop("y")
    with pytest.raises(exc, match=match):
        TiltedObjective("squared", X, y, **kw)


def test_bad_labels_and_mixed_backends():
    X = np.ones((4, 2))
    with pytest.raises(ValueError, match=r"`y` must hold binary labels"):
        TiltedObjective("logistic", X, np.array([0.0, 1.0, 2.0, 1.0]))
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"`X` and `y` come from two different"):
        TiltedObjective("squared", X, torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("name", ["squared", "multinomial"])
def test_bad_theta_shape(xp, name):
    X, y, theta = _problem(name)
    obj = _loss_obj(name, xp, X, y, t=1.0)
    bad = _to(xp, np.zeros(theta.size + 1))
    for method in (obj.value, obj.gradient, obj.value_and_gradient, obj.hessian, obj.losses):
        with pytest.raises(ValueError, match=r"`theta` must have shape"):
            method(bad)
    with pytest.raises(ValueError, match=r"`theta` must have shape"):
        obj.hvp(bad, _to(xp, theta))
    with pytest.raises(ValueError, match=r"`v` must have shape"):
        obj.hvp(_to(xp, theta), bad)
    if name == "squared":
        with pytest.raises(ValueError, match=r"`theta` must have shape"):
            obj.value(_to(xp, theta[:, None]))


def test_nan_tilt_names_t():
    with pytest.raises(ValueError, match=r"`t`"):
        TiltedObjective("squared", np.ones((3, 2)), np.ones(3), t=np.nan)

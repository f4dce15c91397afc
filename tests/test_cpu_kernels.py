"""The fused CPU kernels (numba) against independent NumPy references and the generic path.

References: the tilted risk as ``logsumexp`` of ``t * l`` (scipy) or, at ``|t| = 1e-8``,
its cumulant series ``mean + t var / 2 + t^2 k3 / 6`` (no ``1/t`` amplification of
rounding); the weights as an explicit softmax; gradients ``X^T (w l')``; dense Hessians
from the tilted Hessian lemma (per-sample Kronecker products for the multinomial loss);
central finite differences; and ``TiltedObjective`` (the generic array-API path).
Float32 results are compared with float64 references computed from the same float32 data.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import scipy.special as sps

from tiltlab import TiltedObjective
from tiltlab import _cpu_kernels as ck

numba = pytest.importorskip("numba", reason="the fused CPU kernels need numba")

SCALAR_LOSSES = ["squared", "absolute", "huber", "logistic", "hinge", "squared_hinge"]
ALL_LOSSES = SCALAR_LOSSES + ["multinomial"]
TILTS = [0.0, 1e-8, -1e-8, 2.0, -2.0, 50.0, -50.0]
DTYPES = [np.float64, np.float32]
K = 3
DELTA = 0.7


# ---------------------------------------------------------------------------------------
# independent references (float64)


def _derivs(loss, z, y):
    """Per-sample value, l', and l'' (softmax rows for the multinomial loss)."""
    if loss == "squared":
        r = z - y
        return r**2, 2 * r, np.full_like(r, 2.0)
    if loss == "absolute":
        r = z - y
        return np.abs(r), np.sign(r), np.zeros_like(r)
    if loss == "huber":
        r = z - y
        inside = np.abs(r) <= DELTA
        v = np.where(inside, 0.5 * r**2, DELTA * (np.abs(r) - 0.5 * DELTA))
        return v, np.where(inside, r, DELTA * np.sign(r)), inside.astype(float)
    if loss == "logistic":
        s = sps.expit(z)
        return np.logaddexp(0.0, z) - y * z, s - y, s * (1 - s)
    if loss in ("hinge", "squared_hinge"):
        sgn = 2 * y - 1
        m = 1 - sgn * z
        if loss == "hinge":
            return np.maximum(m, 0), np.where(m > 0, -sgn, 0.0), np.zeros_like(m)
        h = np.maximum(m, 0)
        return h**2, -2 * sgn * h, np.where(m > 0, 2.0, 0.0)
    lab = y.astype(int)
    s = sps.softmax(z, axis=1)
    value = sps.logsumexp(z, axis=1) - z[np.arange(len(lab)), lab]
    onehot = np.eye(z.shape[1])[lab]
    return value, s - onehot, s


def _risk(ell, t, p):
    p = p / p.sum()
    if t == 0.0:
        return float(p @ ell)
    if abs(t) < 1e-6:  # cumulant series: mean + t var / 2 + t^2 k3 / 6
        m = p @ ell
        var = p @ (ell - m) ** 2
        k3 = p @ (ell - m) ** 3
        return float(m + t * var / 2 + t * t * k3 / 6)
    return float(sps.logsumexp(t * ell, b=p) / t)


def _weights(ell, t, p):
    p = p / p.sum()
    on = p > 0
    logits = np.where(on, t * ell + np.log(np.where(on, p, 1.0)), -np.inf)
    return sps.softmax(logits)


def reference(loss, X, y, theta, t, p):
    """Value, gradient, dense Hessian of the tilted data term (float64), and the sizes of
    the terms summed into the gradient and the Hessian (|terms|, the scale of rounding:
    at t = +-50 the tilted covariance nearly cancels)."""
    X = X.astype(np.float64)
    theta = theta.astype(np.float64)
    z = X @ theta
    ell, d1, d2 = _derivs(loss, z, y.astype(np.float64))
    w = _weights(ell, t, p)
    value = _risk(ell, t, p)
    if loss == "multinomial":
        n, d = X.shape
        k = theta.shape[1]
        gi = (X[:, :, None] * d1[:, None, :]).reshape(n, d * k)  # per-sample gradients
        g = w @ gi
        H = np.zeros((d * k, d * k))
        Habs = np.zeros((d * k, d * k))
        for i in range(n):
            hz = np.diag(d2[i]) - np.outer(d2[i], d2[i])
            Hi = np.kron(np.outer(X[i], X[i]), hz)
            H += w[i] * Hi
            Habs += w[i] * np.abs(Hi)
        H += t * ((gi * w[:, None]).T @ gi - np.outer(g, g))
        Habs += abs(t) * ((np.abs(gi) * w[:, None]).T @ np.abs(gi) + np.outer(abs(g), abs(g)))
        gabs = w @ np.abs(gi)
        return value, g.reshape(d, k), H, gabs.reshape(d, k), Habs
    g = X.T @ (w * d1)
    H = X.T @ ((w * (d2 + t * d1**2))[:, None] * X) - t * np.outer(g, g)
    A = np.abs(X)
    Habs = A.T @ ((w * (np.abs(d2) + abs(t) * d1**2))[:, None] * A) + abs(t) * np.outer(
        abs(g), abs(g)
    )
    return value, g, H, A.T @ (w * np.abs(d1)), Habs


def problem(loss, n=60, d=5, dtype=np.float64, seed=0, prior="zeros"):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    if loss == "multinomial":
        theta = (0.5 * rng.standard_normal((d, K))).astype(dtype)
        y = rng.integers(0, K, n)
    else:
        theta = (0.5 * rng.standard_normal(d)).astype(dtype)
        if loss in ("logistic", "hinge", "squared_hinge"):
            y = (rng.random(n) < 0.4).astype(np.float64)
        else:
            y = X.astype(np.float64) @ theta + rng.standard_normal(n)
    v = rng.standard_normal(theta.shape).astype(dtype)
    if prior == "zeros":
        p = rng.random(n) * (rng.random(n) < 0.7)
        p[0] = 1.0  # never all zero
    elif prior == "ones":
        p = None
    return X, y, theta, v, p


def _params(loss):
    return {"delta": DELTA} if loss == "huber" else None


def _close(actual, desired, rtol, atol_scale=None):
    """Relative agreement, with an absolute floor ``rtol * atol_scale`` (default: the
    largest entry of ``desired``; pass the size of the summed terms where they cancel)."""
    actual = np.asarray(actual, dtype=np.float64)
    desired = np.asarray(desired, dtype=np.float64)
    scale = np.max(np.abs(desired)) if atol_scale is None else float(np.max(atol_scale))
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=rtol * max(scale, 1e-300))


def _rtol(dtype):
    return 1e-10 if dtype == np.float64 else 2e-4


# ---------------------------------------------------------------------------------------
# value, gradient and Hessian-vector products against the references


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_value_gradient_hvp_against_reference(loss, dtype):
    X, y, theta, v, p = problem(loss, dtype=dtype)
    ones = np.ones(X.shape[0])
    for t in TILTS:
        for prior in (None, p):
            pr = ones if prior is None else prior
            R, g, H, gabs, Habs = reference(loss, X, y, theta, t, pr)
            vabs = np.abs(v.astype(np.float64)).ravel()
            kw = {"loss_params": _params(loss)}
            value, grad = ck.fused_value_and_gradient(loss, X, y, theta, t, prior, **kw)
            assert value.dtype == dtype and grad.dtype == dtype and grad.shape == theta.shape
            rtol = _rtol(dtype)
            _close(value, R, rtol, atol_scale=abs(R) + 1.0)
            _close(grad, g, rtol, gabs)
            _close(ck.fused_value(loss, X, y, theta, t, prior, **kw), R, rtol, abs(R) + 1.0)
            Hv = (H @ v.astype(np.float64).ravel()).reshape(theta.shape)
            hv = ck.fused_hvp(loss, X, y, theta, v, t, prior, **kw)
            assert hv.dtype == dtype and hv.shape == theta.shape
            _close(hv, Hv, 10 * rtol, Habs @ vabs)
            lin = ck.fused_linearize(loss, X, y, theta, t, prior, **kw)
            _close(lin.value, R, rtol, abs(R) + 1.0)
            _close(lin.gradient, g, rtol, gabs)
            _close(lin.hvp(v), Hv, 10 * rtol, Habs @ vabs)
            np.testing.assert_allclose(
                lin.weights,
                _weights(lin_losses(loss, X, y, theta), t, pr),
                rtol=1e-4 if dtype == np.float32 else 1e-10,
                atol=1e-12,
            )


def lin_losses(loss, X, y, theta):
    return _derivs(loss, X.astype(np.float64) @ theta.astype(np.float64), y.astype(np.float64))[0]


@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("t", [0.0, -2.0, 50.0])
def test_against_generic_objective(loss, t):
    """The generic array-API path (TiltedObjective) gives the same numbers."""
    X, y, theta, v, p = problem(loss, n=80, seed=3)
    kw = {"delta": DELTA} if loss == "huber" else {}
    from tiltlab.losses import get_loss

    for prior in (None, p):
        obj = TiltedObjective(get_loss(loss, **kw), X, y, t=t, weights=prior)
        R, g = obj.value_and_gradient(theta)
        pr = np.ones(X.shape[0]) if prior is None else prior
        _, _, _, gabs, Habs = reference(loss, X, y, theta, t, pr)
        value, grad = ck.fused_value_and_gradient(
            loss, X, y, theta, t, prior, loss_params=_params(loss)
        )
        _close(value, R, 1e-12, abs(float(R)) + 1.0)
        _close(grad, g, 1e-11, gabs)
        hv = ck.fused_hvp(loss, X, y, theta, v, t, prior, loss_params=_params(loss))
        _close(hv, obj.hvp(theta, v), 1e-10, Habs @ np.abs(v).ravel())


@pytest.mark.parametrize("loss", ["squared", "logistic", "multinomial"])
@pytest.mark.parametrize("t", [0.0, -2.0, 3.0])
def test_finite_differences(loss, t):
    """Gradient and Hessian-vector product against central differences (smooth losses)."""
    X, y, theta, v, p = problem(loss, n=40, seed=5)
    f = lambda th: float(ck.fused_value(loss, X, y, th, t, p))  # noqa: E731
    grad = ck.fused_value_and_gradient(loss, X, y, theta, t, p)[1]
    h = 1e-6
    fd = np.zeros(theta.size)
    for j in range(theta.size):
        e = np.zeros(theta.size)
        e[j] = h
        e = e.reshape(theta.shape)
        fd[j] = (f(theta + e) - f(theta - e)) / (2 * h)
    _close(grad.ravel(), fd, 1e-6)
    gfun = lambda th: ck.fused_value_and_gradient(loss, X, y, th, t, p)[1]  # noqa: E731
    fd_hv = (gfun(theta + h * v) - gfun(theta - h * v)) / (2 * h)
    _close(ck.fused_hvp(loss, X, y, theta, v, t, p), fd_hv, 1e-5)


# ---------------------------------------------------------------------------------------
# chunks, threads, shift moves


@pytest.mark.parametrize("loss", ["logistic", "huber", "multinomial"])
def test_chunk_counts_split_unevenly(loss):
    """1 chunk, uneven splits and more chunks than rows (empty chunks) agree."""
    X, y, theta, v, p = problem(loss, n=23, seed=7)
    R, g, H, _, _ = reference(loss, X, y, theta, -2.0, p)
    Hv = (H @ v.ravel()).reshape(theta.shape)
    for chunks in (1, 2, 5, 23, 40):
        kw = {"loss_params": _params(loss), "n_chunks": chunks}
        value, grad = ck.fused_value_and_gradient(loss, X, y, theta, -2.0, p, **kw)
        _close(value, R, 1e-12, abs(R) + 1.0)
        _close(grad, g, 1e-11)
        _close(ck.fused_hvp(loss, X, y, theta, v, -2.0, p, **kw), Hv, 1e-10)
        _close(ck.fused_linearize(loss, X, y, theta, -2.0, p, **kw).hvp(v), Hv, 1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["squared", "logistic", "multinomial"])
def test_threads_do_not_change_results(loss, dtype):
    """Chunks depend on the rows only: 1 and 2 threads give identical bits (float32 data
    too, whose losses and weights are float32 arithmetic)."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba runs with a single thread here")
    X, y, theta, v, p = problem(loss, n=3000, d=9, dtype=dtype, seed=11)
    before = numba.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            vg = ck.fused_value_and_gradient(loss, X, y, theta, 5.0, p)
            hv = ck.fused_hvp(loss, X, y, theta, v, 5.0, p)
            lin = ck.fused_linearize(loss, X, y, theta, 5.0, p).hvp(v)
            outs.append((vg[0], vg[1], hv, lin))
    finally:
        numba.set_num_threads(before)
    for a, b in zip(outs[0], outs[1], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize("t", [50.0, -50.0])
def test_sorted_losses_move_the_shift(order, t):
    """Rows sorted by loss move the running shift at every row (and the lazy vector shift
    many times): the result stays exact."""
    rng = np.random.default_rng(2)
    n, d = 400, 4
    X = rng.standard_normal((n, d))
    theta = np.array([1.0, -0.5, 0.25, 2.0])
    y = X @ theta + np.linspace(-3.0, 3.0, n)  # losses from 0 to 9, spread 450 / |t|
    ell = (X @ theta - y) ** 2
    idx = np.argsort(ell if order == "ascending" else -ell)
    X, y = X[idx], y[idx]
    R, g, H, gabs, Habs = reference("squared", X, y, theta, t, np.ones(n))
    v = np.ones(d)
    for chunks in (1, 3):
        value, grad = ck.fused_value_and_gradient("squared", X, y, theta, t, n_chunks=chunks)
        _close(value, R, 1e-13, abs(R))
        _close(grad, g, 1e-11, gabs)
        _close(ck.fused_hvp("squared", X, y, theta, v, t, n_chunks=chunks), H @ v, 1e-10, Habs @ v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [0.0, -2.0, 50.0])
@pytest.mark.parametrize("loss", SCALAR_LOSSES)
def test_many_blocks_against_reference(loss, t, dtype):
    """Chunks of many row blocks (the scalar kernels work a block of rows at a time), a
    stretch of zero prior weights longer than a block, and a last block that is cut short:
    value, gradient and both Hessian-vector products against the references."""
    n, d = 5003, 40  # blocks of 408 (float64) or 816 (float32) rows
    X, y, theta, v, p = problem(loss, n=n, d=d, dtype=dtype, seed=13)
    X *= np.asarray(0.3, dtype=dtype)  # moderate losses: t = 50 keeps many rows weighted
    p[1000:2200] = 0.0
    R, g, H, gabs, Habs = reference(loss, X, y, theta, t, p)
    rtol = 1e-9 if dtype == np.float64 else 1e-4
    for chunks in (1, 3, None):
        kw = {"loss_params": _params(loss), "n_chunks": chunks}
        value, grad = ck.fused_value_and_gradient(loss, X, y, theta, t, p, **kw)
        _close(value, R, rtol, abs(R) + 1.0)
        _close(grad, g, rtol, gabs)
        _close(ck.fused_hvp(loss, X, y, theta, v, t, p, **kw), H @ v, rtol, Habs @ np.abs(v))
        lin = ck.fused_linearize(loss, X, y, theta, t, p, **kw)
        _close(lin.hvp(v), H @ v, rtol, Habs @ np.abs(v))
        _close(lin.weights, _weights(lin_losses(loss, X, y, theta), t, p), rtol)


def _check_against_references(loss, X, y, theta, v, p, ts, chunk_counts, linearize=False):
    """Value, gradient and the Hessian-vector product (the linearised one with
    ``linearize``) of the fused kernels at each tilt and chunk count against the
    references, each within ``rtol`` of the sum of its terms' magnitudes (float64: 1e-9,
    float32: 1e-4, a few hundred roundings of sums over a thousand rows)."""
    rtol = 1e-9 if X.dtype == np.float64 else 1e-4
    for t in ts:
        R, g, H, gabs, Habs = reference(loss, X, y, theta, t, np.ones(len(y)) if p is None else p)
        for chunks in chunk_counts:
            kw = {"n_chunks": chunks}
            value, grad = ck.fused_value_and_gradient(loss, X, y, theta, t, p, **kw)
            _close(value, R, rtol, abs(R) + 1.0)
            _close(grad, g, rtol, gabs)
            if linearize:
                lin = ck.fused_linearize(loss, X, y, theta, t, p, **kw)
                _close(lin.gradient, g, rtol, gabs)
                hv = lin.hvp(v)
            else:
                hv = ck.fused_hvp(loss, X, y, theta, v, t, p, **kw)
            _close(hv, H @ v, rtol, Habs @ np.abs(v))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_four_row_dot_products_with_a_ragged_tail(loss, dtype):
    """Rows of 100 entries (past ``LONG_ROW``: four rows share each dot-product sweep)
    in chunks whose last block ends 1, 2 or 3 rows past a multiple of four: value,
    gradient and Hessian-vector product against the references at t = -2 and 50."""
    from tiltlab._cpu_kernels import block_steps

    n, d = 1003, 100
    assert d >= block_steps.LONG_ROW
    X, y, theta, v, p = problem(loss, n=n, d=d, dtype=dtype, seed=19)
    X *= np.asarray(0.1, dtype=dtype)
    # chunk ends at rows 1003, 334/668/1003, ...
    _check_against_references(loss, X, y, theta, v, p, (-2.0, 50.0), (1, 3, 7))


@pytest.mark.parametrize("prior", ["zeros", "ones"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_long_rows_take_the_next_blocks_dot_products_along(loss, dtype, prior):
    """Rows longer than ``OVERLAP_ROW_BYTES`` (a block's rank-one updates take the next
    block's dot products along): next blocks that end 1-3 rows past a multiple of four,
    a stretch of zero prior weights longer than a block (whose blocks are skipped), value,
    gradient, the linearised weights and product against the references."""
    from tiltlab._cpu_kernels import block_steps

    n, d = 357, 600  # blocks of 64 rows
    assert d * np.dtype(dtype).itemsize > block_steps.OVERLAP_ROW_BYTES
    assert block_steps.block_rows(d, np.dtype(dtype).itemsize) == 64
    X, y, theta, v, p = problem(loss, n=n, d=d, dtype=dtype, seed=23, prior=prior)
    X *= np.asarray(0.1, dtype=dtype)
    if p is not None:
        p[70:200] = 0.0
    # chunks of 357, 178-179 and 119 rows
    ts = (0.0, -2.0, 50.0)
    _check_against_references(loss, X, y, theta, v, p, ts, (1, 2, 3), linearize=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_long_rows_over_many_blocks(loss, dtype):
    """Rows of 700 entries (dot products four rows at a time, blocks raised to 64 rows)
    over several blocks and chunks, at t = 0, -2 and 50, against the references."""
    n, d = 1500, 700
    X, y, theta, v, p = problem(loss, n=n, d=d, dtype=dtype, seed=17)
    X *= np.asarray(0.05, dtype=dtype)
    _check_against_references(loss, X, y, theta, v, p, (0.0, -2.0, 50.0), (1, 3))


def test_block_rows():
    """Blocks: about BLOCK_BYTES of X, at least 64 rows while within 4 x BLOCK_BYTES,
    a multiple of 8 in [8, BLOCK], the same for every call."""
    from tiltlab._cpu_kernels import block_steps as bl

    for itemsize in (4, 8):
        for d in (1, 8, 20, 40, 100, 700, 1000, 4000, 10**5):
            rows = bl.block_rows(d, itemsize)
            assert rows % 8 == 0 and 8 <= rows <= bl.BLOCK
            size = rows * d * itemsize
            assert size <= 4 * bl.BLOCK_BYTES or rows == 8
            assert rows >= min(bl.MIN_BLOCK, bl.BLOCK_BYTES * 4 // (d * itemsize) // 8 * 8)
    assert bl.block_rows(20, 4) == 1632 and bl.block_rows(1000, 4) == 64
    assert bl.block_rows(100, 8) == 160 and bl.block_rows(10**5, 8) == 8


@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize("t", [50.0, -50.0])
def test_sorted_losses_over_many_blocks(order, t):
    """Rows sorted by loss over many blocks: the shift moves at every block and the lazy
    shift of the gradient and Hessian-vector accumulators many times."""
    rng = np.random.default_rng(5)
    n, d = 20_000, 4
    X = rng.standard_normal((n, d))
    theta = np.array([1.0, -0.5, 0.25, 2.0])
    y = X @ theta + np.linspace(-3.0, 3.0, n)
    ell = (X @ theta - y) ** 2
    idx = np.argsort(ell if order == "ascending" else -ell)
    X, y = X[idx], y[idx]
    R, g, H, gabs, Habs = reference("squared", X, y, theta, t, np.ones(n))
    v = np.ones(d)
    for chunks in (1, 3):
        value, grad = ck.fused_value_and_gradient("squared", X, y, theta, t, n_chunks=chunks)
        _close(value, R, 1e-13, abs(R))
        _close(grad, g, 1e-11, gabs)
        _close(ck.fused_hvp("squared", X, y, theta, v, t, n_chunks=chunks), H @ v, 1e-10, Habs @ v)


def test_non_finite_loss_in_a_later_block():
    """A non-finite loss far into a chunk (a later block) is found; off the support it is
    ignored."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((3000, 5))
    X[2500, 0] = 1e200
    y = np.zeros(3000)
    theta = np.ones(5)
    assert ck.fused_value_and_gradient("squared", X, y, theta, 1.0, n_chunks=1) is None
    assert ck.fused_hvp("squared", X, y, theta, theta, 1.0, n_chunks=1) is None
    p = np.ones(3000)
    p[2500] = 0.0
    X[2500, 0] = 1.0  # zero weight and a finite row: the same as dropping the row
    keep = np.arange(3000) != 2500
    value, grad = ck.fused_value_and_gradient("squared", X, y, theta, 1.0, p, n_chunks=1)
    R, g, _, _, _ = reference("squared", X[keep], y[keep], theta, 1.0, np.ones(2999))
    _close(value, R, 1e-13, abs(R))
    _close(grad, g, 1e-12)


def test_large_losses_do_not_overflow():
    """Losses near 1e4 at t = 50 (exp(t l) overflows float64 many times over)."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((200, 3))
    y = 100.0 + rng.standard_normal(200)
    theta = np.zeros(3)
    R, g, _, _, _ = reference("squared", X, y, theta, 50.0, np.ones(200))
    value, grad = ck.fused_value_and_gradient("squared", X, y, theta, 50.0)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    _close(value, R, 1e-13, abs(R))
    _close(grad, g, 1e-11)


def test_float32_long_chunks_stay_accurate():
    """Float32 data, 2e4 rows in one chunk: float64 accumulation keeps ~1e-6 accuracy."""
    rng = np.random.default_rng(8)
    X = rng.standard_normal((20_000, 6)).astype(np.float32)
    theta = (0.3 * rng.standard_normal(6)).astype(np.float32)
    y = (rng.random(20_000) < 0.5).astype(np.float32)
    R, g, _, gabs, _ = reference("logistic", X, y, theta, 2.0, np.ones(20_000))
    value, grad = ck.fused_value_and_gradient("logistic", X, y, theta, 2.0, n_chunks=1)
    _close(value, R, 1e-6, abs(R))
    _close(grad, g, 2e-5, gabs)


# ---------------------------------------------------------------------------------------
# non-finite losses, bad input, policy


def test_non_finite_loss_returns_none():
    X = np.array([[1.0], [1e200]])
    y = np.zeros(2)
    theta = np.array([1.0])  # the second loss is 1e400: infinite
    assert ck.fused_value_and_gradient("squared", X, y, theta, 1.0) is None
    assert ck.fused_value("squared", X, y, theta, 1.0) is None
    assert ck.fused_hvp("squared", X, y, theta, np.ones(1), 1.0) is None
    assert ck.fused_linearize("squared", X, y, theta, 1.0) is None
    # a zero prior weight takes the overflowing row out of the support
    value, grad = ck.fused_value_and_gradient("squared", X, y, theta, 1.0, np.array([1.0, 0]))
    assert float(value) == 1.0 and grad.tolist() == [2.0]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"loss": "cubic"}, ValueError, "`loss`"),
        ({"loss": 3}, TypeError, "`loss`"),
        ({"X": [[1.0, 2.0]]}, TypeError, "`X`"),
        ({"X": np.ones((4, 2), dtype=np.int64)}, TypeError, "`X`"),
        ({"X": np.ones(4)}, ValueError, "`X`"),
        ({"theta": np.ones(3)}, ValueError, "`theta`"),
        ({"y": np.ones(3)}, ValueError, "`y`"),
        ({"loss": "logistic", "y": np.array([0.0, 1.0, 2.0, 1.0])}, ValueError, "`y`"),
        ({"y": np.array([0.0, np.nan, 1.0, 1.0])}, ValueError, "`y`"),
        ({"t": np.inf}, ValueError, "`t`"),
        ({"t": "1"}, TypeError, "`t`"),
        ({"t": True}, TypeError, "`t`"),
        ({"prior": np.zeros(4)}, ValueError, "`prior`"),
        ({"prior": -np.ones(4)}, ValueError, "`prior`"),
        ({"prior": np.ones(3)}, ValueError, "`prior`"),
        ({"loss_params": {"delta": 1.0}}, TypeError, "`loss_params`"),
        ({"loss": "huber", "loss_params": {"delta": -1.0}}, ValueError, "`loss_params`"),
        ({"n_chunks": 0}, ValueError, "`n_chunks`"),
    ],
)
def test_bad_input(kwargs, exc, match):
    args = {
        "loss": "squared",
        "X": np.ones((4, 2)),
        "y": np.zeros(4),
        "theta": np.zeros(2),
        "t": 1.0,
        "prior": None,
    }
    args.update({k: v for k, v in kwargs.items() if k in args})
    extra = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(exc, match=match):
        ck.fused_value_and_gradient(**args, **extra)


def test_bad_multinomial_labels_and_direction():
    X = np.ones((3, 2))
    with pytest.raises(ValueError, match="`y`"):
        ck.fused_value("multinomial", X, np.array([0, 1, 3]), np.zeros((2, 3)), 1.0)
    with pytest.raises(ValueError, match="`theta`"):
        ck.fused_value("multinomial", X, np.array([0, 1, 2]), np.zeros(2), 1.0)
    with pytest.raises(ValueError, match="`v`"):
        ck.fused_hvp("squared", X, np.zeros(3), np.zeros(2), np.zeros(3), 1.0)
    lin = ck.fused_linearize("squared", X, np.zeros(3), np.zeros(2), 1.0)
    with pytest.raises(ValueError, match="`v`"):
        lin.hvp(np.zeros(3))


def test_policy_and_fallback_without_numba(monkeypatch):
    assert ck.available()
    assert not ck.use_fused(100, 5)
    assert ck.use_fused(200_000, 100)
    assert ck.use_fused(200_000, 20, 3)  # multinomial: d * K entries per row
    assert ck.use_fused(10**6, 20)  # the block kernels serve short rows too
    assert not ck.use_fused(10**6, 4)  # very short rows: the generic path
    assert ck.default_chunks(10) == 1 and ck.default_chunks(10**9) == ck.MAX_CHUNKS
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a)
    )
    assert not ck.available()
    assert not ck.use_fused(200_000, 100)
    with pytest.raises(ImportError, match="numba"):
        ck.fused_value("squared", np.ones((2, 1)), np.zeros(2), np.zeros(1), 1.0)


def test_import_tiltlab_does_not_import_numba():
    import subprocess
    import sys

    code = "import sys, tiltlab, tiltlab._cpu_kernels; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bound_problem_reuses_the_data():
    """A FusedProblem validates once and evaluates at several thetas and tilts."""
    X, y, theta, v, p = problem("logistic", n=50, seed=9)
    fp = ck.FusedProblem("logistic", X, y, p)
    assert fp.loss == "logistic" and fp.X.shape == X.shape and fp.n_chunks >= 1
    for t, th in ((1.5, theta), (-3.0, 2 * theta)):
        R, g, H, gabs, Habs = reference("logistic", X, y, th, t, p)
        value, grad = fp.value_and_gradient(th, t)
        _close(value, R, 1e-12, abs(R) + 1.0)
        _close(grad, g, 1e-11, gabs)
        _close(fp.gradient(th, t), g, 1e-11, gabs)
        _close(fp.value(th, t), R, 1e-12, abs(R) + 1.0)
        _close(fp.hvp(th, v, t), H @ v, 1e-10, Habs @ np.abs(v))
        _close(fp.linearize(th, t).hvp(v), H @ v, 1e-10, Habs @ np.abs(v))


def test_non_contiguous_inputs_and_integer_labels():
    """Fortran-ordered and strided X, integer 0/1 labels, integer theta: same numbers."""
    X, y, theta, v, p = problem("logistic", n=40, seed=12)
    R, g, _, gabs, _ = reference("logistic", X, y, theta, 2.0, p)
    for XX in (np.asfortranarray(X), np.repeat(X, 2, axis=1)[:, ::2]):
        value, grad = ck.fused_value_and_gradient("logistic", XX, y.astype(np.int64), theta, 2, p)
        _close(value, R, 1e-12, abs(R) + 1.0)
        _close(grad, g, 1e-11, gabs)
    R0, g0, _, gabs0, _ = reference("logistic", X, y, np.ones(5), 2.0, p)
    value, grad = ck.fused_value_and_gradient("logistic", X, y, np.ones(5, dtype=np.int64), 2.0, p)
    _close(value, R0, 1e-12, abs(R0) + 1.0)
    _close(grad, g0, 1e-11, gabs0)


# ---------------------------------------------------------------------------------------
# the engine: TiltedObjective serves large NumPy problems with the kernels


@pytest.mark.parametrize("loss", ["squared", "logistic", "multinomial"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_objective_uses_the_fused_engine_and_agrees_with_the_generic_path(loss, dtype, monkeypatch):
    from tiltlab.objective.engines import engines_for

    monkeypatch.setenv(ck.SWITCH, "wait")  # compile here if not cached: the kernels serve

    rng = np.random.default_rng(11)
    n, d = 4096, 64
    X = rng.standard_normal((n, d)).astype(dtype)
    if loss == "multinomial":
        y = rng.integers(0, 3, n)
    elif loss == "logistic":
        y = (rng.random(n) < 0.3).astype(dtype)
    else:
        y = (X @ rng.standard_normal(d)).astype(dtype)
    prior = rng.random(n)
    prior[::7] = 0.0
    for t in (0.0, -2.0, 1.5):
        obj = TiltedObjective(loss, X, y, t=t, weights=prior, l2=1e-3)
        assert engines_for(obj.problem)[0].name == "fused CPU"
        theta = (0.1 * rng.standard_normal(obj.problem.shape)).astype(dtype)
        v = rng.standard_normal(obj.problem.shape).astype(dtype)
        passes = obj.n_passes
        f1, g1 = obj.value_and_gradient(theta)
        h1 = obj.hvp(theta, v)
        assert obj.n_passes - passes == 2  # one pass each
        assert f1.dtype == dtype and g1.dtype == dtype and h1.dtype == dtype
        # the reference: the generic engine, in float64 on the same (rounded) data
        ref = TiltedObjective(
            loss, X.astype(np.float64), y if loss == "multinomial" else y.astype(np.float64),
            t=t, weights=prior, l2=1e-3,
        )  # fmt: skip
        ref.fused = False
        th64, v64 = theta.astype(np.float64), v.astype(np.float64)
        f2, g2 = ref.value_and_gradient(th64)
        h2 = ref.hvp(th64, v64)
        rtol = 1e-10 if dtype == np.float64 else 1e-4
        np.testing.assert_allclose(f1, f2, rtol=rtol)
        np.testing.assert_allclose(g1, g2, rtol=0, atol=rtol * np.abs(g2).max())
        # the tilted Hessian's covariance term cancels at large t: float32 keeps ~1e-3
        # there (the generic float32 path loses about three times as much)
        htol = rtol if dtype == np.float64 else 1e-3
        np.testing.assert_allclose(h1, h2, rtol=0, atol=htol * np.abs(h2).max())


def test_small_and_hierarchical_problems_stay_on_the_generic_engines():
    from tiltlab.objective.engines import engines_for

    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((100, 5)), rng.standard_normal(100)
    assert engines_for(TiltedObjective("squared", X, y, t=1.0).problem)[0].name != "fused CPU"
    X, y = rng.standard_normal((4096, 64)), rng.standard_normal(4096)
    groups = rng.integers(0, 4, 4096)
    hier = TiltedObjective("squared", X, y, tilts=(1.0, 0.0), groups=groups)
    assert all(e.name != "fused CPU" for e in engines_for(hier.problem))


# ---------------------------------------------------------------------------------------
# 512-bit vectors on the CPUs listed in WIDE_CPUS


def _doubler():
    from tiltlab._cpu_kernels import block_steps

    @numba.njit
    def f(x):
        block_steps.wide_vectors()
        for i in range(x.shape[0]):
            x[i] = 2.0 * x[i]

    return f


def test_wide_vectors_sets_the_attribute_only_on_the_listed_cpus(monkeypatch):
    from tiltlab._cpu_kernels import block_steps

    attribute = '"prefer-vector-width"="512"'
    for listed in (True, False):
        cpus = {block_steps._target_cpu()} if listed else set()
        monkeypatch.setattr(block_steps, "WIDE_CPUS", frozenset(cpus))
        f = _doubler()
        x = np.arange(67.0)
        f(x)
        np.testing.assert_array_equal(x, 2.0 * np.arange(67.0))
        assert (attribute in f.inspect_llvm(f.signatures[0])) == listed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["logistic", "poisson", "huber"])
def test_wide_vectors_change_no_loss_bit(monkeypatch, loss, dtype):
    """The loss loops are elementwise: compiled for 512-bit vectors or without them (on
    a CPU without AVX-512 the two builds are the same code), every value and derivative
    has the same bits, remainder rows included (n = 1003)."""
    from tiltlab._cpu_kernels import _losses, block_steps

    rng = np.random.default_rng(3)
    n = 1003
    z = (4.0 * rng.standard_normal(n)).astype(dtype)
    y = (rng.poisson(1.0, n) if loss == "poisson" else rng.random(n) < 0.4).astype(dtype)
    outs = []
    for cpus in ({block_steps._target_cpu()}, set()):
        monkeypatch.setattr(block_steps, "WIDE_CPUS", frozenset(cpus))
        block = numba.njit(getattr(_losses, f"block_{loss}").py_func)
        bufs = [np.empty(n, dtype) for _ in range(3)]
        block(z, y, 0, n, 0.7, *bufs)
        outs.append(bufs)
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)

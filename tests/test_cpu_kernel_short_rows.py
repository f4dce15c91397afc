"""Short rows in the fused CPU kernels: the whole-register dot products and rank-one
updates of ``tiltlab._cpu_kernels._short`` (rows of 32 to 256 bytes: float32 d = 8..64,
float64 d = 4..32) against NumPy float64 references, at row lengths below, at and above
both bounds, lengths that are not a multiple of the register width, and row counts that
make the last group of rows end at the last row of ``X`` (where the update may not read
past the row)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sps

from tiltlab import _cpu_kernels as ck

numba = pytest.importorskip("numba", reason="the fused CPU kernels need numba")

from tiltlab._cpu_kernels import _short  # noqa: E402  (imports numba)
from tiltlab._cpu_kernels._short import SHORT_BYTES, SWITCH_CHUNKS, VBYTES  # noqa: E402
from tiltlab._cpu_kernels.block_steps import short_rows  # noqa: E402

DTYPES = [np.float64, np.float32]
#: below the register width (float32 1..7, float64 1..3), multiples of it and not, the
#: last counts of whole chunks in straight-line code (float64 32, float32 64) and just
#: past them (the loop over chunks), the upper bounds (float64 256, float32 512) and just
#: past them
DS = [1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 20, 31, 32, 33, 40, 63, 64, 65, 100, 128]
DS += [255, 256, 257, 511, 512, 513]
#: for the register functions alone, also every count of whole chunks before the last one
#: that DS misses (5 and 6: float64 d = 23, 26; float32 d = 47, 50)
DS_REGISTER = sorted({*DS, 23, 26, 47, 50})
DELTA = 0.7


def problem(loss, n, d, dtype, seed):
    rng = np.random.default_rng(seed)
    X = (0.5 * rng.standard_normal((n, d))).astype(dtype)
    theta = (0.5 * rng.standard_normal(d)).astype(dtype)
    if loss == "logistic":
        y = (rng.random(n) < 0.4).astype(np.float64)
    else:
        y = X.astype(np.float64) @ theta + rng.standard_normal(n)
    v = rng.standard_normal(d).astype(dtype)
    p = rng.random(n) * (rng.random(n) < 0.7)
    p[0] = 1.0
    return X, y, theta, v, p


def reference(loss, X, y, theta, v, t, p):
    """Tilted value (logsumexp), gradient ``X^T (w l')`` and Hessian-vector product
    ``X^T (w (l'' + t l'^2) u) - t g (g . v)`` with ``u = X v``, in float64 from the same
    data, with the sizes of the summed terms (the scale of their rounding)."""
    X = X.astype(np.float64)
    z = X @ theta.astype(np.float64)
    if loss == "squared":
        r = z - y
        ell, d1, d2 = r**2, 2 * r, np.full_like(r, 2.0)
    elif loss == "huber":
        r = z - y
        inside = np.abs(r) <= DELTA
        ell = np.where(inside, 0.5 * r**2, DELTA * (np.abs(r) - 0.5 * DELTA))
        d1, d2 = np.where(inside, r, DELTA * np.sign(r)), inside.astype(float)
    else:
        s = sps.expit(z)
        ell, d1, d2 = np.logaddexp(0.0, z) - y * z, s - y, s * (1 - s)
    q = p / p.sum()
    on = q > 0
    w = sps.softmax(np.where(on, t * ell + np.log(np.where(on, q, 1.0)), -np.inf))
    value = float(q @ ell) if t == 0 else float(sps.logsumexp(t * ell, b=q) / t)
    g = X.T @ (w * d1)
    vv = v.astype(np.float64)
    u = X @ vv
    hv = X.T @ (w * (d2 + t * d1**2) * u) - t * g * (g @ vv)
    A = np.abs(X)
    gabs = A.T @ (w * np.abs(d1))
    habs = A.T @ (w * (np.abs(d2) + abs(t) * d1**2) * (A @ np.abs(vv))) + abs(t) * gabs * (
        gabs @ np.abs(vv)
    )
    return value, g, hv, gabs, habs


def _close(actual, desired, rtol, scale):
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), desired, rtol=rtol, atol=rtol * float(np.max(scale))
    )


@numba.njit
def _dots(X, v, w):
    n = X.shape[0]
    a = np.empty(n, X.dtype)
    c = np.empty(n, X.dtype)
    b = np.empty(n, X.dtype)
    for i in range(n):
        a[i] = _short.vdot(X, i, v)
        x, y = _short.vdot2(X, i, v, w)
        b[i] = x
        c[i] = y
    f = np.empty(4, X.dtype)
    f[0], f[1], f[2], f[3] = _short.vdot4(X, 1, v)  # rows 1..4 side by side
    g = np.empty(8, X.dtype)
    g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7] = _short.vdot2x4(X, 1, v, w)
    return a, b, c, f, g


@numba.njit
def _axpy4(X, i, c, acc):
    _short.vaxpy4(X, i, c[0], c[1], c[2], c[3], acc)


@numba.njit
def _axpy2x2(X, i, c, acc_a, acc_b):
    _short.vaxpy2x2(X, i, c[0], c[1], c[2], c[3], acc_a, acc_b)


@numba.njit
def _axpy2x4(X, i, c, acc_a, acc_b):
    _short.vaxpy2x4(X, i, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], acc_a, acc_b)


@pytest.mark.parametrize(
    ("d", "dtype"),
    [(d, t) for t in DTYPES for d in DS_REGISTER if d * np.dtype(t).itemsize >= 32],
)
def test_register_functions_against_numpy(d, dtype):
    """vdot, vdot2, vdot4, vdot2x4, vaxpy4, vaxpy2x4 and vaxpy2x2 directly, where they apply
    (a row of at least one register), with infinities and NaNs in the neighbouring rows:
    the lanes outside the row are dropped (selected), so they do not leak into the row's
    results, and the accumulator's padding stays 0. The lengths cover every count of
    whole chunks before the last one (0 to 7 in rows of up to 256 bytes, each a case of
    its own) and counts past them (the loop that longer rows take)."""
    w = _short.lanes(np.dtype(dtype).itemsize)
    rng = np.random.default_rng(d)
    X = rng.standard_normal((8, d)).astype(dtype)
    X[0] = np.inf  # rows 0, 5 and 7: non-finite everywhere
    X[5] = np.nan
    X[7] = -np.inf
    v = rng.standard_normal(d).astype(dtype)
    u = rng.standard_normal(d).astype(dtype)
    a, b, c, f, g = _dots(X, v, u)
    X64 = X.astype(np.float64)
    rtol = 1e-13 if dtype == np.float64 else 2e-6
    # two vectors four rows at a time: each vector's sums in vdot4's order
    np.testing.assert_array_equal(g[:4], f)
    for i in (1, 2, 3, 4, 6):
        four = [(f[i - 1], v), (g[4 + i - 1], u)] if 1 <= i <= 4 else []
        for got, vec in [(a[i], v), (b[i], v), (c[i], u), *four]:
            ref = X64[i] @ vec.astype(np.float64)
            scale = np.abs(X64[i]) @ np.abs(vec.astype(np.float64))
            assert abs(float(got) - ref) <= rtol * scale
    pad = _short.padded(d, np.dtype(dtype).itemsize)
    assert pad % w == 0 and d <= pad < d + w
    coef = rng.standard_normal(4).astype(dtype)
    acc = np.zeros(pad, dtype)
    acc[:d] = rng.standard_normal(d)
    start = acc.copy()
    _axpy4(X, 1, coef, acc)  # rows 1..4; the last chunk reads into row 5 (NaN)
    expect = start[:d].copy()
    for j in range(d):  # the scalar loops' order, in the dtype
        expect[j] += (coef[0] * X[1, j] + coef[1] * X[2, j]) + (
            coef[2] * X[3, j] + coef[3] * X[4, j]
        )
    np.testing.assert_array_equal(acc[:d], expect)
    np.testing.assert_array_equal(acc[d:], 0)
    acc_a = np.zeros(pad, dtype)
    acc_b = np.zeros(pad, dtype)
    _axpy2x2(X, 3, coef, acc_a, acc_b)  # rows 3, 4; reads into row 5
    np.testing.assert_array_equal(acc_a[:d], coef[0] * X[3] + coef[1] * X[4])
    np.testing.assert_array_equal(acc_b[:d], coef[2] * X[3] + coef[3] * X[4])
    np.testing.assert_array_equal(acc_a[d:], 0)
    np.testing.assert_array_equal(acc_b[d:], 0)
    coef8 = rng.standard_normal(8).astype(dtype)
    acc_a[:d] = rng.standard_normal(d)
    acc_b[:d] = rng.standard_normal(d)
    start_a, start_b = acc_a.copy(), acc_b.copy()
    _axpy2x4(X, 1, coef8, acc_a, acc_b)  # rows 1..4; the last chunk reads into row 5 (NaN)
    for acc_m, start_m, c in ((acc_a, start_a, coef8[:4]), (acc_b, start_b, coef8[4:])):
        expect = start_m[:d].copy()
        for j in range(d):  # the order of vaxpy4, in the dtype
            expect[j] += (c[0] * X[1, j] + c[1] * X[2, j]) + (c[2] * X[3, j] + c[3] * X[4, j])
        np.testing.assert_array_equal(acc_m[:d], expect)
        np.testing.assert_array_equal(acc_m[d:], 0)


def test_every_count_of_whole_chunks_is_covered():
    """The row lengths of the register test reach every case of the compiled switch on the
    number of whole chunks before the last (0 to SWITCH_CHUNKS - 1) and the loop past it,
    in both dtypes."""
    cases = SWITCH_CHUNKS
    for dtype in DTYPES:
        w = _short.lanes(np.dtype(dtype).itemsize)
        counts = {(d - 1) // w for d in DS_REGISTER if d >= w}
        assert set(range(cases)) <= counts, (dtype, counts)
        assert max(counts) >= cases, (dtype, counts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_which_rows_are_short(dtype):
    """Rows of 32 to 2048 bytes, C-contiguous, take the register code; others do not."""
    assert SHORT_BYTES == 2048 and VBYTES == 32
    size = np.dtype(dtype).itemsize
    for d in DS:
        X = np.zeros((5, d), dtype)
        assert short_rows(X) == (32 <= d * size <= 2048), d
    X = np.zeros((5, 40), dtype)[:, ::2]  # strided columns
    assert not short_rows(X)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["squared", "logistic", "huber"])
def test_short_rows_against_reference(loss, dtype):
    """Value, gradient and Hessian-vector product at each row length against the float64
    references, for row counts that end the last block in every position of a group of
    4 rows (n = 4m .. 4m + 3), with and without a prior, in one and three chunks."""
    rtol = 1e-10 if dtype == np.float64 else 2e-4
    kw = {"loss_params": {"delta": DELTA}} if loss == "huber" else {}
    for d in DS:
        for n in (4 * 50, 4 * 50 + 1, 4 * 50 + 2, 4 * 50 + 3):
            X, y, theta, v, p = problem(loss, n, d, dtype, seed=d + n)
            for t, prior in ((0.0, None), (-2.0, p), (5.0, None)):
                pr = np.ones(n) if prior is None else prior
                R, g, hv_ref, gabs, habs = reference(loss, X, y, theta, v, t, pr)
                for chunks in (1, 3):
                    opts = {"n_chunks": chunks, **kw}
                    value, grad = ck.fused_value_and_gradient(loss, X, y, theta, t, prior, **opts)
                    _close(value, R, rtol, abs(R) + 1.0)
                    _close(grad, g, rtol, gabs)
                    hv = ck.fused_hvp(loss, X, y, theta, v, t, prior, **opts)
                    _close(hv, hv_ref, 10 * rtol, habs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_short_rows_do_not_depend_on_threads(dtype):
    """1 and 2 threads give identical bits at row lengths around the bounds."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba runs with a single thread here")
    before = numba.get_num_threads()
    try:
        for d in (5, 8, 20, 33, 64, 100, 257):
            X, y, theta, v, p = problem("logistic", 3001, d, dtype, seed=d)
            outs = []
            for threads in (1, 2):
                numba.set_num_threads(threads)
                vg = ck.fused_value_and_gradient("logistic", X, y, theta, 3.0, p)
                hv = ck.fused_hvp("logistic", X, y, theta, v, 3.0, None)
                outs.append((vg[0], vg[1], hv))
            for a, b in zip(outs[0], outs[1], strict=True):
                np.testing.assert_array_equal(a, b)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_python_versions(dtype):
    """The versions used where numba is absent agree with the register code (updates bit
    for bit, dot products to rounding)."""
    rng = np.random.default_rng(3)
    d = 20
    X = rng.standard_normal((6, d)).astype(dtype)
    v = rng.standard_normal(d).astype(dtype)
    u = rng.standard_normal(d).astype(dtype)
    a, b, c, f, g = _dots(X, v, u)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose([_short.vdot_py(X, i, v) for i in range(6)], a, rtol=rtol)
    np.testing.assert_allclose([_short.vdot2_py(X, i, v, u)[1] for i in range(6)], c, rtol=rtol)
    np.testing.assert_allclose(_short.vdot4_py(X, 1, v), f, rtol=rtol)
    np.testing.assert_allclose(_short.vdot2x4_py(X, 1, v, u), g, rtol=rtol)
    coef = rng.standard_normal(4).astype(dtype)
    pad = _short.padded(d, np.dtype(dtype).itemsize)
    acc, ref = np.zeros(pad, dtype), np.zeros(pad, dtype)
    _axpy4(X, 1, coef, acc)
    _short.vaxpy4_py(X, 1, coef[0], coef[1], coef[2], coef[3], ref)
    np.testing.assert_array_equal(acc, ref)
    acc_a, acc_b = np.zeros(pad, dtype), np.zeros(pad, dtype)
    ref_a, ref_b = np.zeros(pad, dtype), np.zeros(pad, dtype)
    _axpy2x2(X, 2, coef, acc_a, acc_b)
    _short.vaxpy2x2_py(X, 2, coef[0], coef[1], coef[2], coef[3], ref_a, ref_b)
    np.testing.assert_array_equal(acc_a, ref_a)
    np.testing.assert_array_equal(acc_b, ref_b)
    coef8 = rng.standard_normal(8).astype(dtype)
    _axpy2x4(X, 1, coef8, acc_a, acc_b)
    _short.vaxpy2x4_py(X, 1, *coef8, ref_a, ref_b)
    np.testing.assert_array_equal(acc_a, ref_a)
    np.testing.assert_array_equal(acc_b, ref_b)


def test_blocks_import_and_run_without_numba():
    """Where numba is absent the block steps import and run as plain Python (the register
    functions fall back to loops): the dot products and a padded update against NumPy."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["numba"] = None
sys.modules["llvmlite"] = None
import numpy as np
from tiltlab._cpu_kernels import _short
from tiltlab._cpu_kernels import block_steps as _blocks
assert _short.vdot is _short.vdot_py
rng = np.random.default_rng(0)
X = rng.standard_normal((13, 20)).astype(np.float32)
v = rng.standard_normal(20).astype(np.float32)
out = np.empty(13, np.float32)
_blocks.dots(X, 0, 13, v, out, np.float32(0))
np.testing.assert_allclose(out, X.astype(float) @ v.astype(float), rtol=1e-5, atol=1e-5)
c = rng.standard_normal(13).astype(np.float32)
blk = np.zeros(_blocks.padded_cols(20, 4), np.float32)
acc = np.zeros(20)
_blocks.axpy_rows(X, 0, 13, c, blk, acc, 0, 13)
np.testing.assert_allclose(acc, c.astype(float) @ X.astype(float), rtol=1e-5, atol=1e-5)
assert not blk.any()
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr

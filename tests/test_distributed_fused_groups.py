"""NumPy chunks of a hierarchical Dask objective on the fused grouped kernel.

Each chunk's innermost-group states and per-group sums come from one compiled pass
(:meth:`tiltlab._cpu_kernels.FusedProblem.group_states`), merged group by group across
chunks, the upper levels finished in the last task (the scalar-predictor losses, and the
multinomial loss with ``G x d x K`` sums). References are independent of the
route: the eager NumPy hierarchical objective on the generic array-API engine (per-sample
weights, segment sums, two products with ``X``), the nested tilted risk written with
SciPy's ``logsumexp`` (value and gradient in closed form, the Hessian-vector product by
central differences of that gradient), and the accumulator's group states for the
kernel itself. The route's use is checked by counting its calls.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tiltlab as tl

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
special = pytest.importorskip("scipy.special")

from tiltlab._cpu_kernels import LOSS_CODES, FusedProblem, available  # noqa: E402
from tiltlab.distributed import _chunk_engine as ce  # noqa: E402

needs_numba = pytest.mark.skipif(not available(), reason="the fused kernels need numba")

#: 4096 x 64 (the fused engine's size policy serves it); uneven chunks, one empty
N, D = 4096, 64
CHUNKS = (1500, 0, 1296, 1300)
SCALAR = sorted(k for k in LOSS_CODES if k != "multinomial")


def _groups(seed=0):
    """Labels of 7 groups (not 0..6): groups 0-2 mixed in the first chunk, group 2 and 4
    spanning chunks, group 6 only in the last chunk, group 3 only in the third."""
    rng = np.random.default_rng(seed)
    codes = np.empty(N, dtype=np.int64)
    codes[:1500] = rng.integers(0, 3, size=1500)
    codes[1400:1600] = 2
    codes[1600:2796] = rng.choice([3, 4], size=1196)
    codes[2796:] = rng.choice([4, 5, 6], size=N - 2796)
    return 10 * codes + 3


def _data(loss, dtype, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)).astype(dtype)
    if loss in ("logistic", "hinge", "squared_hinge"):
        y = (rng.uniform(size=N) < 0.5).astype(dtype)
    elif loss == "poisson":  # counts, zeros included
        y = rng.poisson(1.0, size=N).astype(dtype)
    else:
        y = rng.standard_normal(N).astype(dtype)
    th = (0.1 * rng.standard_normal(D)).astype(dtype)
    v = rng.standard_normal(D).astype(dtype)
    w = rng.uniform(0.2, 2.0, size=N)
    w[::7] = 0.0  # zero prior weights inside groups
    return X, y, th, v, w


def _dask(a):
    return da.from_array(a, chunks=(CHUNKS,) + a.shape[1:])


@pytest.fixture
def route_calls(monkeypatch):
    """Counts the chunks the fused grouped route is asked for and serves."""
    calls = {"served": 0, "asked": 0}
    inner = ce.numpy_group_state

    def counting(*args):
        calls["asked"] += 1
        out = inner(*args)
        calls["served"] += out is not ce.DECLINE
        return out

    monkeypatch.setattr(ce, "numpy_group_state", counting)
    return calls


def _tol(dtype):
    # float64: sums of a few thousand terms; float32: the kernels' float32 predictors and
    # losses (about one rounding each) against references in float32 (generic engine) or
    # float64 (closed forms) of the same data
    return 1e-11 if dtype == np.float64 else 5e-5


def _close(got, want, dtype, scale=None, tol=None):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.abs(want).max() if scale is None else scale
    tol = _tol(dtype) if tol is None else tol
    assert np.abs(got - want).max() <= tol * max(scale, 1e-30), (got, want)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("loss", SCALAR)
@pytest.mark.parametrize("tilts", [(1.0, 0.7), (-2.0, 0.0), (0.5, 1e-9), (3.0, -3.0)])
def test_fused_hierarchy_matches_the_numpy_objective(loss, dtype, tilts, route_calls):
    X, y, th, v, w = _data(loss, dtype)
    g = _groups()
    kw = dict(groups=g, tilts=tilts, weights=w, l2=1e-2)
    ref = tl.TiltedObjective(loss, X, y, **kw)
    ref.fused = False
    obj = tl.TiltedObjective(loss, _dask(X), _dask(y), **{**kw, "weights": _dask(w)})
    f, grad = dask.compute(*obj.value_and_gradient(th))
    hv, val = dask.compute(obj.hvp(th, v), obj.value(th))
    assert route_calls["served"] == 3 * 3  # three non-empty chunks, three evaluations
    assert grad.dtype == dtype and hv.dtype == dtype and grad.shape == th.shape
    f0, g0 = ref.value_and_gradient(th)
    _close(f, f0, dtype)
    _close(val, f0, dtype)
    _close(grad, g0, dtype)
    _close(hv, ref.hvp(th, v), dtype)


def _nested(th, X, y, codes, p, t, tau):
    """The two-level tilted risk of the logistic loss and its gradient, float64 closed
    form: ``R_g = (1/tau) log sum_{i in g} p_i e^{tau l_i} / M_g``, ``J = (1/t) log sum_g
    (M_g / M) e^{t R_g}`` (means at a zero tilt, extremes at an infinite one)."""
    z = X @ th
    ell = np.logaddexp(0.0, z) - y * z
    d1 = special.expit(z) - y
    groups = [k for k in np.unique(codes) if p[codes == k].sum() > 0]
    R, M, gR = [], [], []
    for k in groups:
        sel = (codes == k) & (p > 0)
        pk, lk = p[sel] / p[sel].sum(), ell[sel]
        if tau == 0.0:
            r, wk = float(pk @ lk), pk
        else:
            lse = special.logsumexp(tau * lk, b=pk)
            r, wk = float(lse / tau), pk * np.exp(tau * lk - lse)
        R.append(r)
        M.append(p[sel].sum())
        gR.append(X[sel].T @ (wk * d1[sel]))
    R, M, gR = np.array(R), np.array(M) / np.sum(M), np.array(gR)
    if t == 0.0:
        J, W = float(M @ R), M
    elif math.isinf(t):
        k = int(np.argmax(R) if t > 0 else np.argmin(R))
        J, W = float(R[k]), np.eye(len(R))[k]
    else:
        lse = special.logsumexp(t * R, b=M)
        J, W = float(lse / t), M * np.exp(t * R - lse)
    return J, W @ gR


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "tilts", [(2.0, 0.5), (0.0, 1.5), (-1.0, 0.0), (math.inf, 0.5), (-math.inf, -2.0)]
)
def test_fused_hierarchy_closed_form(dtype, tilts, route_calls):
    """Value and gradient against the nested logsumexp, with prior weights that are zero
    on a whole group of one chunk; the Hessian-vector product (finite tilts) against
    central differences of the closed-form gradient."""
    X, y, th, v, w = _data("logistic", dtype, seed=3)
    g = _groups(seed=1)
    w[(g == 43) & (np.arange(N) < 2796)] = 0.0  # group 4 has no mass in the third chunk
    obj = tl.TiltedObjective(
        "logistic", _dask(X), _dask(y), groups=g, tilts=tilts, weights=_dask(w)
    )
    f, grad = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["served"] == 3
    Xf, yf, tf = X.astype(np.float64), y.astype(np.float64), th.astype(np.float64)
    J, gJ = _nested(tf, Xf, yf, g, w, *tilts)
    _close(f, J, dtype)
    _close(grad, gJ, dtype)
    if all(math.isfinite(t) for t in tilts):
        hv = np.asarray(dask.compute(obj.hvp(th, v))[0], dtype=np.float64)
        vf = v.astype(np.float64)
        h = 1e-5
        fd = (_nested(tf + h * vf, Xf, yf, g, w, *tilts)[1]
              - _nested(tf - h * vf, Xf, yf, g, w, *tilts)[1]) / (2 * h)  # fmt: skip
        # differences: truncation h^2 |g'''| and cancellation eps |g| / h
        _close(hv, fd, dtype, tol=1e-6 if dtype == np.float64 else 5e-5)


@needs_numba
def test_fused_setting_off_and_non_finite_losses(route_calls):
    X, y, th, v, w = _data("squared", np.float64, seed=5)
    g = _groups()
    obj = tl.TiltedObjective("squared", _dask(X), _dask(y), groups=g, tilts=(1.0, 2.0))
    obj.fused = False
    f, grad = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["asked"] == 0
    obj.fused = True
    f1, g1 = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["served"] == 3 and route_calls["asked"] == 4  # the empty chunk declined
    _close(f1, f, np.float64)
    _close(g1, grad, np.float64)
    from tiltlab.distributed import ClientObjective

    with np.errstate(over="ignore", invalid="ignore"):
        value = ClientObjective(obj).value(np.full(D, 1e160))  # overflowing losses
    assert route_calls["asked"] == 8 and route_calls["served"] == 3  # declined
    assert value == np.inf


@pytest.mark.slow
@needs_numba
@pytest.mark.parametrize("loss", ["squared", "multinomial"])
def test_grouped_kernel_compiled_in_the_background(loss, route_calls, monkeypatch):
    """The grouped kernel is not compiled in the task that needs it: the chunks take the
    generic route while a background process is asked to compile it, then the kernel."""
    from tiltlab._cpu_kernels import warmup as _warm

    ready, started = set(), []
    monkeypatch.setenv(_warm.SWITCH, "")
    monkeypatch.setattr(_warm, "ready", lambda name: name in ready)
    monkeypatch.setattr(_warm, "start", lambda name: started.append(name) or True)
    if loss == "multinomial":
        X, y, th, v, w = _multi_data(np.float64, seed=7)
    else:
        X, y, th, v, w = _data("squared", np.float64, seed=7)
    obj = tl.TiltedObjective(loss, _dask(X), _dask(y), groups=_groups(), tilts=(1.0, -0.5))
    f, g = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["served"] == 0 and route_calls["asked"] == 4
    kind = "multi" if loss == "multinomial" else "scalar"
    assert set(started) == {f"group_{kind}-float64"}  # asked by each chunk, started once
    ready.add(started[0])
    f1, g1 = dask.compute(*obj.value_and_gradient(th))
    assert route_calls["served"] == 3  # the empty chunk declines
    _close(f1, f, np.float64)
    _close(g1, g, np.float64)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", [0.0, 1e-12, 0.05, 40.0, -40.0])
def test_group_states_match_the_accumulator(dtype, t):
    """The kernel's per-group states against the accumulator's from the same losses
    (formed here in float64 by NumPy), rows sorted by loss within groups so that the
    running shift moves at every row (the lazy shift of the sums is then exercised), an
    empty group and zero prior weights."""
    from tiltlab.accumulator import TiltState
    from tiltlab.segments import Segments

    rng = np.random.default_rng(11)
    n, d, G = 3000, 9, 5
    X = rng.standard_normal((n, d)).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    th = rng.standard_normal(d).astype(dtype)
    ell = (X.astype(np.float64) @ th - y) ** 2
    order = np.argsort(ell if t >= 0 else -ell)  # the shift moves at every row
    X, y = X[order], y[order]
    codes = rng.choice([0, 1, 3, 4], size=n)  # group 2 empty
    p = rng.uniform(0.5, 1.5, size=n)
    p[::5] = 0.0
    st = FusedProblem("squared", X, y, p).group_states(th, t, codes, G, gradient=True)
    Xf = X.astype(np.float64)
    z = Xf @ th.astype(np.float64)
    lf = (z - y.astype(np.float64)) ** 2
    d1 = 2.0 * (z - y.astype(np.float64))
    seg = Segments.from_codes(codes, G)

    def sums(pe):
        return (np.stack([np.bincount(codes, pe * d1 * Xf[:, j], G) for j in range(d)], 1),)

    ref = TiltState.from_block(lf, t, p, segments=seg, sums=sums)
    assert st.present.tolist() == [True, True, False, True, True]
    on = st.present
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(st.mass[on], ref.mass[on], rtol=1e-14)
    np.testing.assert_allclose(st.shift[on], ref.shift[on], rtol=tol, atol=tol * lf.max())
    np.testing.assert_allclose(st.s[on], ref.s[on], rtol=1e3 * tol if abs(t) > 1 else tol)
    got = st.sums[0][on] / st.s[on, None]
    want = ref.sums[0][on] / ref.s[on, None]
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    risk = st.group_state().risk(np, np.float64)
    np.testing.assert_allclose(risk[on], ref.risk()[on], rtol=tol, atol=tol * lf.max())


# ---------------------------------------------------------------------------------------
# the multinomial loss (theta of shape (d, K), integer labels)

K = 4


def _multi_data(dtype, seed=0, n=N, d=D, scale=0.1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    y = rng.integers(0, K, size=n)
    th = (scale * rng.standard_normal((d, K))).astype(dtype)
    v = rng.standard_normal((d, K)).astype(dtype)
    w = rng.uniform(0.2, 2.0, size=n)
    w[::7] = 0.0  # zero prior weights inside groups
    return X, y, th, v, w


def _multi_pieces(X, y, th, v):
    """float64 losses, ``d1 = softmax - onehot``, ``u = X v``, ``a = d1 . u`` and the
    per-sample Hessian applied to ``u``, ``hz = s u - s (s . u)``."""
    rows = np.arange(X.shape[0])
    z = X @ th
    ell = special.logsumexp(z, axis=1) - z[rows, y]
    S = special.softmax(z, axis=1)
    d1 = S.copy()
    d1[rows, y] -= 1.0
    u = X @ v
    a = np.sum(d1 * u, axis=1)
    hz = S * u - S * np.sum(S * u, axis=1, keepdims=True)
    return ell, d1, u, a, hz


def _multi_tol(X, th, v, t, dtype):
    """Tolerance of the kernel's normalised per-group quantities against float64 ones of
    the same data. The kernel's only arithmetic in ``X``'s dtype is the dot products
    ``z = x theta`` and ``u = x v``, each off by at most ``gamma_d sum_j |x_j theta_j|``
    (``gamma_d = d eps / 2``); the losses and ``d1``, ``hz`` and ``a`` are Lipschitz in
    ``z`` and ``u`` with small constants (``|dl/dz|_1 <= 2``, the softmax's Jacobian <= 2
    in the max norm) and the weights' relative error is ``|t|`` times the losses' (the
    shift moves with them), so the normalised sums differ by a small multiple of ``(1 +
    |t|)`` times the predictors' error, relative to their scale. The float64 sums of a few
    thousand terms add ``n eps`` (the accumulator's and the kernel's orders differ)."""
    Xa = np.abs(X.astype(np.float64))
    gamma = X.shape[1] * np.finfo(dtype).eps / 2
    err = gamma * (np.max(Xa @ np.abs(th.astype(np.float64)))
                   + np.max(Xa @ np.abs(v.astype(np.float64))))  # fmt: skip
    return 16 * (1 + abs(t)) * err + X.shape[0] * np.finfo(np.float64).eps


def _group_xt(Xf, codes, G, coef):
    """Per-group ``sum_{i in g} x_i coef_i^T`` (``G x d x K``), row by row per group."""
    return np.stack([Xf[codes == g].T @ coef[codes == g] for g in range(G)])


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", [0.0, 1e-3, 0.7, -0.7, 40.0, -40.0])
@pytest.mark.parametrize("mode", ["value", "grad", "hvp"])
def test_multinomial_group_states_match_the_accumulator(dtype, t, mode):
    """The multinomial kernel's per-group states and ``G x d x K`` sums against the
    accumulator's from float64 losses and derivatives of the same data, rows sorted by loss
    so that each group's running shift moves at every row (at ``|t| = 40`` the lazy shift
    of the sums moves too), an empty group and zero prior weights."""
    from tiltlab.accumulator import TiltState
    from tiltlab.segments import Segments

    n, d, G = 3000, 9, 5
    X, y, th, v, p = _multi_data(dtype, seed=11, n=n, d=d, scale=1.0)
    Xf, thf, vf = (a.astype(np.float64) for a in (X, th, v))
    ell = _multi_pieces(Xf, y, thf, vf)[0]
    order = np.argsort(ell if t >= 0 else -ell)
    X, y, Xf = X[order], y[order], Xf[order]
    ell, d1, u, a, hz = _multi_pieces(Xf, y, thf, vf)
    codes = np.random.default_rng(3).choice([0, 1, 3, 4], size=n)  # group 2 empty
    fp = FusedProblem("multinomial", X, y, p)
    st = fp.group_states(
        th, t, codes, G, gradient=mode == "grad", hvp_vector=v if mode == "hvp" else None
    )

    def sums(pe):
        if mode == "grad":
            return (_group_xt(Xf, codes, G, pe[:, None] * d1),)
        if mode == "hvp":
            c = pe[:, None] * (hz + t * a[:, None] * d1)
            return (
                _group_xt(Xf, codes, G, c),
                _group_xt(Xf, codes, G, pe[:, None] * d1),
                np.bincount(codes, pe * a, G),
            )
        return ()

    ref = TiltState.from_block(ell, t, p, segments=Segments.from_codes(codes, G), sums=sums)
    assert st.present.tolist() == [True, True, False, True, True]
    on = st.present
    tol = _multi_tol(X, th, v, t, dtype)
    np.testing.assert_allclose(st.mass[on], ref.mass[on], rtol=1e-14)
    np.testing.assert_allclose(st.shift[on], ref.shift[on], rtol=0, atol=tol * ell.max())
    np.testing.assert_allclose(st.s[on], ref.s[on], rtol=tol * max(1.0, ell.max()))
    risk = st.group_state().risk(np, np.float64)
    np.testing.assert_allclose(risk[on], ref.risk()[on], rtol=0, atol=tol * ell.max())
    assert len(st.sums) == {"value": 0, "grad": 1, "hvp": 3}[mode]
    for got, want in zip(st.sums, ref.sums, strict=True):
        assert got.shape == want.shape and got.dtype == np.float64
        s_got = st.s[on].reshape((-1,) + (1,) * (got.ndim - 1))
        s_want = ref.s[on].reshape(s_got.shape)
        want = want[on] / s_want
        _close(got[on] / s_got, want, dtype, tol=tol)
    if mode != "value":
        assert np.all(st.sums[0][~on] == 0.0)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_multinomial_group_states_non_finite_and_threads(dtype):
    """An overflowing predictor gives no states (the caller's generic route decides), and
    the states do not depend on numba's thread count (the rows are walked by one thread)."""
    X, y, th, v, p = _multi_data(dtype, seed=2, n=3000, d=9)
    codes = np.random.default_rng(4).integers(0, 6, size=3000)
    fp = FusedProblem("multinomial", X, y, p)
    big = np.zeros_like(th)
    big[:, 1] = 1e308 if dtype == np.float64 else 1e38
    with np.errstate(over="ignore", invalid="ignore"):
        assert fp.group_states(big, 1.0, codes, 6, gradient=True) is None
        assert fp.group_states(big, -1.0, codes, 6, hvp_vector=v) is None
    numba = pytest.importorskip("numba")
    before = numba.get_num_threads()
    outs = []
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            for loss, y1, th1, v1 in (("multinomial", y, th, v), ("logistic", y % 2, th[:, 0],
                                                                  v[:, 0])):  # fmt: skip
                f1 = FusedProblem(loss, X, y1, p)
                sg = f1.group_states(th1, 2.0, codes, 6, gradient=True)
                sh = f1.group_states(th1, -1.5, codes, 6, hvp_vector=v1)
                outs.append((threads, loss, sg, sh))
    finally:
        numba.set_num_threads(before)
    ones = [o for o in outs if o[0] == 1]
    for o in outs:
        (ref,) = [r for r in ones if r[1] == o[1]]
        for a, b in zip(ref[2:], o[2:], strict=True):
            for f in ("shift", "hi", "lo", "mass", "s", "q", "lsum"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
            for sa, sb in zip(a.sums, b.sums, strict=True):
                np.testing.assert_array_equal(sa, sb)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("tilts", [(1.0, 0.7), (-2.0, 0.0), (0.5, 1e-3), (3.0, -3.0)])
def test_fused_multinomial_hierarchy_matches_the_numpy_objective(dtype, tilts, route_calls):
    """Value, gradient and Hessian-vector product of the Dask hierarchy (uneven chunks, one
    empty, groups spanning chunks, zero prior weights) against the eager NumPy objective
    on the generic engine; each non-empty chunk is served by the grouped kernel."""
    X, y, th, v, w = _multi_data(dtype)
    g = _groups()
    kw = dict(groups=g, tilts=tilts, weights=w, l2=1e-2)
    ref = tl.TiltedObjective("multinomial", X, y, **kw)
    ref.fused = False
    obj = tl.TiltedObjective("multinomial", _dask(X), _dask(y), **{**kw, "weights": _dask(w)})
    f, grad = dask.compute(*obj.value_and_gradient(th))
    hv, val = dask.compute(obj.hvp(th, v), obj.value(th))
    assert route_calls["served"] == 3 * 3  # three non-empty chunks, three evaluations
    assert grad.dtype == dtype and hv.dtype == dtype and grad.shape == th.shape == hv.shape
    # the tolerances of the scalar losses hold: the kernel's float32 predictors (its
    # softmax, losses and weights are float64) against the generic engine's float32 losses
    # differ by a few float32 roundings per loss, amplified by tilts of at most 3
    f0, g0 = ref.value_and_gradient(th)
    _close(f, f0, dtype)
    _close(val, f0, dtype)
    _close(grad, g0, dtype)
    _close(hv, ref.hvp(th, v), dtype)


@needs_numba
def test_fused_multinomial_hierarchy_mixed_routes_and_non_finite_losses(route_calls):
    """A chunk without prior mass is declined (the generic route gives its state, merged
    with the kernel's ``G x d x K`` sums of the other chunks); overflowing losses make every
    chunk decline, and the result is the generic route's."""
    from tiltlab.distributed import ClientObjective

    X, y, th, v, w = _multi_data(np.float64, seed=7)
    w[1500:2796] = 0.0  # the third chunk has no prior mass
    g = _groups(seed=2)
    g[1500:2796] = np.random.default_rng(5).choice([3, 43], size=1296)  # groups of others
    kw = dict(groups=g, tilts=(2.0, -1.0), weights=w)
    ref = tl.TiltedObjective("multinomial", X, y, **kw)
    ref.fused = False
    obj = tl.TiltedObjective("multinomial", _dask(X), _dask(y), **{**kw, "weights": _dask(w)})
    f, grad = dask.compute(*obj.value_and_gradient(th))
    (hv,) = dask.compute(obj.hvp(th, v))
    assert route_calls["asked"] == 2 * 4 and route_calls["served"] == 2 * 2
    f0, g0 = ref.value_and_gradient(th)
    _close(f, f0, np.float64)
    _close(grad, g0, np.float64)
    _close(hv, ref.hvp(th, v), np.float64)
    big = np.zeros_like(th)
    big[:, 1] = 1e308  # most predictors overflow
    client = ClientObjective(obj)
    with np.errstate(over="ignore", invalid="ignore"):
        value = client.value(big)
        obj.fused = False
        generic = client.value(big)
    assert route_calls["asked"] == 3 * 4 and route_calls["served"] == 2 * 2  # declined
    np.testing.assert_equal(value, generic)
    assert not np.isfinite(value)


class _Reads:
    """Counts, on Dask's local scheduler, the graphs computed and, per chunk of ``X`` held
    in the graph (persisted data: arrays of ``D`` columns), the tasks that take it: the
    sweeps over the data."""

    def __init__(self):
        from dask.callbacks import Callback

        self.graphs = 0
        self.reads: list[tuple[int, int]] = []  # (rows of the chunk, tasks that take it)

        def start_state(dsk, state):
            self.graphs += 1
            for key, value in state["cache"].items():
                if isinstance(value, np.ndarray) and value.ndim == 2 and value.shape[1] == D:
                    self.reads.append((value.shape[0], len(state["dependents"].get(key, ()))))

        self.callback = Callback(start_state=start_state)


@needs_numba
@pytest.mark.parametrize("loss", ["logistic", "multinomial"])
@pytest.mark.parametrize("kind", ["sample", "hierarchy"])
def test_one_graph_and_one_sweep_per_evaluation(loss, kind, route_calls):
    """An evaluation of a persisted objective (value, value and gradient, Hessian-vector
    product) is one graph that reads each chunk of ``X`` once, for a hierarchy as for the
    sample level (the fused grouped kernel forms each chunk's group states and sums in
    its one pass); the generic route of a hierarchy (``fused = False``) reads each chunk
    twice (group states, then the products with the final weights)."""
    if loss == "multinomial":
        X, y, th, v, w = _multi_data(np.float64, seed=11)
    else:
        X, y, th, v, w = _data(loss, np.float64, seed=11)
    kw = {"groups": _groups(), "tilts": (-1.0, 2.0)} if kind == "hierarchy" else {"t": -1.0}
    Xd, yd = dask.persist(_dask(X), _dask(y))
    obj = tl.TiltedObjective(loss, Xd, yd, **kw)
    dask.compute(*obj.value_and_gradient(th))  # distributes (persists) the data once
    for fused in (True, False):
        obj.fused = fused
        for mode, evaluate in (
            ("value", lambda: dask.compute(obj.value(th))),
            ("grad", lambda: dask.compute(*obj.value_and_gradient(th))),
            ("hvp", lambda: dask.compute(obj.hvp(th, v))),
        ):
            two = kind == "hierarchy" and not fused and mode != "value"
            reads = _Reads()
            with reads.callback:
                evaluate()
            assert reads.graphs == 1
            assert len(reads.reads) == len(CHUNKS)  # every chunk of X is in the graph
            nonempty = [r for rows, r in reads.reads if rows]
            assert nonempty == [2 if two else 1] * 3, (fused, mode, reads.reads)
    if kind == "hierarchy":
        # three non-empty chunks in each fused evaluation, the first one's included
        assert route_calls["served"] == 3 * 4

"""The one-pass engine: blocked evaluations against plain formulas, and segment hierarchies.

References here are written independently of tiltlab's kernels: plain float64 NumPy with
an explicit softmax of ``t * losses`` (shifted by the max), per-group Python loops, and
central finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest
from _matrix import FULL_MATRIX, backend_grid
from scipy.special import logsumexp, softmax

import tiltlab as tl
from tiltlab._compat import to_numpy


def _ref_parts(loss, X, y, theta, t, p=None):
    """Value, gradient and dense Hessian of the sample-level tilted objective (NumPy)."""
    z = X @ theta
    if loss == "squared":
        ell, d1, d2 = (z - y) ** 2, 2 * (z - y), np.full_like(z, 2.0)
    else:  # logistic
        s = 1 / (1 + np.exp(-z))
        ell = np.logaddexp(0, z) - y * z
        d1, d2 = s - y, s * (1 - s)
    p = np.full(len(y), 1 / len(y)) if p is None else p / p.sum()
    if t == 0:
        value, w = p @ ell, p
    elif abs(t) < 1e-6:  # cumulant series: log-sum-exp / t would amplify rounding by 1/t
        mean = p @ ell
        value = mean + t * (p @ (ell - mean) ** 2) / 2
        w = softmax(t * ell + np.log(p))
    else:
        value = logsumexp(t * ell, b=p) / t
        w = softmax(t * ell + np.log(p))
    g = X.T @ (w * d1)
    gi = d1[:, None] * X
    H = (X * (w * d2)[:, None]).T @ X + t * ((gi - g) * w[:, None]).T @ (gi - g)
    return value, g, H


def _to(xp, a):
    return xp.asarray(np.asarray(a))


BLOCKED_FACTORS = {
    "loss": ["squared", "logistic"],
    "t": [-2.0, 0.0, 1e-9, 5.0],
    "block_rows": [1, 13, None],
}
#: every loss, tilt and block size on NumPy; on array-api-strict, PyTorch and CuPy (the
#: same blocked code on another namespace; one block per row costs 61 passes) each value
#: at least once and every block size with every loss (``_matrix.backend_grid``); Dask
#: one representative tilt (each block reads a graph) with several blocks and with one.
#: The full product on every backend with ``TILTLAB_FULL_MATRIX=1``.
BLOCKED_GRID = [
    row
    for row in backend_grid(BLOCKED_FACTORS, full=[("loss", "block_rows")])
    if row[0] != "dask" or FULL_MATRIX
] + (
    []
    if FULL_MATRIX
    else [("dask", loss, -2.0, rows) for loss in BLOCKED_FACTORS["loss"] for rows in (13, None)]
)


@pytest.mark.parametrize(("xp", "loss", "t", "block_rows"), BLOCKED_GRID, indirect=["xp"])
def test_blocked_matches_plain(xp, xp_name, loss, t, block_rows):
    if xp_name == "dask.array" and (t != -2.0 or block_rows == 1) and not FULL_MATRIX:
        pytest.skip("dask: one representative case (each block reads a graph)")
    rng = np.random.default_rng(0)
    n, d = 61, 4
    X = rng.standard_normal((n, d))
    theta = rng.standard_normal(d) / 2
    y = X @ theta + rng.standard_normal(n) if loss == "squared" else (rng.random(n) < 0.4) * 1.0
    p = rng.random(n) + 0.1
    v = rng.standard_normal(d)
    for prior in (None, p):
        obj = tl.TiltedObjective(
            loss, _to(xp, X), _to(xp, y), t=t, weights=None if prior is None else _to(xp, prior)
        )
        obj.block_rows = block_rows
        obj.value(_to(xp, theta))  # prepares the prior
        val, g = obj.value_and_gradient(_to(xp, theta))
        hv = obj.hvp(_to(xp, theta), _to(xp, v))
        rv, rg, rH = _ref_parts(loss, X, y, theta, t, prior)
        assert g.dtype == xp.float64
        np.testing.assert_allclose(float(to_numpy(val)), rv, rtol=1e-12)
        np.testing.assert_allclose(to_numpy(g), rg, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(to_numpy(hv), rH @ v, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block_rows", [3, None])
def test_blocked_multinomial_against_finite_differences(xp, block_rows):
    rng = np.random.default_rng(1)
    n, d, k = 40, 3, 3
    X = rng.standard_normal((n, d))
    y = rng.integers(0, k, n)
    th = rng.standard_normal((d, k)) / 3
    v = rng.standard_normal((d, k))
    obj = tl.TiltedObjective("multinomial", _to(xp, X), _to(xp, y), t=1.5)
    obj.block_rows = block_rows
    _, g = obj.value_and_gradient(_to(xp, th))
    hv = obj.hvp(_to(xp, th), _to(xp, v))
    ref = tl.TiltedObjective("multinomial", X, y, t=1.5)
    h = 1e-6
    fd_g = np.zeros_like(th)
    for i in np.ndindex(th.shape):
        e = np.zeros_like(th)
        e[i] = h
        fd_g[i] = (float(ref.value(th + e)) - float(ref.value(th - e))) / (2 * h)
    fd_hv = (to_numpy(ref.gradient(th + h * v)) - to_numpy(ref.gradient(th - h * v))) / (2 * h)
    np.testing.assert_allclose(to_numpy(g), fd_g, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_numpy(hv), fd_hv, rtol=1e-5, atol=1e-7)


def test_float32_blocked_engine(xp):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((500, 6))
    theta = rng.standard_normal(6) / 3
    y = (rng.random(500) < 0.3) * 1.0
    obj = tl.TiltedObjective(
        "logistic", _to(xp, X.astype(np.float32)), _to(xp, y.astype(np.float32)), t=3.0
    )
    obj.block_rows = 50
    val, g = obj.value_and_gradient(_to(xp, theta.astype(np.float32)))
    assert g.dtype == xp.float32 and val.dtype == xp.float32
    rv, rg, _ = _ref_parts("logistic", X, y, theta, 3.0)
    np.testing.assert_allclose(float(to_numpy(val)), rv, rtol=2e-6)
    np.testing.assert_allclose(to_numpy(g), rg, rtol=2e-5, atol=2e-6)


def test_block_rows_validation():
    obj = tl.TiltedObjective("squared", np.ones((4, 2)), np.ones(4))
    with pytest.raises(ValueError, match="`block_rows`"):
        obj.block_rows = 0
    obj.block_rows = 2
    assert obj.block_rows == 2
    obj.block_rows = None
    assert obj.block_rows == 4


def test_overflowing_trial_step_gives_inf_not_error():
    # a line search may try a huge step: the value must be inf (so it backtracks)
    obj = tl.TiltedObjective("squared", np.ones((3, 1)), np.zeros(3), t=1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        val, _ = obj.value_and_gradient(np.array([1e200]))
    assert not np.isfinite(float(val))


# ----------------------------------------------------------------------------------------
# hierarchies by segment reductions
# ----------------------------------------------------------------------------------------


def _ref_hier(l, g, t, tau, p=None):
    """Two-level tilted risk by a Python loop over groups (float64 NumPy)."""
    p = np.ones_like(l) if p is None else p
    risks, masses = [], []
    for code in np.unique(g):
        m = g == code
        pg = p[m] / p[m].sum()
        if abs(tau) < 1e-6:  # cumulant series (log-sum-exp / tau loses 1/tau digits)
            mean = pg @ l[m]
            r = mean + tau * (pg @ (l[m] - mean) ** 2) / 2
        else:
            r = logsumexp(tau * l[m], b=pg) / tau
        risks.append(r)
        masses.append(p[m].sum())
    risks, masses = np.array(risks), np.array(masses) / np.sum(masses)
    return masses @ risks if t == 0 else logsumexp(t * risks, b=masses) / t


def _zipf(n, G, rng):
    w = 1.0 / np.arange(1, G + 1) ** 1.2
    return rng.choice(G, size=n, p=w / w.sum())


@pytest.mark.parametrize("tilts", [(1.0, -2.0), (50.0, 0.0), (-1.0, 3.0), (0.0, 1e-12)])
def test_zipf_hierarchy_matches_loop(xp, tilts):
    rng = np.random.default_rng(3)
    n = 3000
    g = _zipf(n, 300, rng)
    l = rng.exponential(2.0, n)
    r = tl.hierarchical_risk(_to(xp, l), g, tilts)
    assert float(to_numpy(r)) == pytest.approx(_ref_hier(l, g, *tilts), rel=1e-12)
    w = to_numpy(tl.hierarchical_weights(_to(xp, l), g, tilts))
    assert w.sum() == pytest.approx(1.0, rel=1e-12)


@pytest.mark.slow
def test_hundred_thousand_groups():
    rng = np.random.default_rng(4)
    n = 400_000
    g = _zipf(n, 100_000, rng)
    l = rng.exponential(1.0, n)
    p = rng.random(n) + 0.01
    r = float(tl.hierarchical_risk(l, g, (2.0, -1.0), weights=p))
    assert r == pytest.approx(_ref_hier_fast(l, g, 2.0, -1.0, p), rel=1e-11)


def _ref_hier_fast(l, g, t, tau, p):
    """The loop reference, vectorised by sorting (for many groups)."""
    order = np.argsort(g, kind="stable")
    gs, ls, ps = g[order], l[order], p[order]
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    risks, masses = [], []
    for a, b in zip(starts, np.r_[starts[1:], len(gs)], strict=True):
        pg = ps[a:b] / ps[a:b].sum()
        risks.append(logsumexp(tau * ls[a:b], b=pg) / tau)
        masses.append(ps[a:b].sum())
    masses = np.array(masses) / np.sum(masses)
    return logsumexp(t * np.array(risks), b=masses) / t


def test_integer_codes_need_no_sort_and_labels_still_work():
    rng = np.random.default_rng(5)
    l = rng.exponential(1.0, 200)
    codes = rng.integers(0, 7, 200)
    labels = np.array(["abcdefg"[c] for c in codes])
    a = tl.hierarchical_risk(l, codes, (1.0, 2.0))
    b = tl.hierarchical_risk(l, labels, (1.0, 2.0))
    c = tl.hierarchical_risk(l, codes * 10 + 3, (1.0, 2.0))  # sparse integer labels
    assert float(a) == pytest.approx(float(b), rel=1e-14)
    assert float(a) == pytest.approx(float(c), rel=1e-14)


def test_hierarchical_objective_gradient_zipf(xp):
    rng = np.random.default_rng(6)
    n, d = 800, 5
    X = rng.standard_normal((n, d))
    y = (rng.random(n) < 0.3) * 1.0
    g = _zipf(n, 60, rng)
    th = rng.standard_normal(d) / 3
    obj = tl.TiltedObjective("logistic", _to(xp, X), _to(xp, y), groups=g, tilts=(2.0, -1.0))
    _, grad = obj.value_and_gradient(_to(xp, th))
    ref = tl.TiltedObjective("logistic", X, y, groups=g, tilts=(2.0, -1.0))
    h = 1e-6
    fd = np.array(
        [(float(ref.value(th + h * e)) - float(ref.value(th - h * e))) / (2 * h) for e in np.eye(d)]
    )
    np.testing.assert_allclose(to_numpy(grad), fd, rtol=1e-6, atol=1e-9)

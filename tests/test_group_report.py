"""Tests of tiltlab.diagnostics.group_report against 50-digit references and the
hierarchical functions, and of its table and plot."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _contract import reference_tilted

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.diagnostics import format_group_report, group_report
from tiltlab.testing import assert_close

mpmath.mp.dps = 50


def _data(seed=0, n=40, n_groups=5):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, n_groups, size=n)
    g[:n_groups] = np.arange(n_groups)  # every group present
    l = rng.exponential(size=n) * (1 + g)  # groups of different scales
    return l, g


def mp_report(l, g, t, tau, prior=None):
    """Per group (sorted labels): risk, mass, weight, ESS fraction, at 50 digits (the
    ESS fraction of tilted weights w under an in-group prior q: 1 / sum w^2 / q)."""
    p = np.ones(l.size) if prior is None else np.asarray(prior, dtype=float)
    total = mpmath.fsum(mpmath.mpf(float(v)) for v in p)
    out = {k: [] for k in ("risk", "mass", "weight", "ess")}
    for lab in np.unique(g):
        idx = np.flatnonzero((g == lab) & (p > 0))
        ps = [mpmath.mpf(float(p[i])) / total for i in idx]
        P = mpmath.fsum(ps)
        q = [v / P for v in ps]  # in-group prior
        R, w = reference_tilted([float(l[i]) for i in idx], tau, q)
        out["risk"].append(R)
        out["mass"].append(P)
        out["ess"].append(1 / mpmath.fsum(a * a / b for a, b in zip(w, q, strict=True)))
    out["weight"] = reference_tilted(out["risk"], t, out["mass"])[1]
    return {k: np.array([float(v) for v in vs]) for k, vs in out.items()}


@pytest.mark.parametrize("tilts", [(1.0, -1.0), (-2.0, 0.5), (0.0, 3.0), (5.0, 0.0)])
def test_matches_mpmath(tilts):
    l, g = _data()
    rep = group_report(l, g, tilts)
    want = mp_report(l, g, *tilts)
    assert rep["group"].tolist() == [0, 1, 2, 3, 4]
    assert rep["size"].tolist() == np.bincount(g).tolist()
    for key in ("risk", "mass", "weight", "ess"):
        assert_close(rep[key], want[key], rtol=1e-12, err_msg=key)


def test_prior_weights_match_mpmath():
    l, g = _data(1)
    p = np.random.default_rng(2).uniform(0.0, 2.0, size=l.size)
    p[10] = 0.0
    rep = group_report(l, g, (1.5, -0.7), weights=p)
    want = mp_report(l, g, 1.5, -0.7, prior=p)
    for key in ("risk", "mass", "weight", "ess"):
        assert_close(rep[key], want[key], rtol=1e-12, err_msg=key)


def test_integer_weights_are_frequencies():
    # the ESS fraction with prior counts equals that of the data with repeated samples
    l, g = _data(3, n=25)
    counts = np.random.default_rng(4).integers(1, 4, size=l.size)
    a = group_report(l, g, (0.5, -2.0), weights=counts)
    b = group_report(np.repeat(l, counts), np.repeat(g, counts), (0.5, -2.0))
    for key in ("risk", "mass", "weight", "ess"):
        assert_close(a[key], b[key], rtol=1e-12, err_msg=key)


@pytest.mark.parametrize("tilts", [(2.0, -1.0), (-1.0, 4.0), (math.inf, -1.0), (1.0, -math.inf)])
def test_consistent_with_hierarchical_functions(tilts):
    l, g = _data(5, n=60, n_groups=7)
    rep = group_report(l, g, tilts)
    w = tl.hierarchical_weights(l, g, tilts)
    per_group = np.bincount(np.searchsorted(rep["group"], g), weights=w)
    assert_close(rep["weight"], per_group, rtol=1e-12, atol=1e-300)
    assert_close(rep["weight"].sum(), 1.0, rtol=1e-14)
    J = tl.tilted_risk(rep["risk"], tilts[0], weights=rep["mass"])
    assert_close(J, tl.hierarchical_risk(l, g, tilts), rtol=1e-12)


def test_infinite_inner_tilt_keeps_the_tied_extremes():
    l = np.array([1.0, 3.0, 3.0, 0.5, 2.0, 2.0, 2.0, 7.0])
    g = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    rep = group_report(l, g, (0.0, math.inf))
    assert rep["risk"].tolist() == [3.0, 7.0]
    assert_close(rep["ess"], [2 / 3, 1 / 5], rtol=1e-15)
    rep = group_report(l, g, (0.0, 0.0))
    assert_close(rep["ess"], [1.0, 1.0], rtol=1e-15)
    assert_close(rep["weight"], rep["mass"], rtol=1e-15)


def test_string_labels():
    l = np.array([0.3, 0.1, 5.0, 0.2])
    rep = group_report(l, np.array(["cat", "ant", "cat", "ant"]), (1.0, 1.0))
    assert rep["group"].tolist() == ["ant", "cat"]
    assert_close(rep["risk"][0], math.log((math.exp(0.1) + math.exp(0.2)) / 2), rtol=1e-14)


def test_deeper_tree_reports_the_outer_level():
    rng = np.random.default_rng(6)
    n = 48
    inner = rng.integers(0, 8, size=n)
    inner[:8] = np.arange(8)
    outer = inner // 3  # three outer groups, nested
    l = rng.exponential(size=n)
    tilts = (1.0, -0.5, 2.0)
    rep = group_report(l, [outer, inner], tilts)
    assert rep["group"].tolist() == [0, 1, 2]
    w = tl.hierarchical_weights(l, [outer, inner], tilts)
    per_group = np.bincount(outer, weights=w)
    assert_close(rep["weight"], per_group, rtol=1e-12)
    J = tl.tilted_risk(rep["risk"], 1.0, weights=rep["mass"])
    assert_close(J, tl.hierarchical_risk(l, [outer, inner], tilts), rtol=1e-12)
    # "risk": the hierarchical risk of each outer group's subtree under (t, tau)
    for k in range(3):
        on = outer == k
        assert_close(rep["risk"][k], tl.hierarchical_risk(l[on], inner[on], tilts[1:]), rtol=1e-12)
    # "ess": Kish's ESS of the product weights inside each outer group, over its size
    for k in range(3):
        q = w[outer == k]
        assert_close(rep["ess"][k], q.sum() ** 2 / (q @ q) / q.size, rtol=1e-12)


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_backends(xp, dtype_name):
    l, g = _data(7)
    dtype = getattr(xp, dtype_name)
    p = np.random.default_rng(8).uniform(0.5, 1.5, size=l.size)
    lx = xp.asarray(l, dtype=dtype)
    host = to_numpy(lx).astype(np.float64)
    rtol = 1e-12 if dtype_name == "float64" else 2e-5
    for prior in (None, p):
        w = None if prior is None else xp.asarray(prior, dtype=dtype)
        rep = group_report(lx, g, (1.0, -1.0), weights=w)
        hp = None if prior is None else to_numpy(w).astype(np.float64)
        want = mp_report(host, g, 1.0, -1.0, prior=hp)
        for key in ("risk", "mass", "weight", "ess"):
            assert_close(rep[key], want[key], xp=xp, dtype=dtype, rtol=rtol, err_msg=key)
        assert to_numpy(rep["size"]).tolist() == np.bincount(g).tolist()
        assert isinstance(rep["group"], np.ndarray)


def test_bad_input():
    l, g = _data(9)
    with pytest.raises(ValueError, match="`losses` must be 1-d"):
        group_report(np.ones((2, 3)), [0, 1, 1], (1.0, 1.0))
    with pytest.raises(ValueError, match="`tilts`"):
        group_report(l, g, (1.0,))
    with pytest.raises(ValueError, match="`groups`"):
        group_report(l, g[:-1], (1.0, 1.0))
    with pytest.raises(ValueError, match="`losses` contains"):
        group_report(np.array([1.0, np.inf]), [0, 1], (1.0, 1.0))
    p = np.ones(l.size)
    p[g == 2] = 0.0
    with pytest.raises(ValueError, match="zero total weight"):
        group_report(l, g, (1.0, 1.0), weights=p)


# ---------------------------------------------------------------------------
# the table


def test_format_lists_worst_then_best():
    l = np.array([5.0, 1.0, 3.0, 2.0, 4.0])
    rep = group_report(l, np.array([10, 11, 12, 13, 14]), (0.0, 0.0))
    lines = format_group_report(rep, worst=2, best=1).splitlines()
    assert lines[0].split() == ["group", "risk", "mass", "weight", "ess", "size"]
    assert [ln.split()[0] for ln in lines[1:]] == ["10", "14", "(2", "11"]
    assert lines[3].strip() == "(2 more)"
    full = format_group_report(rep, worst=3, best=3).splitlines()
    assert [ln.split()[0] for ln in full[1:]] == ["10", "14", "12", "13", "11"]
    with pytest.raises(ValueError, match="`worst`"):
        format_group_report(rep, worst=-1)
    with pytest.raises(ValueError, match="`report`"):
        format_group_report({"risk": rep["risk"]})


# ---------------------------------------------------------------------------
# the plot


def test_plot_renders_with_agg(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiltlab.plot import plot_group_report

    l, g = _data(10, n=300, n_groups=60)
    rep = group_report(l, g, (1.0, -1.0))
    top, bottom = plot_group_report(rep, max_groups=20)
    assert len(top.get_xticklabels()) == 20
    # the largest risk first
    first = int(top.get_xticklabels()[0].get_text())
    assert first == int(rep["group"][np.argmax(rep["risk"])])
    top.figure.savefig(tmp_path / "report.png")
    assert (tmp_path / "report.png").stat().st_size > 0
    plt.close(top.figure)
    with pytest.raises(ValueError, match="`max_groups`"):
        plot_group_report(rep, max_groups=1)

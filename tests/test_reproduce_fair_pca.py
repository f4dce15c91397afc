"""TERM-PCA: the min-max SDP baseline against brute force, the grouped data and the command.

The SDP relaxation is checked against a dense grid over the 2 x 2 Fantope (an independent
brute-force minimisation of the same program) and against every rank-r projection it
bounds; the reproduction against the paper's finding (the worst group's loss falls with t,
towards the min-max value).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tiltlab.baselines import fair_pca_sdp
from tiltlab.datasets import abalone_by_sex, load_csv_groups
from tiltlab.reproduce import ROW_KEYS, fair_pca


def _groups(seed=0, d=2, sizes=(40, 25)):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(sizes):
        scales = np.ones(d)
        scales[i % d] = 3.0
        rot = np.linalg.qr(rng.normal(size=(d, d)))[0] if i else np.eye(d)
        out.append(rng.normal(size=(n, d)) * scales @ rot.T)
    return out


def _linear_losses(groups, P, r):
    """loss_g(P) = (||X_g||^2 - <X_g'X_g, P> - tail_g) / n_g, straight from the definition."""
    out = []
    for X in groups:
        tail = np.sum(np.linalg.svd(X, compute_uv=False)[r:] ** 2)
        out.append((np.sum(X * X) - np.sum((X.T @ X) * P) - tail) / X.shape[0])
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sdp_matches_brute_force_on_the_2x2_fantope(seed):
    groups = _groups(seed)
    res = fair_pca_sdp(groups, 1)
    # the 2 x 2 Fantope (trace 1, eigenvalues in [0, 1]) is the disc of
    # P = [[1/2 + x/2, y/2], [y/2, 1/2 - x/2]], x^2 + y^2 <= 1 (eigenvalues (1 +- rho)/2);
    # a polar grid covers it, rim included, refined three times around its best point
    stats = []
    for X in groups:
        A = X.T @ X
        tail = np.sum(np.linalg.svd(X, compute_uv=False)[1:] ** 2)
        stats.append((A, tail, X.shape[0]))

    def worst(rho, phi):
        x, y = rho * np.cos(phi), rho * np.sin(phi)
        out = []
        for A, tail, n in stats:
            inner = A[0, 0] * (0.5 + x / 2) + A[1, 1] * (0.5 - x / 2) + A[0, 1] * y  # <A, P>
            out.append((np.trace(A) - inner - tail) / n)
        return np.max(out, axis=0)

    lo_r, hi_r, lo_p, hi_p = 0.0, 1.0, 0.0, 2 * np.pi
    for _ in range(4):
        rr, pp = np.linspace(lo_r, hi_r, 401), np.linspace(lo_p, hi_p, 401)
        R, PH = np.meshgrid(rr, pp, indexing="ij")
        W = worst(R, PH)
        i, j = np.unravel_index(np.argmin(W), W.shape)
        brute = W[i, j]
        dr, dp = 3 * (rr[1] - rr[0]), 3 * (pp[1] - pp[0])
        lo_r, hi_r = max(0.0, rr[i] - dr), min(1.0, rr[i] + dr)
        lo_p, hi_p = pp[j] - dp, pp[j] + dp
    # the certified bounds bracket the brute-force minimum (up to the grid's resolution)
    assert res.lower_bound <= brute * (1 + 1e-8) and brute <= res.value * (1 + 1e-8)
    assert res.value - brute <= 1e-6 * brute
    tight = fair_pca_sdp(groups, 1, rtol=1e-10)
    assert -1e-12 <= brute - tight.value <= 5e-7 * brute  # the grid's minimum is above
    assert res.lower_bound <= res.value and res.gap <= 1e-6 * res.value + 1e-12
    np.testing.assert_allclose(res.losses, _linear_losses(groups, res.projection, 1), rtol=1e-9)


def test_sdp_bounds_every_projection_and_is_feasible():
    groups = _groups(3, d=5, sizes=(60, 30, 45))
    r = 2
    res = fair_pca_sdp(groups, r)
    eig = np.linalg.eigvalsh(res.projection)
    assert eig.min() >= -1e-9 and eig.max() <= 1 + 1e-9
    assert np.trace(res.projection) == pytest.approx(r, abs=1e-9)
    np.testing.assert_allclose(res.group_weights.sum(), 1.0)
    rng = np.random.default_rng(0)
    for _ in range(200):  # no rank-r projection beats the relaxation's lower bound
        U = np.linalg.qr(rng.normal(size=(5, r)))[0]
        losses = [
            (np.sum((X - X @ U @ U.T) ** 2) - np.sum(np.linalg.svd(X, compute_uv=False)[r:] ** 2))
            / X.shape[0]
            for X in groups
        ]
        assert max(losses) >= res.lower_bound - 1e-12
    # one group: standard PCA is optimal, the excess loss is zero
    one = fair_pca_sdp(groups[:1], r)
    assert abs(one.value) < 1e-9 and one.rank == r


def test_sdp_input_errors():
    g = _groups(0)
    with pytest.raises(TypeError, match="`groups_data`"):
        fair_pca_sdp(np.zeros((3, 2)), 1)
    with pytest.raises(ValueError, match="`n_components`"):
        fair_pca_sdp(g, 3)
    with pytest.raises(ValueError, match="`groups_data`"):
        fair_pca_sdp([g[0], g[1][:, :1]], 1)
    with pytest.raises(ValueError, match=r"`groups_data\[0\]`"):
        fair_pca_sdp([np.full((3, 2), np.nan)], 1)


def test_abalone_groups_follow_the_file():
    data = abalone_by_sex()
    from tiltlab.datasets._loaders import _data_file

    letters = [line.split(",")[0] for line in _data_file("abalone.data").read_text().split()]
    assert data.sizes == tuple(letters.count(s) for s in "MFI")
    pooled = np.concatenate(data.groups)
    np.testing.assert_allclose(pooled.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(pooled.std(axis=0), 1, atol=1e-12)


def _write_groups(folder, groups):
    for name, X in groups.items():
        with open(os.path.join(folder, f"{name}.csv"), "w") as fh:
            fh.write(",".join(f"A{j + 1}" for j in range(X.shape[1])) + "\n")
            for row in X:
                fh.write(",".join(repr(float(v)) for v in row) + "\n")


def test_csv_groups_and_errors(tmp_path):
    rng = np.random.default_rng(4)
    groups = {"A": rng.normal(size=(30, 4)), "B": rng.normal(size=(12, 4)) * [1, 3, 1, 1]}
    _write_groups(tmp_path, groups)
    data = load_csv_groups(tmp_path)
    assert data.group_names == ("A", "B") and data.sizes == (30, 12)
    np.testing.assert_allclose(data.groups[1], groups["B"], rtol=1e-15)
    with pytest.raises(ValueError, match="`data_dir`"):
        load_csv_groups(tmp_path / "missing")
    (tmp_path / "C.csv").write_text("A1,A2\n1,2\n")
    with pytest.raises(ValueError, match="same number of columns"):
        load_csv_groups(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .csv"):
        load_csv_groups(empty)


def test_fair_pca_reproduction_quick():
    rep = fair_pca(seeds=1, quick=True, datasets=["abalone"])
    payload = rep.to_dict()
    assert payload["experiment"] == "fair-pca"
    assert all(tuple(r) == ROW_KEYS for r in payload["rows"])
    keys = {(r["method"], r["setting"], r["metric"], r["split"]) for r in payload["rows"]}
    assert len(keys) == len(payload["rows"])
    by = {(r["method"], r["setting"], r["metric"]): r["mean"] for r in rep.rows}
    tilts = (0, 10, 100, 10000)
    for r in (2, 3):
        setting = f"abalone, r={r}"
        worst = [by[(f"TERM (t={t})", setting, "worst_group_loss")] for t in tilts]
        # the paper's finding: the worst group's loss falls as t grows ...
        assert all(b <= a * (1 + 1e-6) for a, b in zip(worst, worst[1:], strict=False)), worst
        assert worst[-1] < 0.9 * worst[0]
        # ... to the min-max value, which the SDP relaxation bounds from below
        sdp = by[("fair PCA (SDP)", setting, "worst_group_loss")]
        assert sdp <= worst[-1] <= 1.01 * sdp
        assert by[("standard PCA", setting, "worst_group_loss")] > sdp
        # the worst group's loss is the largest of the groups'
        each = [
            by[("TERM (t=0)", setting, f"excess_loss_{g}")] for g in ("male", "female", "infant")
        ]
        assert by[("TERM (t=0)", setting, "worst_group_loss")] == max(each)


def test_fair_pca_reads_a_local_copy(tmp_path):
    rng = np.random.default_rng(5)
    base = rng.normal(size=(200, 5)) * [3, 2, 1, 0.5, 0.2]
    # two groups with different dominant directions, as high/low education in the paper
    _write_groups(tmp_path, {"high": base[:150], "low": base[150:][:, ::-1].copy()})
    rep = fair_pca(seeds=1, quick=True, datasets=[], data_dir=str(tmp_path), tilts=(0, 1e3))
    settings = {r["setting"] for r in rep.rows}
    assert settings and all(s.startswith(tmp_path.name) for s in settings)
    metrics = {r["metric"] for r in rep.rows}
    assert {"excess_loss_high", "excess_loss_low", "worst_group_loss"} <= metrics
    with pytest.raises(ValueError, match="`datasets`"):
        fair_pca(seeds=1, datasets=["credit"])
    with pytest.raises(ValueError, match="`tilts`"):
        fair_pca(seeds=1, datasets=["abalone"], tilts=(-1.0,))


@pytest.mark.slow  # a whole command run
def test_command_with_a_local_copy(tmp_path, capsys):
    import json

    from tiltlab.cli import main

    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(6)
    data = tmp_path / "credit"
    data.mkdir()
    base = rng.normal(size=(120, 4)) * [2, 1, 1, 0.5]
    _write_groups(data, {"A": base[:80], "B": base[80:][:, ::-1].copy()})
    path, figs = tmp_path / "out.json", tmp_path / "figs"
    argv = ["reproduce", "fair-pca", "--seeds", "1", "--quick", "--no-progress"]
    code = main([*argv, "--data-dir", str(data), "--json", str(path), "--plot", str(figs)])
    assert code == 0
    payload = json.loads(path.read_text())
    assert payload["experiment"] == "fair-pca"
    assert any(r["setting"].startswith("credit, r=") for r in payload["rows"])
    assert "fair_pca_credit.png" in {p.name for p in figs.iterdir()}
    assert "not ship" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--data-dir", str(tmp_path / "missing")])
    assert exc.value.code == 2 and "--data-dir" in capsys.readouterr().err


@pytest.mark.parametrize("max_iter", [0, -1, 1.5])
def test_fair_pca_sdp_checks_max_iter(max_iter):
    # max_iter=0 was taken as 1 and max_iter=-1 as 1 too, silently
    rng = np.random.default_rng(0)
    groups = [rng.normal(size=(10, 3)), rng.normal(size=(12, 3))]
    with pytest.raises(ValueError, match="`max_iter`"):
        fair_pca_sdp(groups, 1, max_iter=max_iter)

"""The console command, end to end on small settings."""

from __future__ import annotations

import json

import numpy as np

from tiltlab.cli import demo_point_estimation, main


def test_demo_runs_and_orders(capsys):
    assert main(["demo", "--n", "60"]) == 0
    out = capsys.readouterr().out
    assert "ESS" in out and "-inf" in out
    rows = demo_point_estimation(n=60)
    r = {row["t"]: row for row in rows}
    # tilted risks lie between min and max and increase with t (at each solution,
    # R(t) = min over theta, which is non-decreasing in t)
    risks = [row["tilted_risk"] for row in rows]
    assert np.all(np.diff(risks) >= -1e-9)
    assert r[np.inf]["max"] <= r[0.0]["max"] + 1e-9  # min-max point has the smallest max
    # negative tilts suppress outliers: the estimate moves towards the inlier centre (1, 1)
    assert np.linalg.norm(r[-2.0]["theta"] - 1.0) < np.linalg.norm(r[0.0]["theta"] - 1.0)


def test_reproduce_small(tmp_path, capsys):
    path = tmp_path / "rr.json"
    code = main(
        [
            "reproduce",
            "robust-regression",
            "--seeds",
            "1",
            "--noise",
            "0.4",
            "--methods",
            "ERM",
            "TERM",
            "Genie ERM",
            "--json",
            str(path),
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "TERM" in out and "paper" in out
    rows = json.loads(path.read_text())["rows"]
    by = {r["method"]: r for r in rows}
    assert set(by) == {"ERM", "TERM", "Genie ERM"}
    for r in rows:
        assert {"method", "noise", "test_rmse_mean", "test_rmse_se", "seconds"} <= set(r)
    # TERM is robust: far better than ERM at 40% noise, not far from the oracle
    assert by["TERM"]["test_rmse_mean"] < 0.6 * by["ERM"]["test_rmse_mean"]
    assert by["TERM"]["test_rmse_mean"] < by["Genie ERM"]["test_rmse_mean"] + 0.3

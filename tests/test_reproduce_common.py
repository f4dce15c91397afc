"""The shared result schema of the reproductions: statistics, rows, JSON and tables."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from tiltlab.reproduce import ROW_KEYS, Reproduction, make_row, mean_se, seed_list, write_json
from tiltlab.reproduce._common import format_grid


@pytest.mark.parametrize("values", [[1.0, 2.0, 4.0], [0.5, 0.25], [3.0, 3.0, 3.0, 3.5, 10.0]])
def test_mean_se_matches_statistics_module(values):
    mean, se, n = mean_se(values)
    assert n == len(values)
    assert mean == pytest.approx(statistics.fmean(values), rel=1e-15)
    assert se == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), rel=1e-14)


def test_mean_se_edge_cases():
    assert mean_se([2.5]) == (2.5, None, 1)
    assert mean_se([]) == (None, None, 0)
    # NaN values (e.g. a solver that did not converge) are left out, not propagated
    assert mean_se([1.0, float("nan"), 3.0]) == (2.0, 1.0, 2)


def test_rows_and_json_never_contain_nan(tmp_path):
    rows = [
        make_row("ERM", "noise=0.2", "test_rmse", "test", [1.0], (float("nan"), None)),
        make_row("TERM", "noise=0.2", "test_rmse", "test", [float("nan")], (1.08, 0.05)),
    ]
    rep = Reproduction("demo", rows)
    payload = rep.to_dict()
    assert payload["experiment"] == "demo"
    for r in payload["rows"]:
        assert tuple(r) == ROW_KEYS
    assert payload["rows"][0]["paper_mean"] is None and payload["rows"][0]["se"] is None
    assert payload["rows"][1]["mean"] is None and payload["rows"][1]["n_seeds"] == 0
    path = tmp_path / "out.json"
    write_json(payload, str(path))

    def reject(name):
        raise ValueError(name)

    assert json.loads(path.read_text(), parse_constant=reject) == payload
    with pytest.raises(ValueError):  # write_json refuses NaN instead of writing bad JSON
        write_json({"x": float("nan")}, str(tmp_path / "bad.json"))


def test_seed_list_validation():
    assert seed_list(3) == [0, 1, 2]
    assert seed_list([4, 7]) == [4, 7]
    for bad in (0, -1, []):
        with pytest.raises(ValueError, match="`seeds`"):
            seed_list(bad)
    with pytest.raises(ValueError, match="`seeds`"):
        seed_list([1, -2])
    with pytest.raises(TypeError, match="`seeds`"):
        seed_list(True)


def test_format_grid_puts_paper_beside_ours():
    rows = [
        make_row("ERM", "a", "acc", "test", [0.5, 0.7], (0.6, 0.01)),
        make_row("ERM", "b", "acc", "test", [0.9], None),
        make_row("TERM", "a", "acc", "test", [0.8, 0.8], (0.85, 0.02)),
    ]
    text = format_grid(rows, row_of=lambda r: r["method"], col_of=lambda r: r["setting"])
    lines = text.splitlines()
    assert lines[0].split("|")[0].strip() == "method"
    assert "0.600 (0.100) [0.600]" in lines[2]  # ours (se) [paper]
    assert "0.800 (0.000) [0.850]" in lines[3]
    assert "0.900" in lines[2] and "[" not in lines[2].split("|")[2]  # no paper column for b


def test_single_blas_thread_restores_the_environment(monkeypatch):
    from tiltlab.reproduce._common import single_blas_thread

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with single_blas_thread():
        import os

        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
        threadpoolctl = pytest.importorskip("threadpoolctl")
        for pool in threadpoolctl.threadpool_info():
            if pool["user_api"] == "blas":
                assert pool["num_threads"] == 1
    import os

    assert os.environ["OMP_NUM_THREADS"] == "7"
    assert "OPENBLAS_NUM_THREADS" not in os.environ


def test_group_reports_in_json_and_text(tmp_path):
    rows = [make_row("TERM", "noise=0.2", "accuracy", "test", [0.5])]
    assert "group_reports" not in Reproduction("demo", rows).to_dict()
    report = {
        "tilts": [-2.0, -2.0],
        "group": ["a", "b", "c"],
        "risk": [0.5, 2.0, float("inf")],
        "mass": [0.25, 0.5, 0.25],
        "weight": [0.5, 0.5, 0.0],
        "ess": np.array([1.0, 0.75, 0.5]),
        "size": [1, 2, 1],
    }
    rep = Reproduction("demo", rows, notes="n", group_reports={"TERM per class": report})
    payload = rep.to_dict()
    got = payload["group_reports"]["TERM per class"]
    assert got["risk"] == [0.5, 2.0, None] and got["ess"] == [1.0, 0.75, 0.5]
    assert got["group"] == ["a", "b", "c"] and got["size"] == [1, 2, 1]
    write_json(payload, str(tmp_path / "out.json"))  # strict JSON: no NaN or inf
    text = rep.report().splitlines()
    at = text.index("TERM per class:")
    assert [line.split()[0] for line in text[at + 2 :]] == ["c", "b", "a"]

"""The regression gate of ``benchmarks/asv_gate.py`` on asv results files written here.

Results in asv's format (version 2: one list of values per benchmark over the Cartesian
product of its parameters) for a recorded history of two commits and a new run; the gate
must take the newest recorded value of each benchmark and parameter combination, fail on
any increase of a count, and leave the timings (ratios) out of the verdict.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("asv")

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["result", "params", "version", "started_at", "duration"]
PASSES = "bench.Passes.track_passes"
RATIO = "bench.Dask.track_in_plain_passes"


@pytest.fixture(scope="module")
def gate():
    spec = importlib.util.spec_from_file_location("asv_gate", ROOT / "benchmarks/asv_gate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(folder: Path, commit: str, date: int, results: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "commit_hash": commit, "env_name": "existing-py", "date": date,
        "params": {"machine": folder.name, "python": "3.11"}, "python": "3.11",
        "requirements": {}, "env_vars": {}, "result_columns": COLUMNS,
        "results": {
            name: [values, [["'squared'", "'logistic'"], ["'sample'", "'hierarchical'"]],
                   "v1", 0, 0.1]
            for name, values in results.items()
        },
        "durations": {}, "version": 2,
    }  # fmt: skip
    (folder / f"{commit[:8]}-existing-py.json").write_text(json.dumps(data))


@pytest.fixture
def recorded(tmp_path):
    """A history of two commits: the older has every value, the newer a lower count for
    (squared, sample) and no result (None) for (logistic, hierarchical)."""
    machine = tmp_path / "results" / "cpu"
    _write(machine, "a" * 40, 1000, {PASSES: [2, 3, 2, 3], RATIO: [0.5, 1.0, 0.6, 1.1]})
    _write(machine, "b" * 40, 2000, {PASSES: [1, 3, 2, None], RATIO: [0.4, 0.9, 0.5, 1.0]})
    units = {PASSES: "passes", RATIO: "plain passes"}
    return machine, units


def test_history_takes_the_newest_recorded_value(gate, recorded):
    machine, _ = recorded
    base = gate.history(machine)
    assert base[(PASSES, ("'squared'", "'sample'"))] == (1.0, "b" * 40)
    assert base[(PASSES, ("'logistic'", "'hierarchical'"))] == (3.0, "a" * 40)  # None skipped


@pytest.mark.parametrize(
    ("new", "increases"),
    [
        ([1, 3, 2, 3], 0),  # the recorded values
        ([1, 2, 1, 3], 0),  # lower counts pass
        ([2, 3, 2, 3], 1),  # (squared, sample) back to the older commit's 2: an increase
        ([1, 3, 2.5, 4], 2),  # any increase, fractional ones too
    ],
)
def test_any_increase_of_a_count_fails(gate, recorded, tmp_path, new, increases, capsys):
    machine, units = recorded
    run = tmp_path / "run" / "gate"
    _write(run, "c" * 40, 3000, {PASSES: new, RATIO: [9.0, 9.0, 9.0, 9.0]})
    assert gate.compare(run, machine, units) == increases
    out = capsys.readouterr().out
    assert out.count("INCREASE") == increases
    assert "a timing, not gated" in out  # the ratios are reported, never counted


def test_a_benchmark_without_history_is_listed_as_new(gate, recorded, tmp_path, capsys):
    machine, units = recorded
    run = tmp_path / "run" / "gate"
    _write(run, "c" * 40, 3000, {"bench.Work.track_iterations": [5, 6, 7, 8]})
    units = {**units, "bench.Work.track_iterations": "iterations"}
    assert gate.compare(run, machine, units) == 0
    assert capsys.readouterr().out.count("new: bench.Work.track_iterations") == 4

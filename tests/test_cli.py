"""The console command, end to end on small settings, and its handling of bad input."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import tiltlab.reproduce
from tiltlab.cli import demo_point_estimation, main
from tiltlab.reproduce import ROW_KEYS


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    """One BLAS thread, as in test_baselines: these problems are small, and on a shared
    2-core machine a second OpenBLAS thread was measured to make a Drug Discovery SVD
    take 30 s instead of 0.4 s. Results do not depend on the thread count."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _strict_loads(text: str):
    """``json.loads`` that fails on NaN and infinities (not valid JSON)."""

    def reject(name):
        raise ValueError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=reject)


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
    assert "TERM" in out and "paper" in out and "Differences from the paper" in out
    payload = _strict_loads(path.read_text())  # one seed: se is null, never NaN
    assert payload["experiment"] == "robust-regression"
    rows = payload["rows"]
    by = {r["method"]: r for r in rows}
    assert set(by) == {"ERM", "TERM", "Genie ERM"}
    for r in rows:
        assert tuple(r) == ROW_KEYS
        assert r["setting"] == "noise=0.4" and r["metric"] == "test_rmse"
        assert r["n_seeds"] == 1 and r["se"] is None
    assert by["ERM"]["paper_mean"] == 2.83 and by["TERM"]["paper_mean"] == 1.10
    # TERM is robust: far better than ERM at 40% noise, not far from the oracle
    assert by["TERM"]["mean"] < 0.6 * by["ERM"]["mean"]
    assert by["TERM"]["mean"] < by["Genie ERM"]["mean"] + 0.3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--n", "0"], "--n"),
        (["demo", "--n", "ten"], "--n"),
        (["demo", "--outliers", "1.5"], "--outliers"),
        (["demo", "--outliers", "-0.1"], "--outliers"),
        (["demo", "--seed", "-1"], "--seed"),
        (["reproduce", "robust-regression", "--noise", "2"], "--noise"),
        (["reproduce", "robust-regression", "--seeds", "0"], "--seeds"),
        (["reproduce", "robust-regression", "--seeds", "-3"], "--seeds"),
        (["reproduce", "robust-regression", "--methods", "NOPE"], "--methods"),
        (["reproduce", "robust-regression", "--jobs", "0"], "--jobs"),
        (["reproduce", "hierarchical", "--seeds", "0"], "--seeds"),
        (["reproduce", "no-such-experiment"], "invalid choice"),
        (["reproduce"], "EXPERIMENT"),
    ],
)
def test_bad_arguments_are_usage_errors(argv, message, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):  # pragma: no cover - failing path
        raise AssertionError("the experiment ran despite a bad argument")

    monkeypatch.setattr(tiltlab.reproduce, "run", must_not_run)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err
    assert "Traceback" not in err


def test_json_to_missing_folder_fails_before_running(tmp_path, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):  # pragma: no cover - failing path
        raise AssertionError("the experiment ran although its output cannot be written")

    monkeypatch.setattr(tiltlab.reproduce, "run", must_not_run)
    missing = tmp_path / "no" / "such" / "folder" / "out.json"
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "abalone", "--json", str(missing)])
    assert exc.value.code == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a folder is not a file name
        main(["reproduce", "abalone", "--json", str(tmp_path)])
    assert exc.value.code == 2


def test_plot_without_matplotlib_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "toys", "--plot", str(tmp_path / "fig")])
    assert exc.value.code == 2
    assert "pip install matplotlib" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("tiltlab ") and any(ch.isdigit() for ch in out)


def test_new_command_writes_schema_and_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "toys.json"
    figs = tmp_path / "figs"  # created by --plot
    code = main(
        ["reproduce", "toys", "--quick", "--no-progress", "--json", str(path), "--plot", str(figs)]
    )
    assert code == 0
    payload = _strict_loads(path.read_text())
    assert payload["experiment"] == "toys"
    assert all(tuple(r) == ROW_KEYS and r["paper_mean"] is None for r in payload["rows"])
    pngs = sorted(p.name for p in figs.iterdir())
    assert pngs == ["toys.png", "toys_tradeoffs.png"]
    for name in pngs:
        assert (figs / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "figures:" in capsys.readouterr().out


def test_json_that_cannot_be_written_fails_before_running(tmp_path, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):  # pragma: no cover - failing path
        raise AssertionError("the experiment ran although its output cannot be written")

    monkeypatch.setattr(tiltlab.reproduce, "run", must_not_run)
    # permission bits do not stop root: a file of a read-only pseudo file system does
    unwritable = "/proc/version"
    if not os.path.exists(unwritable):  # pragma: no cover - not Linux
        pytest.skip("needs /proc")
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "abalone", "--json", unwritable])
    assert exc.value.code == 2
    assert "cannot be written" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # an empty path is an error, not "no JSON"
        main(["reproduce", "abalone", "--json", ""])
    assert exc.value.code == 2
    assert "empty" in capsys.readouterr().err
    fresh = tmp_path / "fresh.json"  # the check leaves no file behind
    monkeypatch.setattr(tiltlab.reproduce, "run", must_not_run)
    with pytest.raises(AssertionError):
        main(["reproduce", "abalone", "--json", str(fresh)])
    assert not fresh.exists()


def _must_not_run(*args, **kwargs):  # pragma: no cover - failing path
    raise AssertionError("the experiment ran despite unusable input")


def _usage_error(argv, capsys) -> str:
    """Run ``argv``; it must end as a usage error (exit 2, one error line, no traceback)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if " error: " in line]
    assert len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize(
    "experiment, what",
    [
        ("label-noise", "CIFAR-10"),
        ("fair-pca", ".csv"),
        ("fair-federated", "train/"),
    ],
)
def test_data_dir_without_the_expected_files_is_a_usage_error(
    experiment, what, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(tiltlab.reproduce, "run", _must_not_run)
    (tmp_path / "notes.txt").write_text("not the data\n")
    line = _usage_error(["reproduce", experiment, "--data-dir", str(tmp_path)], capsys)
    assert f"--data-dir {tmp_path}:" in line and what in line


def test_data_dir_with_unreadable_files_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tiltlab.reproduce, "run", _must_not_run)
    for name in ("data_batch_1", "test_batch"):
        (tmp_path / name).write_bytes(b"\x80\x04garbage")
    line = _usage_error(["reproduce", "label-noise", "--data-dir", str(tmp_path)], capsys)
    assert "--data-dir" in line
    (tmp_path / "group.csv").write_text("a,b\n1,x\n")
    line = _usage_error(["reproduce", "fair-pca", "--data-dir", str(tmp_path)], capsys)
    assert "--data-dir" in line and "group.csv" in line


def test_cuda_device_without_cuda_is_a_usage_error(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(tiltlab.reproduce, "run", _must_not_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for experiment in ("label-noise", "noisy-annotators", "class-imbalance"):
        line = _usage_error(["reproduce", experiment, "--device", "cuda"], capsys)
        assert "--device cuda:" in line and "CUDA" in line
    line = _usage_error(["reproduce", "label-noise", "--device", "tpu"], capsys)
    assert "--device tpu:" in line


def test_deep_reproduction_without_torch_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(tiltlab.reproduce, "run", _must_not_run)
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails
    line = _usage_error(["reproduce", "class-imbalance"], capsys)
    assert "PyTorch" in line

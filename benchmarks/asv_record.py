"""Record the asv benchmarks of the installed tiltlab as one point of the history.

Runs asv on the Python that runs this script (``asv run -E existing``: the package
already installed is measured, nothing is built) and stores the results under a named
machine profile, by default in ``benchmarks/results/<machine>/`` (the committed
history), at the current commit::

    python benchmarks/asv_record.py --machine cpu-2core             # the whole suite
    python benchmarks/asv_record.py --machine cpu-2core -b Passes   # a subset (asv -b)

Equivalent asv commands, where ``~/.asv-machine.json`` already describes the machine
(``asv machine --machine cpu-2core``)::

    asv run -E existing --set-commit-hash $(git rev-parse HEAD) --machine cpu-2core

The machine profile (``asv machine``) is written to a private file, so the user's
``~/.asv-machine.json`` is left alone; ``--cpu``, ``--num-cpu`` and ``--ram`` describe the
hardware (defaults: what the system reports). Without a git checkout (a copied tree), pass
``--commit HASH`` and ``--date`` (the commit's date, ISO 8601 or milliseconds since the
epoch): the results are recorded in a scratch repository and renamed to that commit.
Results of another folder (``--results-dir``, as ``benchmarks/gpu_check.sh`` writes them)
are added to the history by copying their machine folder into ``benchmarks/results/``.
``ASV_PYTHONPATH=$PWD`` measures the checkout instead of the installed package.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str, cwd: Path = ROOT) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                             text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def _ram() -> str:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return ""
    return f"{round(pages / 2**30)}GB"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _date_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    when = datetime.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return int(when.timestamp() * 1000)


def record(machine: str, results_dir: Path, bench: list[str], extra: list[str], *,
           commit: str | None = None, date: str | None = None, cpu: str | None = None,
           num_cpu: int | None = None, ram: str | None = None) -> int:
    """Run asv and store the results; returns asv's exit status."""
    from asv.util import load_json

    results_dir = results_dir.resolve()
    head = _git("rev-parse", "HEAD")
    commit = commit or head
    if commit is None:
        raise SystemExit("not a git checkout: pass --commit (and --date)")
    with tempfile.TemporaryDirectory(prefix="asv-record-") as tmp:
        tmp_path = Path(tmp)
        repo = ROOT
        if head is None or _git("cat-file", "-e", f"{commit}^{{commit}}") is None:
            # a scratch repository with one empty commit stands for the tree measured
            repo = tmp_path / "repo"
            repo.mkdir()
            when = _date_ms(date) if date else int(datetime.datetime.now().timestamp() * 1e3)
            stamp = f"@{when // 1000} +0000"
            env = dict(os.environ, GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp)
            for args in (["init", "-q"], ["-c", "user.name=asv", "-c", "user.email=asv@localhost",
                                          "commit", "-q", "--allow-empty", "-m", commit]):
                subprocess.run(["git", *args], cwd=repo, check=True, env=env)
        run_commit = _git("rev-parse", "HEAD", cwd=repo) if repo != ROOT else commit
        conf = load_json(str(ROOT / "asv.conf.json"), js_comments=True)
        conf.update(
            repo=str(repo),
            branches=["HEAD"] if repo != ROOT else conf.get("branches", ["main"]),
            benchmark_dir=str(ROOT / "benchmarks" / "benchmarks"),
            results_dir=str(results_dir),
            html_dir=str(tmp_path / "html"),
            env_dir=str(tmp_path / "env"),
        )
        conf_path = tmp_path / "asv.conf.json"
        conf_path.write_text(json.dumps(conf, indent=2))
        env = dict(os.environ, HOME=str(tmp_path))  # the machine file goes there
        asv = [sys.executable, "-m", "asv"]
        subprocess.run(
            asv + [
                "machine", "--yes", "--config", str(conf_path), "--machine", machine,
                "--os", f"{platform.system()} {platform.release()}",
                "--arch", platform.machine(), "--cpu", cpu or _cpu(),
                "--num_cpu", str(num_cpu or os.cpu_count() or 1), "--ram", ram or _ram(),
            ],
            check=True, env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        selection = [a for b in bench for a in ("-b", b)]
        status = subprocess.run(
            asv + [
                "run", "--config", str(conf_path), "--machine", machine,
                "-E", f"existing:{sys.executable}", "--set-commit-hash", run_commit,
                "--show-stderr", *selection, *extra,
            ],
            env=env,
        ).returncode  # fmt: skip
        if repo != ROOT:
            _rename(results_dir / machine, run_commit, commit)
    return status


def _rename(machine_dir: Path, scratch: str, commit: str) -> None:
    """Results recorded at the scratch commit, renamed to the commit measured."""
    for path in machine_dir.glob(f"{scratch[:8]}-*.json"):
        data = json.loads(path.read_text())
        data["commit_hash"] = commit
        target = path.with_name(commit[:8] + path.name[8:])
        target.write_text(json.dumps(data, separators=(",", ":")))
        if target != path:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Record asv results of the installed tiltlab under a machine profile.")
    ap.add_argument("--machine", required=True, help="machine profile name (cpu-2core, ...)")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("-b", "--bench", action="append", default=[],
                    help="benchmark regular expression (asv -b; repeatable)")
    ap.add_argument("--commit", help="commit measured (default: git rev-parse HEAD)")
    ap.add_argument("--date", help="its date, where the tree is not a git checkout")
    ap.add_argument("--cpu", help="CPU (or CPU and GPU) description of the profile")
    ap.add_argument("--num-cpu", type=int)
    ap.add_argument("--ram")
    a, extra = ap.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    status = record(a.machine, a.results_dir, a.bench, extra, commit=a.commit, date=a.date,
                    cpu=a.cpu, num_cpu=a.num_cpu, ram=a.ram)
    print(f"results: {a.results_dir / a.machine}")
    return status


if __name__ == "__main__":
    sys.exit(main())

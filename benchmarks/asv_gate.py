"""Regression gate: the deterministic asv benchmarks of this checkout against the history.

Runs the benchmarks whose results are counts (passes over the data, solver iterations,
graphs per Dask evaluation, chunk reads: units in :data:`GATED`) with asv on the Python
that runs this script (``asv run -E existing``, no build), into a temporary results
folder, and compares each value with the newest recorded value of the same benchmark and
parameters in the committed history (``benchmarks/results/<machine>/``, read with asv's
own results loader). Any increase fails (exit status 1); a benchmark or parameter
combination without a recorded value is listed as new. The ratio benchmarks (units in
:data:`REPORTED`: times measured side by side, such as plain Dask passes) run too and
their change is printed, never gated: they are timings, and the machine may be shared.

Usage, from the repository root with tiltlab, asv and dask installed
(``pip install ".[bench]"``)::

    python benchmarks/asv_gate.py                    # against the cpu-2core history
    python benchmarks/asv_gate.py --machine NAME     # another recorded profile
    python benchmarks/asv_gate.py --results DIR      # compare results already run

The counts do not depend on the machine's speed; a solver's iteration count can depend
on the BLAS summation order by an iteration at most, so the reference profile should be
a machine of the same kind as the one running the gate.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: units of the benchmarks that gate: counts, any increase fails
GATED = ("passes", "iterations", "graphs", "host reads")
#: units of the ratio benchmarks that are run and reported, not gated
REPORTED = ("plain passes",)
#: the benchmarks run by the gate (asv ``-b`` regular expression)
SELECTION = r"Passes\.|Work\.track_(iterations|passes)|DaskEvaluation\.track_"


def _load_json(path: Path) -> dict:
    from asv.util import load_json

    return load_json(str(path), js_comments=True)


def _units(results_dir: Path) -> dict[str, str]:
    """Benchmark name -> unit, from asv's ``benchmarks.json`` of a results folder."""
    data = _load_json(results_dir / "benchmarks.json")
    return {k: v.get("unit", "") for k, v in data.items() if isinstance(v, dict)}


def _values(path: Path) -> tuple[str, int, dict]:
    """``(commit, date, {(benchmark, params): value})`` of one asv results file."""
    from asv.results import Results

    res = Results.load(str(path))
    out = {}
    for key in res.get_all_result_keys():
        params = res.get_result_params(key)
        combos = list(itertools.product(*params)) if params else [()]
        values = res.get_result_value(key, params)
        for combo, value in zip(combos, values, strict=False):
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                out[(key, combo)] = float(value)
    return res.commit_hash, int(res.date or 0), out


def history(machine_dir: Path) -> dict:
    """The newest recorded value of each (benchmark, parameters) in a machine's folder,
    with the commit it was recorded at (newest by commit date)."""
    runs = []
    for path in sorted(machine_dir.glob("*.json")):
        if path.name == "machine.json":
            continue
        runs.append(_values(path))
    best: dict = {}
    for commit, _date, values in sorted(runs, key=lambda r: r[1]):
        for key, value in values.items():
            best[key] = (value, commit)
    return best


def run_asv(out_dir: Path) -> Path:
    """Run the selected benchmarks with asv on this Python into ``out_dir``
    (:func:`asv_record.record`, machine profile "gate"); returns the machine folder of
    the results."""
    from asv_record import record  # benchmarks/asv_record.py, beside this script

    status = record("gate", out_dir, [SELECTION], ["-a", "rounds=1"])
    if status:
        raise SystemExit(f"asv run failed (status {status})")
    return out_dir / "gate"


def compare(new_dir: Path, machine_dir: Path, units: dict) -> int:
    """Print the comparison; returns the number of increases of gated benchmarks."""
    base = history(machine_dir)
    runs = [p for p in new_dir.glob("*.json") if p.name != "machine.json"]
    if not runs:
        raise SystemExit(f"no asv results in {new_dir}")
    _, _, new = _values(max(runs, key=lambda p: p.stat().st_mtime))
    worse, fresh, checked = [], [], 0
    for (name, combo), value in sorted(new.items()):
        unit = units.get(name, "")
        if unit not in GATED + REPORTED:
            continue
        label = f"{name}{list(combo) if combo else ''}"
        if (name, combo) not in base:
            fresh.append(f"  new: {label} = {value:g} {unit}")
            continue
        old, commit = base[(name, combo)]
        if unit in REPORTED:
            ratio = value / old if old else math.inf
            print(f"  reported: {label}: {old:.3g} -> {value:.3g} {unit} "
                  f"(x{ratio:.2f} against {commit[:8]}; a timing, not gated)")
            continue
        checked += 1
        if value > old * (1 + 1e-9) + 1e-12:
            worse.append(f"  INCREASE: {label}: {old:g} -> {value:g} {unit} "
                         f"(recorded at {commit[:8]})")
    if fresh:
        print("\n".join(fresh))
    print(f"{checked} counts compared with the history of {machine_dir.name}; "
          f"{len(worse)} increased")
    if worse:
        print("\n".join(worse))
    return len(worse)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machine", default="cpu-2core",
                    help="the recorded machine profile to compare with")
    ap.add_argument("--results", type=Path, default=None,
                    help="a folder of asv results to compare (default: run the benchmarks)")
    a = ap.parse_args(argv)
    machine_dir = ROOT / "benchmarks" / "results" / a.machine
    if not machine_dir.is_dir():
        raise SystemExit(f"no recorded history for machine {a.machine!r} in {machine_dir}")
    units = _units(ROOT / "benchmarks" / "results")
    if a.results is not None:
        return 1 if compare(a.results, machine_dir, units) else 0
    with tempfile.TemporaryDirectory(prefix="asv-gate-") as tmp:
        new_dir = run_asv(Path(tmp))
        units.update(_units(new_dir.parent))
        return 1 if compare(new_dir, machine_dir, units) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Examples meant to be saved as scripts run as scripts.

The scale-out guide's laptop-cluster example starts a ``LocalCluster``, whose workers are
new processes that import the main module again: saved as a file and run with
``python file.py`` it must work as shown (a missing ``__main__`` guard fails there, not
under ``python -c``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _block(path: Path, marker: str) -> str:
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^\n]*-->\n```python\n(.*?)```", text, re.S)
    assert match, f"no python block after the {marker!r} marker in {path.name}"
    return match.group(1)


@pytest.mark.slow
def test_scale_out_example_runs_as_a_script(tmp_path):
    pytest.importorskip("dask.distributed")
    script = tmp_path / "laptop_cluster.py"
    script.write_text(_block(ROOT / "docs/user_guide/scale_out.md", "laptop-cluster"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, nfev = proc.stdout.strip().splitlines()[-2:]
    assert first.startswith("[") and int(nfev) > 0

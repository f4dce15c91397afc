"""The training loop shown in README.md and in the minibatch user guide runs, and the two
copies are the same; so does the guide's DataLoader example for the multilevel estimator."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "user_guide" / "minibatch.md"
README = ROOT / "README.md"


def _block(path: Path, marker: str) -> str:
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^\n]*-->\n```python\n(.*?)```", text, re.S)
    assert match, f"no python block after the {marker!r} marker in {path.name}"
    return match.group(1)


def test_readme_and_guide_show_the_same_training_loop():
    assert _block(README, "training-loop") == _block(GUIDE, "training-loop")


def test_training_loop_runs_and_learns():
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(_block(GUIDE, "training-loop"), "training-loop", "exec"), namespace)
    loss_fn, loss = namespace["loss_fn"], namespace["loss"]
    assert int(loss_fn.step) == namespace["steps"]
    assert loss_fn.t(loss_fn.step) == -2.0  # the ramp reached its end
    assert torch.isfinite(loss)


def test_mlmc_dataloader_example_runs():
    namespace: dict = {}
    exec(compile(_block(GUIDE, "mlmc-loader"), "mlmc-loader", "exec"), namespace)
    tilt = namespace["tilt"]
    assert tilt.step == len(namespace["loader"])
    assert namespace["weights"].shape == namespace["losses"].shape

"""The integration examples of docs/user_guide/choosing_tilt.md run as shown.

The PyTorch Lightning and Hugging Face Trainer blocks are read from the page (each follows
a marker comment) and executed; each test is skipped where its framework is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "user_guide" / "choosing_tilt.md"


def _block(marker: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^>]*-->\n```py\n(.*?)^```", text, flags=re.S | re.M)
    assert match, f"no block after the marker {marker!r} in {PAGE.name}"
    return match.group(1)


def test_blocks_are_on_the_page():
    for marker in ("lightning-example", "transformers-example"):
        assert "TiltedLoss" in _block(marker)


# warnings of the framework itself, not of the example: Lightning's use of a PyTorch tree
# helper that PyTorch deprecates, and its advice to use more data-loading workers
@pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\):FutureWarning")
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_lightning_example(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    ns: dict = {}
    exec(compile(_block("lightning-example"), "lightning-example", "exec"), ns)
    model, loader, epochs = ns["model"], ns["loader"], ns["epochs"]
    # one state update per training batch, none in validation
    assert int(model.loss_fn.step) == epochs * len(loader)
    assert ns["trainer"].state.finished
    # the schedule reached the final tilt
    assert model.loss_fn.t(int(model.loss_fn.step)) == -2.0
    assert torch.isfinite(ns["trainer"].callback_metrics["val_tilted_risk"])


def test_transformers_example(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    torch = pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    ns: dict = {}
    exec(compile(_block("transformers-example"), "transformers-example", "exec"), ns)
    trainer, metrics = ns["trainer"], ns["metrics"]
    steps = trainer.state.global_step
    assert steps == 3 * 8  # 512 rows, batches of 64, 3 epochs
    # training updated the state once per step; evaluation did not
    assert int(trainer.tilted.step) == steps
    # evaluation went through compute_loss in eval mode: the mean over the evaluation
    # batches (8 rows each, in order) of the tilted loss with the state left as it is
    model = trainer.model.eval()
    trainer.tilted.eval()
    with torch.no_grad():
        logits = model(ns["X"])["logits"]
        batches = [
            float(trainer.tilted(logits[i : i + 8], ns["y"][i : i + 8]))
            for i in range(0, len(ns["y"]), 8)
        ]
    assert int(trainer.tilted.step) == steps
    assert metrics["eval_loss"] == pytest.approx(sum(batches) / len(batches), rel=1e-5)

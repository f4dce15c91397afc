"""The integration examples of docs/user_guide/minibatch.md run as shown.

The PyTorch Lightning and Hugging Face Trainer blocks are read from the page (each follows
a marker comment) and executed; each test is skipped where its framework is missing. The
gradient-accumulation examples run with a recording subclass of `TiltedLoss` in place of
the class: each optimiser step's gradient (reaching the logits of its micro-batches,
rescaled by `finish_step`) is compared with one call of a separate loss on the union of
those micro-batches.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "user_guide" / "minibatch.md"


def _block(marker: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^>]*-->\n```py\n(.*?)^```", text, flags=re.S | re.M)
    assert match, f"no block after the marker {marker!r} in {PAGE.name}"
    return match.group(1)


def test_blocks_are_on_the_page():
    markers = (
        "lightning-example",
        "transformers-example",
        "lightning-accumulation-example",
        "transformers-accumulation-example",
    )
    for marker in markers:
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


def _record_accumulation(monkeypatch):
    """Replace `tiltlab.torch.TiltedLoss` (as the examples import it) by a subclass that
    records each training micro-batch (logits, targets, value, the gradient reaching the
    logits) and the factor by which `finish_step` rescales the gradients."""
    import tiltlab.torch
    from tiltlab.torch import TiltedLoss

    log: dict = {"steps": [[]], "factors": []}

    class Recording(TiltedLoss):
        def forward(self, input, target=None, groups=None):
            out = super().forward(input, target, groups)
            if self.training and input.requires_grad:
                entry = {"logits": input.detach().clone(), "target": target.clone()}
                entry["value"] = float(out.detach())
                input.register_hook(lambda g: entry.__setitem__("grad", g.detach().clone()))
                log["steps"][-1].append(entry)
            return out

        def finish_step(self, parameters):
            params = [p for p in parameters if p.grad is not None]
            before = [p.grad.clone() for p in params]
            super().finish_step(params)
            ratio = [(p.grad / b)[b != 0] for p, b in zip(params, before, strict=True)]
            ratio = __import__("torch").cat(ratio)
            assert float(ratio.max() - ratio.min()) <= 1e-6 * float(ratio.abs().max())
            log["factors"].append(float(ratio.mean()))
            log["steps"].append([])

    monkeypatch.setattr(tiltlab.torch, "TiltedLoss", Recording)
    return log, TiltedLoss


def _check_union(log, loss_class, t, torch):
    """Each optimiser step equals one call on the union of its micro-batches."""
    steps = log["steps"][:-1]
    assert len(steps) == len(log["factors"]) > 0 and not log["steps"][-1]
    reference = loss_class(torch.nn.CrossEntropyLoss(reduction="none"), t=t)
    for step, factor in zip(steps, log["factors"], strict=True):
        logits = torch.cat([e["logits"] for e in step]).requires_grad_(True)
        out = reference(logits, torch.cat([e["target"] for e in step]))
        out.backward()
        grad = torch.cat([e["grad"] for e in step]) * factor
        torch.testing.assert_close(grad, logits.grad, rtol=1e-5, atol=1e-8)
        assert step[-1]["value"] == pytest.approx(out.item(), rel=1e-5)
    return [len(step) for step in steps]


@pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\):FutureWarning")
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_lightning_accumulation_example(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    log, loss_class = _record_accumulation(monkeypatch)
    ns: dict = {}
    exec(compile(_block("lightning-accumulation-example"), "lightning-accumulation", "exec"), ns)
    sizes = _check_union(log, loss_class, -2.0, torch)
    assert sizes == 2 * ([4] * 7 + [2])  # 30 batches per epoch, k = 4
    assert int(ns["model"].loss_fn.step) == ns["trainer"].global_step == len(sizes)


def test_transformers_accumulation_example(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch = pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    log, loss_class = _record_accumulation(monkeypatch)
    ns: dict = {}
    block = _block("transformers-accumulation-example")
    exec(compile(block, "transformers-accumulation", "exec"), ns)
    sizes = _check_union(log, loss_class, -2.0, torch)
    assert sizes == 2 * ([4] * 7 + [2])
    trainer = ns["trainer"]
    assert int(trainer.tilted.step) == trainer.state.global_step == len(sizes)

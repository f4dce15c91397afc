"""The deep-learning reproductions in miniature: data, noise, losses, CIFAR loader, commands.

Losses are checked against closed forms; the experiments against the direction of the
paper's effects at one seed and few epochs (deterministic on the CPU).
"""

from __future__ import annotations

import json
import math
import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from tiltlab.cli import main  # noqa: E402
from tiltlab.datasets.cifar import load_cifar10  # noqa: E402
from tiltlab.reproduce import _deep, class_imbalance, label_noise, noisy_annotators  # noqa: E402
from tiltlab.reproduce.noisy_annotators import annotate  # noqa: E402


def test_digits_split_is_stratified_and_seeded():
    a, b = _deep.digits_split(3), _deep.digits_split(3)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    sizes = a.y_train.size + a.y_val.size + a.y_test.size
    assert sizes == 1797 and a.X_train.dtype == np.float32
    assert 0.0 <= a.X_train.min() and a.X_train.max() <= 1.0
    share = np.bincount(a.y_test, minlength=10) / a.y_test.size
    np.testing.assert_allclose(share, np.bincount(a.y_train, minlength=10) / a.y_train.size,
                               atol=0.02)  # fmt: skip


def test_uniform_label_noise_replaces_the_asked_share():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, size=5000)
    noisy, replaced = _deep.uniform_label_noise(y, 0.4, 10, rng)
    assert replaced.sum() == 2000
    assert np.array_equal(noisy[~replaced], y[~replaced])
    # a replaced label is uniform over all classes: right about 1/10 of the time
    assert abs(np.mean(noisy[replaced] == y[replaced]) - 0.1) < 0.03


def test_annotators_spammers_label_at_random():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 10, size=20000)
    labels, who, bad = annotate(y, 100, 80, 10, rng)
    assert np.array_equal(bad, who < 80)
    assert abs(bad.mean() - 0.8) < 0.02
    assert np.array_equal(labels[~bad], y[~bad])
    assert abs(np.mean(labels[bad] == y[bad]) - 0.1) < 0.02


def test_losses_against_closed_forms():
    logits = torch.tensor([[0.3, -1.2, 2.0], [0.0, 0.5, -0.5]], dtype=torch.float64)
    target = torch.tensor([2, 0])
    p = torch.softmax(logits, dim=1)[torch.arange(2), target].numpy()
    for q in (0.4, 1.0):
        got = _deep.generalized_cross_entropy(q)(logits, target).numpy()
        np.testing.assert_allclose(got, (1 - p**q) / q, rtol=1e-12)
    ce = -np.log(p)
    got = _deep.symmetric_cross_entropy(0.1, 1.0, -4.0)(logits, target).numpy()
    np.testing.assert_allclose(got, 0.1 * ce + 4.0 * (1 - p), rtol=1e-12)
    got = _deep.focal_loss(2.0)(logits, target).numpy()
    np.testing.assert_allclose(got, (1 - p) ** 2 * ce, rtol=1e-12)
    got = _deep.cross_entropy([1.0, 3.0, 0.5])(logits, target).numpy()
    np.testing.assert_allclose(got, np.array([0.5, 1.0]) * ce, rtol=1e-12)
    # GCE tends to the cross-entropy as q -> 0
    np.testing.assert_allclose(
        _deep.generalized_cross_entropy(1e-7)(logits, target).numpy(), ce, rtol=1e-5
    )


def _write_cifar(folder, n_per_batch=6, n_batches=2, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, n_batches + 1)] + ["test_batch"]
    for name in names:
        batch = {
            b"data": rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, size=n_per_batch)],
        }
        with open(os.path.join(folder, name), "wb") as fh:
            pickle.dump(batch, fh)


def test_cifar_loader_reads_python_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    _write_cifar(str(folder))
    for where in (folder, tmp_path):  # the folder itself or its parent
        d = load_cifar10(str(where))
        assert d["X_train"].shape == (12, 3072) and d["X_test"].shape == (6, 3072)
        assert d["X_train"].dtype == np.float32 and d["X_train"].max() <= 1.0
        assert d["y_train"].dtype == np.int64
    with pytest.raises(FileNotFoundError, match="`data_dir`"):
        load_cifar10(str(tmp_path / "missing"))
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 10), dtype=np.uint8), b"labels": [0, 1]}, fh)
    with pytest.raises(ValueError, match="3072"):
        load_cifar10(str(folder))


def test_label_noise_on_a_local_cifar_copy(tmp_path):
    folder = tmp_path / "cifar"
    _write_cifar(str(folder), n_per_batch=40)
    rep = label_noise(seeds=1, noise=[0.2], methods=["ERM"], epochs=1, data_dir=str(folder),
                      model="cnn")  # fmt: skip
    (row,) = rep.rows
    assert 0.0 <= row["mean"] <= 1.0 and "CIFAR-10" in rep.notes


def test_label_noise_term_beats_erm_at_heavy_noise():
    rep = label_noise(seeds=1, noise=[0.8], methods=["ERM", "TERM", "Genie ERM"], epochs=40)
    acc = {r["method"]: r["mean"] for r in rep.rows}
    assert acc["TERM"] > acc["ERM"] + 0.05
    assert acc["Genie ERM"] > acc["ERM"]
    row = next(r for r in rep.rows if r["method"] == "TERM")
    assert row["paper_mean"] == 0.455
    # the per-group report: the replaced labels get less of the tilted weight than their
    # share of the rows, and their samples are kept less (smaller ESS fraction)
    by_kind = rep.group_reports["TERM at t = -2, noise=0.8, seed 0: replaced and kept labels"]
    assert by_kind["group"] == ["kept", "replaced"] and by_kind["tilts"] == [-2.0, -2.0]
    kept, repl = 0, 1
    assert by_kind["weight"][repl] < by_kind["mass"][repl]
    assert by_kind["risk"][repl] > by_kind["risk"][kept]
    assert by_kind["ess"][repl] < by_kind["ess"][kept]
    per_class = rep.group_reports["TERM at t = -2, noise=0.8, seed 0: per class (training labels)"]
    assert per_class["group"] == list(range(10))
    assert math.isclose(sum(per_class["weight"]), 1.0, rel_tol=1e-12)
    assert 0.0 < per_class["ess_all"] < 1.0
    text = rep.report()
    assert "replaced and kept labels:" in text and "(4 more)" in text


def test_report_losses_and_weights_against_a_direct_computation():
    from tiltlab import hierarchical_weights
    from tiltlab.reproduce._deep_report import training_losses, training_report

    net = _deep.make_model("mlp", 64, 10, (1, 8, 8), seed=0)
    split = _deep.digits_split(0)
    X, y = split.X_train[:200], split.y_train[:200]
    l = training_losses(net, X, y)
    with torch.no_grad():
        logp = torch.log_softmax(net(torch.as_tensor(X)).double(), dim=1).numpy()
    np.testing.assert_allclose(l, -logp[np.arange(y.size), y], rtol=1e-5)
    rep = training_report(l, y, (-2.0, -2.0))
    w = hierarchical_weights(l, y, (-2.0, -2.0))
    np.testing.assert_allclose(rep["weight"], np.bincount(y, weights=w), rtol=1e-12)
    assert math.isclose(rep["ess_all"], 1.0 / (y.size * np.sum(w**2)), rel_tol=1e-12)


def test_term_ess_loss_keeps_the_asked_share_of_each_batch():
    # TERM-ESS trains with TiltedLoss(ess=...): each batch's tilt gives its weights the
    # asked effective sample size, checked against tilted_weights of that batch
    from tiltlab import tilted_weights
    from tiltlab.reproduce.label_noise import _objective

    ce = torch.nn.CrossEntropyLoss(reduction="none")
    loss = _objective("TERM-ESS", ce, 2, 0.3)  # the share ramps from 1 to 0.3 in 2 steps
    gen = torch.Generator().manual_seed(0)
    for step, share_wanted in enumerate([1.0, 0.65, 0.3]):
        logits = torch.randn(32, 5, generator=gen, dtype=torch.float64)
        target = torch.randint(0, 5, (32,), generator=gen)
        loss(logits, target)
        t = loss.tilts[-1]
        w = tilted_weights(ce(logits, target).numpy(), t)
        share = 1.0 / (32 * np.sum(w**2))
        assert math.isclose(share, share_wanted, rel_tol=1e-8)
        assert (t == 0.0) if step == 0 else (t < 0.0)


def test_label_noise_term_ess_runs_and_checks_its_share():
    rep = label_noise(seeds=1, noise=[0.4], methods=["TERM-ESS"], epochs=1, ess=0.7)
    (row,) = rep.rows
    assert row["method"] == "TERM-ESS" and 0.0 <= row["mean"] <= 1.0
    assert "TERM-ESS keeps 0.7 of each batch" in rep.notes
    with pytest.raises(ValueError, match="`ess`"):
        label_noise(seeds=1, noise=[0.4], methods=["TERM-ESS"], epochs=1, ess=0.0)


def test_noisy_annotators_term_down_weights_spammers():
    rep = noisy_annotators(seeds=1, spammer_shares=[0.8], epochs=15)
    acc = {r["method"]: r["mean"] for r in rep.rows}
    assert acc["TERM"] > acc["ERM"]
    assert acc["Genie ERM"] > acc["ERM"]
    (caption,) = rep.group_reports
    assert "annotators 0-79 label at random" in caption
    r = rep.group_reports[caption]
    spam = np.asarray(r["group"]) < 80
    # the spammers' annotator weight falls below their share of the rows
    assert np.sum(np.asarray(r["weight"])[spam]) < np.sum(np.asarray(r["mass"])[spam])
    assert np.mean(np.asarray(r["risk"])[spam]) > np.mean(np.asarray(r["risk"])[~spam])


def test_class_imbalance_term_helps_the_rare_class():
    rep = class_imbalance(seeds=1, imbalance=[50], methods=["ERM", "TERM"], epochs=40)
    by = {(r["method"], r["metric"]): r["mean"] for r in rep.rows}
    assert by[("TERM", "accuracy_rare")] > by[("ERM", "accuracy_rare")] + 0.3
    assert by[("TERM", "accuracy_overall")] > by[("ERM", "accuracy_overall")]
    r = rep.group_reports["TERM at tilts (20, 0), 1:50, seed 0: per class"]
    rare = r["group"].index("4s (rare)")
    assert r["weight"][rare] > r["mass"][rare]  # the tilt lifts the rare class


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="`methods`"):
        label_noise(seeds=1, methods=["nope"])
    with pytest.raises(ValueError, match="`noise`"):
        label_noise(seeds=1, noise=[1.5])
    with pytest.raises(ValueError, match="`device`"):
        label_noise(seeds=1, device="tpu")
    with pytest.raises(ValueError, match="`model`"):
        label_noise(seeds=1, noise=[0.2], methods=["ERM"], model="resnet", epochs=1)
    with pytest.raises(ValueError, match="`spammer_shares`"):
        noisy_annotators(seeds=1, spammer_shares=[1.0])
    with pytest.raises(ValueError, match="`t`"):
        class_imbalance(seeds=1, t=-1.0)
    with pytest.raises(ValueError, match="`imbalance`"):
        class_imbalance(seeds=1, imbalance=[0])


def test_command_line_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "ci.json"
    figs = tmp_path / "figs"
    code = main([
        "reproduce", "class-imbalance", "--seeds", "1", "--quick", "--no-progress",
        "--json", str(path), "--plot", str(figs),
    ])  # fmt: skip
    assert code == 0
    payload = json.loads(path.read_text())
    assert payload["experiment"] == "class-imbalance"
    assert {r["method"] for r in payload["rows"]} == {"ERM", "FocalLoss", "ClassBalanced", "TERM"}
    assert all(math.isfinite(r["mean"]) for r in payload["rows"])
    assert (figs / "class_imbalance.png").exists()
    reports = payload["group_reports"]
    assert set(reports) == {f"TERM at tilts (20, 0), 1:{r}, seed 0: per class" for r in (20, 50)}
    for r in reports.values():
        assert set(r) >= {"group", "risk", "mass", "weight", "ess", "size", "tilts", "ess_all"}
        assert r["group"] == ["4s (rare)", "9s (common)"]
        assert math.isclose(sum(r["weight"]), 1.0, rel_tol=1e-12)

"""`tiltlab reproduce lm-noisy-targets`: the language, the corruption, the schema."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiltlab.reproduce import ROW_KEYS
from tiltlab.reproduce import lm_noisy_targets as lm_module

M = __import__("importlib").import_module("tiltlab.reproduce.lm_noisy_targets")


def test_language_follows_its_rule_and_corruption_its_other_rule():
    rule, bad = M._rules(0)
    x = M._sequences(2000, rule, np.random.default_rng(0))
    follows = x[:, 1:] == rule[x[:, :-1]]
    # the rule's token with probability P_RULE, plus a uniform draw that hits it
    expected = M.P_RULE + (1 - M.P_RULE) / M.VOCAB
    assert abs(follows.mean() - expected) < 0.01
    assert sorted(rule) == list(range(M.VOCAB)) and sorted(bad) == list(range(M.VOCAB))
    assert np.all(rule != bad)  # the corruption changes every next token
    y = M._corrupt(x, bad)
    assert y.shape == (2000, M.LENGTH) and np.array_equal(y, bad[x[:, :-1]])


def test_rows_follow_the_schema_and_the_command_writes_json(tmp_path, capsys):
    pytest.importorskip("torch")
    rep = lm_module(seeds=[0], noise=[0.4], methods=["ERM", "TERM-sequence"], epochs=1, n_train=64)
    assert all(tuple(r) == ROW_KEYS for r in rep.to_dict()["rows"])
    acc = [r["mean"] for r in rep.rows if r["metric"] == "token_accuracy"]
    assert all(0.0 <= a <= 1.0 for a in acc)
    with pytest.raises(ValueError, match="noise"):
        lm_module(seeds=1, noise=[1.5])
    with pytest.raises(ValueError, match="t_token"):
        lm_module(seeds=1, t_token=1.0)

    import tiltlab.reproduce as rp
    from tiltlab.cli import main

    original = rp.EXPERIMENTS["lm-noisy-targets"]
    rp.EXPERIMENTS["lm-noisy-targets"] = lambda *a, **k: original(
        *a, epochs=1, n_train=64, methods=["DFT"], **k
    )
    try:
        path = tmp_path / "out.json"
        code = main(
            [
                "reproduce",
                "lm-noisy-targets",
                "--seeds",
                "1",
                "--quick",
                "--no-progress",
                "--json",
                str(path),
            ]
        )
    finally:
        rp.EXPERIMENTS["lm-noisy-targets"] = original
    assert code == 0
    assert json.loads(path.read_text())["experiment"] == "lm-noisy-targets"

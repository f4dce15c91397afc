"""The README's Drug Discovery examples run and print what their comments show."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

README = Path(__file__).resolve().parent.parent / "README.md"


def _block(marker: str) -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^\n]*-->\n```python\n(.*?)```", text, re.S)
    assert match, f"no python block after the {marker!r} marker in README.md"
    return match.group(1)


def _comment_after(code: str, expression: str) -> str:
    """The comment on the line of ``code`` that is ``expression`` alone."""
    for line in code.splitlines():
        head, _, comment = line.partition("#")
        if head.strip() == expression:
            return comment.strip()
    raise AssertionError(f"no line {expression!r} in the block")


@pytest.mark.slow
def test_readme_drug_discovery_examples_print_what_they_show():
    ns: dict = {}
    robust = _block("drug-robust")
    exec(compile(robust, "README drug-robust", "exec"), ns)
    shown = float(_comment_after(robust, "term.tilted_weights_[noisy].sum()").split(":")[0])
    assert round(float(ns["term"].tilted_weights_[ns["noisy"]].sum()), 2) == shown
    grid = _block("drug-grid-search")
    exec(compile(grid, "README drug-grid-search", "exec"), ns)
    want = ast.literal_eval(_comment_after(grid, "search.best_params_"))
    assert ns["search"].best_params_ == want
    # the sentence under the block: the four mean held-out scores, to the digits shown
    scores = -ns["search"].cv_results_["mean_test_score"]
    np.testing.assert_allclose(scores, [2.28, 2.26, 3.04, 3.18], atol=0.006)

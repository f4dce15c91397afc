"""The paper's class-level TERM table on HIV-1 (variance reduction and fairness).

Logistic regression (no regularisation) on the HIV-1 protease cleavage data, split
80/10/10 by seed exactly as the authors' code does (:func:`tiltlab.datasets.load_hiv1`):

* ``ERM``: the plain logistic loss;
* ``TERM (t=0.1)``: class-level tilting, ``TiltedObjective(..., groups=y, tilts=(0.1, 0))``
  (the classes are the groups, no tilt inside a class), for generalisation;
* ``TERM (t=50)``: the same with ``t = 50``, for fairness between the classes;
* ``ERM+``: the ERM model with its decision threshold lowered until its validation
  accuracy on the rare class matches that of ``TERM (t=50)`` (the paper tuned it by a
  binary search and reports 0.26).

Every model is fitted by L-BFGS with early stopping on the validation split's objective
(same loss and tilt), the paper's "tuned on the validation set".

The rare class (1360 of 6590 rows) is the paper's ``Y = 0``; the loader encodes it as 1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._common import Reproduction, format_grid, make_row, progress_bar, seed_list

__all__ = ["PAPER_HIV1_FAIRNESS", "hiv1_fairness", "fit_logistic", "class_accuracies"]

_METRICS = ("accuracy_rare", "accuracy_common", "accuracy_overall")

#: The paper's table (mean, se) per (method, setting, metric, split).
PAPER_HIV1_FAIRNESS: dict[tuple[str, str, str, str], tuple[float, float]] = {}


def _put(method: str, setting: str, values: Sequence[float]) -> None:
    it = iter(values)
    for metric in _METRICS:
        for split in ("train", "test"):
            PAPER_HIV1_FAIRNESS[(method, setting, metric, split)] = (next(it), next(it))


_put("ERM", "t=0", [0.841, 0.005, 0.822, 0.009, 0.971, 0.000, 0.966, 0.002,
                    0.944, 0.000, 0.934, 0.003])  # fmt: skip
_put("TERM", "t=0.1", [0.864, 0.003, 0.840, 0.011, 0.970, 0.000, 0.964, 0.003,
                       0.949, 0.001, 0.937, 0.004])  # fmt: skip
_put("ERM+", "tuned threshold", [0.943, 0.001, 0.916, 0.008, 0.919, 0.001, 0.917, 0.003,
                                 0.924, 0.001, 0.917, 0.002])  # fmt: skip
_put("TERM", "t=50", [0.942, 0.001, 0.917, 0.005, 0.926, 0.001, 0.925, 0.002,
                      0.929, 0.001, 0.924, 0.001])  # fmt: skip
PAPER_HIV1_FAIRNESS[("ERM+", "tuned threshold", "threshold", "val")] = (0.26, float("nan"))


def fit_logistic(
    X_train: Any,
    y_train: Any,
    X_val: Any,
    y_val: Any,
    *,
    groups: Any = None,
    tilts: Any = None,
    groups_val: Any = None,
    patience: int = 20,
    max_iter: int = 2000,
) -> np.ndarray:
    """Logistic regression, (hierarchically) tilted, with validation early stopping.

    ``groups``/``tilts`` are passed to :class:`~tiltlab.TiltedObjective` unchanged (for
    class-level TERM: ``groups=y_train, tilts=(t, 0)``); the validation objective uses
    ``groups_val`` (default ``y_val`` when ``groups`` is ``y_train``-shaped labels of the
    classes) and the same tilts. Returns the coefficients as a NumPy array.
    """
    from ..objective import TiltedObjective
    from ..solvers import minimize

    if groups is None:
        train = TiltedObjective("logistic", X_train, y_train)
        val = TiltedObjective("logistic", X_val, y_val)
    else:
        if groups_val is None:
            raise ValueError("`groups_val` is needed with `groups`")
        train = TiltedObjective("logistic", X_train, y_train, groups=groups, tilts=tilts)
        val = TiltedObjective("logistic", X_val, y_val, groups=groups_val, tilts=tilts)
    res = minimize(train, method="lbfgs", validation=val, patience=patience, max_iter=max_iter)
    return np.asarray(res.x)


def _probabilities(X: np.ndarray, w: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(X @ w)


def class_accuracies(X, y, w, threshold: float = 0.5) -> dict[str, float]:
    """Rare-class (label 1), common-class (label 0) and overall accuracy.

    A sample is predicted rare when its probability ``sigmoid(x w)`` is at least
    ``threshold``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.hiv1_fairness import class_accuracies
    >>> X = np.array([[1.0], [-1.0], [-2.0], [0.5]])
    >>> y = np.array([1.0, 0.0, 0.0, 0.0])
    >>> class_accuracies(X, y, np.array([1.0]))
    {'accuracy_rare': 1.0, 'accuracy_common': 0.6666666666666666, 'accuracy_overall': 0.75}
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    pred = (_probabilities(X, np.asarray(w, dtype=np.float64)) >= threshold).astype(np.float64)
    rare, common = y == 1, y == 0
    return {
        "accuracy_rare": float(np.mean(pred[rare] == 1)) if rare.any() else float("nan"),
        "accuracy_common": float(np.mean(pred[common] == 0)) if common.any() else float("nan"),
        "accuracy_overall": float(np.mean(pred == y)),
    }


def matching_threshold(p_rare: np.ndarray, target: float) -> float:
    """Largest threshold whose rare-class accuracy on ``p_rare`` is at least ``target``.

    ``p_rare`` are the predicted probabilities of the rare-class samples; accuracy at a
    threshold ``c`` is the fraction with ``p >= c``. Never above 0.5 (ERM's own threshold).
    """
    p = np.sort(np.asarray(p_rare, dtype=np.float64))[::-1]
    k = int(np.ceil(target * p.size - 1e-9))
    if k <= 0:
        return 0.5
    return float(min(0.5, p[min(k, p.size) - 1]))


def hiv1_fairness(
    seeds: int | Sequence[int] = 5,
    *,
    quick: bool = False,
    progress: bool = False,
) -> Reproduction:
    """Reproduce the paper's HIV-1 class-level TERM table (ERM, TERM t=0.1, ERM+, TERM t=50).

    Parameters
    ----------
    seeds : int or sequence of int, default 5
        Number of random splits (``0 .. seeds-1``), or the seeds; the paper uses five.
    quick : bool, default False
        Accepted for a uniform interface (this experiment is already fast).
    progress : bool, default False
        Show a progress bar.

    Returns
    -------
    Reproduction
        Rows for ``accuracy_rare``, ``accuracy_common``, ``accuracy_overall`` on the
        ``train`` and ``test`` splits, and ERM+'s ``threshold`` (``val``).

    Examples
    --------
    >>> from tiltlab.reproduce import hiv1_fairness
    >>> rep = hiv1_fairness(seeds=1)
    >>> by = {(r["method"], r["setting"], r["metric"], r["split"]): r["mean"] for r in rep.rows}
    >>> by[("TERM", "t=50", "accuracy_rare", "test")] > by[("ERM", "t=0", "accuracy_rare", "test")]
    True
    """
    from ..datasets import load_hiv1

    del quick
    seeds_ = seed_list(seeds)
    methods = [("ERM", "t=0"), ("TERM", "t=0.1"), ("ERM+", "tuned threshold"), ("TERM", "t=50")]
    values: dict[tuple[str, str, str, str], list[float]] = {}
    bar = progress_bar(progress, len(seeds_) * 3, "hiv1-fairness")
    started = time.perf_counter()
    for s in seeds_:
        d = load_hiv1(seed=s)
        fits = {}
        for name, t in (("t=0", 0.0), ("t=0.1", 0.1), ("t=50", 50.0)):
            bar.set_postfix_str(f"seed={s} {name}")
            fits[name] = fit_logistic(
                d.X_train, d.y_train, d.X_val, d.y_val,
                groups=d.y_train, groups_val=d.y_val, tilts=(t, 0.0),
            )  # fmt: skip
            bar.update(1)
        # ERM+: match TERM(t=50)'s validation rare-class accuracy by moving the threshold
        target = class_accuracies(d.X_val, d.y_val, fits["t=50"])["accuracy_rare"]
        p_val = _probabilities(d.X_val, fits["t=0"])
        thr = matching_threshold(p_val[d.y_val == 1], target)
        values.setdefault(("ERM+", "tuned threshold", "threshold", "val"), []).append(thr)
        for method, setting in methods:
            w = fits["t=0"] if method == "ERM+" else fits[setting]
            c = thr if method == "ERM+" else 0.5
            for split, X, y in (("train", d.X_train, d.y_train), ("test", d.X_test, d.y_test)):
                for metric, v in class_accuracies(X, y, w, c).items():
                    values.setdefault((method, setting, metric, split), []).append(v)
    bar.close()
    rows = [
        make_row(method, setting, metric, split, values[key], PAPER_HIV1_FAIRNESS.get(key))
        for split in ("train", "test")
        for method, setting in methods
        for metric in _METRICS
        for key in [(method, setting, metric, split)]
    ]
    key = ("ERM+", "tuned threshold", "threshold", "val")
    rows.append(make_row(*key, values[key], PAPER_HIV1_FAIRNESS[key]))
    seconds = time.perf_counter() - started
    table = format_grid(
        [r for r in rows if r["split"] != "val"],
        row_of=lambda r: f"{r['method']} ({r['setting']})",
        col_of=lambda r: r["metric"].removeprefix("accuracy_"),
        block_of=lambda r: f"{r['split']} accuracy",
    )
    thr_row = rows[-1]
    table += (
        f"\n\nERM+ threshold (chosen on validation): {thr_row['mean']:.3f} "
        f"[paper {thr_row['paper_mean']:.2f}]"
    )
    notes = (
        "Protocol: logistic regression without regularisation, class-level TERM via "
        "TiltedObjective(groups=y, tilts=(t, 0));\nL-BFGS with early stopping on the "
        "validation split (patience 20); 80/10/10 splits as in the authors' code.\n"
        "Differences from the paper: the paper's solver and stopping rule are not given "
        "beyond 'tuned on validation';\nits ERM underfits the training split a little more "
        "than ours (train rare-class accuracy 0.84 against our ~0.87).\nLinear SVM, "
        "LearnReweight, FocalLoss, HRM and RobustRegRisk rows are not reproduced "
        "(not part of tiltlab).\n"
        f"{len(seeds_)} seed(s), {seconds:.1f} s."
    )
    return Reproduction(
        experiment="hiv1-fairness",
        rows=rows,
        title=(
            f"tiltlab reproduce hiv1-fairness: HIV-1 (6590 x 160), {len(seeds_)} seed(s); "
            "accuracy, mean (se) [paper]; rare class = paper's Y=0"
        ),
        table=table,
        notes=notes,
    )

"""The paper's class-level TERM table on HIV-1 (variance reduction and fairness).

Logistic regression (no regularisation) on the HIV-1 protease cleavage data, split
80/10/10 by seed exactly as the authors' code does (:func:`tiltlab.datasets.load_hiv1`):

* ``ERM``: the plain logistic loss;
* ``TERM (t=0.1)``: class-level tilting, ``TiltedObjective(..., groups=y, tilts=(0.1, 0))``
  (the classes are the groups, no tilt inside a class), for generalisation;
* ``TERM (t=50)``: the same with ``t = 50``, for fairness between the classes;
* ``ERM+``: the ERM model with its decision threshold lowered until its validation
  accuracy on the rare class matches that of ``TERM (t=50)`` (the paper tuned it by a
  binary search and reports 0.26);
* the paper's baselines (:mod:`tiltlab.baselines.classification`): ``Linear SVM``
  (hinge loss, ``C = 1``), ``LearnReweight`` (Ren et al., with 10 clean validation
  samples per class, the authors' meta step), ``FocalLoss`` (``gamma = 2``), ``HRM``
  (Leqi et al.'s human-aligned risk, ``a = 0.01, b = 0``), ``RobustRegRisk`` (Namkoong and
  Duchi's chi-square robust risk, ``rho / n`` chosen on validation accuracy from the
  paper's grid) and ``RobustRegRisk+`` (its threshold matched to ``TERM (t=50)`` as for
  ``ERM+``; the paper reports 0.49).

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

__all__ = [
    "PAPER_HIV1_FAIRNESS",
    "RHO_GRID",
    "class_accuracies",
    "fit_logistic",
    "hiv1_fairness",
]

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
_put("Linear SVM", "C=1", [0.873, 0.003, 0.838, 0.013, 0.965, 0.000, 0.964, 0.002,
                           0.951, 0.001, 0.937, 0.004])  # fmt: skip
_put("LearnReweight", "20 clean samples", [0.860, 0.004, 0.841, 0.014, 0.960, 0.002, 0.961,
                                           0.004, 0.940, 0.001, 0.934, 0.004])  # fmt: skip
_put("FocalLoss", "gamma=2", [0.871, 0.003, 0.834, 0.013, 0.970, 0.000, 0.966, 0.003,
                              0.949, 0.001, 0.937, 0.004])  # fmt: skip
_put("HRM", "a=0.01, b=0", [0.875, 0.003, 0.839, 0.012, 0.972, 0.000, 0.965, 0.003,
                            0.952, 0.001, 0.937, 0.003])  # fmt: skip
_put("RobustRegRisk", "rho/n tuned", [0.875, 0.003, 0.844, 0.010, 0.971, 0.000, 0.966, 0.003,
                                      0.951, 0.001, 0.939, 0.004])  # fmt: skip
_put("RobustRegRisk+", "tuned threshold", [0.943, 0.000, 0.917, 0.005, 0.928, 0.001, 0.928,
                                           0.002, 0.931, 0.001, 0.924, 0.001])  # fmt: skip
PAPER_HIV1_FAIRNESS[("RobustRegRisk+", "tuned threshold", "threshold", "val")] = (
    0.49,
    float("nan"),
)

#: The paper's grid for the robust risk's radius, ``rho / n`` (the per-sample radius).
RHO_GRID = (0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0)


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
    classes) and the same tilts.

    Parameters
    ----------
    X_train, y_train : array_like
        Training features ``(n, d)`` and labels 0/1 ``(n,)``.
    X_val, y_val : array_like
        Validation features and labels, for early stopping.
    groups : array_like, optional
        Group labels of the training rows (None: plain, untilted logistic regression).
    tilts : float or tuple of float, optional
        The tilts, as in :class:`~tiltlab.TiltedObjective`.
    groups_val : array_like, optional
        Group labels of the validation rows; required with `groups`.
    patience : int, default 20
        Iterations without a better validation loss before stopping.
    max_iter : int, default 2000
        Maximum number of L-BFGS iterations.

    Returns
    -------
    numpy.ndarray, shape (d,)
        The coefficients.

    Raises
    ------
    ValueError
        If `groups` is given without `groups_val`.

    See Also
    --------
    class_accuracies : The accuracies of the fitted coefficients.
    :func:`~tiltlab.reproduce.hiv1_fairness` : The experiment that uses this fit.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.hiv1_fairness import class_accuracies, fit_logistic
    >>> rng = np.random.default_rng(0)
    >>> X = np.column_stack([rng.standard_normal(80), np.ones(80)])
    >>> y = (X[:, 0] + 0.5 * rng.standard_normal(80) > 1.0).astype(float)
    >>> w = fit_logistic(X[:60], y[:60], X[60:], y[60:], groups=y[:60], tilts=(1.0, 0.0),
    ...                  groups_val=y[60:])
    >>> w.shape, bool(w[0] > 0)
    ((2,), True)
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

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features.
    y : array_like, shape (n,)
        Labels 0 (common) and 1 (rare).
    w : array_like, shape (d,)
        Logistic-regression coefficients.
    threshold : float, default 0.5
        Probability at and above which a sample is predicted rare.

    Returns
    -------
    dict
        ``accuracy_rare``, ``accuracy_common`` and ``accuracy_overall`` (NaN for a class
        with no samples).

    See Also
    --------
    fit_logistic : Fits the coefficients.

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

    Parameters
    ----------
    p_rare : array_like, shape (n_rare,)
        Predicted probabilities of the rare class, on the rare-class samples.
    target : float
        The rare-class accuracy to reach, in ``[0, 1]``.

    Returns
    -------
    float
        The threshold, at most 0.5.

    See Also
    --------
    class_accuracies : The accuracies at a given threshold.

    Examples
    --------
    >>> from tiltlab.reproduce.hiv1_fairness import matching_threshold
    >>> matching_threshold([0.9, 0.4, 0.3, 0.1], 0.5)  # two of four at p >= 0.4
    0.4
    >>> matching_threshold([0.9, 0.8], 0.5)  # already met at 0.5
    0.5
    """
    p = np.sort(np.asarray(p_rare, dtype=np.float64))[::-1]
    k = int(np.ceil(target * p.size - 1e-9))
    if k <= 0:
        return 0.5
    return float(min(0.5, p[min(k, p.size) - 1]))


def _baseline_fits(d, quick: bool, bar, s) -> tuple[dict, dict]:
    """The paper's baselines on one split: ``{name: (X_aug?, w)}`` and chosen settings."""
    from .. import baselines as bl

    fits: dict[str, np.ndarray] = {}
    chosen: dict[str, float] = {}
    bar.set_postfix_str(f"seed={s} Linear SVM")
    w, b = bl.fit_linear_svm(d.X_train, d.y_train, C=1.0)
    fits["Linear SVM"] = np.concatenate([w, [b]])  # used with a column of ones
    bar.update(1)
    keep = np.concatenate([np.nonzero(d.y_val == c)[0][:10] for c in (0, 1)])
    bar.set_postfix_str(f"seed={s} LearnReweight")
    fits["LearnReweight"] = bl.fit_learn_reweight(
        d.X_train, d.y_train, d.X_val[keep], d.y_val[keep]
    )
    bar.update(1)
    bar.set_postfix_str(f"seed={s} FocalLoss")
    fits["FocalLoss"] = bl.fit_focal(d.X_train, d.y_train, gamma=2.0)
    bar.update(1)
    bar.set_postfix_str(f"seed={s} HRM")
    fits["HRM"] = bl.fit_hrm(d.X_train, d.y_train, a=0.01, b=0.0)
    bar.update(1)
    best = None
    for rho in (1.0, 10.0) if quick else RHO_GRID:
        bar.set_postfix_str(f"seed={s} RobustRegRisk rho/n={rho:g}")
        w = bl.fit_robust_risk(d.X_train, d.y_train, rho)
        val = class_accuracies(d.X_val, d.y_val, w)["accuracy_overall"]
        if best is None or val > best[0]:
            best = (val, rho, w)
    fits["RobustRegRisk"] = best[2]
    chosen["rho"] = best[1]
    bar.update(1)
    return fits, chosen


def _with_ones(X: np.ndarray) -> np.ndarray:
    return np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)


def hiv1_fairness(
    seeds: int | Sequence[int] = 5,
    *,
    quick: bool = False,
    progress: bool = False,
    baselines: bool = True,
) -> Reproduction:
    """Reproduce the paper's HIV-1 class-level TERM table, with the paper's baselines.

    Parameters
    ----------
    seeds : int or sequence of int, default 5
        Number of random splits (``0 .. seeds-1``), or the seeds; the paper uses five.
    quick : bool, default False
        Choose the robust risk's radius from two values (1 and 10) instead of the paper's
        seven.
    progress : bool, default False
        Show a progress bar.
    baselines : bool, default True
        Also fit the paper's baselines (Linear SVM, LearnReweight, FocalLoss, HRM,
        RobustRegRisk and RobustRegRisk+); ``False`` gives ERM, ERM+ and TERM only.

    Returns
    -------
    Reproduction
        Rows for ``accuracy_rare``, ``accuracy_common``, ``accuracy_overall`` on the
        ``train`` and ``test`` splits, the ``threshold`` (``val``) of ERM+ and
        RobustRegRisk+, and RobustRegRisk's chosen ``rho_over_n`` (``val``).

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment by its command name.
    :func:`~tiltlab.reproduce.hierarchical` : Hierarchical TERM on the same data.

    Examples
    --------
    >>> from tiltlab.reproduce import hiv1_fairness
    >>> rep = hiv1_fairness(seeds=1, baselines=False)
    >>> by = {(r["method"], r["setting"], r["metric"], r["split"]): r["mean"]
    ...       for r in rep.rows}
    >>> term = by[("TERM", "t=50", "accuracy_rare", "test")]
    >>> term > by[("ERM", "t=0", "accuracy_rare", "test")]
    True
    """
    from ..datasets import load_hiv1

    seeds_ = seed_list(seeds)
    methods = [("ERM", "t=0")]
    if baselines:
        methods += [("Linear SVM", "C=1"), ("LearnReweight", "20 clean samples"),
                    ("FocalLoss", "gamma=2"), ("HRM", "a=0.01, b=0"),
                    ("RobustRegRisk", "rho/n tuned")]  # fmt: skip
    methods += [("TERM", "t=0.1"), ("ERM+", "tuned threshold")]
    if baselines:
        methods += [("RobustRegRisk+", "tuned threshold")]
    methods += [("TERM", "t=50")]
    values: dict[tuple[str, str, str, str], list[float]] = {}
    bar = progress_bar(progress, len(seeds_) * (3 + 5 * baselines), "hiv1-fairness")
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
        target = class_accuracies(d.X_val, d.y_val, fits["t=50"])["accuracy_rare"]
        models = {("ERM", "t=0"): fits["t=0"], ("TERM", "t=0.1"): fits["t=0.1"],
                  ("TERM", "t=50"): fits["t=50"]}  # fmt: skip
        thresholds = {}
        # ERM+: match TERM(t=50)'s validation rare-class accuracy by moving the threshold
        plus = [("ERM+", "tuned threshold", ("ERM", "t=0"))]
        if baselines:
            extra, chosen = _baseline_fits(d, quick, bar, s)
            for method, setting in methods:
                if method in extra:
                    models[(method, setting)] = extra[method]
            values.setdefault(("RobustRegRisk", "rho/n tuned", "rho_over_n", "val"), []).append(
                chosen["rho"]
            )
            plus.append(("RobustRegRisk+", "tuned threshold", ("RobustRegRisk", "rho/n tuned")))
        for method, setting, base in plus:
            p_val = _probabilities(d.X_val, models[base])
            thr = matching_threshold(p_val[d.y_val == 1], target)
            thresholds[(method, setting)] = thr
            models[(method, setting)] = models[base]
            values.setdefault((method, setting, "threshold", "val"), []).append(thr)
        for method, setting in methods:
            w = models[(method, setting)]
            c = thresholds.get((method, setting), 0.5)
            for split, X, y in (("train", d.X_train, d.y_train), ("test", d.X_test, d.y_test)):
                if method == "Linear SVM":
                    X = _with_ones(X)
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
    extra_keys = [k for k in values if k[3] == "val"]
    rows += [make_row(*key, values[key], PAPER_HIV1_FAIRNESS.get(key)) for key in extra_keys]
    seconds = time.perf_counter() - started
    table = format_grid(
        [r for r in rows if r["split"] != "val"],
        row_of=lambda r: f"{r['method']} ({r['setting']})",
        col_of=lambda r: r["metric"].removeprefix("accuracy_"),
        block_of=lambda r: f"{r['split']} accuracy",
    )
    for r in rows:
        if r["metric"] == "threshold":
            table += (
                f"\n{r['method']} threshold (chosen on validation): {r['mean']:.3f} "
                f"[paper {r['paper_mean']:.2f}]"
            )
        elif r["metric"] == "rho_over_n":
            table += f"\nRobustRegRisk rho/n (chosen on validation accuracy): {r['mean']:.2f}"
    notes = _notes(baselines, quick)
    notes += f"\n{len(seeds_)} seed(s), {seconds:.1f} s."
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


def _notes(baselines: bool, quick: bool) -> str:
    """The protocol and the differences from the paper, printed under the table."""
    notes = (
        "Protocol: logistic regression without regularisation, class-level TERM via "
        "TiltedObjective(groups=y, tilts=(t, 0));\nL-BFGS with early stopping on the "
        "validation split (patience 20); 80/10/10 splits as in the authors' code.\n"
        "Differences from the paper: the paper's solver and stopping rule are not given "
        "beyond 'tuned on validation';\nits ERM underfits the training split a little more "
        "than ours (train rare-class accuracy 0.84 against our ~0.87)."
    )
    if baselines:
        notes += (
            "\nBaselines: Linear SVM is LinearSVC's problem (hinge, C = 1, penalised "
            "intercept) solved through its dual; FocalLoss (gamma = 2, no alpha),\nHRM "
            "(a = 0.01, b = 0) and RobustRegRisk by L-BFGS (the authors ran 10,000 gradient "
            "steps); HRM and RobustRegRisk start from the logistic fit.\nLearnReweight "
            "follows the authors' script (uniform weights moved by one meta step of 0.001 "
            "towards 10 clean validation samples per class),\n1,000 steps of size 1 where "
            "they ran 10,000 of size 0.1. RobustRegRisk's rho/n is chosen on validation "
            "accuracy from the paper's grid\n"
            + ("(quick: from {1, 10} only). " if quick else "{0.5, 1, 2, 3, 4, 5, 10}. ")
            + "The thresholds of ERM+ and RobustRegRisk+ match TERM (t=50)'s validation "
            "rare-class accuracy (the paper: binary search)."
        )
    else:
        notes += "\nThe paper's baselines were not run (baselines=False)."
    return notes

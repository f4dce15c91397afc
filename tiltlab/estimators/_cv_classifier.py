"""``TiltedClassifierCV``: a tilted classifier whose tilt is chosen by cross-validation."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils.metaestimators import available_if

from .._compat import to_numpy
from ._base import FitData
from ._classifier import TiltedClassifier
from ._cv_search import (
    ROBUST_SCORES,
    _TiltCV,
)

__all__ = ["TiltedClassifierCV"]


class TiltedClassifierCV(_TiltCV, TiltedClassifier):
    """:class:`TiltedClassifier` with the tilt chosen by cross-validation.

    Each fold solves the grid ``ts`` as a warm-started continuation path and scores every
    solution on its held-out rows. With groups (``groups="class"`` or labels in ``fit``)
    the grid varies the group-level tilt of ``tilts=(t, tau)``.

    Parameters
    ----------
    loss, groups, alpha, fit_intercept, solver, tol, max_iter, random_state, solver_options
        As in :class:`TiltedClassifier`.
    early_stopping, validation_fraction, n_iter_no_change
        As in :class:`TiltedClassifier`.
    scoring : str or callable, optional
        ``"worst_group"``: the lowest held-out accuracy over the groups (the classes for
        ``groups="class"``; fairness); ``"accuracy"``; ``"median"``, ``"trimmed"``,
        ``"mean"``: minus the median / trimmed / mean held-out classification loss (robust
        to label noise); any scikit-learn scorer name or callable. Default:
        ``"worst_group"`` with groups, else ``"accuracy"``.
    tau : float, default 0.0
        Sample-level tilt inside the groups.
    ts : array-like of float, optional
        The grid of tilts (default :data:`DEFAULT_TS`: 0 and 0.1, 0.32, 1, 3.2, 10 of
        both signs).
    cv : int, cross-validation generator or iterable, default 5
        An int ``k`` means ``k`` *shuffled* folds (``KFold``, or ``StratifiedKFold`` for
        classifiers, seeded by ``random_state``): the robust scores assume that each
        held-out fold is no more corrupted than the data as a whole, which contiguous
        folds of sorted data (corrupted rows first) would break. Otherwise as in
        scikit-learn.
    trim : float, default 0.5
        Share of the largest held-out losses dropped by ``scoring="trimmed"``.
    select : {"one_se", "best"}, default "one_se"
        As in :class:`TiltedRegressorCV`.
    refit : bool, default True
        Refit on all the data at the chosen tilt (``best_estimator_``); needed for
        ``predict``.

    Attributes
    ----------
    t_, cv_results_, best_score_, best_index_, scoring_
        As in :class:`TiltedRegressorCV`.
    best_estimator_ : TiltedClassifier
    classes_, coef_, intercept_, n_iter_, tilted_weights_, result_

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.estimators import TiltedClassifierCV
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(0, 1, (285, 2)), rng.normal(1.5, 1, (15, 2))]
    >>> y = np.r_[np.zeros(285), np.ones(15)]            # 1:19 imbalance
    >>> cv = TiltedClassifierCV(ts=[0.0, 1.0, 10.0], groups="class", cv=3).fit(X, y)
    >>> cv.t_ > 0                      # the worst-class accuracy asks for a positive tilt
    True
    """

    _estimator_class = TiltedClassifier
    _builtin_scores = ROBUST_SCORES + ("accuracy",)

    def __init__(
        self,
        ts: Any = None,
        *,
        loss: str = "logistic",
        groups: Any = None,
        scoring: Any = None,
        trim: float = 0.5,
        select: str = "one_se",
        tau: float = 0.0,
        cv: Any = 5,
        refit: bool = True,
        alpha: float = 1e-4,
        fit_intercept: bool = True,
        solver: str = "lbfgs",
        tol: float = 1e-6,
        max_iter: int = 1000,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        random_state: Any = None,
        solver_options: dict | None = None,
    ):
        self.ts = ts
        self.loss = loss
        self.groups = groups
        self.scoring = scoring
        self.trim = trim
        self.select = select
        self.tau = tau
        self.cv = cv
        self.refit = refit
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.random_state = random_state
        self.solver_options = solver_options

    def _default_scoring(self, n_levels: int) -> str:
        return "worst_group" if n_levels else "accuracy"

    def _held_out_targets(self, est, held):
        codes = to_numpy(held.stratify)
        return np.asarray(to_numpy(self.classes_))[codes]

    def _predicted_codes(self, held: FitData, thetas: list) -> np.ndarray:
        cols = [np.asarray(to_numpy(held.X @ th), dtype=np.float64) for th in thetas]
        if len(cols) == 1:
            z = cols[0]
            if z.ndim == 1:
                return (z > 0).astype(np.int64)
            return np.argmax(z, axis=1)
        return np.argmax(np.stack(cols, axis=1), axis=1)

    def _builtin_score(self, held: FitData, thetas: list, scoring: str) -> float:
        if scoring in ("accuracy", "worst_group"):
            correct = self._predicted_codes(held, thetas) == held.stratify
            if scoring == "accuracy":
                return float(correct.mean())
            codes = self._group_codes(held)
            if codes is None:
                codes = held.stratify
            return float(min(correct[codes == g].mean() for g in np.unique(codes)))
        return self._robust(self._held_out_losses(held, thetas), scoring)

    def decision_function(self, X: Any) -> Any:
        """Scores of the estimator refitted at ``t_``."""
        self._check_refit(X, "decision_function")
        return self.best_estimator_.decision_function(X)

    @available_if(TiltedClassifier._has_proba)
    def predict_proba(self, X: Any) -> Any:
        """Class probabilities of the estimator refitted at ``t_``."""
        self._check_refit(X, "predict_proba")
        return self.best_estimator_.predict_proba(X)

    @available_if(TiltedClassifier._has_proba)
    def predict_log_proba(self, X: Any) -> Any:
        """Log-probabilities of the estimator refitted at ``t_``."""
        self._check_refit(X, "predict_log_proba")
        return self.best_estimator_.predict_log_proba(X)

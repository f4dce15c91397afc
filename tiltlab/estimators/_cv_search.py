"""The cross-validated search over tilts shared by ``TiltedRegressorCV`` and ``TiltedClassifierCV``.

Per fold, the tilts of the grid are solved in continuation order (``t = 0`` first, then
upwards through the positive tilts and downwards through the negative ones, each solve
warm-started at the previous solution, as :func:`tiltlab.tilt_path` does) and every
solution is scored on the held-out rows. The path is walked here rather than by
``tilt_path`` because each step may need its own early-stopping objective (same tilt,
validation rows) and may vary the group-level tilt of a hierarchy, which ``tilt_path``
does not do.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np
from sklearn.base import ClassifierMixin, clone
from sklearn.metrics import check_scoring
from sklearn.model_selection import KFold, StratifiedKFold, check_cv
from sklearn.utils.validation import check_is_fitted

from .._compat import to_numpy
from ._base import FitData, subset_data
from ._checks import check_bool, check_real, check_same_namespace
from ._regressor import TiltedRegressor
from ._scores import follows_predictions

__all__ = ["DEFAULT_TS"]

#: Default grid of tilts: 0 and five log-spaced tilts of each sign from 0.1 to 10.
DEFAULT_TS = np.concatenate([-np.logspace(1, -1, 5), [0.0], np.logspace(-1, 1, 5)])

ROBUST_SCORES = ("median", "trimmed", "mean", "worst_group")
REGRESSION_SCORES = ROBUST_SCORES + ("adaptive", "likelihood", "clean")

#: ``scoring="adaptive"``: below this estimated share of corrupted held-out rows the tilts
#: are scored by their plain mean held-out loss
CLEAN_CONTAMINATION = 0.1


def _check_ts(ts: Any) -> np.ndarray:
    if ts is None:
        return DEFAULT_TS.copy()
    arr = np.asarray(to_numpy(ts), dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError("`ts` must hold at least one tilt")
    if not np.all(np.isfinite(arr)):
        raise ValueError("`ts` must be finite")
    return arr


def _continuation_order(ts: np.ndarray) -> list[int]:
    pos = sorted((i for i in range(ts.size) if ts[i] >= 0), key=lambda i: ts[i])
    neg = sorted((i for i in range(ts.size) if ts[i] < 0), key=lambda i: -ts[i])
    return pos + neg


class _TiltCV:
    """Shared fit / predict of the CV estimators (not public)."""

    _estimator_class: type = TiltedRegressor
    _own_params: tuple[str, ...] = ("ts", "cv", "scoring", "trim", "refit", "tau")

    # ------------------------------------------------------------------- helpers

    def _base_params(self) -> dict[str, Any]:
        names = self._estimator_class._get_param_names()
        params = self.get_params(deep=False)
        out = {k: params[k] for k in names if k in params and k not in ("t", "tilts")}
        out["warm_start"] = False
        return out

    def _estimator_for(self, t: float, n_levels: int) -> Any:
        est = self._estimator_class(**self._base_params())
        if n_levels:
            tau = check_real(self.tau, "tau")
            est.set_params(tilts=(float(t),) + (0.0,) * (n_levels - 1) + (tau,))
        else:
            est.set_params(t=float(t))
        return est

    def _n_levels(self, groups: Any) -> int:
        if getattr(self, "groups", None) == "class":
            return 1
        if groups is None:
            return 0
        g = np.asarray(to_numpy(groups))
        return 1 if g.ndim == 1 else int(g.shape[1])

    def _check_cv_params(self) -> None:
        check_bool(self.refit, "refit")
        trim = check_real(self.trim, "trim")
        if not 0 <= trim < 1:
            raise ValueError(f"`trim` must lie in [0, 1), got {self.trim!r}")
        if hasattr(self, "outlier_threshold"):
            thr = check_real(self.outlier_threshold, "outlier_threshold")
            if thr <= 0:
                raise ValueError(f"`outlier_threshold` must be positive, got {thr!r}")
        s = self.scoring
        if s is not None and not callable(s) and not isinstance(s, str):
            raise TypeError("`scoring` must be None, a string or a callable scorer")

    def _scoring_name(self, n_levels: int) -> Any:
        if self.scoring is not None:
            return self.scoring
        return self._default_scoring(n_levels)

    # ----------------------------------------------------------------------- fit

    def fit(self, X: Any, y: Any, sample_weight: Any = None, groups: Any = None):
        """Cross-validate the grid of tilts, pick ``t_`` and refit on all the data.

        Parameters
        ----------
        X : array of shape (n_samples, n_features)
        y : array of shape (n_samples,)
        sample_weight : array of shape (n_samples,), optional
            Prior weights of the tilted risk.
        groups : array of shape (n_samples,) or (n_samples, n_levels), optional
            Group labels: the grid then varies the group-level tilt (the inner tilts are 0
            and the sample tilt is ``tau``), and ``scoring="worst_group"`` scores the
            worst group. They are also handed to the CV splitter (group splitters use them).

        Returns
        -------
        self
        """
        self._check_cv_params()
        ts = _check_ts(self.ts)
        n_levels = self._n_levels(groups)
        est = self._estimator_for(0.0, n_levels)
        data = est._prepare(X, y, sample_weight, groups)
        self.n_features_in_ = est.n_features_in_
        if hasattr(est, "feature_names_in_"):
            self.feature_names_in_ = est.feature_names_in_
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        if hasattr(est, "classes_"):
            self.classes_ = est.classes_
        scoring = self._scoring_name(n_levels)
        scorer = None
        if not (isinstance(scoring, str) and scoring in self._builtin_scores):
            scorer = check_scoring(est, scoring=scoring)
        # folds are drawn over every row passed to fit (as the splitter and the groups
        # see them), then the rows dropped for their zero weight leave each fold
        n = data.n if data.rows is None else int(data.n_all)
        y_np = data.stratify if data.rows is None else data.stratify_all
        seed = est._seed()
        cv = self.cv
        if cv is None or (isinstance(cv, numbers.Integral) and not isinstance(cv, bool)):
            # shuffled folds: the robust scores assume every held-out fold is no more
            # corrupted than the data, which sorted data (corrupted rows first) would break
            n_folds = 5 if cv is None else int(cv)
            kind = StratifiedKFold if isinstance(self, ClassifierMixin) else KFold
            cv = kind(n_folds, shuffle=True, random_state=seed)
        cv = check_cv(cv, y_np, classifier=isinstance(self, ClassifierMixin))
        g_split = None if groups is None else np.asarray(to_numpy(groups))
        with warnings.catch_warnings():  # non-group splitters warn that they ignore groups
            warnings.filterwarnings("ignore", message="The groups parameter is ignored")
            splits = list(cv.split(np.zeros((n, 1)), y_np, g_split))
        if data.rows is not None:
            where = np.full(n, -1, dtype=np.int64)
            where[data.rows] = np.arange(data.n)
            splits = [(where[tr][where[tr] >= 0], where[te][where[te] >= 0]) for tr, te in splits]
        scores = np.full((len(splits), ts.size), np.nan)
        n_iter = np.zeros((len(splits), ts.size), dtype=np.int64)
        anchor = None
        adaptive: list[tuple[np.ndarray, np.ndarray, float, np.ndarray]] = []
        for k, (tr, te) in enumerate(splits):
            fold = subset_data(data, np.asarray(tr))
            held = subset_data(data, np.asarray(te))
            path: dict[int, list] = {}
            for j, thetas, nit in self._path(est, fold, ts, seed, anchor):
                n_iter[k, j] = nit
                path[j] = thetas
            # the next fold's t = 0 solve starts at this fold's: the folds share most rows
            # (not with early stopping: there the start is part of the regularisation)
            if 0.0 in ts and not est._early_stopping_on(fold.n, fold.spec.with_outer(0.0)):
                anchor = path[int(np.argmin(np.abs(ts)))]
            if scorer is not None:
                for j in range(ts.size):
                    scores[k, j] = self._score(est, held, path[j], scorer)
            elif scoring == "adaptive":
                adaptive.append(self._adaptive_fold(held, [path[j] for j in range(ts.size)]))
            else:
                scores[k] = self._builtin_scores_fold(
                    held, [path[j] for j in range(ts.size)], scoring
                )
        self.contamination_ = None
        if adaptive:
            # the estimated share of corrupted held-out rows decides what "good" means: the
            # plain held-out loss when the data look clean, else the loss on the rows the
            # contaminated model believes clean
            # rows in the tail of skewed clean noise are flagged too, but their targets
            # move with the predictions, which corrupted targets do not: pooled over the
            # folds, flagged rows that follow the predictions count as clean
            flagged = float(np.mean([a[2] for a in adaptive]))
            follow = follows_predictions(np.sum([a[3] for a in adaptive], axis=0))
            self.contamination_ = 0.0 if follow else flagged
            use = 0 if self.contamination_ >= CLEAN_CONTAMINATION else 1
            scores = np.array([a[use] for a in adaptive])
        mean = scores.mean(axis=0)
        std = scores.std(axis=0)
        if not np.any(np.isfinite(mean)):
            raise ValueError("every tilt of the grid scored NaN; check `scoring` and the data")
        best = self._select(ts, scores)
        rank = np.empty(ts.size, dtype=np.int64)
        order = np.argsort(-np.where(np.isfinite(mean), mean, -np.inf), kind="stable")
        rank[order] = np.arange(1, ts.size + 1)
        results: dict[str, Any] = {"t": ts.copy()}
        for k in range(len(splits)):
            results[f"split{k}_test_score"] = scores[k].copy()
        results.update(
            mean_test_score=mean,
            std_test_score=std,
            rank_test_score=rank,
            mean_n_iter=n_iter.mean(axis=0),
        )
        self.cv_results_ = results
        self.t_ = float(ts[best])
        self.best_index_ = best
        self.best_score_ = float(mean[best])
        self.scoring_ = scoring
        self.n_splits_ = len(splits)
        if self.refit:
            final = self._estimator_for(self.t_, n_levels)
            final.fit(X, y, sample_weight=sample_weight, groups=groups)
            self.best_estimator_ = final
            for name in ("coef_", "intercept_", "n_iter_", "tilted_weights_", "result_"):
                setattr(self, name, getattr(final, name))
        return self

    def _path(self, est: Any, fold: FitData, ts: np.ndarray, seed: int, start: Any = None):
        """Yield (index, thetas, iterations) along the warm-started continuation path.

        ``start``: the t = 0 solution of another fold, where this fold's t = 0 solve starts.
        """
        cache: dict = {}
        anchor_thetas, anchor_res = est._solve_all(
            fold, fold.spec.with_outer(0.0), start, seed, cache
        )
        anchor_nit = max(r.nit for r in anchor_res)
        prev_sign = None
        thetas = anchor_thetas
        for i in _continuation_order(ts):
            sign = ts[i] >= 0
            if sign != prev_sign:  # each direction starts at the t = 0 solution
                thetas = anchor_thetas
                prev_sign = sign
            if ts[i] == 0.0:
                yield i, anchor_thetas, anchor_nit
                continue
            spec = fold.spec.with_outer(float(ts[i]))
            thetas, res = est._solve_all(fold, spec, thetas, seed, cache)
            yield i, thetas, max(r.nit for r in res)

    # -------------------------------------------------------------------- scores

    def _held_out_losses(self, held: FitData, thetas: list) -> np.ndarray:
        xp = held.xp
        total = None
        for prob, th in zip(held.problems, thetas, strict=True):
            z = held.X @ th
            ell = prob.loss.value(z, prob.y, validate=False, xp=xp)
            total = ell if total is None else total + ell
        return np.asarray(to_numpy(total), dtype=np.float64)

    def _select(self, ts: np.ndarray, scores: np.ndarray) -> int:
        """Index of the chosen tilt: the best mean score, or with ``select="one_se"`` the
        tilt nearest 0 whose mean score is within one standard error of the best.

        The standard error is that of the *paired* per-fold score difference to the best
        tilt: every tilt is scored on the same held-out rows, so the fold-to-fold spread
        of the scores themselves (which mostly measures how hard each fold is) would let
        tilts the folds consistently rank worse pass as indistinguishable.
        """
        if self.select not in ("best", "one_se"):
            raise ValueError(f"`select` must be 'best' or 'one_se', got {self.select!r}")
        mean = scores.mean(axis=0)
        finite = np.where(np.isfinite(mean), mean, -np.inf)
        top = int(np.argmax(finite))
        slack = 1e-12 * max(1.0, abs(finite[top]))
        gap = finite[top] - finite
        if self.select == "one_se" and scores.shape[0] > 1:
            diff = scores[:, [top]] - scores
            with np.errstate(invalid="ignore"):
                se = np.std(diff, axis=0, ddof=1) / np.sqrt(scores.shape[0])
            slack = slack + np.where(np.isfinite(se), se, 0.0)
        cand = np.flatnonzero(gap <= slack)
        return int(cand[np.argmin(np.abs(ts[cand]))])

    def _score(self, est, held, thetas, scorer) -> float:
        fitted = clone(est)
        fitted._set_coef(held, thetas)
        fitted.n_features_in_ = est.n_features_in_
        if hasattr(est, "classes_"):
            fitted.classes_ = est.classes_
        Xh = held.X[:, :-1] if held.intercept else held.X
        yh = self._held_out_targets(est, held)
        return float(scorer(fitted, Xh, yh))

    def _builtin_scores_fold(self, held: FitData, path: list, scoring: str) -> np.ndarray:
        return np.array([self._builtin_score(held, th, scoring) for th in path])

    def _robust(self, ell: np.ndarray, scoring: str) -> float:
        if scoring == "median":
            return -float(np.median(ell))
        if scoring == "mean":
            return -float(ell.mean())
        # trimmed: mean of the smallest (1 - trim) share of the losses
        keep = max(1, int(np.ceil((1.0 - float(self.trim)) * ell.size)))
        return -float(np.sort(ell)[:keep].mean())

    def _group_codes(self, held: FitData) -> np.ndarray | None:
        if held.spec.groups is not None:
            return held.spec.groups[0]
        return None

    # ----------------------------------------------------------------- predictions

    def _check_refit(self, X: Any = None, method: str | None = None) -> None:
        check_is_fitted(self, "best_estimator_")
        if method is not None:
            check_same_namespace(X, self, method)

    def predict(self, X: Any) -> Any:
        """Predictions of the estimator refitted at ``t_``."""
        self._check_refit(X, "predict")
        return self.best_estimator_.predict(X)

    def plot(self, ax: Any = None) -> Any:
        """Plot the cross-validated score against ``t`` (see :func:`plot_tilt_scores`)."""
        from ._plot import plot_tilt_scores

        return plot_tilt_scores(self, ax=ax)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.array_api_support = True
        return tags

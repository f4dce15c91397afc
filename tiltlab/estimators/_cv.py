"""Choosing the tilt by cross-validation: ``TiltedRegressorCV`` and ``TiltedClassifierCV``.

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
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from .._compat import to_numpy
from ._base import FitData, check_real, subset_data
from ._classifier import TiltedClassifier
from ._regressor import TiltedRegressor
from ._scores import (
    contaminated_fit,
    contaminated_log_likelihood,
    gaussian_logpdf_of_targets,
)

__all__ = ["TiltedRegressorCV", "TiltedClassifierCV", "DEFAULT_TS"]

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
        adaptive: list[tuple[np.ndarray, np.ndarray, float]] = []
        for k, (tr, te) in enumerate(splits):
            fold = subset_data(data, np.asarray(tr))
            held = subset_data(data, np.asarray(te))
            path: dict[int, list] = {}
            for j, thetas, nit in self._path(est, fold, ts, seed, anchor):
                n_iter[k, j] = nit
                path[j] = thetas
            # the next fold's t = 0 solve starts at this fold's: the folds share most rows
            # (not with early stopping: there the start is part of the regularisation)
            if 0.0 in ts and not est._early_stopping_on(fold.n):
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
            self.contamination_ = float(np.mean([a[2] for a in adaptive]))
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

    def _check_refit(self) -> None:
        check_is_fitted(self, "best_estimator_")

    def predict(self, X: Any) -> Any:
        """Predictions of the estimator refitted at ``t_``."""
        self._check_refit()
        return self.best_estimator_.predict(X)

    def plot(self, ax: Any = None) -> Any:
        """Plot the cross-validated score against ``t`` (see :func:`plot_tilt_scores`)."""
        from ._plot import plot_tilt_scores

        return plot_tilt_scores(self, ax=ax)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.array_api_support = True
        return tags


class TiltedRegressorCV(_TiltCV, TiltedRegressor):
    """:class:`TiltedRegressor` with the tilt chosen by cross-validation.

    Each fold solves the grid ``ts`` as a warm-started continuation path (from ``t = 0``
    outwards) and scores every solution on its held-out rows. With ``select="one_se"``
    (default) the chosen tilt ``t_`` is the one nearest 0 whose mean score is within one
    standard error of the best, the standard error of the per-fold score difference to the
    best tilt (the "one-standard-error rule": prefer the least departure from ERM the data
    cannot tell apart from the best); ``select="best"`` takes the best.

    The held-out rows are as corrupted as the training rows, so the default score
    (``"adaptive"``) first asks how corrupted they are. Per fold, it fits a contaminated
    model to the held-out targets of every tilt's solution: a share ``1 - eps`` of the
    targets is the prediction plus Gaussian noise, the rest follows a broad outlier
    density (the Gaussian of the held-out targets' mean and variance), ``eps`` and the
    noise scale fitted by EM. The tilt with the highest such likelihood gives each
    held-out row a probability of being clean. When the estimated share of corrupted rows
    (``contamination_``, averaged over the folds) is below 10%, every tilt is scored by its
    plain mean held-out loss; otherwise by its held-out loss weighted by those
    probabilities. Unlike the median or a trimmed mean of the losses, this stays right when
    the corrupted rows are the majority: on the Drug Discovery data with 80% of the
    targets corrupted it picks t = -0.32 to -1 (test RMSE 1.2-1.5, least squares 4.5-4.8),
    and on clean data it scores like the plain held-out loss (see
    ``benchmarks/estimators_tilt_selection.py``).

    Defaults: with ``early_stopping="auto"`` every fit of the path and the refit hold out
    ``validation_fraction`` of their training rows once the data have 1,000 rows or more
    and stop on the held-out tilted objective, the protocol of the TERM paper's robust
    regression; on the Drug Discovery data this keeps the whole search to seconds, where
    minimising every fit to ``tol`` takes minutes and overfits the rank-deficient design.
    (scikit-learn's ``RidgeCV`` has no such question, as it solves in closed form;
    ``SGDRegressor``, ``MLPRegressor`` and ``HistGradientBoostingRegressor`` offer the
    same validation early stopping, the last with the same ``"auto"`` switch on size.)

    Parameters
    ----------
    loss, alpha, epsilon, fit_intercept, solver, tol, max_iter, random_state, solver_options
        As in :class:`TiltedRegressor`.
    early_stopping : bool or "auto", default "auto"
        As in :class:`TiltedRegressor`, applied inside every fit of the path (its
        validation split is drawn from the fold's training rows) and in the refit;
        ``"auto"``: on from 1,000 rows (see above).
    validation_fraction, n_iter_no_change
        As in :class:`TiltedRegressor`.
    scoring : str or callable, optional
        Default ``"adaptive"`` (see above), or ``"worst_group"`` when groups are given.
        ``"likelihood"``: the held-out log-likelihood of the contaminated model itself;
        ``"clean"``: minus the mean loss on the held-out rows a robust reference fit (the
        grid's fit with the smallest median held-out loss) does not flag as outliers
        (residual beyond ``outlier_threshold`` robust standard deviations; fooled when
        most rows are corrupted).
        ``"median"``: minus the median held-out loss (robust to up to half of the held-out
        targets being corrupted, like the training ones); ``"trimmed"``: minus the mean
        of the smallest ``1 - trim`` share of the held-out losses; ``"mean"``: minus the
        mean held-out loss (not robust); ``"worst_group"``: minus the largest group-mean
        held-out loss (needs groups: fairness). Any other string names a scikit-learn
        scorer (e.g. ``"neg_mean_absolute_error"``); a callable is a scorer
        ``scorer(estimator, X, y)``. Losses are the estimator's own ``loss``; held-out
        rows count equally.
    tau : float, default 0.0
        Sample-level tilt inside the groups when groups are given to ``fit`` (the grid then
        varies the group-level tilt).
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
    outlier_threshold : float, default 3.0
        Robust standard deviations beyond which ``scoring="clean"`` flags a held-out row.
    select : {"one_se", "best"}, default "one_se"
    refit : bool, default True
        Refit on all the data at the chosen tilt (``best_estimator_``); needed for
        ``predict``.

    Attributes
    ----------
    t_ : float
        The chosen tilt.
    contamination_ : float or None
        With ``scoring="adaptive"``: the estimated share of corrupted held-out rows.
    cv_results_ : dict of ndarray
        ``t``, ``split{k}_test_score``, ``mean_test_score``, ``std_test_score``,
        ``rank_test_score``, ``mean_n_iter``.
    best_score_ : float
    best_index_ : int
    scoring_ : str or callable
        The scoring used.
    best_estimator_ : TiltedRegressor
        Refitted at ``t_`` (with ``refit=True``).
    coef_, intercept_, n_iter_, tilted_weights_, result_
        Those of ``best_estimator_``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.estimators import TiltedRegressorCV
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 3))
    >>> y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=300)
    >>> y[:90] = rng.normal(5.0, 5.0, size=90)          # 30% corrupted targets
    >>> cv = TiltedRegressorCV(cv=3).fit(X, y)
    >>> cv.t_ < 0, np.round(cv.coef_, 1).tolist()
    (True, [1.0, -2.0, 0.5])
    """

    _estimator_class = TiltedRegressor
    _builtin_scores = REGRESSION_SCORES

    def __init__(
        self,
        ts: Any = None,
        *,
        loss: str = "squared",
        scoring: Any = None,
        trim: float = 0.5,
        outlier_threshold: float = 3.0,
        select: str = "one_se",
        tau: float = 0.0,
        cv: Any = 5,
        refit: bool = True,
        alpha: float = 0.0,
        epsilon: float = 1.35,
        fit_intercept: bool = True,
        solver: str = "lbfgs",
        tol: float = 1e-6,
        max_iter: int = 1000,
        early_stopping: Any = "auto",
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        random_state: Any = None,
        solver_options: dict | None = None,
    ):
        self.ts = ts
        self.loss = loss
        self.scoring = scoring
        self.trim = trim
        self.outlier_threshold = outlier_threshold
        self.select = select
        self.tau = tau
        self.cv = cv
        self.refit = refit
        self.alpha = alpha
        self.epsilon = epsilon
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
        return "worst_group" if n_levels else "adaptive"

    def _held_out_targets(self, est, held):
        return held.problems[0].y

    def _builtin_scores_fold(self, held: FitData, path: list, scoring: str) -> np.ndarray:
        if scoring == "likelihood":
            y = np.asarray(to_numpy(held.problems[0].y), dtype=np.float64)
            g = gaussian_logpdf_of_targets(y)
            return np.array(
                [
                    contaminated_log_likelihood(
                        y - np.asarray(to_numpy(held.X @ th[0]), dtype=np.float64), g
                    )
                    for th in path
                ]
            )
        if scoring != "clean":
            return super()._builtin_scores_fold(held, path, scoring)
        # one set of held-out rows for every tilt: those the robust reference (the tilt with
        # the smallest median held-out loss) does not flag as outliers
        losses = [self._held_out_losses(held, th) for th in path]
        ref = int(np.argmin([np.median(e) for e in losses]))
        y = np.asarray(to_numpy(held.problems[0].y), dtype=np.float64)
        r = np.asarray(to_numpy(held.X @ path[ref][0]), dtype=np.float64) - y
        center = np.median(r)
        scale = 1.4826 * np.median(np.abs(r - center))
        keep = np.abs(r - center) <= float(self.outlier_threshold) * scale
        if not keep.any():
            keep[:] = True
        return np.array([-float(e[keep].mean()) for e in losses])

    def _adaptive_fold(self, held: FitData, path: list) -> tuple[np.ndarray, np.ndarray, float]:
        """Scores of one fold for ``scoring="adaptive"``.

        Returns minus the held-out loss weighted by the rows' probability of being clean
        (under the contaminated model fitted to the residuals of the tilt with the best
        held-out likelihood), minus the plain mean held-out loss, and the estimated share
        of corrupted rows.
        """
        y = np.asarray(to_numpy(held.problems[0].y), dtype=np.float64)
        g = gaussian_logpdf_of_targets(y)
        fits = [
            contaminated_fit(y - np.asarray(to_numpy(held.X @ th[0]), dtype=np.float64), g)
            for th in path
        ]
        clean = fits[int(np.argmax([f[0] for f in fits]))][1]
        losses = [self._held_out_losses(held, th) for th in path]
        total = max(float(clean.sum()), np.finfo(np.float64).tiny)
        robust = np.array([-float(np.sum(clean * e)) / total for e in losses])
        plain = np.array([-float(e.mean()) for e in losses])
        return robust, plain, 1.0 - float(clean.mean())

    def _builtin_score(self, held: FitData, thetas: list, scoring: str) -> float:
        ell = self._held_out_losses(held, thetas)
        if scoring == "worst_group":
            codes = self._group_codes(held)
            if codes is None:
                raise ValueError('`scoring`="worst_group" needs groups: pass fit(..., groups=...)')
            means = [ell[codes == g].mean() for g in np.unique(codes)]
            return -float(max(means))
        return self._robust(ell, scoring)


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
        self._check_refit()
        return self.best_estimator_.decision_function(X)

    @available_if(TiltedClassifier._has_proba)
    def predict_proba(self, X: Any) -> Any:
        """Class probabilities of the estimator refitted at ``t_``."""
        self._check_refit()
        return self.best_estimator_.predict_proba(X)

    @available_if(TiltedClassifier._has_proba)
    def predict_log_proba(self, X: Any) -> Any:
        """Log-probabilities of the estimator refitted at ``t_``."""
        self._check_refit()
        return self.best_estimator_.predict_log_proba(X)

"""What the tilted estimators share: parameter checks, data handling and the fit itself.

Conventions (documented in the estimators' docstrings):

* The fitted objective is ``R_t(loss_1, ..., loss_N; p) + alpha/2 * ||coef||^2`` where
  ``R_t`` is the tilted (or hierarchical) risk of :class:`~tiltlab.TiltedObjective`, ``p``
  the normalised ``sample_weight`` and ``coef`` the coefficients *without* the intercept.
* The intercept is the coefficient of an appended column of ones and is never penalised.
* Everything after input validation runs in the array namespace and on the device of
  ``X`` (NumPy unless scikit-learn's ``array_api_dispatch`` is on).
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .._compat import (
    device,
    library_namespace,
    to_numpy,
)
from ._checks import (
    add_intercept_column,
    as_float_X,
    check_bool,
    check_groups,
    check_real,
    check_same_namespace,
    check_solver_options,
    check_tilts,
    namespace,
    take_rows,
)
from ._direct import direct_applies, newton_solve
from ._objective import make_objective

SOLVERS = ("lbfgs", "newton", "agd", "gd", "stochastic")

#: ``early_stopping="auto"`` holds out a validation split from this many training rows up
AUTO_EARLY_STOPPING_ROWS = 1000

#: losses with a kink where the minimiser usually sits: their fits stop on the value test
#: (``ftol`` of :func:`tiltlab.minimize`, set to ``tol``) as well as the gradient test
KINKED_LOSSES = ("absolute", "hinge", "pinball")


# ---------------------------------------------------------------------- the fitted problem


@dataclass
class Problem:
    """One tilted minimisation: a loss and the targets it sees (one per OvR class)."""

    loss: Any
    y: Any


@dataclass
class TiltSpec:
    """Sample-level tilt ``t``, or hierarchical ``tilts`` with host group codes."""

    t: float = 0.0
    tilts: tuple[float, ...] | None = None
    groups: list[np.ndarray] | None = None

    def with_outer(self, t: float) -> TiltSpec:
        """The same spec with the outermost tilt replaced by ``t``."""
        if self.tilts is None:
            return TiltSpec(t=t)
        return TiltSpec(tilts=(t,) + tuple(self.tilts[1:]), groups=self.groups)

    @property
    def tilted(self) -> bool:
        """Whether any tilt is non-zero."""
        if self.tilts is None:
            return self.t != 0.0
        return any(t != 0.0 for t in self.tilts)

    def tilt_kwargs(self) -> dict[str, Any]:
        """The tilt alone, as ``with_tilt`` takes it."""
        if self.tilts is None:
            return {"t": self.t}
        return {"tilts": self.tilts}

    def objective_kwargs(self, idx: np.ndarray | None = None) -> dict[str, Any]:
        if self.tilts is None:
            return {"t": self.t}
        gs = self.groups if idx is None else [g[idx] for g in self.groups]
        return {"tilts": self.tilts, "groups": gs[0] if len(gs) == 1 else gs}


@dataclass
class FitData:
    """Validated training data in X's namespace.

    ``features`` is ``X`` as validated; :attr:`X` is ``features`` with the intercept's
    column of ones appended (when ``intercept``), built on first use: a copy of ``X``,
    which a fit that never builds an objective on these rows (the direct solve of
    :mod:`._direct`) does not make.
    """

    features: Any
    xp: Any
    sample_weight: Any
    intercept: bool
    spec: TiltSpec
    problems: list[Problem] = field(default_factory=list)
    stratify: np.ndarray | None = None
    #: rows of the data passed to fit that these rows are (None: all of them, in order)
    rows: np.ndarray | None = None
    n_all: int | None = None
    stratify_all: np.ndarray | None = None
    _X: Any = field(default=None, repr=False)

    @property
    def X(self) -> Any:
        """The features with the intercept column appended (built once, on first use)."""
        if self._X is None:
            f = self.features
            self._X = add_intercept_column(f, self.xp) if self.intercept else f
        return self._X

    @property
    def n(self) -> int:
        return int(self.features.shape[0])

    @property
    def n_params(self) -> int:
        """Rows of ``theta``: the features, plus one for the intercept."""
        return int(self.features.shape[1]) + int(self.intercept)


def subset_data(data: FitData, rows: np.ndarray) -> FitData:
    """The rows ``rows`` (host indices) of ``data``; group codes re-numbered densely."""
    xp = data.xp
    spec = data.spec
    if spec.groups is not None:
        groups = [np.unique(g[rows], return_inverse=True)[1].reshape(-1) for g in spec.groups]
        spec = TiltSpec(tilts=spec.tilts, groups=[g.astype(np.int64) for g in groups])
    return FitData(
        features=take_rows(data.features, rows, xp),
        xp=xp,
        sample_weight=None
        if data.sample_weight is None
        else take_rows(data.sample_weight, rows, xp),
        intercept=data.intercept,
        spec=spec,
        problems=[Problem(p.loss, take_rows(p.y, rows, xp)) for p in data.problems],
        stratify=None if data.stratify is None else data.stratify[rows],
    )


def drop_zero_weight_rows(data: FitData) -> FitData:
    """Rows with zero ``sample_weight`` removed, as if they had not been passed.

    scikit-learn's convention: a zero weight means the row is absent. Without this, a
    group (or class, with ``groups="class"``) whose rows all weigh zero would be an empty
    group of the hierarchical risk. The fitted ``tilted_weights_`` still cover every row
    passed to fit (zero for the dropped ones).
    """
    if data.sample_weight is None:
        return data
    positive = np.asarray(to_numpy(data.sample_weight)) > 0
    if positive.all():
        return data
    rows = np.flatnonzero(positive)
    out = subset_data(data, rows)
    out.rows, out.n_all, out.stratify_all = rows, data.n, data.stratify
    return out


class TiltedLinearBase(BaseEstimator):
    """Base class of the tilted linear estimators (not public)."""

    _is_classifier = False

    # ------------------------------------------------------------------ parameter checks

    def _check_params(self) -> None:
        if self.solver not in SOLVERS:
            raise ValueError(f"`solver` must be one of {SOLVERS}, got {self.solver!r}")
        alpha = check_real(self.alpha, "alpha")
        if alpha < 0:
            raise ValueError(f"`alpha` must be non-negative, got {self.alpha!r}")
        check_bool(self.fit_intercept, "fit_intercept")
        check_bool(getattr(self, "warm_start", False), "warm_start")
        tol = check_real(self.tol, "tol")
        if tol < 0:
            raise ValueError(f"`tol` must be non-negative, got {self.tol!r}")
        if (
            isinstance(self.max_iter, bool)
            or not isinstance(self.max_iter, numbers.Integral)
            or self.max_iter < 1
        ):
            raise ValueError(f"`max_iter` must be a positive integer, got {self.max_iter!r}")
        es = self.early_stopping
        if not (isinstance(es, (bool, np.bool_)) or (isinstance(es, str) and es == "auto")):
            raise ValueError(f"`early_stopping` must be True, False or 'auto', got {es!r}")
        if es is not False:
            vf = check_real(self.validation_fraction, "validation_fraction")
            if not 0 < vf < 1:
                raise ValueError(
                    f"`validation_fraction` must lie in (0, 1), got {self.validation_fraction!r}"
                )
            nic = self.n_iter_no_change
            if isinstance(nic, bool) or not isinstance(nic, numbers.Integral) or nic < 1:
                raise ValueError(
                    f"`n_iter_no_change` must be a positive integer, got {self.n_iter_no_change!r}"
                )
        check_solver_options(self.solver_options)
        self._check_robustness()

    def _check_robustness(self) -> None:
        kind = getattr(self, "robustness", None)
        if kind is None:
            return
        if not (isinstance(kind, str) and kind in ("kl", "cvar")):
            raise ValueError(f"`robustness` must be None, 'kl' or 'cvar', got {kind!r}")
        if kind == "kl":
            r = check_real(self.radius, "radius")
            if not 0 <= r < float("inf"):
                raise ValueError(f"`radius` must be a finite number >= 0, got {self.radius!r}")
        else:
            a = check_real(self.tail, "tail")
            if not 0 < a <= 1:
                raise ValueError(f"`tail` must lie in (0, 1], got {self.tail!r}")
        if self.solver not in ("lbfgs", "gd", "agd") and not (
            kind == "kl" and self.solver == "newton"
        ):
            raise ValueError(
                f"`solver`={self.solver!r} is not available with `robustness`={kind!r}"
            )
        if self.t != 0 or self.tilts is not None:
            raise ValueError(
                f"`robustness`={kind!r} chooses the tilt itself: leave `t` at 0 and `tilts` "
                "unset"
            )

    def _tilt_spec(self, groups: Any, n: int, class_codes: np.ndarray | None) -> TiltSpec:
        """Check ``t``, ``tilts`` and the groups together; clear errors at fit."""
        by_class = getattr(self, "groups", None)
        if by_class is not None and not (isinstance(by_class, str) and by_class == "class"):
            raise ValueError(
                f"`groups` (constructor) must be None or 'class', got {by_class!r}; pass "
                "per-sample group labels to fit(X, y, groups=...)"
            )
        if by_class == "class" and groups is not None:
            raise ValueError(
                "`groups`: got groups='class' in the constructor and group labels in fit; "
                "use one of them"
            )
        t = check_real(self.t, "t", allow_inf=False)
        if self.tilts is None:
            if groups is not None or by_class == "class":
                raise ValueError(
                    "`groups` were given but `tilts` is None: pass tilts=(t_group, t_sample) "
                    "for group-level tilting (or drop the groups and use `t`)"
                )
            return TiltSpec(t=t)
        tilts = check_tilts(self.tilts)
        if t != 0.0:
            raise ValueError(
                f"`t`={self.t!r} and `tilts`={self.tilts!r} were both given; with `tilts` the "
                "tilts are (t_group, ..., t_sample): leave `t` at 0"
            )
        if by_class == "class":
            codes = [np.asarray(class_codes, dtype=np.int64)]
        elif groups is None:
            raise ValueError(
                "`tilts` needs groups: pass fit(X, y, groups=...) (through metadata routing in "
                "a meta-estimator: est.set_fit_request(groups=True)), or groups='class'"
            )
        else:
            codes = check_groups(groups, n)
        if len(tilts) != len(codes) + 1:
            raise ValueError(
                f"`tilts` must have {len(codes) + 1} entries for {len(codes)} grouping "
                f"level(s) (outermost first, the sample tilt last), got {len(tilts)}"
            )
        return TiltSpec(tilts=tilts, groups=codes)

    # ----------------------------------------------------------------------- data

    def _validate_X(self, X: Any, *, reset: bool) -> tuple[Any, Any]:
        X = validate_data(self, X, reset=reset, dtype="numeric")
        xp = namespace(X)
        return as_float_X(X, xp), xp

    # ------------------------------------------------------------------------ solving

    def _seed(self) -> int:
        return int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))

    def _split(self, data: FitData, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Train / validation indices for early stopping (stratified for classifiers)."""
        from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit

        n = data.n
        n_val = int(np.ceil(self.validation_fraction * n))
        if n_val < 1 or n - n_val < 2:
            raise ValueError(
                f"early stopping needs a validation split: `validation_fraction`="
                f"{self.validation_fraction} of {n} samples is too few or too many"
            )
        dummy = np.zeros((n, 1))
        strat = data.stratify
        if strat is not None and np.bincount(strat).min() >= 2 and n_val >= strat.max() + 1:
            splitter: Any = StratifiedShuffleSplit(
                n_splits=1, test_size=self.validation_fraction, random_state=seed
            )
            tr, va = next(splitter.split(dummy, strat))
        else:
            splitter = ShuffleSplit(
                n_splits=1, test_size=self.validation_fraction, random_state=seed
            )
            tr, va = next(splitter.split(dummy))
        return np.sort(tr), np.sort(va)

    def _early_stopping_on(self, n: int, spec: TiltSpec) -> bool:
        """``early_stopping="auto"``: on from ``AUTO_EARLY_STOPPING_ROWS`` rows up for a
        tilted objective; off for the untilted one (every tilt 0: the convex empirical
        risk that scikit-learn's linear models minimise to their tolerance)."""
        if getattr(self, "robustness", None) is not None:
            return False  # a robust fit has no validation objective to stop on
        if isinstance(self.early_stopping, str):
            return n >= AUTO_EARLY_STOPPING_ROWS and spec.tilted
        return bool(self.early_stopping)

    def _objective(self, data: FitData, problem: Problem, spec: TiltSpec, rows=None) -> Any:
        xp = data.xp
        X, y, sw = data.X, problem.y, data.sample_weight
        if rows is not None:
            X, y = take_rows(X, rows, xp), take_rows(y, rows, xp)
            sw = None if sw is None else take_rows(sw, rows, xp)
        return make_objective(
            problem.loss,
            X,
            y,
            weights=sw,
            alpha=float(self.alpha),
            intercept=data.intercept,
            check_finite=False,  # validate_data has checked X and y (see _prepare)
            **spec.objective_kwargs(rows),
        )

    def _validation_objective(self, data: FitData, problem: Problem, spec: TiltSpec, rows):
        xp = data.xp
        sw = data.sample_weight
        return make_objective(
            problem.loss,
            take_rows(data.X, rows, xp),
            take_rows(problem.y, rows, xp),
            weights=None if sw is None else take_rows(sw, rows, xp),
            alpha=0.0,
            check_finite=False,
            **spec.objective_kwargs(rows),
        )

    def _minimize(self, obj: Any, theta0: Any, val: Any, seed: int) -> Any:
        from ..solvers import minimize, minimize_dro

        opts = check_solver_options(self.solver_options)
        kind = getattr(self, "robustness", None)
        if kind is not None:
            level = {"kl": float(self.radius)} if kind == "kl" else {"cvar": float(self.tail)}
            return minimize_dro(
                obj, **level, theta0=theta0, method=self.solver, tol=float(self.tol),
                max_iter=int(self.max_iter), **opts,
            )  # fmt: skip
        kw: dict[str, Any] = {}
        if val is not None:
            kw = {"validation": val, "patience": int(self.n_iter_no_change)}
        if self.solver == "stochastic":
            kw["seed"] = seed
        elif obj.loss.name in KINKED_LOSSES and "ftol" not in opts:
            # no gradient test can certify a minimiser at a kink: these runs also stop
            # once the value falls by less than `tol` (relative) over 30 iterations
            kw["ftol"] = float(self.tol)
        # `tol` is relative to the larger gradient norm at zero and at the start (minimize's
        # fixed scale), so a warm start stops where a cold start would. A tolerance below
        # what the dtype can resolve ends with status PRECISION (converged to working
        # precision), a success: the user's tol is passed as given.
        return minimize(
            obj,
            theta0,
            method=self.solver,
            tol=float(self.tol),
            max_iter=int(self.max_iter),
            **kw,
            **opts,
        )

    def _solve_all(
        self,
        data: FitData,
        spec: TiltSpec,
        theta0s: list | None,
        seed: int,
        cache: dict | None = None,
    ):
        """Solve every problem; returns (thetas, results).

        ``cache`` (a dict the caller keeps between calls on the same ``data``, as along a
        tilt path) holds the objectives built on the first call; later calls only change
        their tilt, instead of copying the training and validation rows again.
        """
        split = None
        if self._early_stopping_on(data.n, spec):
            split = cache.get("split") if cache is not None else None
            if split is None:
                split = self._split(data, seed)
        thetas, results = [], []
        for k, prob in enumerate(data.problems):
            theta0 = None if theta0s is None else theta0s[k]
            robust = getattr(self, "robustness", None) is not None
            if split is None and not robust and self._direct(data, prob, spec):
                x, res = newton_solve(
                    data.features, prob.y, data.sample_weight, alpha=float(self.alpha),
                    intercept=data.intercept, tol=float(self.tol), xp=data.xp,
                )  # fmt: skip
                if res is not None:
                    thetas.append(res.x)
                    results.append(res)
                    continue
                theta0 = x if x is not None else theta0  # the tolerance was not met: go on
            key = (k, split is not None)  # the untilted start of a path may not stop early
            if cache is not None and key in cache:
                obj, val = (
                    None if o is None else o.with_tilt(**spec.tilt_kwargs()) for o in cache[key]
                )
            else:
                rows = None if split is None else split[0]
                obj = self._objective(data, prob, spec, rows)
                val = None
                if split is not None:
                    val = self._validation_objective(data, prob, spec, split[1])
                if cache is not None:
                    cache[key] = (obj, val)
            if theta0 is not None and tuple(theta0.shape) != tuple(obj.zeros().shape):
                theta0 = None  # e.g. a warm-start refit that sees another number of classes
            res = self._minimize(obj, theta0, val, seed)
            thetas.append(res.x)
            results.append(res)
        if cache is not None and split is not None:
            cache["split"] = split
        return thetas, results

    def _direct(self, data: FitData, problem: Problem, spec: TiltSpec) -> bool:
        """Whether ``problem`` is the untilted ridge problem that :mod:`._direct` solves
        exactly (the estimator's docstring says when)."""
        return direct_applies(
            loss_name=problem.loss.name, untilted=spec.tilts is None and spec.t == 0.0,
            solver=self.solver, solver_options=self.solver_options, X=data.features,
            xp=data.xp,
        )  # fmt: skip

    def _tilted_weights(self, data: FitData, spec: TiltSpec, thetas: list) -> Any:
        """Tilted weights of all rows passed to fit at the solution (one column per problem)."""
        xp = data.xp
        if spec.tilts is None and spec.t == 0.0:  # untilted: the weights are the prior
            n = data.n
            if data.sample_weight is None:
                f = data.features
                w = xp.full((n,), 1.0 / n, dtype=f.dtype, device=device(f))
            else:
                w = data.sample_weight / xp.sum(data.sample_weight)
            k = len(data.problems)
            return self._all_rows(data, w if k == 1 else xp.stack([w] * k, axis=1))
        cols = []
        for prob, th in zip(data.problems, thetas, strict=True):
            obj = make_objective(
                prob.loss,
                data.X,
                prob.y,
                weights=data.sample_weight,
                check_finite=False,
                **spec.objective_kwargs(),
            )
            cols.append(obj.weights(th))
        return self._all_rows(data, cols[0] if len(cols) == 1 else xp.stack(cols, axis=1))

    def _set_worst_case(self, data: FitData, results: list) -> None:
        """``worst_case_weights_`` (and ``tilted_weights_``) of a robust fit."""
        if getattr(self, "robustness", None) is None:
            if hasattr(self, "worst_case_weights_"):
                del self.worst_case_weights_
            return
        xp = data.xp
        cols = [r.weights for r in results]
        w = self._all_rows(data, cols[0] if len(cols) == 1 else xp.stack(cols, axis=1))
        self.worst_case_weights_ = self.tilted_weights_ = w

    @staticmethod
    def _all_rows(data: FitData, w: Any) -> Any:
        """Weights of the fitted rows spread over all rows passed to fit (0 elsewhere)."""
        if data.rows is None:
            return w
        xp = data.xp
        zero = xp.zeros((1,) + tuple(w.shape[1:]), dtype=w.dtype, device=device(w))
        where = np.full(int(data.n_all), data.n, dtype=np.int64)
        where[data.rows] = np.arange(data.n)
        return take_rows(xp.concat([w, zero], axis=0), where, xp)

    def _warn_convergence(self, results: list, problems: list) -> None:
        from ..solvers import Status

        bad = [r for r in results if not r.success]
        if any(p.loss.name in KINKED_LOSSES for p in problems):
            # the gradient test cannot be met at the kinks of non-smooth losses (absolute,
            # hinge, pinball): a line search that stalls there ends their runs silently; an
            # exhausted budget means the value test was not met either, and warns
            bad = [r for r in bad if r.status != Status.LINE_SEARCH_FAILED]
        if bad:
            warnings.warn(
                f"{type(self).__name__}: the solver did not converge ({bad[0].message}); "
                "raise `max_iter` or `tol`, or scale the features",
                ConvergenceWarning,
                stacklevel=3,
            )

    def _theta0(self, data: FitData) -> list | None:
        """Previous solution for warm starts, when its shape still fits."""
        if not self.warm_start or not hasattr(self, "_thetas"):
            return None
        prev = self._thetas
        if len(prev) != len(data.problems):
            return None
        want = data.n_params
        if any(int(th.shape[0]) != want for th in prev):
            return None
        if library_namespace(prev[0]) is not data.xp:
            return None
        return [xp_copy(th, data.xp) for th in prev]

    def _check_fitted(self, X: Any = None, method: str | None = None) -> None:
        """Fitted, and (with ``X``) ``X`` in the namespace and on the device of the fit."""
        check_is_fitted(self, "coef_")
        if method is not None:
            check_same_namespace(X, self, method)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.array_api_support = True
        return tags


def xp_copy(a: Any, xp: Any) -> Any:
    return xp.asarray(a, copy=True)


def split_theta(theta: Any, intercept: bool, xp: Any) -> tuple[Any, Any]:
    """(coefficients, intercept) from ``theta`` of shape (d[+1],) or (d[+1], K)."""
    if not intercept:
        if theta.ndim == 1:
            return theta, xp.zeros((), dtype=theta.dtype, device=device(theta))
        return theta, xp.zeros((theta.shape[1],), dtype=theta.dtype, device=device(theta))
    return theta[:-1, ...], theta[-1, ...]

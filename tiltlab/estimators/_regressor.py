"""``TiltedRegressor``: linear regression with a tilted (TERM) objective."""

from __future__ import annotations

from typing import Any

from sklearn.base import RegressorMixin
from sklearn.utils.validation import validate_data

from .._compat import check_finite
from ..losses import get_loss
from ._base import FitData, Problem, TiltedLinearBase, drop_zero_weight_rows, split_theta
from ._checks import (
    as_float_X,
    check_real,
    check_sample_weight,
    follow_X,
    is_numpy,
    namespace,
)

__all__ = ["TiltedRegressor"]

REGRESSION_LOSSES = ("squared", "absolute", "huber", "poisson", "pinball")


def regression_loss(loss: str, epsilon: float, quantile: float = 0.5) -> Any:
    if loss not in REGRESSION_LOSSES:
        raise ValueError(f"`loss` must be one of {REGRESSION_LOSSES}, got {loss!r}")
    if loss == "huber":
        eps = check_real(epsilon, "epsilon")
        if eps <= 0:
            raise ValueError(f"`epsilon` must be positive, got {epsilon!r}")
        return get_loss("huber", delta=eps)
    if loss == "pinball":
        q = check_real(quantile, "quantile")
        if not 0 < q < 1:
            raise ValueError(f"`quantile` must lie in (0, 1), got {quantile!r}")
        return get_loss("pinball", quantile=q)
    return get_loss(loss)


class TiltedRegressor(RegressorMixin, TiltedLinearBase):
    r"""Linear regression by tilted empirical risk minimization (TERM).

    Minimises over the coefficients ``w`` and the intercept ``b``

    .. math:: \frac{1}{t}\log\Big(\sum_i p_i\, e^{t\,\ell(x_i^\top w + b,\ y_i)}\Big)
              + \frac{\alpha}{2}\|w\|^2

    (the mean loss at ``t = 0``; the hierarchical risk with ``tilts``), with ``p`` the
    normalised ``sample_weight``. Negative ``t`` suppresses outliers (robust regression),
    positive ``t`` magnifies the largest losses (fairness, min-max).

    Parameters
    ----------
    loss : {"squared", "absolute", "huber", "poisson", "pinball"}, default "squared"
        Per-sample loss of the residual ``r = x^T w + b - y``: ``r**2`` (no factor 1/2),
        ``|r|``, Huber's ``r**2/2`` for ``|r| <= epsilon`` and
        ``epsilon * (|r| - epsilon/2)`` beyond, or the pinball loss
        ``max(q (y - z), (q - 1)(y - z))`` of the ``quantile`` ``q`` (``z = x^T w + b``;
        the fit estimates that conditional quantile). ``"poisson"``: the half Poisson
        deviance ``exp(z) - y - y (z - log y)`` of targets ``y >= 0`` with a log link;
        ``predict`` then returns the mean ``exp(z)``.
    t : float, default 0.0
        Sample-level tilt.
    tilts : tuple of float, optional
        Hierarchical tilting ``(t_group, t_sample)`` (one tilt per grouping level,
        outermost first, the sample tilt last) with the groups passed to
        ``fit(X, y, groups=...)``. Leave ``t`` at 0 when ``tilts`` is given.
    alpha : float, default 0.0
        Ridge strength: ``alpha/2 * ||w||^2`` is added to the tilted risk. The intercept is
        never penalised. At ``t = 0`` with the squared loss this is scikit-learn's
        ``Ridge(alpha=alpha * S / 2)`` with ``S`` the sum of the sample weights (``N``
        without weights), because ``Ridge`` sums the squared errors where TERM averages them.
    epsilon : float, default 1.35
        Huber threshold, in the units of ``y`` (not rescaled by a fitted scale as in
        :class:`sklearn.linear_model.HuberRegressor`).
    quantile : float, default 0.5
        The quantile ``q`` in ``(0, 1)`` of the pinball loss.
    fit_intercept : bool, default True
        Fit an unpenalised intercept (the coefficient of an appended column of ones).
    solver : {"lbfgs", "newton", "agd", "gd", "stochastic"}, default "lbfgs"
        A :func:`tiltlab.minimize` method. At ``t = 0`` with the squared loss the
        objective is quadratic, and ``"lbfgs"`` and ``"newton"`` (without
        ``solver_options`` or early stopping, on float64 data with at most 512
        coefficients, the intercept included, and at least as many rows) take one exact
        Newton step from zero instead: the normal equations, as
        :class:`sklearn.linear_model.Ridge` solves them, with the gradient at the solution
        checked against ``tol``
        (``result_.method`` is then ``"newton"`` and ``n_iter_`` 1). Where the gradient
        test fails, the solver goes on from there; where the Hessian is too
        ill-conditioned (collinear features without a ridge term), it runs from zero.
    tol : float, default 1e-6
        Relative gradient tolerance: stop when ``||grad|| <= tol * ||grad at 0||`` (the
        gradient at zero coefficients; for warm starts the larger of that and the gradient
        at the start). A tolerance finer than the data's floating-point type can resolve
        ends with the solver's status ``PRECISION`` ("converged to working precision", a
        success, no warning). Half-precision data (float16) are fitted in float32, as
        scikit-learn does.
    max_iter : int, default 1000
        Iteration budget of the solver.
    early_stopping : bool or "auto", default "auto"
        Hold out ``validation_fraction`` of the training rows, evaluate the tilted objective
        (same tilt, no penalty) on them after every iteration and return the best iterate,
        stopping after ``n_iter_no_change`` iterations without improvement: the validation
        protocol of the TERM paper's robust-regression experiments. The held-out rows may be
        as noisy as the training rows; the tilt makes their objective robust.
        ``"auto"`` (default): on for a tilted objective (some tilt non-zero) when the
        data have 1,000 rows or more; off below 1,000 rows and off for the untilted
        objective (every tilt 0: the convex empirical risk, minimised to ``tol`` on all
        the rows, so that ``TiltedRegressor(alpha=a)`` at ``t = 0`` is
        ``Ridge(alpha=a * N / 2)`` at any size). On the Drug Discovery data, minimising
        a negative tilt's objective to ``tol`` takes over 1,000 iterations and fits noise
        in the null directions of the rank-deficient design; early stopping takes tens.
        scikit-learn's ``HistGradientBoostingRegressor`` has the same switch on size
        (from 10,000 rows); its linear models have no default stopping rule beyond
        ``tol`` because they are convex (this objective is not for ``t < 0``).
    validation_fraction : float, default 0.1
    n_iter_no_change : int, default 10
    warm_start : bool, default False
        Start from the previous solution when refitting.
    random_state : int, RandomState or None, default None
        Seeds the validation split and the stochastic solver.
    solver_options : dict, optional
        Extra options for the solver (e.g. ``{"batch_size": 64}`` for ``"stochastic"``).
    robustness : {None, "kl", "cvar"}, default None
        A distributionally robust fit (:func:`tiltlab.minimize_dro`) instead of the tilted
        one: ``"kl"`` minimises the worst expected loss over the distributions within KL
        divergence ``radius`` of the (weighted) data, ``"cvar"`` the mean of the worst
        ``tail`` of the data (CVaR). Leave ``t`` at 0 and ``tilts`` unset; no early
        stopping. Grid searches can tune it with ``radius`` and ``tail``.
    radius : float, default 0.1
        The KL radius (``robustness="kl"``), ``>= 0``.
    tail : float, default 0.1
        The tail fraction in ``(0, 1]`` (``robustness="cvar"``; ``1`` is the mean).

    Attributes
    ----------
    coef_ : array of shape (n_features,)
    intercept_ : float (NumPy) or 0-d array (other array namespaces)
    n_iter_ : int
        Solver iterations.
    tilted_weights_ : array of shape (n_samples,)
        Tilted weights of the rows passed to ``fit`` at the solution (they sum to one): small
        for the suppressed samples when ``t < 0``, large for the magnified ones when ``t > 0``.
        With early stopping they cover the held-out rows too. Robust fits: the worst case.
    worst_case_weights_ : array of shape (n_samples,)
        Robust fits only: the worst-case distribution over the rows at the solution (for
        ``"kl"`` the tilted weights at the optimal tilt ``result_.t``).
    result_ : OptimizeResult
        The solver's result.
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    Notes
    -----
    With ``sklearn.set_config(array_api_dispatch=True)``, ``X`` (and ``y``) may be PyTorch,
    CuPy or other array-API arrays: the fit runs in their namespace and on their device, and
    the fitted arrays stay there. (scikit-learn's array-API mode also needs the environment
    variable ``SCIPY_ARRAY_API=1`` set before SciPy is imported.)

    The absolute loss has a kink, where no gradient test can certify convergence: its fits
    also stop once the objective falls by less than ``tol`` (relative) over 30 iterations
    (status ``VALUE_CONVERGED``; ``solver_options={"ftol": 0}`` turns this off), or when
    the line search stalls, without a ConvergenceWarning; a run that uses up ``max_iter``
    warns.

    Examples
    --------
    The TERM row of the paper's robust-regression table: 40% of the training targets replaced
    by N(5, 5) draws, t = -2, early stopping on a noisy validation split (here on a 2000-row
    subset; see the README for the full protocol).

    >>> import numpy as np
    >>> from tiltlab.datasets import load_drug_discovery
    >>> from tiltlab.estimators import TiltedRegressor
    >>> d = load_drug_discovery(seed=1, noise=0.4)
    >>> X, y = d.X_train[:2000, :-1], d.y_train[:2000]   # the last column is the intercept
    >>> term = TiltedRegressor(t=-2.0, early_stopping=True, random_state=0).fit(X, y)
    >>> from sklearn.linear_model import LinearRegression
    >>> ols = LinearRegression().fit(X, y)                 # plain least squares
    >>> def rmse(m):
    ...     return float(np.sqrt(np.mean((m.predict(d.X_test[:, :-1]) - d.y_test) ** 2)))
    >>> rmse(term) < 1.5 < 3.0 < rmse(ols)
    True
    >>> noisy = d.noisy_train[:2000]            # 40% of the rows, under 30% of the weight
    >>> float(term.tilted_weights_[noisy].sum()) < 0.3
    True
    """

    def __init__(
        self,
        loss: str = "squared",
        *,
        t: float = 0.0,
        tilts: Any = None,
        alpha: float = 0.0,
        epsilon: float = 1.35,
        quantile: float = 0.5,
        fit_intercept: bool = True,
        solver: str = "lbfgs",
        tol: float = 1e-6,
        max_iter: int = 1000,
        early_stopping: Any = "auto",
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        warm_start: bool = False,
        random_state: Any = None,
        solver_options: dict | None = None,
        robustness: Any = None,
        radius: float = 0.1,
        tail: float = 0.1,
    ):
        self.loss = loss
        self.t = t
        self.tilts = tilts
        self.alpha = alpha
        self.epsilon = epsilon
        self.quantile = quantile
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.random_state = random_state
        self.solver_options = solver_options
        self.robustness = robustness
        self.radius = radius
        self.tail = tail

    # ----------------------------------------------------------------------- fitting

    def _prepare(self, X: Any, y: Any, sample_weight: Any, groups: Any) -> FitData:
        self._check_params()
        loss = regression_loss(self.loss, self.epsilon, self.quantile)
        X, y = self._validate_Xy(X, y)
        xp = namespace(X)
        n = int(X.shape[0])
        spec = self._tilt_spec(groups, n, None)
        sw = check_sample_weight(sample_weight, n, X, xp)
        if y.dtype != X.dtype:
            y = xp.astype(y, X.dtype)
            # validate_data checked y before the cast; float32 X can overflow it
            check_finite(y, xp, name="y")
        data = FitData(
            features=X,
            xp=xp,
            sample_weight=sw,
            intercept=bool(self.fit_intercept),
            spec=spec,
            problems=[Problem(loss, y)],
        )
        return drop_zero_weight_rows(data)

    def _validate_Xy(self, X: Any, y: Any) -> tuple[Any, Any]:
        X, y = validate_data(self, X, y, dtype="numeric", y_numeric=True, multi_output=False)
        xp = namespace(X)
        return as_float_X(X, xp), as_float_X(follow_X(y, X, xp), xp)

    def fit(self, X: Any, y: Any, sample_weight: Any = None, groups: Any = None):
        """Fit the tilted linear model.

        Parameters
        ----------
        X : array of shape (n_samples, n_features)
        y : array of shape (n_samples,)
        sample_weight : array of shape (n_samples,), optional
            Prior weights ``p`` of the tilted risk (normalised; uniform by default).
        groups : array of shape (n_samples,) or (n_samples, n_levels), optional
            Group labels for hierarchical tilting (needs ``tilts``). In a meta-estimator
            route them with ``set_fit_request(groups=True)`` under
            ``sklearn.set_config(enable_metadata_routing=True)``.

        Returns
        -------
        self
        """
        data = self._prepare(X, y, sample_weight, groups)
        thetas, results = self._solve_all(data, data.spec, self._theta0(data), self._seed())
        self._set_fitted(data, thetas, results)
        self._warn_convergence(results, data.problems)
        return self

    def _set_fitted(self, data: FitData, thetas: list, results: list) -> None:
        self._set_coef(data, thetas)
        self.n_iter_ = int(max(r.nit for r in results))
        self.result_ = results[0] if len(results) == 1 else results
        self.tilted_weights_ = self._tilted_weights(data, data.spec, thetas)
        self._set_worst_case(data, results)

    def _set_coef(self, data: FitData, thetas: list) -> None:
        xp = data.xp
        self._thetas = thetas
        coef, b = split_theta(thetas[0], data.intercept, xp)
        self.coef_ = coef
        self.intercept_ = float(b) if is_numpy(xp) else b

    def predict(self, X: Any) -> Any:
        """Predictions ``X @ coef_ + intercept_`` (in the namespace of ``X``); for the
        Poisson loss the mean ``exp(X @ coef_ + intercept_)``."""
        self._check_fitted(X, "predict")
        X, xp = self._validate_X(X, reset=False)
        coef = self.coef_
        if coef.dtype != X.dtype:
            X = xp.astype(X, coef.dtype)
        z = X @ coef + self.intercept_
        return xp.exp(z) if self.loss == "poisson" else z

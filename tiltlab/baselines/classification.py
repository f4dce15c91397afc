"""Binary-classification baselines of the paper's HIV-1 table (linear models, host NumPy).

Labels are ``y`` in ``{0, 1}``, the design ``X`` is ``(n, d)`` (add a column of ones for an
intercept; none is added except by :func:`fit_linear_svm`, as in scikit-learn), and the
probability of class 1 is ``sigmoid(X @ w)``. Each ``fit_*`` returns the coefficients:

* :func:`fit_linear_svm` - the linear SVM (hinge loss, ``C = 1`` in the paper);
* :func:`fit_focal` - the focal loss of Lin et al. (2017), ``gamma = 2`` in the paper;
* :func:`fit_hrm` - human-aligned risk minimisation (Leqi, Prasad and Ravikumar, 2019):
  rank-dependent weights from a cumulative-prospect-theory weighting function;
* :func:`fit_robust_risk` - the variance-regularised robust risk of Namkoong and Duchi
  (2017), the worst expected loss over a chi-square ball around the empirical
  distribution (:func:`chi_square_worst_case`);
* :func:`fit_learn_reweight` - Ren et al.'s (2018) online reweighting towards a small
  clean validation set.

Smooth objectives are minimised with SciPy's L-BFGS-B from zero, and the rank- or
worst-case-weighted ones with their (sub)gradient ``sum_i p_i grad l_i`` (Danskin), as the
authors' scripts do with gradient descent.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.special

from ._linalg import _check_iterations

__all__ = [
    "chi_square_worst_case",
    "fit_focal",
    "fit_hrm",
    "fit_learn_reweight",
    "fit_linear_svm",
    "fit_robust_risk",
    "focal_loss",
    "hrm_weights",
]


def _binary(X, y) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.ndim != 1 or y.shape[0] != X.shape[0] or X.shape[0] == 0:
        raise ValueError(
            f"`X` must be 2-D (n, d) and `y` 1-D of length n, got {X.shape} and {y.shape}"
        )
    if not np.all(np.isin(y, (0.0, 1.0))):
        raise ValueError("`y` must hold labels 0 and 1")
    if not np.all(np.isfinite(X)):
        raise ValueError("`X` must be finite")
    return X, y


def _logistic_losses(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample logistic loss ``-y log s(z) - (1-y) log(1-s(z))``, stably."""
    return np.logaddexp(0.0, z) - y * z


def _lbfgs(fun, d: int, max_iter: int = 5000, start=None) -> np.ndarray:
    max_iter = _check_iterations(max_iter, "max_iter")
    x0 = np.zeros(d) if start is None else start
    res = scipy.optimize.minimize(
        fun, x0, jac=True, method="L-BFGS-B",
        options={"maxiter": max_iter, "gtol": 1e-9, "ftol": 1e-14},
    )  # fmt: skip
    return res.x


def _logistic_fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Unregularised logistic regression (the start of the rank- and worst-case-weighted
    fits: at zero every loss is log 2, where their weights are not differentiable)."""
    n = X.shape[0]

    def fun(w):
        z = X @ w
        return float(np.mean(_logistic_losses(z, y))), X.T @ (scipy.special.expit(z) - y) / n

    return _lbfgs(fun, X.shape[1])


# --------------------------------------------------------------------------- linear SVM


def fit_linear_svm(X, y, C: float = 1.0, *, tol: float = 1e-6, max_iter: int = 20000):
    """Linear SVM with the hinge loss, as scikit-learn's ``LinearSVC(loss="hinge")``.

    Minimises ``||v||^2 / 2 + C sum_i max(0, 1 - s_i v' [x_i, 1])`` with ``s_i = 2 y_i - 1``
    over ``v = (w, b)``: the intercept is a weight on a constant feature 1 and is
    penalised too (LIBLINEAR's ``intercept_scaling = 1``, scikit-learn's default). Solved
    through its dual, ``min_a ||sum_i a_i s_i [x_i, 1]||^2 / 2 - sum_i a_i`` over the box
    ``0 <= a_i <= C`` (a smooth problem with bounds), with L-BFGS-B.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features (the intercept is fitted separately).
    y : array_like, shape (n,)
        Binary labels 0 and 1.
    C : float, default 1.0
        Inverse regularisation strength (weight of the hinge losses).
    tol : float, default 1e-6
        Gradient tolerance of L-BFGS-B on the dual.
    max_iter : int, default 20000
        Maximum number of L-BFGS-B iterations.

    Returns
    -------
    w : ndarray, shape (d,)
        The weights.
    b : float
        Predict class 1 where ``X @ w + b > 0``.

    Raises
    ------
    ValueError
        If `C` is not positive, or `X`, `y` are malformed.

    See Also
    --------
    fit_focal, fit_hrm, fit_robust_risk, fit_learn_reweight

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import fit_linear_svm
    >>> X = np.array([[0.0], [1.0], [3.0], [4.0]])
    >>> w, b = fit_linear_svm(X, np.array([0, 0, 1, 1]), C=10.0)
    >>> [round(float(v), 6) for v in (w[0], b)]  # the maximum-margin rule x > 2
    [1.0, -2.0]
    """
    X, y = _binary(X, y)
    if not C > 0:
        raise ValueError(f"`C` must be positive, got {C!r}")
    max_iter = _check_iterations(max_iter, "max_iter")
    s = 2.0 * y - 1.0
    Z = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1) * s[:, None]

    def dual(a):
        v = Z.T @ a
        return 0.5 * float(v @ v) - float(a.sum()), Z @ v - 1.0

    res = scipy.optimize.minimize(
        dual, np.zeros(X.shape[0]), jac=True, method="L-BFGS-B",
        bounds=[(0.0, C)] * X.shape[0],
        options={"maxiter": max_iter, "gtol": tol, "ftol": tol * 1e-6, "maxcor": 30},
    )  # fmt: skip
    v = Z.T @ res.x
    return v[:-1], float(v[-1])


# --------------------------------------------------------------------------- focal loss


def focal_loss(z, y, gamma: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample binary focal loss and its derivative in the logit ``z``.

    ``FL = -(1 - p_t)^gamma log p_t`` with ``p_t = sigmoid(z)`` for ``y = 1`` and
    ``1 - sigmoid(z)`` for ``y = 0`` (Lin et al., 2017, without the class weight
    ``alpha``, as in the TERM authors' script); ``gamma = 0`` is the logistic loss.

    Parameters
    ----------
    z : array_like
        Logits.
    y : array_like
        Binary labels 0 and 1, broadcastable with `z`.
    gamma : float, default 2.0
        Focusing parameter (non-negative).

    Returns
    -------
    value : numpy.ndarray
        The focal loss of each sample (float64).
    slope : numpy.ndarray
        Its derivative with respect to `z`.

    Raises
    ------
    ValueError
        If `y` holds other labels than 0 and 1, or `gamma` is negative.

    See Also
    --------
    fit_focal : The linear model that minimises the mean of this loss.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import focal_loss
    >>> value, slope = focal_loss(np.array([0.0]), np.array([1.0]), gamma=2.0)
    >>> value.round(6), slope.round(6)  # (1/2)^2 log 2, and its derivative
    (array([0.173287]), array([-0.298287]))
    """
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if not np.all(np.isin(y, (0.0, 1.0))):
        raise ValueError("`y` must hold labels 0 and 1")
    if not gamma >= 0:
        raise ValueError(f"`gamma` must be non-negative, got {gamma!r}")
    m = np.where(y == 1.0, z, -z)  # p_t = sigmoid(m)
    log_pt = -np.logaddexp(0.0, -m)
    pt = np.exp(log_pt)
    q = scipy.special.expit(-m)  # 1 - p_t
    qg = q**gamma
    value = -qg * log_pt
    # d/dm [-(1-p)^g log p] with dp/dm = p (1-p): g (1-p)^g p log p - (1-p)^(g+1)
    dm = gamma * qg * pt * log_pt - qg * q
    return value, np.where(y == 1.0, dm, -dm)


def fit_focal(X, y, gamma: float = 2.0, *, max_iter: int = 5000) -> np.ndarray:
    """Linear model minimising the mean focal loss (:func:`focal_loss`) by L-BFGS-B.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features (include a column of ones for an intercept; none is added).
    y : array_like, shape (n,)
        Binary labels 0 and 1.
    gamma : float, default 2.0
        Focusing parameter (``0`` is logistic regression).
    max_iter : int, default 5000
        Maximum number of L-BFGS-B iterations.

    Returns
    -------
    numpy.ndarray, shape (d,)
        The coefficients of the linear logit ``X @ w`` (float64).

    Raises
    ------
    ValueError
        If `gamma` is negative, or `X`, `y` are malformed.

    See Also
    --------
    focal_loss : The per-sample loss.
    fit_hrm, fit_robust_risk, fit_learn_reweight, fit_linear_svm

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import fit_focal
    >>> X = np.array([[1.0, -2.0], [1.0, -1.0], [1.0, 1.0], [1.0, 2.0], [1.0, 0.5]])
    >>> w = fit_focal(X, np.array([0, 1, 0, 1, 1]))  # overlapping classes: a finite fit
    >>> bool(w[1] > 0)
    True
    """
    X, y = _binary(X, y)
    if not gamma >= 0:
        raise ValueError(f"`gamma` must be non-negative, got {gamma!r}")
    n = X.shape[0]

    def fun(w):
        v, dz = focal_loss(X @ w, y, gamma)
        return float(v.mean()), X.T @ dz / n

    return _lbfgs(fun, X.shape[1], max_iter)


# --------------------------------------------------------------------------- HRM


def _check_hrm_parameters(a: float, b: float) -> None:
    if not (np.isfinite(a) and np.isfinite(b)):
        raise ValueError(f"`a` and `b` must be finite, got {a!r} and {b!r}")


def hrm_weights(losses, a: float = 0.01, b: float = 0.0) -> np.ndarray:
    """Human-aligned risk weights ``w(F_i)`` of the losses (Leqi et al., 2019).

    ``F_i`` is the rank of loss ``i`` divided by ``n`` (``0 .. (n-1)/n``, ties in input
    order) and ``w(F) = 3 (1 - b) / (a^2 - a + 1) * (3 F^2 - 2 (a + 1) F + a) + 1``, the
    derivative of the inverse-S probability weighting of cumulative prospect theory
    (``a = 0.01``, ``b = 0`` in the TERM authors' script: the largest losses weigh about
    four, the middle ones about zero). ``b = 1`` gives equal weights (ERM).

    Parameters
    ----------
    losses : array_like, shape (n,)
        Per-sample losses; only their ranks matter.
    a : float, default 0.01
        Shape parameter of the probability weighting.
    b : float, default 0.0
        Mixing parameter (``1`` gives equal weights).

    Returns
    -------
    numpy.ndarray, shape (n,)
        The weight of each loss (float64).

    Raises
    ------
    ValueError
        If `losses`, `a` or `b` is not finite.

    See Also
    --------
    fit_hrm : The logistic model weighted this way.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import hrm_weights
    >>> hrm_weights(np.array([3.0, 1.0, 2.0]), a=0.0, b=0.0).round(4)
    array([1., 1., 0.])
    """
    losses = np.asarray(losses, dtype=np.float64)
    _check_hrm_parameters(a, b)
    if not np.all(np.isfinite(losses)):
        raise ValueError("`losses` must be finite (their ranks set the weights)")
    n = losses.size
    F = np.empty(n)
    F[np.argsort(losses, kind="stable")] = np.arange(n) / n
    return 3.0 * (1.0 - b) / (a * a - a + 1.0) * (3.0 * F * F - 2.0 * (a + 1.0) * F + a) + 1.0


def fit_hrm(X, y, a: float = 0.01, b: float = 0.0, *, max_iter: int = 2000) -> np.ndarray:
    """Logistic model minimising the human-aligned risk ``mean_i w(F_i) l_i``.

    The weights (:func:`hrm_weights`) depend on the ranks of the losses, which are locally
    constant in ``w``: the gradient is ``mean_i w(F_i) grad l_i``, and L-BFGS-B runs on
    that piecewise-smooth objective from the logistic-regression fit (the authors ran
    10,000 gradient steps of size 1 from zero).

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features (include a column of ones for an intercept; none is added).
    y : array_like, shape (n,)
        Binary labels 0 and 1.
    a, b : float
        Parameters of :func:`hrm_weights` (defaults 0.01 and 0).
    max_iter : int, default 2000
        Maximum number of L-BFGS-B iterations.

    Returns
    -------
    numpy.ndarray, shape (d,)
        The coefficients of the linear logit ``X @ w`` (float64).

    Raises
    ------
    ValueError
        If `y` does not hold labels 0 and 1 with one per row of `X`, or `X`, `a` or `b`
        is not finite.

    See Also
    --------
    hrm_weights : The rank-dependent weights.
    fit_focal, fit_robust_risk, fit_learn_reweight

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import fit_hrm
    >>> X = np.array([[1.0, -2.0], [1.0, -1.0], [1.0, 1.0], [1.0, 2.0]])
    >>> w = fit_hrm(X, np.array([0, 0, 1, 1]), max_iter=50)
    >>> bool(w[1] > 0)
    True
    """
    X, y = _binary(X, y)
    _check_hrm_parameters(a, b)
    n = X.shape[0]

    def fun(w):
        z = X @ w
        losses = _logistic_losses(z, y)
        p = hrm_weights(losses, a, b)
        return float(p @ losses) / n, X.T @ (p * (scipy.special.expit(z) - y)) / n

    return _lbfgs(fun, X.shape[1], max_iter, start=_logistic_fit(X, y))


# --------------------------------------------------------------------------- chi-square DRO


def chi_square_worst_case(losses, rho: float) -> np.ndarray:
    """The worst-case distribution of the chi-square ball around the uniform one.

    Maximises ``sum_i p_i l_i`` over ``p`` in the simplex with
    ``(1/n) sum_i (n p_i - 1)^2 / 2 <= rho`` (the ball of Namkoong and Duchi's
    variance-regularised robust risk, with radius ``rho`` written per sample as in the
    authors' code: the paper's ``rho / n``). The maximiser is
    ``p_i = max(l_i - eta, 0) / sum_j max(l_j - eta, 0)`` (KKT), with ``eta`` found by
    bisection so that the constraint is tight; the uniform distribution over the largest
    losses when even that is inside the ball.

    Parameters
    ----------
    losses : array_like, shape (n,)
        Finite per-sample losses.
    rho : float
        Radius of the ball, per sample (positive).

    Returns
    -------
    p : ndarray
        The weights; ``p @ losses`` is the robust risk.

    Raises
    ------
    ValueError
        If `losses` is not a non-empty 1-D array of finite numbers or `rho` is not positive.

    See Also
    --------
    fit_robust_risk : The logistic model minimising this worst case.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import chi_square_worst_case
    >>> p = chi_square_worst_case(np.array([0.0, 1.0, 2.0, 3.0]), rho=0.1)
    >>> p.round(4), bool(abs(0.5 * np.mean((4 * p - 1) ** 2) - 0.1) < 1e-9)
    (array([0.1, 0.2, 0.3, 0.4]), True)
    """
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 1 or losses.size == 0 or not np.all(np.isfinite(losses)):
        raise ValueError("`losses` must be a non-empty 1-D array of finite numbers")
    if not rho > 0:
        raise ValueError(f"`rho` must be positive, got {rho!r}")
    n = losses.size

    def weights(eta):
        e = np.maximum(losses - eta, 0.0)
        return e / e.sum()

    def excess(eta):  # divergence minus the radius; increasing in eta
        p = weights(eta)
        return 0.5 * np.mean((n * p - 1.0) ** 2) - rho

    top = losses.max()
    ties = losses >= top
    point = ties / ties.sum()
    if 0.5 * np.mean((n * point - 1.0) ** 2) <= rho:  # the whole simplex corner is inside
        return point
    spread = max(top - losses.min(), np.finfo(np.float64).tiny)
    lo = losses.min() - spread
    while excess(lo) > 0:  # far below the losses p is near uniform (divergence near 0)
        lo -= 10 * spread
    hi = losses[~ties].max()  # between it and the top, p is the point mass: outside
    eta = scipy.optimize.brentq(excess, lo, hi, xtol=1e-15 * max(1.0, abs(top)), rtol=1e-15)
    return weights(eta)


def fit_robust_risk(X, y, rho: float, *, max_iter: int = 2000) -> np.ndarray:
    """Logistic model minimising the chi-square robust risk ``max_p sum_i p_i l_i``.

    ``p`` ranges over the ball of :func:`chi_square_worst_case` (radius ``rho`` per
    sample, the paper's ``rho / n``); the risk is convex in ``w`` with gradient
    ``sum_i p*_i grad l_i`` at the maximiser ``p*`` (Danskin). Minimised by L-BFGS-B from
    the logistic-regression fit (at zero all losses tie and the risk is not smooth).

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features (include a column of ones for an intercept; none is added).
    y : array_like, shape (n,)
        Binary labels 0 and 1.
    rho : float
        Radius of the chi-square ball, per sample (positive).
    max_iter : int, default 2000
        Maximum number of L-BFGS-B iterations.

    Returns
    -------
    numpy.ndarray, shape (d,)
        The coefficients of the linear logit ``X @ w`` (float64).

    Raises
    ------
    ValueError
        If `rho` is not positive, or `X`, `y` are malformed.

    See Also
    --------
    chi_square_worst_case : The inner maximisation.
    fit_hrm, fit_focal, fit_learn_reweight

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import fit_robust_risk
    >>> X = np.array([[1.0, -2.0], [1.0, -1.0], [1.0, 1.0], [1.0, 2.0], [1.0, 0.5]])
    >>> w = fit_robust_risk(X, np.array([0, 0, 1, 1, 0]), rho=0.5)
    >>> bool(w[1] > 0)
    True
    """
    X, y = _binary(X, y)

    def fun(w):
        z = X @ w
        losses = _logistic_losses(z, y)
        p = chi_square_worst_case(losses, rho)
        return float(p @ losses), X.T @ (p * (scipy.special.expit(z) - y))

    return _lbfgs(fun, X.shape[1], max_iter, start=_logistic_fit(X, y))


# --------------------------------------------------------------------------- LearnReweight


def fit_learn_reweight(
    X,
    y,
    X_clean,
    y_clean,
    *,
    lr: float = 1.0,
    n_iter: int = 1000,
    meta_step: float | None = 1e-3,
) -> np.ndarray:
    """Ren et al.'s learning to reweight, for the logistic model, by gradient descent.

    At every step the training samples are reweighted towards the clean set: with
    ``g_i`` the loss gradient of sample ``i`` and ``g_c`` the gradient of the clean set's
    mean loss after a plain look-ahead step ``theta - lr * mean_j g_j``, lowering the
    clean loss favours samples with ``g_i . g_c > 0`` (for a linear model one meta-gradient
    step is exact). Ren, Zeng, Yang and Urtasun (2018) take ``w_i = max(g_i . g_c, 0)``
    normalised to sum one (``meta_step=None``; no step where no weight is positive); the
    TERM authors' script, whose numbers the paper reports, takes one meta step of size
    ``meta_step`` from uniform weights, ``w_i = max(1/n + meta_step * g_i . g_c, 0)``
    normalised (their 0.001, the default here). The model then steps
    ``theta <- theta - lr * sum_i w_i g_i``. The authors kept 10 samples of each class of
    the validation split as the clean set and ran 10,000 steps of size 0.1; the default
    here is 1,000 steps of size 1.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features (include a column of ones for an intercept; none is added).
    y : array_like, shape (n,)
        Binary labels 0 and 1.
    X_clean : array_like, shape (m, d)
        Features of the small trusted (clean) set.
    y_clean : array_like, shape (m,)
        Its labels 0 and 1.
    lr : float, default 1.0
        Step size of the model update.
    n_iter : int, default 1000
        Number of gradient steps.
    meta_step : float or None, default 1e-3
        Size of the meta step from uniform weights; None for Ren et al.'s normalised
        clipped inner products.

    Returns
    -------
    numpy.ndarray, shape (d,)
        The coefficients of the linear logit ``X @ w`` (float64).

    Raises
    ------
    ValueError
        If `X_clean` does not have the columns of `X`, `meta_step` or `lr` is not positive,
        `n_iter` is negative, or the labels are malformed.

    See Also
    --------
    fit_focal, fit_hrm, fit_robust_risk

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.baselines import fit_learn_reweight
    >>> X = np.array([[1.0, -2.0], [1.0, -1.0], [1.0, 1.0], [1.0, 2.0], [1.0, 1.5]])
    >>> y = np.array([0, 0, 1, 1, 0])  # the last label is wrong
    >>> w = fit_learn_reweight(X, y, X[:4], y[:4], n_iter=200, meta_step=None)
    >>> bool((X[4] @ w) > 0)  # the mislabelled point is overruled
    True
    """
    X, y = _binary(X, y)
    Xc, yc = _binary(X_clean, y_clean)
    if Xc.shape[1] != X.shape[1]:
        raise ValueError("`X_clean` must have the columns of `X`")
    if meta_step is not None and not meta_step > 0:
        raise ValueError(f"`meta_step` must be positive or None, got {meta_step!r}")
    if not (lr > 0 and np.isfinite(lr)):
        raise ValueError(f"`lr` must be a positive finite number, got {lr!r}")
    if isinstance(n_iter, bool) or int(n_iter) != n_iter or n_iter < 0:
        raise ValueError(f"`n_iter` must be a non-negative integer, got {n_iter!r}")
    n = X.shape[0]
    theta = np.zeros(X.shape[1])
    for _ in range(int(n_iter)):
        r = scipy.special.expit(X @ theta) - y  # g_i = r_i x_i
        ahead = theta - lr * (X.T @ r) / n
        g_clean = Xc.T @ (scipy.special.expit(Xc @ ahead) - yc) / Xc.shape[0]
        align = r * (X @ g_clean)  # g_i . g_c
        if meta_step is None:
            w = np.maximum(align, 0.0)
        else:
            w = np.maximum(1.0 / n + meta_step * align, 0.0)
        total = w.sum()
        if total <= 0:
            continue
        theta = theta - lr * (X.T @ (w * r)) / total
    return theta

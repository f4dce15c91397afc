"""Small seeded toy problems in the spirit of the TERM paper's introductory figure.

Three generators, each returning NumPy ``float64`` arrays (and boolean masks) of a few
dozen to a few hundred rows:

* :func:`~tiltlab.datasets.point_estimation_2d` - 2-D points around (1, 1) plus a cluster
  of outliers; a point estimate ``theta`` has per-sample loss ``||x_i - theta||^2``
  (see :func:`~tiltlab.datasets.point_estimation_losses`). ERM (t = 0) gives the sample
  mean, negative tilts move towards the inliers, positive tilts towards the minimax
  (smallest enclosing ball) centre.
* :func:`~tiltlab.datasets.linear_regression_outliers` - a line with a block of gross
  outliers; design matrix ``[x, 1]`` for the squared loss.
* :func:`~tiltlab.datasets.logistic_imbalanced` - two Gaussian classes in 2-D, one rare;
  design matrix ``[x1, x2, 1]`` for the logistic loss with labels in {0, 1}.

All use ``np.random.default_rng(seed)``, so the same ``seed`` gives the same data.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "point_estimation_objective",
    "linear_regression_outliers",
    "logistic_imbalanced",
    "point_estimation_2d",
    "point_estimation_losses",
]


def _check_count(n, name: str, minimum: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"`{name}` must be an integer, got {type(n).__name__}")
    if n < minimum:
        raise ValueError(f"`{name}` must be at least {minimum}, got {n}")
    return int(n)


def _check_unit(value, name: str, *, open_right: bool = False) -> float:
    value = float(value)
    upper_ok = value < 1.0 if open_right else value <= 1.0
    if not (0.0 <= value and upper_ok):
        bracket = ")" if open_right else "]"
        raise ValueError(f"`{name}` must lie in [0, 1{bracket}, got {value!r}")
    return value


def point_estimation_2d(
    n: int = 100,
    outlier_fraction: float = 0.2,
    *,
    seed: int = 0,
    center=(1.0, 1.0),
    spread: float = 0.5,
    outlier_center=(4.0, 4.0),
    outlier_spread: float = 0.5,
):
    """2-D samples around ``center`` with a cluster of outliers.

    ``round(outlier_fraction * n)`` points are drawn from an isotropic Gaussian at
    ``outlier_center`` and the rest from one at ``center``; rows come in random order.

    Parameters
    ----------
    n : int, default 100
        Number of points.
    outlier_fraction : float in [0, 1), default 0.2
        Share of outliers.
    seed : int, default 0
        Seed for ``np.random.default_rng``.
    center, outlier_center : pair of float
        Means of the inlier and outlier clusters.
    spread, outlier_spread : float
        Standard deviations (per coordinate) of the two clusters.

    Returns
    -------
    points : ndarray, shape (n, 2), float64
        The inliers and outliers, in random order.
    inlier : ndarray, shape (n,), bool
        True for points drawn around ``center``.

    See Also
    --------
    point_estimation_objective : The toy as an objective.

    Examples
    --------
    >>> from tiltlab.datasets import point_estimation_2d, point_estimation_losses
    >>> points, inlier = point_estimation_2d(n=50, outlier_fraction=0.2, seed=0)
    >>> points.shape, int((~inlier).sum())
    ((50, 2), 10)
    >>> point_estimation_losses(points, points.mean(axis=0)).shape
    (50,)
    """
    n = _check_count(n, "n")
    outlier_fraction = _check_unit(outlier_fraction, "outlier_fraction", open_right=True)
    if spread < 0 or outlier_spread < 0:
        raise ValueError("`spread` and `outlier_spread` must be non-negative")
    rng = np.random.default_rng(seed)
    n_out = int(round(outlier_fraction * n))
    inliers = np.asarray(center, dtype=np.float64) + spread * rng.standard_normal((n - n_out, 2))
    outliers = np.asarray(outlier_center, dtype=np.float64) + outlier_spread * rng.standard_normal(
        (n_out, 2)
    )
    points = np.concatenate([inliers, outliers], axis=0)
    inlier = np.arange(n) < n - n_out
    order = rng.permutation(n)
    return points[order], inlier[order]


def point_estimation_losses(points, theta):
    """Per-sample losses ``||x_i - theta||^2`` of a point estimate (NumPy, host side).

    Parameters
    ----------
    points : array_like, shape (n, d)
        The points.
    theta : array_like, shape (d,)
        The point estimate.

    Returns
    -------
    ndarray, shape (n,)
        Squared Euclidean distances. The gradient of sample i in ``theta`` is
        ``2 * (theta - x_i)``.

    See Also
    --------
    point_estimation_2d, point_estimation_objective

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.datasets import point_estimation_losses
    >>> point_estimation_losses(np.array([[0.0, 0.0], [3.0, 4.0]]), np.zeros(2))
    array([ 0., 25.])
    """
    points = np.asarray(points, dtype=np.float64)
    theta = np.asarray(theta, dtype=np.float64)
    if points.ndim != 2 or theta.shape != (points.shape[1],):
        raise ValueError(
            f"`points` must have shape (n, d) and `theta` shape (d,), got {points.shape} "
            f"and {theta.shape}"
        )
    diff = points - theta
    return np.einsum("ij,ij->i", diff, diff)


def point_estimation_objective(points, *, t: float = 0.0, l2: float = 0.0):
    """The point-estimation toy as a :class:`~tiltlab.TiltedObjective`.

    Per-sample loss ``||x_i - theta||^2`` (:class:`~tiltlab.losses.PointEstimationLoss`) on
    the rows of ``points``, which may be an array of any supported backend.

    Parameters
    ----------
    points : array of shape (n_samples, d)
        The points (for instance from :func:`~tiltlab.datasets.point_estimation_2d`).
    t : float, default 0.0
        The tilt.
    l2 : float, default 0.0
        Ridge strength.

    Returns
    -------
    TiltedObjective
        Its parameter is the point estimate ``theta`` of shape ``(d,)``.

    See Also
    --------
    point_estimation_2d : The paper's data for this toy.
    point_estimation_losses : The per-sample losses at a given ``theta``.

    Examples
    --------
    >>> import tiltlab as tl
    >>> from tiltlab.datasets import point_estimation_2d, point_estimation_objective
    >>> points, _ = point_estimation_2d(n=40, seed=0)
    >>> obj = point_estimation_objective(points, t=-2.0)
    >>> tl.minimize(obj, points.mean(axis=0), method="newton").success
    True
    """
    from ..losses import PointEstimationLoss
    from ..objective import TiltedObjective

    return TiltedObjective(PointEstimationLoss(), X=points, t=t, l2=l2)


def linear_regression_outliers(
    n: int = 100,
    outlier_fraction: float = 0.2,
    *,
    seed: int = 0,
    slope: float = 2.0,
    intercept: float = 1.0,
    noise_std: float = 0.3,
    outlier_shift: float = -6.0,
    outlier_std: float = 0.5,
):
    """1-D linear regression data with a block of gross outliers.

    Features ``x ~ Uniform(0, 2)``; inliers have ``y = slope * x + intercept + e`` with
    ``e ~ N(0, noise_std^2)``; outliers sit ``outlier_shift`` below (or above) the line,
    ``y = slope * x + intercept + outlier_shift + N(0, outlier_std^2)``, and are the points
    with the largest ``x`` (a structured group that tilts the least-squares line).

    Parameters
    ----------
    n : int, default 100
        Number of samples.
    outlier_fraction : float in [0, 1), default 0.2
        Share of outliers (``round(outlier_fraction * n)`` rows).
    seed : int, default 0
        Seed for ``np.random.default_rng``.
    slope, intercept : float
        True coefficients; the clean fit is ``w = [slope, intercept]``.
    noise_std, outlier_shift, outlier_std : float
        Inlier noise, outlier offset from the line, outlier spread.

    Returns
    -------
    X : ndarray, shape (n, 2), float64
        Columns ``[x, 1]`` (feature, intercept).
    y : ndarray, shape (n,), float64
        The targets.
    inlier : ndarray, shape (n,), bool
        True for the rows on the line (up to the inlier noise).

    See Also
    --------
    logistic_imbalanced : The paper's classification toy.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.datasets import linear_regression_outliers
    >>> X, y, inlier = linear_regression_outliers(n=60, seed=1)
    >>> X.shape, y.shape, bool(np.all(X[:, 1] == 1.0))
    ((60, 2), (60,), True)
    """
    n = _check_count(n, "n", minimum=2)
    outlier_fraction = _check_unit(outlier_fraction, "outlier_fraction", open_right=True)
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0.0, 2.0, n))
    n_out = int(round(outlier_fraction * n))
    inlier = np.arange(n) < n - n_out
    y = slope * x + intercept + noise_std * rng.standard_normal(n)
    y[~inlier] = (
        slope * x[~inlier] + intercept + outlier_shift + outlier_std * rng.standard_normal(n_out)
    )
    X = np.stack([x, np.ones(n)], axis=1)
    order = rng.permutation(n)
    return X[order], y[order], inlier[order]


def logistic_imbalanced(
    n: int = 200,
    rare_fraction: float = 0.1,
    *,
    seed: int = 0,
    common_center=(0.0, 0.0),
    rare_center=(2.5, 2.5),
    spread: float = 1.0,
):
    """Two-class 2-D data with a rare class, for (tilted) logistic regression.

    ``round(rare_fraction * n)`` points of class 1 (rare) around ``rare_center`` and the
    rest of class 0 (common) around ``common_center``, both isotropic Gaussians with
    standard deviation ``spread``; the classes overlap a little so that ERM misclassifies
    part of the rare class.

    Parameters
    ----------
    n : int, default 200
        Number of samples.
    rare_fraction : float in (0, 1), default 0.1
        Share of the rare class (label 1); 0.1 is an imbalance of 1:9.
    seed : int, default 0
        Seed for ``np.random.default_rng``.
    common_center, rare_center : pair of float
        Class means.
    spread : float
        Per-coordinate standard deviation of both classes.

    Returns
    -------
    X : ndarray, shape (n, 3), float64
        Columns ``[x1, x2, 1]`` (two features, intercept).
    y : ndarray, shape (n,), float64
        Labels in ``{0.0, 1.0}``; 1 is the rare class.

    See Also
    --------
    linear_regression_outliers : The paper's regression toy.

    Examples
    --------
    >>> from tiltlab.datasets import logistic_imbalanced
    >>> X, y = logistic_imbalanced(n=100, rare_fraction=0.1, seed=0)
    >>> X.shape, int(y.sum())
    ((100, 3), 10)
    """
    n = _check_count(n, "n", minimum=2)
    rare_fraction = float(rare_fraction)
    if not 0.0 < rare_fraction < 1.0:
        raise ValueError(f"`rare_fraction` must lie in (0, 1), got {rare_fraction!r}")
    rng = np.random.default_rng(seed)
    n_rare = min(max(int(round(rare_fraction * n)), 1), n - 1)
    labels = (np.arange(n) >= n - n_rare).astype(np.float64)
    centers = np.where(
        labels[:, None] == 1.0,
        np.asarray(rare_center, dtype=np.float64),
        np.asarray(common_center, dtype=np.float64),
    )
    features = centers + spread * rng.standard_normal((n, 2))
    X = np.concatenate([features, np.ones((n, 1))], axis=1)
    order = rng.permutation(n)
    return X[order], labels[order]

"""Held-out scores for choosing the tilt that stay honest when most targets are corrupted.

The default regression score of :class:`TiltedRegressorCV` is a held-out log-likelihood
under a *contaminated* model of the targets: a share ``1 - eps`` of them is the fit's
prediction plus Gaussian noise ``N(0, sigma^2)``, the rest comes from a broad outlier
density that does not depend on the fit (the Gaussian with the held-out targets' own mean
and variance). ``eps`` and ``sigma`` are fitted per tilt by EM, so the score adapts to any
corruption level: on clean data ``eps`` goes to zero and the score ranks fits by their
held-out mean squared error (as the plain held-out loss does); when most targets are
corrupted the outliers are explained by the broad density whatever the fit, and the score
rewards the fit under which the remaining rows cluster tightly around the predictions.
Scores that summarise the losses directly (mean, median, a trimmed mean) break down once
corrupted rows are the majority, because the fit closest to the corrupted targets then
also has the smallest typical loss.

A Gaussian core also flags the tail of skewed or heavy-tailed *clean* noise (15-35% of
the rows for log-normal noise). :func:`follows_predictions` tells the two apart: the
targets of corrupted rows ignore the predictions, those in a noise tail move with them.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "contaminated_fit",
    "contaminated_log_likelihood",
    "follows_predictions",
    "gaussian_logpdf_of_targets",
]

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def _normal_logpdf(r: np.ndarray, scale: float) -> np.ndarray:
    return -0.5 * (r / scale) ** 2 - np.log(scale) - _LOG_SQRT_2PI


def contaminated_fit(
    residuals: np.ndarray, outlier_logpdf: np.ndarray, *, max_iter: int = 200
) -> tuple[float, np.ndarray]:
    """Fit the contaminated Gaussian model to held-out residuals by EM.

    Parameters
    ----------
    residuals : ndarray of shape (n,)
        ``y - prediction`` on the held-out rows (host float64).
    outlier_logpdf : ndarray of shape (n,)
        Log-density of each held-out target under the outlier model (the same for every
        fit that is compared).
    max_iter : int
        EM iterations (from two starting points; the better likelihood is kept).

    Returns
    -------
    log_likelihood : float
        ``mean_i log((1 - eps) N(r_i; 0, sigma^2) + eps g(y_i))`` at the fitted
        ``eps`` and ``sigma``.
    clean : ndarray of shape (n,)
        Posterior probability of each row being clean (not an outlier).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y = np.r_[rng.normal(0, 1, 200), rng.normal(5, 5, 800)]    # 80% outliers
    >>> g = -0.5 * ((y - y.mean()) / y.std()) ** 2 - np.log(y.std() * np.sqrt(2 * np.pi))
    >>> good, clean = contaminated_fit(y - 0.0, g)   # the fit that predicts the clean rows
    >>> bad, _ = contaminated_fit(y - y.mean(), g)   # the fit that chases the outliers
    >>> bool(good > bad), round(float(clean[:200].mean() - clean[200:].mean()), 1)
    (True, 0.4)
    """
    r = np.asarray(residuals, dtype=np.float64).reshape(-1)
    g = np.asarray(outlier_logpdf, dtype=np.float64).reshape(-1)
    a = np.abs(r)
    spread = float(np.sqrt(np.mean(r * r)))
    if not np.isfinite(spread):
        return float("-inf"), np.zeros_like(r)
    if spread == 0.0:
        return float("inf"), np.ones_like(r)
    floor = 1e-6 * spread
    best: tuple[float, np.ndarray] = (-np.inf, np.ones_like(r))
    # two starts: a tight core (most rows corrupted) and the robust scale of all residuals
    for q in (0.1, 0.5):
        sigma = max(float(np.quantile(a, q)) / _half_normal_quantile(q), floor)
        eps = 0.5
        for _ in range(max_iter):
            resp = _clean_posterior(r, g, eps, sigma)
            mass = float(resp.sum())
            if mass <= 0.0:
                break
            new_eps = min(max(1.0 - mass / r.size, 1e-12), 1.0 - 1e-12)
            new_sigma = max(float(np.sqrt(np.sum(resp * r * r) / mass)), floor)
            done = abs(new_sigma - sigma) <= 1e-9 * sigma and abs(new_eps - eps) <= 1e-9
            eps, sigma = new_eps, new_sigma
            if done:
                break
        lc = np.log1p(-eps) + _normal_logpdf(r, sigma)
        lo = np.log(eps) + g
        value = float(np.mean(np.logaddexp(lc, lo)))
        if value > best[0]:
            best = (value, np.exp(lc - np.logaddexp(lc, lo)))
    return best


def _clean_posterior(r: np.ndarray, g: np.ndarray, eps: float, sigma: float) -> np.ndarray:
    lc = np.log1p(-eps) + _normal_logpdf(r, sigma)
    lo = np.log(eps) + g
    return np.exp(lc - np.logaddexp(lc, lo))


def contaminated_log_likelihood(
    residuals: np.ndarray, outlier_logpdf: np.ndarray, *, max_iter: int = 200
) -> float:
    """The mean log-likelihood of :func:`contaminated_fit` alone.

    Examples
    --------
    >>> import numpy as np
    >>> r = np.random.default_rng(0).normal(size=500)
    >>> round(contaminated_log_likelihood(r, np.full(500, -10.0)), 1)   # ~ N(0, 1)
    -1.4
    """
    return contaminated_fit(residuals, outlier_logpdf, max_iter=max_iter)[0]


def _half_normal_quantile(q: float) -> float:
    from scipy.special import ndtri

    return float(ndtri(0.5 + 0.5 * q))


def gaussian_logpdf_of_targets(y: np.ndarray) -> np.ndarray:
    """Log-density of each target under the Gaussian of the targets' mean and variance."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    s = float(np.std(y))
    if not s > 0:
        s = 1.0
    return _normal_logpdf(y - float(np.mean(y)), s)


def follows_predictions(y: np.ndarray, pred: np.ndarray, weight: np.ndarray) -> float:
    """How much better the predictions explain the flagged targets than their mean does.

    The contaminated model takes its outliers from a density that does not depend on the
    fit. Rows in the tail of skewed or heavy-tailed *clean* noise are flagged as well, but
    their targets still move with the predictions. With ``w`` the rows' probability of
    being flagged, this returns ``sum w (y - ybar)^2 - sum w (r - rbar)^2`` (weighted
    means, ``r = y - pred``): positive when the flagged targets follow the predictions
    (slope 1 explains them better than slope 0, the Gaussian likelihood ratio of the two
    at a common scale), negative when they ignore them, as corrupted targets do. Sums over
    folds add.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> pred = rng.normal(0, 2, 1000)
    >>> w = np.ones(1000)
    >>> follows_predictions(pred + rng.exponential(3, 1000), pred, w) > 0   # skewed noise
    True
    >>> follows_predictions(rng.normal(5, 5, 1000), pred, w) > 0           # replaced targets
    False
    """
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    w = np.asarray(weight, dtype=np.float64).reshape(-1)
    r = y - np.asarray(pred, dtype=np.float64).reshape(-1)
    mass = float(w.sum())
    if not mass > 0:
        return 0.0
    dy = y - float(np.sum(w * y)) / mass
    dr = r - float(np.sum(w * r)) / mass
    return float(np.sum(w * (dy * dy - dr * dr)))

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
    "slope_and_error",
    "slope_sums",
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


def slope_sums(y: np.ndarray, pred: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Weighted sums of one fold for :func:`follows_predictions` (sums over folds add).

    With ``w`` the rows' probability of being flagged and weighted centring
    (``dy = y - ybar``, ``dp = pred - pbar``), returns
    ``[sum w dy dp, sum w dp^2, sum w dy^2, sum w, sum w^2, sum w^2 dp^2]``.

    Examples
    --------
    >>> import numpy as np
    >>> slope_sums(np.array([1.0, 3.0]), np.array([0.0, 1.0]), np.ones(2)).tolist()
    [1.0, 0.5, 2.0, 2.0, 2.0, 0.5]
    """
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    p = np.asarray(pred, dtype=np.float64).reshape(-1)
    w = np.asarray(weight, dtype=np.float64).reshape(-1)
    mass = float(w.sum())
    if not mass > 0:
        return np.zeros(6)
    dy = y - float(np.sum(w * y)) / mass
    dp = p - float(np.sum(w * p)) / mass
    wdp = w * dp
    return np.array(
        [
            np.sum(wdp * dy),
            np.sum(wdp * dp),
            np.sum(w * dy * dy),
            mass,
            np.sum(w * w),
            np.sum(wdp * wdp),
        ]
    )


def slope_and_error(sums: np.ndarray) -> tuple[float, float]:
    """The weighted slope of the targets on the predictions and its standard error.

    From pooled :func:`slope_sums`: ``b = sum w dy dp / sum w dp^2`` and
    ``se^2 = s^2 sum w^2 dp^2 / (sum w dp^2)^2`` (the least-squares slope's variance for
    fixed weights), ``s^2`` the weighted mean squared residual ``sum w (dy - b dp)^2 /
    sum w`` scaled by ``n_eff / (n_eff - 2)``, ``n_eff = (sum w)^2 / sum w^2`` rows. NaN
    where the sums cannot define them (no weight, constant predictions, ``n_eff <= 2``).

    Examples
    --------
    >>> import numpy as np
    >>> p = np.arange(5.0)
    >>> b, se = slope_and_error(slope_sums(2 * p + 1, p, np.ones(5)))
    >>> float(b), float(se)
    (2.0, 0.0)
    """
    s_yp, s_pp, s_yy, mass, mass2, s_wpp = (float(v) for v in np.asarray(sums, np.float64))
    if not (mass > 0 and s_pp > 0 and mass2 > 0):
        return float("nan"), float("nan")
    b = s_yp / s_pp
    n_eff = mass * mass / mass2
    if not n_eff > 2:
        return b, float("nan")
    resid = max(s_yy - b * s_yp, 0.0)  # sum w (dy - b dp)^2
    s2 = resid / mass * n_eff / (n_eff - 2)
    return b, float(np.sqrt(s2 * s_wpp) / s_pp)


#: how many standard errors the flagged targets' slope on the predictions must lie above
#: 1/2 (the midpoint of "ignores them", 0, and "follows them", 1) for the flagged rows to
#: count as clean
FOLLOW_Z = 1.0


def follows_predictions(sums: np.ndarray, z: float = FOLLOW_Z) -> bool:
    """Whether the flagged targets follow the predictions, from pooled :func:`slope_sums`.

    The contaminated model takes its outliers from a density that does not depend on the
    fit. Rows in the tail of skewed or heavy-tailed *clean* noise are flagged as well, but
    their targets still move with the predictions (slope 1), where corrupted targets ignore
    them (slope 0). The weighted slope ``b`` of the flagged targets on the predictions
    decides: they follow when ``b - 1/2 > z * se(b)``, with ``se(b)`` the standard error
    of the weighted least-squares slope for fixed weights,
    ``se^2 = s^2 sum w^2 dp^2 / (sum w dp^2)^2``, ``s^2`` the weighted mean squared
    residual with ``n_eff = (sum w)^2 / sum w^2`` rows less two degrees of freedom. The
    standard
    error keeps a few flagged rows from passing as clean by chance (with 30 corrupted
    rows of spread 5 against predictions of spread 2, ``b`` has a standard error of about
    0.4): taking corrupted rows for clean noise scores every tilt by its plain mean loss,
    which picks the untilted fit, a far worse error than the converse.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> pred = rng.normal(0, 2, 1000)
    >>> w = np.ones(1000)
    >>> follows_predictions(slope_sums(pred + rng.exponential(3, 1000), pred, w))  # skewed
    True
    >>> follows_predictions(slope_sums(rng.normal(5, 5, 1000), pred, w))  # replaced targets
    False
    """
    b, se = slope_and_error(sums)
    if not (np.isfinite(b) and np.isfinite(se)):
        return False
    return bool(b - 0.5 > z * se)

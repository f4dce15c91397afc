"""Robust-regression baselines of the TERM paper's robust-regression table.

Reference methods that the paper compares tilted least squares against: ordinary least
squares (ERM), least absolute deviations (L1), the Huber loss, Consistent Robust
Regression (CRR) and STIR, plus the oracle "Genie ERM". Each ``fit_*`` function takes a
design matrix ``X`` of shape ``(n, d)`` (include a column of ones for an intercept; none is
added) and targets ``y`` of shape ``(n,)``, and returns the coefficient vector ``w`` of
shape ``(d,)``; predictions are ``X @ w``.

These are **host-side reference implementations** written with NumPy, SciPy (LAPACK
least squares, HiGHS linear programming, L-BFGS-B); they accept anything
``numpy.asarray`` converts and always compute in float64. They do not follow the
array-API conventions of the rest of tiltlab, and are meant for comparison tables and
tests, not as GPU solvers.

Rank-deficient designs (the Drug Discovery design has rank 409 with 411 columns, its
training splits about 407) make every minimiser non-unique along the null space of ``X``.
All functions return coefficients in the row space of ``X`` (no null-space component,
which would not change ``X @ w`` on the training rows): for least squares, CRR and STIR
that is the minimum-norm solution. L1 and Huber can have further flat directions inside
the row space; they return the minimiser their solver reaches.

Examples
--------
>>> import numpy as np
>>> from tiltlab.baselines import fit_least_squares, fit_crr, rmse
>>> rng = np.random.default_rng(0)
>>> X = np.column_stack([rng.standard_normal((200, 3)), np.ones(200)])
>>> w_true = np.array([1.0, -2.0, 0.5, 3.0])
>>> y = X @ w_true
>>> y[:30] += 20.0  # 15% gross corruptions
>>> bool(np.abs(fit_crr(X, y, k=40) - w_true).max() < 1e-8)
True
>>> bool(rmse(X[30:], y[30:], fit_least_squares(X, y)) > 1.0)
True
"""

from .classification import (
    chi_square_worst_case,
    fit_focal,
    fit_hrm,
    fit_learn_reweight,
    fit_linear_svm,
    fit_robust_risk,
    focal_loss,
    hrm_weights,
)
from .corruption import fit_crr, fit_stir
from .fair_pca import FairPCASDPResult, fair_pca_sdp
from .regression import fit_genie, fit_huber, fit_l1, fit_least_squares, huber_loss, rmse

__all__ = [
    "FairPCASDPResult",
    "chi_square_worst_case",
    "fair_pca_sdp",
    "fit_focal",
    "fit_hrm",
    "fit_learn_reweight",
    "fit_linear_svm",
    "fit_robust_risk",
    "focal_loss",
    "hrm_weights",
    "fit_crr",
    "fit_genie",
    "fit_huber",
    "fit_l1",
    "fit_least_squares",
    "fit_stir",
    "huber_loss",
    "rmse",
]

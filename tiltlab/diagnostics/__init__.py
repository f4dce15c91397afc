r"""Diagnostics of tilted objectives: curvature, step sizes, GLM statistics, d theta/dt.

Everything here reads a :class:`~tiltlab.TiltedObjective` and a parameter ``theta``
and answers a question the TERM paper's theory asks about them. One file of this
subpackage per question (import everything from ``tiltlab.diagnostics``):

* **Curvature** (``curvature.py``). :func:`smoothness` (largest Hessian eigenvalue, the
  paper's :math:`\beta(t)`, optionally the supremum over a ball around ``theta``),
  :func:`strong_convexity` (smallest eigenvalue), :func:`condition_number` and
  :func:`classify_stationary_point` (the strict-saddle property of the paper's
  assumptions). Small problems use a dense symmetric eigensolver on
  ``objective.hessian``; large ones run Lanczos (``scipy.sparse.linalg.eigsh``) on
  ``objective.hvp`` without forming the Hessian.
* **Step size** (``step_size_rule.py``). :func:`fit_step_size_rule` fits the convergence
  theorem's rule :math:`\alpha = 1/(C_1 + C_2 t)` to measured smoothness at several tilts;
  :func:`step_size` evaluates it.
* **GLM statistics** (``glm.py``). :func:`glm_statistics` returns the paper's
  :math:`\Lambda`, :math:`\Gamma`, :math:`\mathcal M`, :math:`\mathcal V` for the exponential-family
  losses (squared, logistic), plus the tilted averages that generalise them to our
  per-sample cumulants (see below).
* **Tilted solutions** (``path_derivative.py``). :func:`solution_derivative` gives
  :math:`d\breve\theta/dt` at a stationary point from the implicit function theorem.
* **Weights** (``weight_statistics.py``). :func:`weight_entropy`,
  :func:`effective_sample_size` and :func:`tilted_weight_stats`.
* **Groups** (``group_statistics.py``). :func:`group_report`: per group of a
  hierarchical tilt its risk, mass, outer weight and the effective sample size kept by
  the inner tilt; :func:`format_group_report` prints the worst and best groups.
  (:func:`tiltlab.tilt_for_ess`, the tilt at a given effective sample size, lives with
  the risk functions.)

Mapping the paper's GLM to tiltlab's losses
-------------------------------------------
The paper (appendix "General Properties of the Objective for GLMs") assumes
``f(x; theta) = A(theta) - theta . T(x)`` with one cumulant ``A`` shared by all samples
and no ``theta``-free term. tiltlab's GLM losses are regression GLMs in the linear
predictor ``z_i = x_i . theta``:

.. math:: \ell_i(\theta) = A(x_i^\top\theta) - \theta^\top T_i + c(y_i),
          \qquad T_i = T(y_i)\, x_i ,

with ``A(z) = z**2, T(y) = 2y, c(y) = y**2`` for the squared loss (which carries no factor
1/2) and ``A = softplus, T(y) = y, c = 0`` for the logistic loss. So the cumulant
``A(x_i . theta)`` and the offset ``c(y_i)`` vary from sample to sample, and both enter
the tilted weights ``w_i ~ p_i exp(t l_i)``. Consequences, all checked numerically in
``tests/test_diagnostics.py``:

* :math:`\Gamma(t;\theta) = \log\sum_i p_i e^{-t\theta^\top T_i}` and the mean and
  covariance :math:`\mathcal M, \mathcal V` of ``T_i`` under
  :math:`\pi_i = p_i e^{-t\theta^\top T_i - \Gamma}` are defined exactly as in the paper
  (the prior ``p`` replaces ``1/N``); the lemmas on the partial derivatives of
  :math:`\Gamma` and :math:`\mathcal M` hold as stated, for any data.
* :math:`\Lambda = tR` equals :math:`tA + \Gamma` only when every sample has the same
  cumulant and the same offset (an intercept-only logistic model, say); then
  :math:`\pi` is the tilted weight vector ``w`` and every lemma holds as stated. In
  general the lemmas on :math:`\Lambda` hold with ``A``, its gradient and Hessian replaced
  by their ``w``-averages :math:`\bar A = \sum_i w_i (A(z_i) + c(y_i))`,
  :math:`\overline{\nabla A} = \sum_i w_i A'(z_i) x_i`,
  :math:`\overline{\nabla^2 A} = \sum_i w_i A''(z_i) x_i x_i^\top`, with
  :math:`\mathcal M, \mathcal V` replaced by the ``w``-mean and ``w``-covariance of
  ``T_i`` (fields ``tilted_M``, ``tilted_V``), and with extra covariance terms for the
  second derivatives (see :func:`solution_derivative`).

Conventions: ``Lambda`` is ``t`` times the tilted risk *without* the ridge penalty
(the paper has none); the solution derivative includes the ridge term. Arrays are
returned in the objective's namespace, dtype and device. Step-size constants are Python
floats (a step-size rule is a host-side setting).
"""

from __future__ import annotations

from ._checks import DENSE_LIMIT as DENSE_LIMIT  # re-exported: the dense/Lanczos switch
from .curvature import (
    CurvatureEstimate,
    StationaryPoint,
    classify_stationary_point,
    condition_number,
    smoothness,
    strong_convexity,
)
from .glm import GLMStatistics, glm_statistics
from .group_statistics import format_group_report, group_report
from .path_derivative import solution_derivative
from .step_size_rule import StepSizeRule, fit_step_size_rule, step_size
from .weight_statistics import (
    WeightStats,
    effective_sample_size,
    tilted_weight_stats,
    weight_entropy,
)

__all__ = [
    "CurvatureEstimate",
    "StationaryPoint",
    "StepSizeRule",
    "GLMStatistics",
    "WeightStats",
    "smoothness",
    "strong_convexity",
    "condition_number",
    "classify_stationary_point",
    "fit_step_size_rule",
    "step_size",
    "glm_statistics",
    "solution_derivative",
    "weight_entropy",
    "effective_sample_size",
    "tilted_weight_stats",
    "group_report",
    "format_group_report",
]

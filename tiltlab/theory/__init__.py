r"""Numerical checks of the TERM paper's properties along a tilt path.

:func:`check_path` takes a :class:`~tiltlab.TiltPath` (solutions :math:`\breve\theta(t)`
of a tilted objective over a grid of tilts) and checks, one record per property, the
statements of the paper's appendices "General Properties of the Objective/Solutions for
GLMs" and "TERM as an Approximate Superquantile Method";
:func:`format_checks` prints the records as a table and :func:`tradeoff_curves` returns
the data of the paper's trade-off figure.

Notation: :math:`\ell_i(\theta)` the per-sample losses, ``p`` the prior (uniform by
default), :math:`R(t;\theta)` the tilted risk, :math:`F_t(\theta) = R(t;\theta) +
\tfrac{\lambda}{2}\|\theta\|^2` the objective (ridge ``lambda = objective.l2``), and
:math:`\breve\theta(t)` its minimiser, the path. With a ridge the path minimises
:math:`F_t`, so the statements derived from the sign theorem (the risk at a fixed tilt
``tau``, and its limits ``tau = 0`` (mean), ``+inf`` (max), ``-inf`` (min)) are checked for
the *penalised* quantities :math:`R(\tau;\theta) + \tfrac{\lambda}{2}\|\theta\|^2`; with
``l2 = 0`` these are the paper's quantities.

What holds, and what the paper states wrongly
----------------------------------------------
*Theorems for any smooth losses* (checked, and they hold on every valid path):

* ``objective_monotone_in_t`` -- :math:`R(t;\theta)` is non-decreasing in ``t`` for each
  fixed ``theta`` (a power-mean inequality; no GLM assumption is needed).
* ``optimal_objective_monotone`` -- :math:`\min_\theta F_t` is non-decreasing in ``t``.
* ``quantile_ordering`` -- :math:`Q^0 \le Q^1 \le Q^2 \le Q^3`
  (:func:`tiltlab.bounds.quantile_curves`, :func:`tiltlab.bounds.min_tail_fraction`).
* ``stationarity`` (each path point is a strict local minimum), ``gradient_fd`` and
  ``hessian_fd`` (tilted gradient and Hessian lemmas against finite differences) and
  ``solution_derivative_fd`` (:math:`d\breve\theta/dt = -H^{-1}\mathrm{Cov}_w(\ell,
  \nabla\ell)` against finite differences of re-solved solutions): the preconditions and
  lemmas the rest builds on.

*Claims that are not theorems.* The sign theorem ("d/dt R(tau; theta(t)) < 0 iff
t < tau", the theorem labelled ``thm:Lambda``) and everything the paper derives from it
(trade-offs, variance reduction, cosine similarity, weight uniformity) rest on the last
step of its proof, which treats
:math:`\breve\theta^\top \mathcal V(t) (\nabla^2 A + t\mathcal V(t))^{-1}
(\int_\tau^t \mathcal V)\,\breve\theta` as sign-definite. A product of two positive
semi-definite matrices is not positive semi-definite, so the step holds only where the
two matrices coincide, i.e. locally (``t -> tau``; ``t = 0`` for the variance and cosine
statements whose proofs use :math:`\mathcal V_0`). Counterexamples, with tight solves
(gradient norms below 1e-12; violations far above any tolerance):

* In the paper's own setting, :math:`f(x_i;\theta) = \|\theta\|^2 - 2\theta^\top x_i`
  (``A = ||theta||^2``, ``T(x) = 2x``, no ridge), with 2-D Gaussian data
  (``numpy.random.default_rng(s)``, ``n = rng.integers(5, 20)`` points
  ``rng.normal(size=(n, 2)) @ rng.normal(size=(2, 2)) + 2 rng.normal(size=2)``): the
  max-loss *increases* by 0.020 between ``t = 0.25`` and ``0.30`` (seed 38) and already
  at ``t = 0+`` (seed 546: d/dt max-loss = 1.47 at ``t = 0``; the max/mean trade-off has
  no local form near ``t = 0``, because the max-loss is the risk at ``tau = +inf``), the
  mean loss *decreases* by 0.0062 from ``t = 2.05`` to ``2.10`` (seed 15), for ``t < 0``
  *both* halves of the min/mean trade-off fail (seed 31: the mean loss rises by 0.29 from
  ``t = -10`` to ``t = -1.58``; the min half fails on the squared-loss test path), the loss variance
  increases for ``t > 0`` (seed 15, by 0.012) and for ``t < 0``; the entropy of
  fixed-tilt weights decreases in ``t`` (seed 33, ``tau = -20``).
* The paper claims its GLM assumption covers the squared and logistic losses; it does
  not (their cumulant depends on the sample through ``x_i``), and there the claims fail on
  ordinary data too: regularised least squares (``tests/test_theory.py``, data
  ``x ~ N(0, 1)``, ``y = 1.5 x + 0.5 + 0.7 N(0, 1)``, ``n = 40``): the loss variance
  increases for ``t >= 2.5`` (0.06570 at ``t = 2.5`` to 0.06614 at ``t = 4``) and the
  min-loss is not monotone for ``t < 0`` (residuals cross zero: 7.7e-4 at ``t = -1.5``,
  2.3e-4 at ``t = -1``); regularised logistic regression: the cosine similarity decreases for
  ``t < 0`` and the fixed-tilt weight entropy is not monotone. On the paper's own
  linear-regression toy (:func:`tiltlab.datasets.linear_regression_outliers` with
  ``n=50, seed=0``, ``l2=1e-6``) the max-loss *rises* from 11.33 at ``t = 0.0215`` to 12.32
  at ``t = 0.251``, where the objective is convex (notebook
  ``notebooks/superquantile_and_tradeoffs.ipynb``).

Each such record's description says so. On many paths the claims still hold (the sign
theorem and the max/mean trade-off hold on the logistic and squared-loss test paths), which
is what the figure of the paper shows; :func:`check_path` reports what the data say.

*Corrected statements* (theorems for any twice-differentiable losses with a positive
definite Hessian at the path, ridge included; checked by the ``*_local`` records). With
:math:`c_\tau = \sum_i w_i(\tau)(\ell_i - \bar\ell_w)\nabla\ell_i` and
:math:`\breve\theta'(\tau) = -H^{-1}c_\tau` (:func:`tiltlab.diagnostics.solution_derivative`):

* ``risk_sign_local`` -- :math:`t \mapsto F_\tau(\breve\theta(t))` has a stationary minimum
  at ``t = tau``: its derivative vanishes there and has the sign of ``t - tau`` for ``t``
  near ``tau`` (second derivative :math:`\breve\theta'^\top H\breve\theta' \ge 0`). The
  sign theorem holds in this local form only.
* ``variance_local`` -- :math:`\frac{d}{dt}\mathrm{Var}_p\,\ell(\breve\theta(t))|_{t=0}
  = -2 c_0^\top H^{-1} c_0 \le 0`: the variance decreases through ``t = 0``; nothing more.
* ``cosine_local`` -- at ``t = 0``,
  :math:`\frac{d}{dt}s = (m\,c_0^\top H^{-1}c_0 + \lambda\,\mathrm{Var}\,
  \breve\theta^\top H^{-1}c_0)/q^3` (``m`` the mean, ``q`` the root-mean-square loss):
  non-negative when ``m >= 0`` and there is no ridge, and only then. With losses of
  mean ``m < 0`` (the paper's point-estimation GLM, whose losses
  :math:`\|\theta\|^2 - 2\theta^\top x_i` are negative near the data) the cosine
  *decreases* through ``t = 0``; the record then fails and says so (the cosine is defined
  for losses of any sign, so the check is never skipped for negative losses).
* ``entropy_local`` -- :math:`\frac{d}{dt} H(w(\tau;\breve\theta(t)))|_{t=\tau}
  = \tau^2 c_\tau^\top H^{-1} c_\tau \ge 0` (the paper's "more uniform weights" holds at
  the path point itself; the paper's strict ``> 0`` also fails at ``tau = 0``, where the
  weights are uniform for every ``theta``).
* The min-loss trade-off (theorem ``thm:tradeoff-2``) has, besides the gap above, slips
  in its proof: it writes the max-loss :math:`\widehat R` for the min-loss
  :math:`\widecheck R` in the limit ``t -> -inf``, restricts ``tau, t`` to
  :math:`\mathbb R^+` where :math:`\mathbb R^-` is meant, names the solution
  :math:`\widetilde\theta`, and keeps a strict inequality through a limit. The statement
  as printed (min non-decreasing, mean non-increasing in ``t < 0``) is what is checked.

Tolerances
----------
Every comparison allows for the accuracy of the solver. For path point ``k`` the error
of the solution is estimated as :math:`\delta\theta_k = \|g_k\| / \mu_k`, with
:math:`g_k` the gradient *reported by the solver* (``path.results[k].jac``; recomputed
only when a result has none) and :math:`\mu_k` the smallest eigenvalue of the
objective's Hessian there. A statistic :math:`q(\ell)` of the losses moves by at most
:math:`\|\partial q/\partial\ell\|_1\, G_k\,\delta\theta_k` (``G_k`` the largest
per-sample gradient norm; the ridge adds :math:`\lambda\|\theta_k\|\delta\theta_k`), so a
comparison of ``q`` at points ``j`` and ``k`` passes when it fails by at most::

    10 * (S_j G_j dtheta_j + S_k G_k dtheta_k) + rtol * (|q_j| + |q_k|),

``S = ||dq/dl||_1`` computed exactly for each statistic and ``rtol`` (default ``1e-10``,
or ``100 eps`` of the path's dtype where larger: ``1.2e-5`` for float32) covering
floating-point rounding. The local rates (``*_local``) are sums with
cancellation; their tolerance is ``1e-8`` times the rate's magnitude bound built from the
absolute values of every term (per-sample coefficients before cancellation times
per-sample gradient norms, and ``||H^-1||``), so a rate of ``1e-78`` computed from terms
of ``1e-60`` reads as rounding, not as a broken theorem. Finite-difference checks use a
Richardson estimate of their truncation error (steps ``h`` and ``2h``) plus the solution
error over the step, and the rounding of the objective's values or gradients in its own
dtype (steps ``h`` scale with the cube root of its ``eps``). A path whose solutions are
wrong (say, shuffled across tilts) fails the stationarity record and the monotonicity
records, since its reported gradients are small.

Backends: any (the objective is evaluated in its namespace, in its dtype); the checks run
on the host in float64 with NumPy and SciPy.
"""

from __future__ import annotations

from .records import PROPERTIES, PropertyCheck, format_checks
from .registry import check_path
from .tradeoffs import tradeoff_curves

# Re-bound here so that Sphinx, which reads ``#:`` comments from this module's source,
# documents the constant (it is defined in records.py).
#: Names of the checks of :func:`check_path`, in the order they are reported.
PROPERTIES = PROPERTIES

__all__ = [
    "PropertyCheck",
    "PROPERTIES",
    "check_path",
    "format_checks",
    "tradeoff_curves",
]

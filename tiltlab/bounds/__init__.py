r"""Tail fractions, quantile risks and the tail bounds that tilted risks give.

Everything here is a function of one loss vector ``l`` (samples along ``axis``) and,
where it makes sense, prior weights ``p`` (non-negative, normalised to sum one; uniform
by default). Notation follows the TERM paper's appendix "TERM as an Approximate
Superquantile Method":

* ``Q(a) = sum_i p_i [l_i >= a]``, the share of the losses at or above ``a``
  (:func:`tail_fraction`); ``R_(k)``, the k-th smallest loss (:func:`k_loss`);
* ``R(t) = (1/t) log sum_i p_i exp(t l_i)``, the tilted risk (:func:`tiltlab.tilted_risk`);
* ``F`` the floor ``F(-inf)``: a number no larger than any loss, for every parameter
  value (the paper's ``min_theta min_i f(x_i; theta)``; 0 for non-negative losses).

Quantile conventions
--------------------
``alpha`` is a *confidence level* in ``[0, 1)``, the share of the mass that is cut away
from below: ``value_at_risk(l, alpha)`` is the lower ``alpha``-quantile
``min{c : P(l <= c) >= alpha}``, ``superquantile(l, alpha)`` (CVaR) the average of the
top ``1 - alpha`` of the mass and ``entropic_value_at_risk(l, alpha)`` Ahmadi-Javid's
EVaR at confidence ``alpha``. ``alpha = 0`` gives the minimum (VaR) and the mean
(CVaR, EVaR); all three tend to the maximum as ``alpha -> 1``, and
``VaR <= CVaR <= EVaR <= max`` always.

Tail bounds
-----------
For every real ``t`` and ``a > F`` the paper's theorem gives

    Q(a) <= (exp(t R(t)) - exp(t F)) / (exp(t a) - exp(t F))

(:func:`tilted_tail_bound`, continuous at ``t = 0`` where it is Markov's inequality
``(R(0) - F) / (a - F)``). For ``t > 0`` it is never weaker than the Chernoff bound
``Q(a) <= exp(t (R(t) - a))`` (:func:`chernoff_bound`) whenever either is below one.
Setting ``a = R_(k)`` gives upper bounds on the k-loss (:func:`k_loss_bound`); see its
notes for how they relate to the paper's corollaries.

Backends
--------
NumPy, CuPy, PyTorch, array-api-strict and Dask through array-api-compat; results keep
the namespace, floating dtype and device of ``losses``. :func:`entropic_value_at_risk`
solves its one-dimensional minimisation on the host in float64 and returns the result
in the input's namespace.

Layout
------
The functions live in submodules named after what they hold; import them from here:

* :mod:`~tiltlab.bounds.quantiles`: :func:`tail_fraction`, :func:`k_loss`,
  :func:`value_at_risk`, :func:`superquantile`;
* :mod:`~tiltlab.bounds.tail_bounds`: :func:`tilted_tail_bound`, :func:`chernoff_bound`,
  :func:`k_loss_bound`;
* :mod:`~tiltlab.bounds.entropic`: :func:`entropic_value_at_risk`;
* :mod:`~tiltlab.bounds.dro`: :func:`kl_dro_dual`, :func:`worst_case_distribution`,
  :func:`kl_divergence`;
* :mod:`~tiltlab.bounds.curves`: :func:`quantile_curves` (Q1, Q2, Q3 along a tilt path);
* :mod:`~tiltlab.bounds.exact_q0`: :func:`min_tail_fraction` (the exact Q0).
"""

from .curves import quantile_curves
from .dro import kl_divergence, kl_dro_dual, worst_case_distribution
from .entropic import entropic_value_at_risk
from .exact_q0 import min_tail_fraction
from .quantiles import k_loss, superquantile, tail_fraction, value_at_risk
from .tail_bounds import chernoff_bound, k_loss_bound, tilted_tail_bound

__all__ = [
    "tail_fraction",
    "k_loss",
    "value_at_risk",
    "superquantile",
    "tilted_tail_bound",
    "chernoff_bound",
    "k_loss_bound",
    "entropic_value_at_risk",
    "kl_dro_dual",
    "worst_case_distribution",
    "kl_divergence",
    "quantile_curves",
    "min_tail_fraction",
]

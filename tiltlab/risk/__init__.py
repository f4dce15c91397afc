"""Tilted risks and tilted weights, sample-level and hierarchical.

The t-tilted risk of losses ``l`` under prior weights ``p`` (summing to one) is

    R(t) = (1/t) log sum_i p_i exp(t l_i),

with its continuous extensions R(0) = sum_i p_i l_i, R(+inf) = max l, R(-inf) = min l
(over the support p_i > 0). The tilted weights are w_i = p_i exp(t l_i) / sum_j p_j exp(t l_j).

Numerics
--------
Every evaluation shifts the losses by the extreme loss on the side the tilt favours
(``c = max l`` for t > 0, ``min l`` for t < 0), so that ``u_i = t (l_i - c) <= 0`` and no
exponential can overflow. The log of the normaliser ``Z = sum p_i exp(u_i)`` is then taken
in one of two forms, chosen per tilt on ``|t| * (max l - min l)``:

* ``|t| * spread <= 1``: ``log Z = log1p(sum p_i expm1(u_i))``. All terms have one sign, so
  the sum keeps full relative precision and R keeps it as t -> 0 (where ``log(Z) / t`` would
  amplify the rounding of Z by 1/t).
* otherwise ``log Z`` directly; Z >= p_k > 0 for the extreme sample, so it never underflows.

Below ``|t| * spread < sqrt(tiny)`` (where ``u_i`` would be subnormal) the mean is exact to
rounding and is used; a tilt that carries autograd takes the cumulant series
``mean + t var / 2 + t^2 k3 / 6`` near zero, so that ``dR/dt`` is right there. Spreads
beyond the float maximum are halved before they are subtracted. t = 0 and t = +-inf are
exact. A grid of tilts is evaluated in one vectorised pass (the tilt axis leads the
result).

This rule is written once, in :mod:`tiltlab.accumulator` (the tilted reduction, for
samples and for groups); the functions here drive it.

Layout
------
The code lives in submodules named after what they hold; import it from here:

* :mod:`~tiltlab.risk.inputs`: validation of losses, tilts and prior weights
  (``prepare_*``);
* :mod:`~tiltlab.risk.kernels`: the shifted risk and weight kernels, without validation;
* :mod:`~tiltlab.risk.fast_path`: one-dimensional losses on eager backends;
* :mod:`~tiltlab.risk.sample`: :func:`tilted_risk` and :func:`tilted_weights`;
* :mod:`~tiltlab.risk.ess`: :func:`tilt_for_ess` and :func:`tilt_for_kl`, the tilt at a
  given effective sample size or KL radius;
* :mod:`~tiltlab.risk.advantage`: :func:`tilted_advantage`, the advantage of a reward
  against its group's tilted mean;
* :mod:`~tiltlab.risk.hierarchy`: hierarchical tilting (:class:`GroupTree`,
  :func:`build_tree`, :func:`hierarchy_eval`, :func:`hierarchical_risk`,
  :func:`hierarchical_weights`).
"""

# ruff: noqa: F401  (private re-exports, see below)
# Every name the single-module ``tiltlab.risk`` defined stays importable from here
# (other tiltlab modules import the kernels and the ``prepare_*`` helpers).
from ._dispatch import HIERARCHICAL_RISK, HIERARCHICAL_WEIGHTS, TILTED_RISK, TILTED_WEIGHTS
from .advantage import tilted_advantage
from .ess import tilt_for_ess, tilt_for_kl
from .fast_path import (
    _check_losses,
    _checked_extremes,
    _finite_nonzero,
    _host_tilt,
    _keep,
    _quiet,
    _risk_1d,
    _use_fast_path,
    _weights_1d,
)
from .hierarchy import (
    GroupTree,
    _build_levels,
    _codes_of,
    _prepare_hierarchy,
    _weights_from_state,
    broadcast_groups,
    build_tree,
    check_group_mass,
    group_level,
    hierarchical_risk,
    hierarchical_weights,
    hierarchy_eval,
    level_masses,
    risk_and_weights,
    risk_weights_scalar,
    segment_sum,
)
from .inputs import prepare_losses, prepare_prior, prepare_tilt, prepare_tilts
from .kernels import (
    _inplace,
    _inplace_exp,
    _shift,
    _Shifted,
    prior_mean,
    risk_kernel,
    support_range,
    weights_kernel,
)
from .sample import _GRID_CHUNK, _risk_grid, tilted_risk, tilted_weights

__all__ = [
    "tilted_risk",
    "tilted_weights",
    "hierarchical_risk",
    "hierarchical_weights",
    "tilt_for_ess",
    "tilted_advantage",
    "tilt_for_kl",
]

"""The tilted reduction: a streaming, exactly mergeable log-sum-exp state.

This module is the one home of the numerical rule behind every tilted risk in tiltlab
(the eager risk functions, the one-pass objective, the segment reductions of
hierarchies, Dask's tree reductions and the host side of the CuPy kernels).

For one tilt ``t`` a block of samples with losses ``l_i`` and prior weights ``p_i`` is
summarised by

* ``hi``, ``lo``: the largest and smallest loss over the block's support (``p_i > 0``),
  and the *shift* ``c`` (``hi`` for ``t > 0``, ``lo`` otherwise), so that every
  ``u_i = t (l_i - c)`` is ``<= 0`` and no exponential overflows;
* ``mass = sum p_i`` and ``s = sum p_i exp(u_i)``;
* ``q = sum p_i expm1(u_i)``, kept while ``|t| (hi - lo) <= 1``: near ``t = 0`` the risk
  ``c + log1p(q / mass) / t`` keeps full relative precision where ``log(s) / t`` would
  amplify the rounding of ``s`` by ``1 / |t|``;
* ``lsum = sum p_i (l_i - c)``, kept at ``t = 0`` and while ``|t| (hi - lo)`` is below the
  square root of the smallest normal number (there the risk is the mean to rounding);
* any number of *sums* ``sum_i p_i exp(u_i) v_i`` of per-sample arrays ``v_i`` (the pieces
  of a gradient or a Hessian-vector product), which are rescaled exactly like ``s``.

Two states merge exactly: the state with the smaller shift is rescaled by
``r = exp(t (c_small - c_big)) <= 1`` (the online-normaliser idea), and ``q`` by
``mass expm1(t (c_small - c_big)) + q r``, a sum of terms of one sign, so no cancellation
creeps in however the samples are split into blocks. The merge is associative up to
rounding.

The same state describes ``G`` groups at once (the segment reductions of a hierarchy):
with ``segments`` given, ``hi``, ``lo`` are host arrays of length ``G`` (``-inf``/``+inf``
for a group without samples in the block) and the other fields arrays of length ``G``; the
regime of each group is read from its own spread.

Shifts, extremes and the regime flags live on the host (Python floats, NumPy arrays for
groups): a block costs one device synchronisation, in which its extremes are read and
checked for NaN and infinity. Spreads beyond the float maximum (losses of both signs near
it) are handled by halving before subtracting.

:mod:`tiltlab.accumulator.packed` is the same state as one array (one field layout for
every array library), with a merge and a finish that read nothing on the host: the
minibatch estimators, the PyTorch module's steps and the vectorised kernels of
:mod:`tiltlab.risk` (a grid of tilts, autograd through ``t``, :func:`finish_risk`) are
its drivers.

:func:`group_risk` gives the risk of every group of a partition; on NumPy it is
:func:`shared_shift_risk`: one shift for all groups, so that the exponentials are one
vectorised pass and the normalisers one segment sum, with the groups for which that
shift is not exact to rounding recomputed by the group state with their own;
:func:`labelled_risk` is the same for groups given by integer labels, without building a
partition first (one compiled pass counts and sums every group), and
:func:`pooled_risk` the tilted risk of values with masses under the same rule;
:func:`labelled_level` gives the group risks of codes with what it takes to spread
group weights over the samples (one gather), for hierarchical weights and objectives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ._rule import (
    GroupState,
    TiltState,
    needed_sums,
    shifted_exponent,  # noqa: F401  (for drivers that exponentiate themselves)
)
from ._shared import (
    LabelledLevel,
    group_risk,
    label_codes,
    labelled_level,
    labelled_risk,
    pooled_risk,
    shared_shift_risk,
)
from ._support import (  # noqa: F401  (for drivers)
    EXTREMES,
    NonFiniteLosses,
    spread_overflows,
)
from ._support import _extremes as host_extremes  # noqa: F401  (for drivers)
from .packed import finish_risk, risk_of_exponents, series_threshold

__all__ = [
    "NonFiniteLosses",
    "TiltState",
    "GroupState",
    "block_state",
    "merge",
    "merge_all",
    "finalize_risk",
    "normalized_sums",
    "finish_risk",
    "series_threshold",
    "needed_sums",
    "risk_of_exponents",
    "group_risk",
    "LabelledLevel",
    "label_codes",
    "labelled_level",
    "labelled_risk",
    "pooled_risk",
    "shared_shift_risk",
]

# pickles name the public module
for _cls in (TiltState, GroupState, NonFiniteLosses, LabelledLevel):
    _cls.__module__ = __name__
del _cls

# ---------------------------------------------------------------------------------------
# the functional interface (stable names)


def block_state(
    l: Any,
    p: Any,
    t: float,
    xp: Any,
    *,
    sums: Callable[[Any], tuple] | None = None,
    tiny: float | None = None,
    extremes: tuple[float, float] | None = None,
) -> TiltState:
    """The state of one block of samples (1-d losses ``l``; prior ``p`` or None).

    ``p=None`` means unit weights (``mass`` is then the sample count); normalisation
    happens once, in :func:`finalize_risk` and :func:`normalized_sums`. ``sums`` maps the
    block's unnormalised weights ``p_i exp(u_i)`` to a tuple of weighted sums.
    ``extremes`` passes ``(hi, lo)`` already read for these losses (a grid of tilts).
    The same as :meth:`TiltState.from_block`.

    Raises ``ValueError`` (naming ``losses``) when the block holds NaN or infinite losses
    on its support.

    Examples
    --------
    >>> import numpy as np
    >>> st = block_state(np.array([0.0, 2.0]), None, 1.0, np)
    >>> bool(np.isclose(finalize_risk(st, np, np.float64), np.log((1 + np.e**2) / 2)))
    True
    """
    return TiltState.from_block(l, t, p, sums=sums, xp=xp, tiny=tiny, extremes=extremes)


def mean_state(ell: Any, p: Any, xp: Any, sums: Any) -> TiltState:
    """A state at ``t = 0`` (no exponentials; the weights are the prior)."""
    return TiltState.from_block(ell, 0.0, p, sums=sums, xp=xp)


_mean_state = mean_state


def merge(a: TiltState, b: TiltState, *, tiny: float | None = None) -> TiltState:
    """Merge two states of the same tilt (exact up to rounding; associative).

    Examples
    --------
    >>> import numpy as np
    >>> a, b = (block_state(np.array([v]), None, 2.0, np) for v in (0.0, 1.0))
    >>> float(merge(a, b).mass)
    2.0
    """
    return a.merge(b)


def merge_all(states: list[TiltState]) -> TiltState:
    """Merge a list of states pairwise (a balanced tree, as a cluster would).

    Examples
    --------
    >>> import numpy as np
    >>> sts = [block_state(np.array([v]), None, -1.0, np) for v in (0.0, 1.0, 2.0)]
    >>> float(merge_all(sts).mass)
    3.0
    """
    if not states:
        raise ValueError("no states to merge")
    while len(states) > 1:
        nxt = [states[i].merge(states[i + 1]) for i in range(0, len(states) - 1, 2)]
        if len(states) % 2:
            nxt.append(states[-1])
        states = nxt
    return states[0]


def finalize_risk(state: TiltState, xp: Any, dtype: Any) -> Any:
    """The tilted risk of the merged samples (a 0-d array of ``dtype``).

    Examples
    --------
    >>> import numpy as np
    >>> state = block_state(np.array([3.0, 3.0]), None, 5.0, np)
    >>> float(finalize_risk(state, np, np.float64))
    3.0
    """
    return state.risk(xp, dtype)


def normalized_sums(state: TiltState) -> tuple:
    """The requested sums divided by the normaliser: ``sum_i w_i v_i`` with tilted weights.

    Examples
    --------
    >>> import numpy as np
    >>> st = block_state(np.array([0.0, 0.0]), None, 1.0, np, sums=lambda pe: (pe.sum(),))
    >>> float(normalized_sums(st)[0])
    1.0
    """
    return state.normalized_sums()


def with_sums(state: TiltState, sums: tuple) -> TiltState:
    """A copy of ``state`` carrying other sums (for callers that post-process them)."""
    return replace(state, sums=tuple(sums))

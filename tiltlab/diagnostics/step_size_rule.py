r"""The convergence theorem's step-size rule :math:`\alpha(t) = 1/(C_1 + C_2 t)`:
fitting its constants to measured smoothness and evaluating it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import (
    as_float_array,
    is_array_api_obj,
    to_numpy,
)
from ..objective import TiltedObjective
from ._checks import _check_objective, _theta_of
from .curvature import smoothness

__all__ = [
    "StepSizeRule",
    "fit_step_size_rule",
    "step_size",
]


@dataclass(frozen=True)
class StepSizeRule:
    """Constants of the step-size rule ``alpha(t) = 1 / (C1 + C2 t)``.

    Unpacks as ``C1, C2 = rule``; calling ``rule(t)`` gives the step size.

    Attributes
    ----------
    C1, C2 : float
        The fitted constants.
    ts, betas : numpy.ndarray
        The tilts and the smoothness ``beta(t)`` measured at them.
    fit : str
        ``"envelope"`` (``C1 + C2 t >= beta(t)`` at every sampled tilt) or ``"lstsq"``.
    """

    C1: float
    C2: float
    ts: np.ndarray
    betas: np.ndarray
    fit: str

    def __iter__(self):
        return iter((self.C1, self.C2))

    def __call__(self, t: Any) -> Any:
        return step_size(self.C1, self.C2, t)


def _path_points(objective: TiltedObjective, theta_or_path: Any, n: int) -> list[Any]:
    """One parameter per tilt: a sequence/stacked array of ``n`` points, or one point."""
    xp = objective.xp
    if not is_array_api_obj(theta_or_path) and isinstance(theta_or_path, Sequence):
        items = list(theta_or_path)
        if items and all(is_array_api_obj(e) or isinstance(e, Sequence) for e in items):
            if len(items) != n:
                raise ValueError(
                    f"`theta_or_path` holds {len(items)} points but `ts` has {n} tilts"
                )
            return [_theta_of(objective, e) for e in items]
    arr = as_float_array(theta_or_path, xp, name="theta_or_path", dev=objective.device)
    shape = tuple(arr.shape)
    single = (
        objective.shape is not None
        and (shape == tuple(objective.shape) or shape == (int(np.prod(objective.shape)),))
    ) or (objective.shape is None and arr.ndim == 1)
    if single:
        th = _theta_of(objective, arr)
        return [th] * n
    if shape[0] != n:
        raise ValueError(
            f"`theta_or_path` must be one parameter or {n} stacked parameters (one per "
            f"tilt); got shape {shape}"
        )
    return [_theta_of(objective, arr[j, ...]) for j in range(n)]


def fit_step_size_rule(
    objective: Any,
    theta_or_path: Any,
    ts: Any,
    *,
    fit: str = "envelope",
    radius: float = 0.0,
    n_samples: int = 16,
    seed: int = 0,
    method: str = "auto",
) -> StepSizeRule:
    r"""Fit the convergence theorem's step size :math:`\alpha(t) = 1/(C_1 + C_2 t)`.

    The theorem ("Convergence with t") takes :math:`C_1 + C_2 t \ge \beta(t)` for all
    :math:`t \ge 0`, where :math:`\beta(t)` grows at most linearly (smoothness lemma).
    This measures :math:`\beta(t_j)` with :func:`smoothness` on
    ``objective.with_tilt(t_j)`` at the given point(s) and fits the line.

    Parameters
    ----------
    objective : TiltedObjective
        A sample-level objective (its tilt is replaced by each ``t_j``).
    theta_or_path : array or sequence of arrays
        One parameter used at every tilt, or one parameter per tilt (e.g. the tilted
        solutions along a path; a list, or an array with a leading axis of ``len(ts)``).
        :math:`\beta(t)` is a local quantity: measure it near the solutions, where the
        paper's linear growth holds (at a fixed point far from them the tilted weights
        collapse onto one sample as ``t`` grows and the measured curvature can fall).
    ts : sequence of float
        At least two distinct, finite tilts ``>= 0``.
    fit : {"envelope", "lstsq"}, default "envelope"
        ``"envelope"``: the tightest upper envelope, i.e. the line with
        :math:`C_1, C_2 \ge 0` and :math:`C_1 + C_2 t_j \ge \beta(t_j)` for every ``j``
        that minimises :math:`\sum_j (C_1 + C_2 t_j)` (a linear programme, solved with
        ``scipy.optimize.linprog``); the step sizes are then safe at every sampled tilt.
        ``"lstsq"``: the least-squares line through the points (no guarantee).
    radius, n_samples, seed, method
        Passed to :func:`smoothness` (a ball around each point estimates the paper's
        neighbourhood supremum).

    Returns
    -------
    StepSizeRule
        Unpacks as ``C1, C2``; Python floats.

    See Also
    --------
    step_size : The step the rule gives.
    smoothness : The measurements it fits.
    tiltlab.minimize : Uses it with ``method="gd", step="rule"``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import fit_step_size_rule
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    >>> obj = TiltedObjective("squared", X, np.array([0.0, 2.0, 1.0]))
    >>> C1, C2 = fit_step_size_rule(obj, np.array([0.5, 0.25]), [0.0, 0.5, 1.0])
    >>> C1 > 0 and C2 >= 0
    True
    """
    obj = _check_objective(objective)
    if obj.is_hierarchical:
        raise NotImplementedError(
            "fit_step_size_rule varies the sample-level tilt; it does not support "
            "hierarchical objectives"
        )
    if fit not in ("envelope", "lstsq"):
        raise ValueError(f"`fit` must be 'envelope' or 'lstsq', got {fit!r}")
    tgrid = np.asarray(to_numpy(ts), dtype=np.float64).reshape(-1)
    if tgrid.size < 2 or np.unique(tgrid).size < 2:
        raise ValueError("`ts` must hold at least two distinct tilts")
    if not np.all(np.isfinite(tgrid)) or np.any(tgrid < 0):
        raise ValueError("`ts` must hold finite tilts t >= 0 (the step-size theorem's range)")
    points = _path_points(obj, theta_or_path, tgrid.size)
    betas = np.array(
        [
            float(
                to_numpy(
                    smoothness(
                        obj.with_tilt(float(t)),
                        th,
                        radius=radius,
                        n_samples=n_samples,
                        seed=seed,
                        method=method,
                    ).value
                )
            )
            for t, th in zip(tgrid, points, strict=True)
        ]
    )
    if fit == "lstsq":
        A = np.stack([np.ones_like(tgrid), tgrid], axis=1)
        (C1, C2), *_ = np.linalg.lstsq(A, betas, rcond=None)
    else:
        if not np.max(betas) > 0:
            raise ValueError(
                "the measured smoothness is not positive at any tilt; no step-size rule "
                "1/(C1 + C2 t) applies"
            )
        from scipy.optimize import linprog

        res = linprog(
            c=[tgrid.size, float(np.sum(tgrid))],
            A_ub=-np.stack([np.ones_like(tgrid), tgrid], axis=1),
            b_ub=-betas,
            bounds=[(0, None), (0, None)],
            method="highs",
        )
        if not res.success:  # pragma: no cover - the programme is always feasible
            raise RuntimeError(f"the envelope fit failed: {res.message}")
        C1, C2 = (float(v) for v in res.x)
        C2 = max(C2, 0.0)
        # remove the solver's feasibility slack so the envelope holds exactly
        C1 = max(C1, float(np.max(betas - C2 * tgrid)))
    return StepSizeRule(float(C1), float(C2), tgrid, betas, fit)


def step_size(C1: Any, C2: Any, t: Any) -> Any:
    r"""The convergence theorem's step size :math:`\alpha = 1/(C_1 + C_2 t)`.

    Parameters
    ----------
    C1, C2 : float or array
        Constants, e.g. from :func:`fit_step_size_rule`.
    t : float or array
        Tilt(s); arrays give elementwise step sizes in their namespace.

    Returns
    -------
    float or array

    Raises
    ------
    ValueError
        For Python numbers when ``C1 + C2 t`` is not a positive finite number.

    See Also
    --------
    fit_step_size_rule : Fits the constants.

    Examples
    --------
    >>> from tiltlab.diagnostics import step_size
    >>> step_size(2.0, 0.5, 4.0)
    0.25
    """
    scalars = all(
        isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
        for v in (C1, C2, t)
    )
    if scalars:
        den = float(C1) + float(C2) * float(t)
        if not (math.isfinite(den) and den > 0):
            raise ValueError(f"`C1` + `C2` * `t` must be a positive finite number, got {den!r}")
        return 1.0 / den
    return 1.0 / (C1 + C2 * t)

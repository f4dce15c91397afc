"""Argument checks and shared constants of the diagnostics (internal)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import as_float_array
from ..objective import TiltedObjective
from ..objective.protocol import check_objective

#: Problems with at most this many parameters use the dense eigensolver / linear solver
#: under ``method="auto"``.
DENSE_LIMIT = 500

_METHODS = ("auto", "dense", "lanczos")


def _check_objective(objective: Any) -> TiltedObjective:
    # the diagnostics read the objective's data, so they need the class itself
    return check_objective(objective, "objective", tilted=True)


def _check_finite_tilts(objective: TiltedObjective) -> None:
    if not all(math.isfinite(t) for t in objective.tilts):
        raise ValueError(
            f"the Hessian is not defined at an infinite tilt (`objective` has tilts "
            f"{objective.tilts}); use a large finite tilt"
        )


def _theta_of(objective: TiltedObjective, theta: Any) -> Any:
    """``theta`` as an array of the objective's namespace, dtype and device."""
    xp = objective.xp
    th = as_float_array(theta, xp, name="theta", dev=objective.device)
    if objective.dtype is not None and th.dtype != objective.dtype:
        th = xp.astype(th, objective.dtype)
    if objective.shape is not None:
        size = int(np.prod(objective.shape))
        if tuple(th.shape) != tuple(objective.shape) and tuple(th.shape) != (size,):
            raise ValueError(
                f"`theta` must have shape {objective.shape} (or be flat of size {size}), "
                f"got {tuple(th.shape)}"
            )
    elif th.ndim != 1:
        raise ValueError(f"`theta` must be a 1-d parameter vector, got shape {tuple(th.shape)}")
    return th


def _n_params(th: Any) -> int:
    return int(np.prod(tuple(th.shape))) if th.ndim else 1


def _check_method(method: str, p: int) -> str:
    if method not in _METHODS:
        raise ValueError(f"`method` must be one of {_METHODS}, got {method!r}")
    if method == "auto":
        return "dense" if p <= DENSE_LIMIT else "lanczos"
    return method

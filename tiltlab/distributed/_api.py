"""Entry points called by the hooks in :mod:`tiltlab.objective` and :mod:`tiltlab.risk`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._objective import evaluate, supported

__all__ = ["objective_call"]


def objective_call(objective: Any, kind: str, theta: Any, v: Any = None) -> Any:
    """A Dask objective's ``value`` / ``value_and_gradient`` / ``hvp`` / ``hessian`` in one
    graph (one ``compute``); None where the one-graph path does not apply.

    Results are Dask arrays (wrapping the small computed results), in the shape the
    eager methods give: the gradient and ``Hv`` in the shape of ``theta``.
    """
    if not supported(objective):
        return None
    xp = objective.xp
    th = objective._theta(theta)
    shape = objective.shape
    flat_shape = tuple(th.shape)
    T = xp.reshape(th, shape)
    if kind == "value":
        (val,) = evaluate(objective, T, None, "value")
        return xp.asarray(val)
    if kind == "grad":
        val, g = evaluate(objective, T, None, "grad")
        return xp.asarray(val), xp.asarray(np.reshape(g, flat_shape))
    if kind == "hvp":
        vv = xp.reshape(objective._theta(v, name="v"), shape)
        _, hv = evaluate(objective, T, vv, "hvp")
        return xp.asarray(np.reshape(hv, tuple(objective._theta(v, name="v").shape)))
    if kind == "hess":
        if len(shape) != 1 or objective.is_hierarchical:
            return None  # columns of hvp (each one graph)
        _, H = evaluate(objective, T, None, "hess")
        return xp.asarray(H)
    raise ValueError(f"unknown evaluation {kind!r}")  # pragma: no cover

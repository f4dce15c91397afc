"""A Dask objective's evaluations by name (the objective itself reaches them through its
Dask engine, :class:`tiltlab.distributed._objective.DaskEngine`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._objective import evaluate, problem_of, supported

__all__ = ["objective_call"]


def objective_call(objective: Any, kind: str, theta: Any, v: Any = None) -> Any:
    """A Dask objective's ``value`` / ``value_and_gradient`` / ``hvp`` / ``hessian`` in one
    graph (one ``compute``); None where the one-graph path does not apply.

    Results are Dask arrays (wrapping the small computed results), in the shape the
    eager methods give: the gradient and ``Hv`` in the shape of ``theta``.
    """
    if not supported(objective):
        return None
    problem = problem_of(objective)
    xp = problem.xp
    th = problem.check_theta(theta)
    shape = problem.shape
    flat_shape = tuple(th.shape)
    T = xp.reshape(th, shape)
    if kind == "value":
        (val,) = evaluate(objective, T, None, "value")
        return xp.asarray(val)
    if kind == "grad":
        val, g = evaluate(objective, T, None, "grad")
        return xp.asarray(val), xp.asarray(np.reshape(g, flat_shape))
    if kind == "hvp":
        vv = problem.check_theta(v, name="v")
        _, hv = evaluate(objective, T, xp.reshape(vv, shape), "hvp")
        return xp.asarray(np.reshape(hv, tuple(vv.shape)))
    if kind == "hess":
        if len(shape) != 1 or problem.is_hierarchical:
            return None  # columns of hvp (each one graph)
        _, H = evaluate(objective, T, None, "hess")
        return xp.asarray(H)
    raise ValueError(f"unknown evaluation {kind!r}")  # pragma: no cover

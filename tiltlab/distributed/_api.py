"""A Dask objective's evaluations by name (the objective itself reaches them through its
Dask engine, :class:`tiltlab.distributed._objective.DaskEngine`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._objective import in_memory, lazy_hessian, lazy_results, problem_of, supported

__all__ = ["objective_call"]


def _reshaped(a: Any, shape: tuple, xp: Any) -> Any:
    """``a`` in the parameter shape: its NumPy value where it is data in memory (it then
    travels inside the tasks), else a lazy reshape."""
    host = in_memory(a)
    return np.reshape(host, shape) if isinstance(host, np.ndarray) else xp.reshape(a, shape)


def objective_call(objective: Any, kind: str, theta: Any, v: Any = None) -> Any:
    """A Dask objective's ``value`` / ``value_and_gradient`` / ``hvp`` / ``hessian`` as one
    graph; None where the one-graph path does not apply.

    ``kind`` is ``"value"``, ``"grad"``, ``"hvp"`` or ``"hess"`` (the dense Hessian: one
    evaluation for a sample-level scalar-predictor objective, else one Hessian-vector
    product per column, all in one graph). Results are lazy Dask arrays in the shapes the
    objective's methods give (the gradient and ``Hv`` in the shape of ``theta``, resp.
    ``v``; ``"hvp"`` and ``"hess"`` raise ``ValueError`` at an infinite tilt, where the
    Hessian is not defined, as the objective's methods do): nothing runs at call time,
    and computing the results of one call together (``dask.compute(value, grad)``) runs
    one graph, the whole evaluation. Each result computed on its own runs the evaluation
    again.

    Examples
    --------
    >>> import dask, dask.array as da, numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.distributed import objective_call
    >>> X = da.from_array(np.eye(4), chunks=2)
    >>> obj = tl.TiltedObjective("squared", X, da.ones(4, chunks=2), t=1.0)
    >>> value, grad = objective_call(obj, "grad", np.zeros(4))
    >>> value, grad = dask.compute(value, grad)
    >>> grad.shape
    (4,)
    """
    if not supported(objective):
        return None
    problem = problem_of(objective)
    if kind in ("hvp", "hess") and not all(math.isfinite(float(t)) for t in problem.tilts):
        raise ValueError("the Hessian is not defined at an infinite tilt")
    xp = problem.xp
    th = problem.check_theta(theta)
    shape = problem.shape
    T = _reshaped(th, shape, xp)
    if kind == "value":
        return lazy_results(objective, T, None, "value", ())[0]
    if kind == "grad":
        value, g = lazy_results(objective, T, None, "grad", tuple(T.shape))
        return value, xp.reshape(g, tuple(th.shape))
    if kind == "hvp":
        vv = problem.check_theta(v, name="v")
        V = _reshaped(vv, shape, xp)
        hv = lazy_results(objective, T, V, "hvp", tuple(V.shape))[1]
        return xp.reshape(hv, tuple(vv.shape))
    if kind == "hess":
        return lazy_hessian(objective, T)[0]
    raise ValueError(f"`kind` must be 'value', 'grad', 'hvp' or 'hess', got {kind!r}")

"""Solver drivers that run outside the objective's array library, registered from above.

An optional backend can drive the unchanged solvers itself: for Dask data the solvers run
on the client in NumPy and every evaluation is one task graph on the cluster
(:mod:`tiltlab.distributed`). Such a backend registers a driver into :data:`DRIVERS` for
its array library (lazily, from ``tiltlab/_backends.py``), and :func:`driver_for` finds it,
so the solvers never import the backend.

A driver is an object with ``applies(objective) -> bool`` and
``__call__(minimize, objective, theta0, **kwargs)``, which returns the result of
``minimize`` on the objective.
"""

from __future__ import annotations

from typing import Any

from .._dispatch import Dispatch

__all__ = ["DRIVERS", "driver_for"]

#: drivers of :func:`tiltlab.minimize`, one per array library
DRIVERS = Dispatch("minimize driver")


def driver_for(objective: Any) -> Any:
    """The registered driver that takes ``objective`` over, or None.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> driver_for(tl.TiltedObjective("squared", np.eye(2), np.ones(2))) is None
    True
    """
    xp = getattr(objective, "xp", None)
    if xp is None:
        return None
    driver = DRIVERS.dispatch(xp)
    if driver is None or not driver.applies(objective):
        return None
    return driver

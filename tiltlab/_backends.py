"""Wiring of optional backends into the dispatch tables of the lower layers.

This module sits at the top of the package (it is imported by ``tiltlab/__init__.py``)
and is the one place that names both a lower layer's :class:`~tiltlab._dispatch.Dispatch`
table and the higher module that fills it. Registrations are lazy (module paths as
strings), so ``import tiltlab`` imports no optional backend: the named module is imported
the first time an array of its library is evaluated, and registers its implementation.
"""

from __future__ import annotations

from ._dispatch import register_lazy
from .accumulator import EXTREMES
from .objective.engines import ENGINES
from .risk import (
    HIERARCHICAL_RISK,
    HIERARCHICAL_WEIGHTS,
    TILTED_RISK,
    TILTED_WEIGHTS,
)
from .segments import SEGMENT_KERNELS
from .solvers import DRIVERS

__all__: list[str] = []

# CuPy: every registration and all CUDA code in one backend package (tiltlab/_cupy/):
# the extremes of 1-d losses, the risks and the weights, the fused objective engine
for _table in (
    EXTREMES,
    TILTED_RISK,
    TILTED_WEIGHTS,
    HIERARCHICAL_RISK,
    HIERARCHICAL_WEIGHTS,
    ENGINES,
):
    _table.register_lazy("cupy", "tiltlab._cupy")

# Dask: risks of lazy arrays as one task graph (tiltlab.distributed registers them)
for _table in (TILTED_RISK, HIERARCHICAL_RISK, TILTED_WEIGHTS):
    _table.register_lazy("dask", "tiltlab.distributed")

# the compiled CPU kernels (numba): every registration in one backend package
# (tiltlab/_cpu_kernels/): the fused objective engine, the segment kernels and the route
# of NumPy chunks of a Dask evaluation (a table of tiltlab.distributed, named here so that
# this module does not import it)
ENGINES.register_lazy("numpy", "tiltlab._cpu_kernels")
SEGMENT_KERNELS.register_lazy("numpy", "tiltlab._cpu_kernels")
register_lazy("dask chunk routes", "numpy", "tiltlab._cpu_kernels")

# objective engines of Dask (tiltlab/objective/engines/__init__.py)
ENGINES.register_lazy("dask", "tiltlab.distributed._objective")

# solvers driven from outside the array library (tiltlab/solvers/_external.py)
DRIVERS.register_lazy("dask", "tiltlab.distributed._solvers")

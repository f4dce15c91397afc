"""Wiring of optional backends into the dispatch tables of the lower layers.

This module sits at the top of the package (it is imported by ``tiltlab/__init__.py``)
and is the one place that names both a lower layer's :class:`~tiltlab._dispatch.Dispatch`
table and the higher module that fills it. Registrations are lazy (module paths as
strings), so ``import tiltlab`` imports no optional backend: the named module is imported
the first time an array of its library is evaluated, and registers its implementation.
"""

from __future__ import annotations

from .objective.engines import ENGINES
from .solvers._external import DRIVERS

__all__: list[str] = []

# objective engines, one per array library (tiltlab/objective/engines/__init__.py)
ENGINES.register_lazy("cupy", "tiltlab.objective.engines.cuda")
ENGINES.register_lazy("dask", "tiltlab.distributed._objective")

# solvers driven from outside the array library (tiltlab/solvers/_external.py)
DRIVERS.register_lazy("dask", "tiltlab.distributed._solvers")

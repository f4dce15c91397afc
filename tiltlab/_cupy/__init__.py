"""The CuPy backend: every CuPy registration and all CUDA code of the package.

- ``tilt.cuh``: the scalar functions, written once in C (each loss's value and
  derivatives at one point; the tilted state with its empty element, merge and finish),
  compiled both as host C (tested on the CPU) and in the kernels;
- ``kernels.cu``: the kernels (the fused value and gradient and its finish, the one-pass
  reductions of the risk and the weights);
- :mod:`.source`: the builds (NVRTC through CuPy), :mod:`.engine`: the objective engine,
  :mod:`.reductions`: ``tilted_risk``, ``tilted_weights``, ``hierarchical_risk``,
  ``hierarchical_weights`` and the extremes, :mod:`.hierarchy`: hierarchies on the device
  (the group tree uploaded once, the levels' reductions), :mod:`.hierarchical_engine`:
  the hierarchical objective's value, gradient, Hessian-vector products and
  linearisation on that tree.

Importing this module registers them into the dispatch tables of the lower layers;
``tiltlab/_backends.py`` imports it lazily, the first time a CuPy array shows up.
"""

from __future__ import annotations

from ..accumulator import EXTREMES
from ..objective.engines import ENGINES
from ..risk import (
    HIERARCHICAL_RISK,
    HIERARCHICAL_WEIGHTS,
    TILTED_RISK,
    TILTED_WEIGHTS,
)
from . import reductions
from .engine import FUSED_CUDA

__all__: list[str] = []

EXTREMES.register("cupy", reductions.extremes)
TILTED_RISK.register("cupy", reductions.tilted_risk)
TILTED_WEIGHTS.register("cupy", reductions.tilted_weights)
HIERARCHICAL_RISK.register("cupy", reductions.hierarchical_risk)
HIERARCHICAL_WEIGHTS.register("cupy", reductions.hierarchical_weights)
ENGINES.register("cupy", FUSED_CUDA)

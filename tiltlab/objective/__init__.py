"""Tilted objectives: a loss, data, a tilt (or a hierarchy of tilts) and a prior.

The package is a thin public class over a problem description and the engines that
evaluate it:

* :mod:`~tiltlab.objective.problem`: :class:`TiltedProblem`, the frozen description
  (loss, ``X``, ``y``, prior, tilt tree, ridge term);
* :mod:`~tiltlab.objective.engines`: the engines (generic array-API, one-pass blocks,
  parameter-space losses, fused CUDA; Dask registers its own) and the dispatch table
  that picks them;
* :mod:`~tiltlab.objective.blocks`: the block-size policy and the per-block pieces that
  the one-pass engine and the Dask engine share;
* :mod:`~tiltlab.objective.linearization`: an objective at a fixed point, for the many
  Hessian-vector products of a Newton step;
* :mod:`~tiltlab.objective.protocol`: the interface solvers use (:class:`Objective`) and
  its one check.
"""

from __future__ import annotations

from ._facade import TiltedObjective
from .blocks import hvp_coefficients as hvp_coefficients
from .blocks import mean_state as _mean_state  # noqa: F401  (older import path)

# pickles name the class by its public path, which stays when files move inside the package
TiltedObjective.__module__ = __name__

__all__ = ["TiltedObjective"]

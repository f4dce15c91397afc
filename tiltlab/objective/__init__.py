"""Tilted objectives: a loss, data, a tilt (or a hierarchy of tilts) and a prior."""

from __future__ import annotations

from ._facade import TiltedObjective
from ._facade import _mean_state as _mean_state
from ._facade import hvp_coefficients as hvp_coefficients

# pickles name the class by its public path, which stays when files move inside the package
TiltedObjective.__module__ = __name__

__all__ = ["TiltedObjective"]

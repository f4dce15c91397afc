"""tiltlab: tilted empirical risk minimization on any array-API backend.

The public face of the package: re-exports only. See ``tiltlab.risk`` for the tilted
risk and weights, ``tiltlab.objective`` for tilted objectives, ``tiltlab.solvers`` for
``minimize`` and ``tilt_path``, and ``tiltlab.bounds``, ``tiltlab.diagnostics`` and
``tiltlab.theory`` for the analysis tools.
"""

from . import (
    _backends,  # noqa: F401  (wires optional backends; registers lazily)
    bounds,
    diagnostics,
    losses,
    plot,
    theory,
)
from .objective import TiltedObjective
from .risk import (
    hierarchical_risk,
    hierarchical_weights,
    tilt_for_ess,
    tilt_for_kl,
    tilted_advantage,
    tilted_risk,
    tilted_weights,
)
from .solvers import OptimizeResult, Status, TiltPath, minimize, minimize_dro, tilt_path

__version__ = "0.1.0.dev0"


def __getattr__(name: str):
    # ``tiltlab.estimators`` needs scikit-learn (an optional extra): imported on first use
    if name == "estimators":
        import importlib

        return importlib.import_module(".estimators", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "tilted_risk",
    "tilted_weights",
    "hierarchical_risk",
    "hierarchical_weights",
    "tilt_for_ess",
    "tilted_advantage",
    "tilt_for_kl",
    "TiltedObjective",
    "minimize",
    "minimize_dro",
    "tilt_path",
    "TiltPath",
    "OptimizeResult",
    "Status",
    "bounds",
    "diagnostics",
    "losses",
    "plot",
    "theory",
]

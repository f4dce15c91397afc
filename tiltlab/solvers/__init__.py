"""Solvers for tilted objectives: ``minimize``, ``tilt_path`` and ``minimize_dro``."""

from ._external import DRIVERS  # noqa: F401  (the table the backends fill)
from ._minimize import METHODS, minimize
from ._result import OptimizeResult, SolverState, Status
from .dro import DROResult, minimize_dro
from .path import TiltPath, tilt_path

__all__ = [
    "minimize",
    "minimize_dro",
    "DROResult",
    "tilt_path",
    "TiltPath",
    "OptimizeResult",
    "Status",
    "SolverState",
    "METHODS",
]

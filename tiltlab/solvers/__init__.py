"""Solvers for tilted objectives: ``minimize`` and ``tilt_path``."""

from ._minimize import METHODS, minimize
from ._result import OptimizeResult, SolverState, Status
from .path import TiltPath, tilt_path

__all__ = [
    "minimize",
    "tilt_path",
    "TiltPath",
    "OptimizeResult",
    "Status",
    "SolverState",
    "METHODS",
]

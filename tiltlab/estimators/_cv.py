"""Choosing the tilt by cross-validation: ``TiltedRegressorCV`` and ``TiltedClassifierCV``.

The search itself is in :mod:`tiltlab.estimators._cv_search`; each estimator has its own
module. This module keeps the import path that earlier versions (and their pickles) use.
"""

from __future__ import annotations

from ._cv_classifier import TiltedClassifierCV
from ._cv_regressor import TiltedRegressorCV
from ._cv_search import DEFAULT_TS

__all__ = ["TiltedRegressorCV", "TiltedClassifierCV", "DEFAULT_TS"]

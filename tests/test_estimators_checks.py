"""scikit-learn's estimator checks for the four tilted estimators."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from tiltlab.estimators import (  # noqa: E402
    TiltedClassifier,
    TiltedClassifierCV,
    TiltedRegressor,
    TiltedRegressorCV,
)

ESTIMATORS = [
    TiltedRegressor(),
    TiltedRegressor(t=-1.0, loss="huber"),
    TiltedClassifier(),
    TiltedClassifier(t=1.0, loss="squared_hinge"),
    TiltedRegressorCV(ts=[-1.0, 0.0, 1.0], cv=3),
    TiltedClassifierCV(ts=[-1.0, 0.0, 1.0], cv=3),
]


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_compatible(estimator, check):
    check(estimator)

"""scikit-learn estimators for tilted empirical risk minimization, and choosing the tilt.

* :class:`TiltedRegressor` - linear regression (squared, absolute or Huber loss),
* :class:`TiltedClassifier` - binary and multiclass linear classification (logistic /
  multinomial, hinge and squared hinge, one-vs-rest for the hinge losses),
* :class:`TiltedRegressorCV`, :class:`TiltedClassifierCV` - choose ``t`` by
  cross-validation over a warm-started tilt path,
* :func:`plot_tilt_scores` - the cross-validated score against ``t`` (matplotlib).

scikit-learn is an optional dependency of tiltlab (``pip install "tiltlab[sklearn]"``);
``import tiltlab`` does not import it, ``import tiltlab.estimators`` does.
"""

from ._classifier import TiltedClassifier
from ._cv import DEFAULT_TS, TiltedClassifierCV, TiltedRegressorCV
from ._plot import plot_tilt_scores
from ._regressor import TiltedRegressor

__all__ = [
    "TiltedRegressor",
    "TiltedClassifier",
    "TiltedRegressorCV",
    "TiltedClassifierCV",
    "DEFAULT_TS",
    "plot_tilt_scores",
]

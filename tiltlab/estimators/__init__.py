"""scikit-learn estimators for tilted empirical risk minimization, and choosing the tilt.

* :class:`TiltedRegressor` - linear regression (squared, absolute, Huber, Poisson or
  pinball loss),
* :class:`TiltedClassifier` - binary and multiclass linear classification (logistic /
  multinomial, hinge and squared hinge, one-vs-rest for the hinge losses),
* :class:`TiltedRegressorCV`, :class:`TiltedClassifierCV` - choose ``t`` by
  cross-validation over a warm-started tilt path,
* :func:`plot_tilt_scores` - the cross-validated score against ``t`` (matplotlib).

scikit-learn is an optional dependency of tiltlab (``pip install "tiltlab[sklearn]"``);
``import tiltlab`` does not import it, ``import tiltlab.estimators`` does.

Conventions: the objective is the tilted risk of the per-sample losses (their mean at
``t = 0``) plus ``alpha/2 * ||coef||^2``; the intercept is the coefficient of an appended
column of ones and is not penalised; ``sample_weight`` gives the prior weights of the
tilted risk. ``alpha`` therefore maps to ``Ridge(alpha=alpha * S / 2)`` and
``LogisticRegression(C=1 / (alpha * S))`` at ``t = 0``, with ``S`` the sum of the sample
weights (``N`` without weights).

Examples
--------
The tilt is a hyper-parameter like any other: a grid search over ``t`` with a robust
scorer picks a negative tilt when a fifth of the targets are corrupted.

>>> import numpy as np
>>> from sklearn.model_selection import GridSearchCV, KFold
>>> from tiltlab.estimators import TiltedRegressor
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 3))
>>> y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=200)
>>> y[:40] = rng.normal(5.0, 5.0, size=40)
>>> search = GridSearchCV(
...     TiltedRegressor(), {"t": [-2.0, -1.0, 0.0, 1.0]},
...     scoring="neg_median_absolute_error", cv=KFold(4, shuffle=True, random_state=0),
... ).fit(X, y)
>>> search.best_params_["t"] < 0
True
>>> np.round(search.best_estimator_.coef_, 1).tolist()
[1.0, -2.0, 0.5]
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

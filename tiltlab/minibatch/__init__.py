"""Tilted losses for models trained on minibatches.

:class:`MinibatchTilt` estimates the tilted risk of a whole data set (and the weights of
its gradient) from one minibatch of per-sample losses at a time, with three estimators
(the paper's running normaliser, multilevel Monte Carlo, and the variational form), at the
sample level or across groups. It works on NumPy, CuPy, PyTorch and the other array-API
libraries; :class:`tiltlab.torch.TiltedLoss` is its ``torch.nn.Module`` form.
:class:`MLMCBatchSampler` draws the random batch sizes of the multilevel estimator, and
:func:`linear_schedule` the paper's tilt ramp.
"""

from ._sampling import MLMCBatchSampler, level_probabilities, linear_schedule
from ._tilt import MinibatchTilt

__all__ = ["MinibatchTilt", "MLMCBatchSampler", "level_probabilities", "linear_schedule"]

"""`TiltedLoss`: tilted losses as a PyTorch module, for training on minibatches.

This package imports PyTorch; ``import tiltlab`` does not import it.
"""

from ._loss import TiltedLoss

TiltedLoss.__module__ = __name__

__all__ = ["TiltedLoss"]

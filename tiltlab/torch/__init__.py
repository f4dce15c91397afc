"""`TiltedLoss`: tilted losses as a PyTorch module, for training on minibatches; the
chunked tilted cross-entropy of a language model's output layer (`tilted_cross_entropy`,
`TiltedCrossEntropy`, `token_cross_entropy`).

This package imports PyTorch; ``import tiltlab`` does not import it.
"""

from ._loss import TiltedLoss
from .cross_entropy import tilted_cross_entropy, token_cross_entropy
from .cross_entropy_module import TiltedCrossEntropy

TiltedLoss.__module__ = __name__
TiltedCrossEntropy.__module__ = __name__

__all__ = [
    "TiltedLoss",
    "TiltedCrossEntropy",
    "tilted_cross_entropy",
    "token_cross_entropy",
]

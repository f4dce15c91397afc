"""Building blocks of the deep-learning reproductions, for notebooks and scripts.

The data, label noise, small networks, training loop and evaluation that
:func:`~tiltlab.reproduce.label_noise`, :func:`~tiltlab.reproduce.noisy_annotators` and
:func:`~tiltlab.reproduce.class_imbalance` are made of, the baselines' per-sample losses,
and the per-group reports of a trained network. PyTorch and scikit-learn are imported on
first use.
"""

from __future__ import annotations

from ._deep import (
    Split,
    accuracy,
    check_device,
    class_accuracies,
    digits_split,
    make_model,
    predict,
    stratified_split,
    train,
    uniform_label_noise,
)
from ._deep_losses import (
    cross_entropy,
    focal_loss,
    generalized_cross_entropy,
    mean_of,
    symmetric_cross_entropy,
)
from ._deep_report import training_losses, training_report

__all__ = [
    "Split",
    "accuracy",
    "check_device",
    "class_accuracies",
    "cross_entropy",
    "digits_split",
    "focal_loss",
    "generalized_cross_entropy",
    "make_model",
    "mean_of",
    "predict",
    "stratified_split",
    "symmetric_cross_entropy",
    "train",
    "training_losses",
    "training_report",
    "uniform_label_noise",
]

"""Shared pieces of the deep-learning reproductions: data, noise, models, losses, training.

The paper's deep experiments (label noise on CIFAR-10, low-quality annotators, class
imbalance on MNIST) are run here in miniature on data that ship offline: scikit-learn's
bundled handwritten digits (1,797 images of 8 x 8 pixels, 10 classes), or the real
CIFAR-10 python batches from a local folder (:func:`tiltlab.datasets.load_cifar10`).
The models are small PyTorch networks (an MLP and a small CNN), trained with Adam on
minibatches, on the CPU by default. PyTorch and scikit-learn are imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Split",
    "accuracy",
    "class_accuracies",
    "digits_split",
    "focal_loss",
    "generalized_cross_entropy",
    "make_model",
    "symmetric_cross_entropy",
    "train",
    "uniform_label_noise",
]


#: Inputs up to this many numbers train with one CPU thread (the digits have 1e5).
SMALL_PROBLEM = 4_000_000


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a test dependency
        raise ImportError(
            "the deep-learning reproductions need PyTorch: pip install torch"
        ) from None
    return torch


@dataclass
class Split:
    """Train, validation and test arrays of one seed (images flattened, float32)."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    image_shape: tuple[int, ...]
    n_classes: int


def digits_split(seed: int, *, val_fraction: float = 0.15, test_fraction: float = 0.25) -> Split:
    """scikit-learn's handwritten digits, split at random (stratified) for one seed.

    Pixels are scaled to ``[0, 1]``; the split is stratified by class.

    Examples
    --------
    >>> from tiltlab.reproduce._deep import digits_split
    >>> s = digits_split(0)
    >>> s.X_train.shape[1], s.n_classes, s.image_shape
    (64, 10, (1, 8, 8))
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - scikit-learn is a test dependency
        raise ImportError(
            "the digits data come with scikit-learn: pip install 'tiltlab[sklearn]'"
        ) from None
    data = load_digits()
    X = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    return stratified_split(X, y, seed, (1, 8, 8), val_fraction, test_fraction)


def stratified_split(
    X: np.ndarray,
    y: np.ndarray,
    seed: int,
    image_shape: tuple[int, ...],
    val_fraction: float = 0.15,
    test_fraction: float = 0.25,
) -> Split:
    """A seeded split of ``(X, y)`` that keeps each class's share in every part."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(test_fraction * idx.size))
        n_val = int(round(val_fraction * idx.size))
        parts[2].append(idx[:n_test])
        parts[1].append(idx[n_test : n_test + n_val])
        parts[0].append(idx[n_test + n_val :])
    tr, va, te = (rng.permutation(np.concatenate(p)) for p in parts)
    return Split(X[tr], y[tr], X[va], y[va], X[te], y[te], image_shape, int(np.max(y)) + 1)


def uniform_label_noise(
    y: np.ndarray, fraction: float, n_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Replace a ``fraction`` of the labels by labels drawn uniformly from all classes.

    Returns the noisy labels and the mask of the replaced rows (a replaced label equals
    the true one with probability ``1 / n_classes``, as in the uniform-noise protocol of
    the paper's CIFAR-10 experiment).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce._deep import uniform_label_noise
    >>> y = np.zeros(1000, dtype=np.int64)
    >>> noisy, replaced = uniform_label_noise(y, 0.4, 10, np.random.default_rng(0))
    >>> int(replaced.sum())
    400
    """
    n = y.size
    replaced = np.zeros(n, dtype=bool)
    replaced[rng.choice(n, size=int(round(fraction * n)), replace=False)] = True
    noisy = y.copy()
    noisy[replaced] = rng.integers(0, n_classes, size=int(replaced.sum()))
    return noisy, replaced


# --------------------------------------------------------------------------- models


def make_model(kind: str, n_features: int, n_classes: int, image_shape: tuple[int, ...]) -> Any:
    """A small network: ``"mlp"`` (one hidden layer of 128) or ``"cnn"`` (two conv layers).

    Examples
    --------
    >>> from tiltlab.reproduce._deep import make_model
    >>> make_model("mlp", 64, 10, (1, 8, 8))[0].in_features
    64
    """
    torch = _torch()
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Linear(n_features, 128), nn.ReLU(), nn.Linear(128, n_classes))
    if kind == "cnn":
        channels, height, width = image_shape
        flat = 32 * (height // 4) * (width // 4)
        return nn.Sequential(
            nn.Unflatten(1, image_shape),
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(flat, n_classes),
        )  # fmt: skip
    raise ValueError(f"`model` must be 'mlp' or 'cnn', got {kind!r}")


# --------------------------------------------------------------------------- per-sample losses


def generalized_cross_entropy(q: float) -> Callable[[Any, Any], Any]:
    """Zhang and Sabuncu's GCE, ``(1 - p_y^q) / q`` per sample (CE as q -> 0, MAE at q = 1).

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce._deep import generalized_cross_entropy
    >>> loss = generalized_cross_entropy(1.0)(torch.zeros(1, 4), torch.tensor([2]))
    >>> round(float(loss[0]), 6)
    0.75
    """
    torch = _torch()

    def gce(logits: Any, target: Any) -> Any:
        p = torch.softmax(logits, dim=1).gather(1, target[:, None])[:, 0]
        return (1.0 - p.clamp_min(1e-12) ** q) / q

    return gce


def symmetric_cross_entropy(
    alpha: float = 0.1, beta: float = 1.0, log_zero: float = -4.0
) -> Callable[[Any, Any], Any]:
    """Wang et al.'s symmetric CE: ``alpha CE + beta RCE`` with ``log 0 = log_zero``.

    The reverse cross-entropy of a one-hot label is ``-log_zero (1 - p_y)``.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce._deep import symmetric_cross_entropy
    >>> loss = symmetric_cross_entropy(0.0, 1.0)(torch.zeros(1, 4), torch.tensor([2]))
    >>> round(float(loss[0]), 6)
    3.0
    """
    torch = _torch()

    def sce(logits: Any, target: Any) -> Any:
        logp = torch.log_softmax(logits, dim=1)
        ce = -logp.gather(1, target[:, None])[:, 0]
        p_y = logp.gather(1, target[:, None])[:, 0].exp()
        return alpha * ce + beta * (-log_zero) * (1.0 - p_y)

    return sce


def focal_loss(gamma: float = 2.0, class_weight: Any = None) -> Callable[[Any, Any], Any]:
    """Lin et al.'s focal loss, ``-a_y (1 - p_y)^gamma log p_y`` per sample.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce._deep import focal_loss
    >>> loss = focal_loss(0.0)(torch.zeros(1, 2), torch.tensor([1]))
    >>> round(float(loss[0]), 6) == round(float(torch.log(torch.tensor(2.0))), 6)
    True
    """
    torch = _torch()

    def focal(logits: Any, target: Any) -> Any:
        logp = torch.log_softmax(logits, dim=1).gather(1, target[:, None])[:, 0]
        out = -((1.0 - logp.exp()).clamp_min(0.0) ** gamma) * logp
        if class_weight is not None:
            out = out * torch.as_tensor(class_weight, dtype=out.dtype, device=out.device)[target]
        return out

    return focal


def cross_entropy(class_weight: Any = None) -> Callable[[Any, Any], Any]:
    """Per-sample cross-entropy, optionally weighted by class (``a_y CE``)."""
    torch = _torch()

    def ce(logits: Any, target: Any) -> Any:
        out = torch.nn.functional.cross_entropy(logits, target, reduction="none")
        if class_weight is not None:
            out = out * torch.as_tensor(class_weight, dtype=out.dtype, device=out.device)[target]
        return out

    return ce


def mean_of(criterion: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    """The plain (ERM) batch objective of a per-sample criterion."""

    def objective(logits: Any, target: Any, groups: Any = None) -> Any:
        return criterion(logits, target).mean()

    return objective


# --------------------------------------------------------------------------- training


def train(
    model: Any,
    X: np.ndarray,
    y: np.ndarray,
    objective: Callable[..., Any],
    *,
    epochs: int,
    seed: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    groups: np.ndarray | None = None,
    device: str = "cpu",
    extra_parameters: Any = (),
) -> Any:
    """Train ``model`` with Adam on shuffled minibatches of ``(X, y)``.

    ``objective(logits, target, groups)`` returns the scalar to minimise for one batch
    (the plain mean of a criterion, or a :class:`tiltlab.torch.TiltedLoss`). A
    non-finite objective stops the run with a ``FloatingPointError`` (a diverged run is
    never reported as a result).
    """
    torch = _torch()
    threads = torch.get_num_threads()
    if device == "cpu" and X.size <= SMALL_PROBLEM:
        # a network this small gains nothing from a second thread on a shared machine
        torch.set_num_threads(1)
    try:
        return _train(
            torch, model, X, y, objective, epochs=epochs, seed=seed, batch_size=batch_size,
            lr=lr, groups=groups, device=device, extra_parameters=extra_parameters,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def _train(torch, model, X, y, objective, *, epochs, seed, batch_size, lr, groups, device,
           extra_parameters):  # fmt: skip
    torch.manual_seed(seed)
    model = model.to(device)
    if hasattr(objective, "to"):
        objective.to(device)
    params = list(model.parameters()) + list(extra_parameters)
    opt = torch.optim.Adam(params, lr=lr)
    Xt = torch.as_tensor(X, device=device)
    yt = torch.as_tensor(y, device=device)
    gt = None if groups is None else torch.as_tensor(groups, device=device)
    gen = torch.Generator().manual_seed(seed)
    n = Xt.shape[0]
    model.train()
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = objective(model(Xt[idx]), yt[idx], None if gt is None else gt[idx])
            if not bool(torch.isfinite(loss)):
                raise FloatingPointError("the training objective became non-finite")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    return model


def predict(model: Any, X: np.ndarray, device: str = "cpu") -> np.ndarray:
    """Predicted classes of ``X`` (host array)."""
    torch = _torch()
    with torch.no_grad():
        logits = model(torch.as_tensor(X, device=device))
    return logits.argmax(dim=1).cpu().numpy()


def accuracy(model: Any, X: np.ndarray, y: np.ndarray, device: str = "cpu") -> float:
    """Share of correctly classified rows."""
    return float(np.mean(predict(model, X, device) == y))


def class_accuracies(
    model: Any, X: np.ndarray, y: np.ndarray, n_classes: int, device: str = "cpu"
) -> np.ndarray:
    """Accuracy within each class (NaN for a class absent from ``y``)."""
    pred = predict(model, X, device)
    out = np.full(n_classes, math.nan)
    for c in range(n_classes):
        mask = y == c
        if mask.any():
            out[c] = float(np.mean(pred[mask] == c))
    return out


def check_device(device: str) -> str:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"``, available on this machine."""
    torch = _torch()
    if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"`device` must be 'cpu' or 'cuda[:N]', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"`device` {device!r}: PyTorch sees no CUDA device here")
    return device

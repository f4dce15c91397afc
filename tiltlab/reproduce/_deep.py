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

from ._deep_losses import (
    _torch,
    cross_entropy,
    focal_loss,
    generalized_cross_entropy,
    mean_of,
    symmetric_cross_entropy,
)

__all__ = [
    "Split",
    "accuracy",
    "class_accuracies",
    "cross_entropy",
    "digits_split",
    "focal_loss",
    "generalized_cross_entropy",
    "make_model",
    "mean_of",
    "symmetric_cross_entropy",
    "train",
    "uniform_label_noise",
]


#: Inputs up to this many numbers train with one CPU thread (the digits have 1e5).
SMALL_PROBLEM = 4_000_000


@dataclass
class Split:
    """Train, validation and test arrays of one seed (images flattened, float32).

    Parameters
    ----------
    X_train, y_train, X_val, y_val, X_test, y_test : numpy.ndarray
        Features ``(n, n_features)`` (float32) and integer labels ``(n,)`` of each part.
    image_shape : tuple of int
        ``(channels, height, width)`` of one image (for the convolutional model).
    n_classes : int
        Number of classes.

    See Also
    --------
    digits_split, stratified_split : Build a split.

    Examples
    --------
    >>> from tiltlab.reproduce.deep import digits_split
    >>> s = digits_split(0)
    >>> s.X_train.dtype, s.X_train.shape[0] + s.X_val.shape[0] + s.X_test.shape[0]
    (dtype('float32'), 1797)
    """

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

    Parameters
    ----------
    seed : int
        Seed of the split.
    val_fraction : float, default 0.15
        Share of each class in the validation part.
    test_fraction : float, default 0.25
        Share of each class in the test part.

    Returns
    -------
    Split
        The 1,797 images flattened to 64 float32 pixels, labels 0-9.

    Raises
    ------
    ImportError
        If scikit-learn is not installed.

    See Also
    --------
    stratified_split : The same split of any data.

    Examples
    --------
    >>> from tiltlab.reproduce.deep import digits_split
    >>> s = digits_split(0)
    >>> s.X_train.shape[1], s.n_classes, s.image_shape
    (64, 10, (1, 8, 8))
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - scikit-learn is a test dependency
        raise ImportError(
            "the digits data come with scikit-learn: pip install scikit-learn"
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
    """A seeded split of ``(X, y)`` that keeps each class's share in every part.

    Parameters
    ----------
    X : numpy.ndarray, shape (n, n_features)
        Features.
    y : numpy.ndarray of int, shape (n,)
        Labels ``0 .. C - 1``.
    seed : int
        Seed of the permutations.
    image_shape : tuple of int
        ``(channels, height, width)`` of one row as an image.
    val_fraction : float, default 0.15
        Share of each class in the validation part (rounded per class).
    test_fraction : float, default 0.25
        Share of each class in the test part (rounded per class).

    Returns
    -------
    Split
        The three parts, each shuffled.

    See Also
    --------
    digits_split : This split of the handwritten digits.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.deep import stratified_split
    >>> X, y = np.zeros((40, 2), np.float32), np.repeat([0, 1], 20)
    >>> s = stratified_split(X, y, 0, (1, 1, 2), val_fraction=0.25, test_fraction=0.25)
    >>> np.bincount(s.y_train).tolist(), np.bincount(s.y_test).tolist()
    ([10, 10], [5, 5])
    """
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

    A replaced label equals the true one with probability ``1 / n_classes``, as in the
    uniform-noise protocol of the paper's CIFAR-10 experiment.

    Parameters
    ----------
    y : numpy.ndarray of int, shape (n,)
        The true labels (not modified).
    fraction : float
        Share of the rows whose label is replaced (rounded to a count).
    n_classes : int
        Number of classes.
    rng : numpy.random.Generator
        The random generator.

    Returns
    -------
    noisy : numpy.ndarray of int, shape (n,)
        The labels after replacement.
    replaced : numpy.ndarray of bool, shape (n,)
        Which rows were replaced.

    See Also
    --------
    tiltlab.reproduce.label_noise : The experiment that uses it.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.deep import uniform_label_noise
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


def make_model(
    kind: str,
    n_features: int,
    n_classes: int,
    image_shape: tuple[int, ...],
    *,
    seed: int | None = None,
) -> Any:
    """A small network: ``"mlp"`` (one hidden layer of 128) or ``"cnn"`` (two conv layers).

    The parameters are float32 and, with ``seed``, initialised from that seed alone
    (whatever PyTorch's default dtype and global generator are at the call).

    Parameters
    ----------
    kind : {"mlp", "cnn"}
        The architecture.
    n_features : int
        Length of a flattened input.
    n_classes : int
        Number of outputs (logits).
    image_shape : tuple of int
        ``(channels, height, width)``: the convolutional model reshapes its input to it.
    seed : int, optional
        Seed of the initialisation (default: PyTorch's global generator).

    Returns
    -------
    torch.nn.Sequential
        The untrained network, mapping ``(batch, n_features)`` to ``(batch, n_classes)``.

    Raises
    ------
    ValueError
        If `kind` is neither ``"mlp"`` nor ``"cnn"``.

    See Also
    --------
    train : Trains the model.

    Examples
    --------
    >>> from tiltlab.reproduce.deep import make_model
    >>> make_model("mlp", 64, 10, (1, 8, 8))[0].in_features
    64
    """
    torch = _torch()
    if kind not in ("mlp", "cnn"):
        raise ValueError(f"`model` must be 'mlp' or 'cnn', got {kind!r}")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            return _build(torch.nn, kind, n_features, n_classes, image_shape)
    finally:
        torch.set_default_dtype(default)


def _build(nn: Any, kind: str, n_features: int, n_classes: int, image_shape: tuple) -> Any:
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

    Parameters
    ----------
    model : torch.nn.Module
        The network (moved to `device`).
    X : numpy.ndarray, shape (n, n_features)
        Training features (float32).
    y : numpy.ndarray of int, shape (n,)
        Training labels.
    objective : callable
        ``objective(logits, target, groups)`` returning the scalar batch loss.
    epochs : int
        Passes over the data.
    seed : int
        Seed of PyTorch's global generator and of the minibatch shuffles.
    batch_size : int, default 64
        Minibatch size.
    lr : float, default 1e-3
        Adam's step size.
    groups : numpy.ndarray, optional
        Group labels of the rows, passed to `objective` batch by batch.
    device : str, default "cpu"
        The PyTorch device.
    extra_parameters : iterable of torch.Tensor, optional
        Further parameters to optimise (for instance a learnable normaliser).

    Returns
    -------
    torch.nn.Module
        The trained model, in evaluation mode.

    Raises
    ------
    FloatingPointError
        If the objective becomes non-finite.

    See Also
    --------
    accuracy, class_accuracies, predict : Evaluate the trained model.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.deep import (
    ...     cross_entropy, digits_split, make_model, mean_of, train)
    >>> s = digits_split(0)
    >>> model = make_model("mlp", 64, 10, s.image_shape).float()  # float32, as the data
    >>> model = train(model, s.X_train, s.y_train, mean_of(cross_entropy()),
    ...               epochs=2, seed=0)
    >>> model.training
    False
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
    Xt = torch.as_tensor(X, device=device)
    model = model.to(device=device, dtype=Xt.dtype)
    if hasattr(objective, "to"):
        objective.to(device)
    params = list(model.parameters()) + list(extra_parameters)
    opt = torch.optim.Adam(params, lr=lr)
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
    """Predicted classes of ``X`` (host array).

    Parameters
    ----------
    model : torch.nn.Module
        A trained network.
    X : numpy.ndarray, shape (n, n_features)
        Features.
    device : str, default "cpu"
        The device the model is on.

    Returns
    -------
    numpy.ndarray of int64, shape (n,)
        The class with the largest logit for each row.

    See Also
    --------
    accuracy, class_accuracies

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.deep import (
    ...     cross_entropy, digits_split, make_model, mean_of, train)
    >>> s = digits_split(0)
    >>> model = make_model("mlp", 64, 10, s.image_shape).float()  # float32, as the data
    >>> model = train(model, s.X_train, s.y_train, mean_of(cross_entropy()),
    ...               epochs=2, seed=0)
    >>> from tiltlab.reproduce.deep import predict
    >>> predict(model, s.X_test[:5]).shape
    (5,)
    """
    torch = _torch()
    with torch.no_grad():
        logits = model(torch.as_tensor(X, device=device))
    return logits.argmax(dim=1).cpu().numpy()


def accuracy(model: Any, X: np.ndarray, y: np.ndarray, device: str = "cpu") -> float:
    """Share of correctly classified rows.

    Parameters
    ----------
    model : torch.nn.Module
        A trained network.
    X : numpy.ndarray, shape (n, n_features)
        Features.
    y : numpy.ndarray of int, shape (n,)
        True labels.
    device : str, default "cpu"
        The device the model is on.

    Returns
    -------
    float
        The accuracy, in ``[0, 1]``.

    See Also
    --------
    class_accuracies : The accuracy within each class.
    predict : The predicted classes.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.deep import (
    ...     cross_entropy, digits_split, make_model, mean_of, train)
    >>> s = digits_split(0)
    >>> model = make_model("mlp", 64, 10, s.image_shape).float()  # float32, as the data
    >>> model = train(model, s.X_train, s.y_train, mean_of(cross_entropy()),
    ...               epochs=2, seed=0)
    >>> from tiltlab.reproduce.deep import accuracy
    >>> bool(accuracy(model, s.X_test, s.y_test) > 0.5)  # chance is 0.1
    True
    """
    return float(np.mean(predict(model, X, device) == y))


def class_accuracies(
    model: Any, X: np.ndarray, y: np.ndarray, n_classes: int, device: str = "cpu"
) -> np.ndarray:
    """Accuracy within each class (NaN for a class absent from ``y``).

    Parameters
    ----------
    model : torch.nn.Module
        A trained network.
    X : numpy.ndarray, shape (n, n_features)
        Features.
    y : numpy.ndarray of int, shape (n,)
        True labels.
    n_classes : int
        Number of classes.
    device : str, default "cpu"
        The device the model is on.

    Returns
    -------
    numpy.ndarray, shape (n_classes,)
        The share of the rows of each class that are classified correctly.

    See Also
    --------
    accuracy : The overall accuracy.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.deep import (
    ...     cross_entropy, digits_split, make_model, mean_of, train)
    >>> s = digits_split(0)
    >>> model = make_model("mlp", 64, 10, s.image_shape).float()  # float32, as the data
    >>> model = train(model, s.X_train, s.y_train, mean_of(cross_entropy()),
    ...               epochs=2, seed=0)
    >>> from tiltlab.reproduce.deep import class_accuracies
    >>> class_accuracies(model, s.X_test, s.y_test, 10).shape
    (10,)
    """
    pred = predict(model, X, device)
    out = np.full(n_classes, math.nan)
    for c in range(n_classes):
        mask = y == c
        if mask.any():
            out[c] = float(np.mean(pred[mask] == c))
    return out


def check_device(device: str) -> str:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"``, available on this machine.

    Parameters
    ----------
    device : str
        The device to check.

    Returns
    -------
    str
        `device`, unchanged.

    Raises
    ------
    ValueError
        If `device` is not ``"cpu"`` or ``"cuda[:N]"``, or CUDA is not available.

    See Also
    --------
    train : Trains on the checked device.

    Examples
    --------
    >>> from tiltlab.reproduce.deep import check_device
    >>> check_device("cpu")
    'cpu'
    """
    torch = _torch()
    if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"`device` must be 'cpu' or 'cuda[:N]', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"`device` {device!r}: PyTorch sees no CUDA device here")
    return device

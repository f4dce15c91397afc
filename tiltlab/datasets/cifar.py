"""The CIFAR-10 python batches, read from a local folder (never downloaded).

CIFAR-10 (Krizhevsky, 2009) is not shipped with tiltlab. Users who have the "python
version" of the data (the folder ``cifar-10-batches-py`` with ``data_batch_1`` ...
``data_batch_5`` and ``test_batch``, each a pickled dict with ``data``, a ``uint8``
array of shape ``(N, 3072)``, and ``labels``) can point
:func:`~tiltlab.datasets.load_cifar10` at it to run the paper's own setting of the deep
reproductions.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

__all__ = ["CIFAR10_CLASSES", "load_cifar10"]

#: The ten class names, in label order.
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip

_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST = "test_batch"


def _read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as fh:
        batch: dict[Any, Any] = pickle.load(fh, encoding="bytes")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (no 'data' and 'labels')")
    data = np.asarray(data)
    labels = np.asarray(labels, dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: 'data' must be uint8 of shape (N, 3072), got "
                         f"{data.dtype} {data.shape}")  # fmt: skip
    if labels.shape != (data.shape[0],) or labels.min() < 0 or labels.max() > 9:
        raise ValueError(f"{path}: 'labels' must be N integers in 0..9")
    return data, labels


def load_cifar10(data_dir: str) -> dict[str, np.ndarray]:
    """CIFAR-10 from the python batches in ``data_dir``.

    Parameters
    ----------
    data_dir : str
        The folder holding ``data_batch_1`` ... ``data_batch_5`` and ``test_batch``, or
        its parent (containing ``cifar-10-batches-py``). Batches that are missing from
        the training set are skipped (at least one is needed); ``test_batch`` is
        required.

    Returns
    -------
    dict
        ``X_train``, ``X_test`` (float32 in ``[0, 1]``, shape ``(N, 3072)``, channels
        first: reshape to ``(N, 3, 32, 32)``), ``y_train``, ``y_test`` (int64).

    Raises
    ------
    FileNotFoundError
        No batches in ``data_dir``.
    ValueError
        A file is not a CIFAR-10 python batch.

    See Also
    --------
    tiltlab.datasets.load_hiv1 : A shipped classification data set.

    Examples
    --------
    >>> from tiltlab.datasets.cifar import load_cifar10
    >>> load_cifar10("/no/such/folder")
    Traceback (most recent call last):
    ...
    FileNotFoundError: `data_dir` /no/such/folder: no CIFAR-10 python batches ...
    """
    if not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"`data_dir` must be a folder path, got {type(data_dir).__name__}")
    folder = os.fspath(data_dir)
    nested = os.path.join(folder, "cifar-10-batches-py")
    if os.path.isdir(nested):
        folder = nested
    train = [os.path.join(folder, name) for name in _TRAIN]
    train = [p for p in train if os.path.isfile(p)]
    test = os.path.join(folder, _TEST)
    if not train or not os.path.isfile(test):
        raise FileNotFoundError(
            f"`data_dir` {data_dir}: no CIFAR-10 python batches (data_batch_1..5 and "
            "test_batch; the data are not shipped with tiltlab and never downloaded)"
        )
    parts = [_read_batch(p) for p in train]
    X_test, y_test = _read_batch(test)
    return {
        "X_train": np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0,
        "y_train": np.concatenate([p[1] for p in parts]),
        "X_test": X_test.astype(np.float32) / 255.0,
        "y_test": y_test,
    }

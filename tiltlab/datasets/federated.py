"""Federated data: one (train, test) split per device.

* :func:`synthetic_federated` - the "synthetic (alpha, beta)" data of the q-FFL and FedProx
  papers, generated here from their published recipe (and seeded);
* :func:`load_leaf_federated` - a local copy of a federated data set in the LEAF JSON
  layout (for example the Vehicle sensor data of the TERM paper's fair federated-learning
  table, which tiltlab does not ship).

Both return a :class:`FederatedData` of host-side NumPy arrays: float64 features and
integer class labels ``0 .. n_classes - 1``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["FederatedData", "load_leaf_federated", "synthetic_federated"]


@dataclass(frozen=True)
class FederatedData:
    """Per-device training and test data.

    Attributes
    ----------
    name : str
        The data set.
    X_train, y_train, X_test, y_test : tuple of ndarray
        One entry per device: ``(n_k, d)`` float64 features and ``(n_k,)`` int64 labels.
    n_classes : int
        Number of classes; labels lie in ``0 .. n_classes - 1``.
    device_names : tuple of str
        One name per device.

    See Also
    --------
    synthetic_federated, load_leaf_federated : The loaders that return it.

    Examples
    --------
    >>> from tiltlab.datasets import synthetic_federated
    >>> data = synthetic_federated(n_devices=3, seed=0)
    >>> data.n_devices, data.n_features, len(data.device_names)
    (3, 60, 3)
    >>> data.train_sizes.shape
    (3,)
    """

    name: str
    X_train: tuple[np.ndarray, ...]
    y_train: tuple[np.ndarray, ...]
    X_test: tuple[np.ndarray, ...]
    y_test: tuple[np.ndarray, ...]
    n_classes: int
    device_names: tuple[str, ...]

    @property
    def n_devices(self) -> int:
        """Number of devices."""
        return len(self.X_train)

    @property
    def n_features(self) -> int:
        """Number of features ``d``."""
        return int(self.X_train[0].shape[1])

    @property
    def train_sizes(self) -> np.ndarray:
        """Training rows per device."""
        return np.array([x.shape[0] for x in self.X_train])


def synthetic_federated(
    alpha: float = 1.0,
    beta: float = 1.0,
    *,
    iid: bool = False,
    n_devices: int = 100,
    n_features: int = 60,
    n_classes: int = 10,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> FederatedData:
    """The q-FFL/FedProx "synthetic (alpha, beta)" federated classification data.

    The recipe of Li et al. (FedProx, 2020; q-FFL, 2020), which extends Shamir et al.'s:
    device ``k`` holds ``floor(LogNormal(4, 2)) + 50`` samples; its model
    ``y = argmax(x W_k + b_k)`` has ``W_k, b_k`` entries drawn from ``N(u_k, 1)`` with
    ``u_k ~ N(0, alpha^2)``, and its features ``x ~ N(v_k, Sigma)`` with ``Sigma``
    diagonal, ``Sigma_jj = j^-1.2``, and ``v_k`` entries from ``N(B_k, 1)``,
    ``B_k ~ N(0, beta^2)`` (``alpha`` and ``beta`` are the standard deviations the
    published script draws with):
    ``alpha`` controls how much the devices' models differ, ``beta`` how much their data
    do. The "iid" variant shares one model ``W, b ~ N(0, 1)`` and one feature mean (zero)
    across devices, with sizes ``floor(LogNormal(4, 1)) + 50``. Each device's rows are
    shuffled and split ``1 - test_fraction`` / ``test_fraction`` (90/10 in the original).

    The original scripts draw from NumPy's global random state without a seed; here
    everything comes from ``numpy.random.default_rng(seed)``.

    Parameters
    ----------
    alpha, beta : float, default 1.0
        The heterogeneity of the models and of the features (the q-FFL paper's synthetic
        data set is ``(1, 1)``). Ignored when ``iid``.
    iid : bool, default False
        The "synthetic iid" variant.
    n_devices, n_features, n_classes : int, default 100, 60, 10
        Number of devices, of features and of classes.
    test_fraction : float, default 0.1
        Share of each device's rows held out for testing.
    seed : int, default 0
        Seed of the generator: the same seed gives the same data.

    Returns
    -------
    FederatedData
        Per-device training and test rows.

    See Also
    --------
    load_leaf_federated : Federated data from LEAF files.
    FederatedData : The returned container.

    Examples
    --------
    >>> from tiltlab.datasets import synthetic_federated
    >>> data = synthetic_federated(seed=0)
    >>> data.n_devices, data.n_features, data.n_classes
    (100, 60, 10)
    >>> bool(data.train_sizes.min() >= 45)
    True
    """
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"`{name}` must be a finite non-negative number, got {v!r}")
    for name, v, lo in (("n_devices", n_devices, 1), ("n_features", n_features, 1),
                        ("n_classes", n_classes, 2)):  # fmt: skip
        if isinstance(v, bool) or int(v) != v or v < lo:
            raise ValueError(f"`{name}` must be an integer of at least {lo}, got {v!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"`test_fraction` must lie in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    K, d, C = int(n_devices), int(n_features), int(n_classes)
    sizes = rng.lognormal(4.0, 1.0 if iid else 2.0, K).astype(np.int64) + 50
    std = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # sqrt of Sigma_jj = j^-1.2
    if iid:
        W_all = rng.normal(0.0, 1.0, (d, C))
        b_all = rng.normal(0.0, 1.0, C)
        means = np.zeros((K, d))
    else:
        u = rng.normal(0.0, alpha, K)  # alpha and beta are standard deviations there
        B = rng.normal(0.0, beta, K)
        means = rng.normal(B[:, None], 1.0, (K, d))
    Xtr, ytr, Xte, yte = [], [], [], []
    for k in range(K):
        if iid:
            W, b = W_all, b_all
        else:
            W = rng.normal(u[k], 1.0, (d, C))
            b = rng.normal(u[k], 1.0, C)
        X = means[k] + std * rng.standard_normal((int(sizes[k]), d))
        y = np.argmax(X @ W + b, axis=1).astype(np.int64)
        order = rng.permutation(X.shape[0])
        n_train = int((1.0 - test_fraction) * X.shape[0])
        Xtr.append(X[order[:n_train]])
        ytr.append(y[order[:n_train]])
        Xte.append(X[order[n_train:]])
        yte.append(y[order[n_train:]])
    name = "synthetic iid" if iid else f"synthetic ({alpha:g}, {beta:g})"
    names = tuple(f"f_{k:05d}" for k in range(K))
    return FederatedData(name, tuple(Xtr), tuple(ytr), tuple(Xte), tuple(yte), C, names)


def _read_leaf_folder(folder: str) -> dict:
    files = sorted(f for f in os.listdir(folder) if f.endswith(".json"))
    if not files:
        raise ValueError(f"`data_dir` folder {folder!r} holds no .json file")
    users: dict = {}
    for f in files:
        with open(os.path.join(folder, f), encoding="utf-8") as fh:
            try:
                payload = json.load(fh)
            except json.JSONDecodeError as exc:
                raise ValueError(f"`data_dir` file {f}: not JSON ({exc})") from exc
        if not isinstance(payload, dict) or "user_data" not in payload:
            raise ValueError(f"`data_dir` file {f}: no 'user_data' (not the LEAF layout)")
        users.update(payload["user_data"])
    return users


def load_leaf_federated(data_dir: str | os.PathLike, *, name: str | None = None) -> FederatedData:
    """A federated data set stored in the LEAF JSON layout (as the q-FFL code reads it).

    ``data_dir`` holds ``train/`` and ``test/`` folders of ``*.json`` files, each
    ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[...], ...],
    "y": [...]}}}``; the devices are the users found in both, in sorted order. Labels
    (any numbers, e.g. the Vehicle data's -1/+1) are mapped to ``0 .. n_classes - 1`` in
    sorted order over all devices.

    Parameters
    ----------
    data_dir : path
        Folder with the ``train/`` and ``test/`` sub-folders.
    name : str, optional
        Name of the data set (default: the folder's name).

    Returns
    -------
    FederatedData
        Per-device training and test rows, one device per user found in both files.

    See Also
    --------
    synthetic_federated : Synthetic federated data.
    FederatedData : The returned container.

    Examples
    --------
    >>> import json, os, tempfile
    >>> from tiltlab.datasets import load_leaf_federated
    >>> root = tempfile.mkdtemp()
    >>> for split in ("train", "test"):
    ...     os.makedirs(os.path.join(root, split))
    ...     data = {"u1": {"x": [[0.0, 1.0], [1.0, 0.0]], "y": [-1, 1]},
    ...             "u2": {"x": [[2.0, 2.0]], "y": [1]}}
    ...     with open(os.path.join(root, split, "data.json"), "w") as fh:
    ...         json.dump({"users": ["u1", "u2"], "num_samples": [2, 1],
    ...                    "user_data": data}, fh)
    >>> fed = load_leaf_federated(root)
    >>> fed.n_devices, fed.n_classes, fed.y_train[0].tolist()
    (2, 2, [0, 1])
    """
    root = os.fspath(data_dir)
    parts = {}
    for split in ("train", "test"):
        folder = os.path.join(root, split)
        if not os.path.isdir(folder):
            raise ValueError(f"`data_dir` {root!r} must hold a {split}/ folder (LEAF layout)")
        parts[split] = _read_leaf_folder(folder)
    users = sorted(set(parts["train"]) & set(parts["test"]))
    if not users:
        raise ValueError(f"`data_dir` {root!r}: no device has both training and test data")
    arrays: dict[str, list] = {"Xtr": [], "ytr": [], "Xte": [], "yte": []}
    for u in users:
        for split, kx, ky in (("train", "Xtr", "ytr"), ("test", "Xte", "yte")):
            entry = parts[split][u]
            X = np.asarray(entry["x"], dtype=np.float64)
            y = np.asarray(entry["y"], dtype=np.float64).reshape(-1)
            if X.ndim != 2 or X.shape[0] != y.shape[0] or X.shape[0] == 0:
                raise ValueError(
                    f"`data_dir` device {u!r} ({split}): 'x' must be a non-empty list of "
                    f"rows with one label per row, got shapes {X.shape} and {y.shape}"
                )
            if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
                raise ValueError(f"`data_dir` device {u!r} ({split}) holds non-finite values")
            arrays[kx].append(X)
            arrays[ky].append(y)
    d = arrays["Xtr"][0].shape[1]
    if any(x.shape[1] != d for x in arrays["Xtr"] + arrays["Xte"]):
        raise ValueError("`data_dir`: every device must have the same number of features")
    labels = np.unique(np.concatenate(arrays["ytr"] + arrays["yte"]))
    if labels.size < 2:
        raise ValueError("`data_dir`: the data hold a single class")

    def encode(y):
        return np.searchsorted(labels, y).astype(np.int64)

    return FederatedData(
        name or os.path.basename(os.path.abspath(root)),
        tuple(arrays["Xtr"]),
        tuple(encode(y) for y in arrays["ytr"]),
        tuple(arrays["Xte"]),
        tuple(encode(y) for y in arrays["yte"]),
        int(labels.size),
        tuple(users),
    )

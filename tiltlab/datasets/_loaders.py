"""Loaders for the real data sets used in the TERM paper's experiments.

The raw files live in ``tiltlab/datasets/data/`` and are read through
:mod:`importlib.resources`, so the loaders work from a source checkout and from an
installed wheel alike, without network access. See ``data/README.md`` for provenance
and licences.

All three loaders follow the protocol of the paper's reference code:

1. build the full design matrix (deterministic row order),
2. shuffle the rows with ``np.random.RandomState(seed).permutation``,
3. split into train / validation / test at ``int(n * split[0])`` and
   ``int(n * (split[0] + split[1]))`` (for Drug Discovery: 3268 / 408 / 409 rows),
4. corrupt the *first* ``int(noise * n_split)`` rows of the training and of the validation
   split (a uniformly random subset, since the rows were shuffled); with ``genie=True``
   those rows are dropped instead. The test split is never corrupted.

The noise draws continue the same ``RandomState`` stream that produced the permutation,
which reproduces the authors' data exactly (their scripts call ``np.random.seed(i)``,
``np.random.permutation`` and then ``np.random.normal`` on the global generator).

These are host-side helpers: they return NumPy ``float64`` arrays. Convert with your
array library (``cupy.asarray``, ``torch.from_numpy``...) to run the solvers elsewhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

__all__ = [
    "ABALONE_FEATURES",
    "AMINO_ACIDS",
    "DatasetSplit",
    "load_abalone",
    "load_drug_discovery",
    "load_hiv1",
]

#: Amino-acid alphabet used to one-hot encode the HIV-1 octamers (20 letters).
AMINO_ACIDS = "ARNDCQEGHILKMFPSTWYV"

#: Column names of the abalone design matrix returned by :func:`load_abalone`.
ABALONE_FEATURES = (
    "sex_male",
    "length",
    "diameter",
    "height",
    "whole_weight",
    "shucked_weight",
    "viscera_weight",
    "shell_weight",
    "intercept",
)

_DATA_PACKAGE = "tiltlab.datasets"


@dataclass
class DatasetSplit:
    """Train / validation / test split of one data set, as NumPy ``float64`` arrays.

    Attributes
    ----------
    X_train, y_train, X_val, y_val, X_test, y_test : numpy.ndarray
        Design matrices of shape ``(n_split, n_features)`` and targets of shape
        ``(n_split,)``. Classification targets are ``0.0``/``1.0``.
    noisy_train, noisy_val : numpy.ndarray of bool
        Which rows of ``X_train``/``X_val`` had their target replaced (all ``False`` when
        ``noise=0`` or ``genie=True``, where the noisy rows were dropped).
    feature_names : tuple of str
        One name per column of the design matrices.
    description : str
        One paragraph saying what was loaded and how it was corrupted.

    See Also
    --------
    load_drug_discovery, load_abalone, load_hiv1 : The loaders that return it.

    Examples
    --------
    >>> from tiltlab.datasets import load_abalone
    >>> data = load_abalone(noise=0.2, seed=0)
    >>> data.n_features == data.X_train.shape[1] == len(data.feature_names)
    True
    >>> bool(data.noisy_train.any())
    True
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    noisy_train: np.ndarray
    noisy_val: np.ndarray
    feature_names: tuple[str, ...] = field(default_factory=tuple)
    description: str = ""

    @property
    def n_features(self) -> int:
        """Number of columns of the design matrices (an int)."""
        return int(self.X_train.shape[1])

    def __repr__(self) -> str:  # arrays are large; show shapes only
        return (
            f"DatasetSplit(train={self.X_train.shape}, val={self.X_val.shape}, "
            f"test={self.X_test.shape}, noisy_train={int(self.noisy_train.sum())}, "
            f"noisy_val={int(self.noisy_val.sum())})"
        )


# --------------------------------------------------------------------------- raw files


def _data_file(*parts: str):
    return resources.files(_DATA_PACKAGE).joinpath("data", *parts)


def _readonly(*arrays: np.ndarray) -> Any:
    for a in arrays:
        a.setflags(write=False)
    return arrays


@functools.lru_cache(maxsize=1)
def _drug_raw() -> tuple[np.ndarray, np.ndarray]:
    """qsar.mat: train and test stacked (4085 x 410, 0/1 entries) and the targets."""
    from scipy.io import loadmat

    with _data_file("qsar.mat").open("rb") as fh:
        mat = loadmat(fh)
    X = np.concatenate([mat["X_train"], mat["X_test"]], axis=0).astype(np.float64)
    y = np.concatenate([mat["y_train"], mat["y_test"]], axis=0).astype(np.float64).ravel()
    return _readonly(X, y)


@functools.lru_cache(maxsize=1)
def _abalone_raw() -> tuple[np.ndarray, np.ndarray]:
    """abalone.data: 4177 rows of (sex, 7 measurements) and the ring count."""
    rows = []
    targets = []
    text = _data_file("abalone.data").read_text(encoding="ascii")
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.strip().split(",")
        if len(fields) != 9:
            raise ValueError(f"abalone.data line {lineno}: expected 9 fields, got {len(fields)}")
        # Reference encoding: male -> 1, female and infant -> 0.
        rows.append([1.0 if fields[0] == "M" else 0.0, *map(float, fields[1:8])])
        targets.append(float(fields[8]))
    return _readonly(np.asarray(rows, dtype=np.float64), np.asarray(targets, dtype=np.float64))


@functools.lru_cache(maxsize=1)
def _hiv1_raw() -> tuple[np.ndarray, np.ndarray]:
    """hiv1/*.txt in sorted file-name order: one-hot octamers (6590 x 160), labels 0/1."""
    index = {letter: i for i, letter in enumerate(AMINO_ACIDS)}
    folder = _data_file("hiv1")
    files = sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith(".txt")),
        key=lambda entry: entry.name,
    )
    rows: list[list[int]] = []
    labels: list[float] = []
    for entry in files:
        for lineno, line in enumerate(entry.read_text(encoding="ascii").splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            octamer, label = line.split(",")
            if len(octamer) != 8 or label not in ("1", "-1"):
                raise ValueError(f"hiv1/{entry.name} line {lineno}: malformed entry {line!r}")
            try:
                rows.append([20 * pos + index[c] for pos, c in enumerate(octamer)])
            except KeyError as exc:
                raise ValueError(
                    f"hiv1/{entry.name} line {lineno}: unknown amino acid {exc.args[0]!r}"
                ) from None
            labels.append(1.0 if label == "1" else 0.0)
    hot = np.asarray(rows, dtype=np.intp)
    X = np.zeros((hot.shape[0], 20 * 8), dtype=np.float64)
    np.put_along_axis(X, hot, 1.0, axis=1)
    return _readonly(X, np.asarray(labels, dtype=np.float64))


# --------------------------------------------------------------------------- protocol


def _check_fraction(value, name: str) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"`{name}` must lie in [0, 1], got {value!r}")
    return value


def _split_points(n: int, split) -> tuple[int, int]:
    try:
        parts = tuple(float(s) for s in split)
    except TypeError:
        raise TypeError(f"`split` must be a sequence of three fractions, got {split!r}") from None
    if len(parts) != 3 or min(parts) < 0 or abs(sum(parts) - 1.0) > 1e-9:
        raise ValueError(
            f"`split` must be three non-negative fractions summing to 1, got {split!r}"
        )
    first = int(n * parts[0])
    second = int(n * (parts[0] + parts[1]))
    return first, second


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"`seed` must be an integer, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"`seed` must be non-negative, got {seed}")
    return int(seed)


def _regression_split(
    X: np.ndarray,
    y: np.ndarray,
    *,
    seed: int,
    noise: float,
    genie: bool,
    split,
    noise_mean: float,
    noise_std: float,
    corrupt_features: float | None = None,
    corrupt_targets: float | None = None,
    n_train: int | None = None,
    feature_names: tuple[str, ...],
    name: str,
) -> DatasetSplit:
    seed = _check_seed(seed)
    noise = _check_fraction(noise, "noise")
    if float(noise_std) < 0:
        raise ValueError(f"`noise_std` must be non-negative, got {noise_std!r}")
    rng = np.random.RandomState(seed)
    perm = rng.permutation(X.shape[0])
    X, y = X[perm], y[perm]  # fancy indexing: fresh, writable copies of the cache
    a, b = _split_points(X.shape[0], split)
    X_tr, y_tr = X[:a], y[:a]
    X_va, y_va = X[a:b], y[a:b]
    X_te, y_te = X[b:], y[b:]
    if n_train is not None:
        if not 1 <= int(n_train) <= X_tr.shape[0]:
            raise ValueError(f"`n_train` must lie in [1, {X_tr.shape[0]}], got {n_train!r}")
        X_tr, y_tr = X_tr[: int(n_train)], y_tr[: int(n_train)]

    k_tr = int(X_tr.shape[0] * noise)
    k_va = int(X_va.shape[0] * noise)
    noisy_tr = np.zeros(X_tr.shape[0], dtype=bool)
    noisy_va = np.zeros(X_va.shape[0], dtype=bool)
    if genie:
        X_tr, y_tr = X_tr[k_tr:], y_tr[k_tr:]
        X_va, y_va = X_va[k_va:], y_va[k_va:]
        noisy_tr, noisy_va = noisy_tr[k_tr:], noisy_va[k_va:]
        how = f"the {k_tr} training and {k_va} validation rows that would be noisy were dropped"
    elif corrupt_targets is not None:
        # Feature-and-target scaling (Yu et al. 2012 setup): no random draws needed.
        for Xs, ys, k, mask in ((X_tr, y_tr, k_tr, noisy_tr), (X_va, y_va, k_va, noisy_va)):
            Xs[:k, :-1] *= corrupt_features
            ys[:k] *= corrupt_targets
            mask[:k] = True
        how = (
            f"{k_tr} training and {k_va} validation rows had their features (not the "
            f"intercept) multiplied by {corrupt_features:g} and targets by {corrupt_targets:g}"
        )
    else:
        y_tr[:k_tr] = rng.normal(noise_mean, noise_std, k_tr)
        y_va[:k_va] = rng.normal(noise_mean, noise_std, k_va)
        noisy_tr[:k_tr] = True
        noisy_va[:k_va] = True
        how = (
            f"{k_tr} training and {k_va} validation targets were replaced by draws from "
            f"N({noise_mean:g}, {noise_std:g}^2)"
        )
    description = (
        f"{name}: {X.shape[0]} rows x {X.shape[1]} features (intercept last), shuffled with "
        f"seed {seed}, split {X_tr.shape[0]}/{X_va.shape[0]}/{X_te.shape[0]}; "
        f"noise fraction {noise:g}: {how}. The test split is clean."
    )
    return DatasetSplit(
        X_tr, y_tr, X_va, y_va, X_te, y_te, noisy_tr, noisy_va, feature_names, description
    )


def _finish(data: DatasetSplit, return_mask: bool):
    return (data, data.noisy_train) if return_mask else data


# --------------------------------------------------------------------------- public


def load_drug_discovery(
    *,
    seed: int = 0,
    noise: float = 0.0,
    genie: bool = False,
    split=(0.8, 0.1, 0.1),
    noise_mean: float = 5.0,
    noise_std: float = 5.0,
    return_mask: bool = False,
):
    """Drug Discovery (QSAR) regression data with the paper's noisy-target protocol.

    The train and test parts of ``qsar.mat`` are stacked (4085 compounds, 410 binary
    fingerprint features), an intercept column of ones is appended (411 features), rows are
    shuffled with ``np.random.RandomState(seed)`` and split 80/10/10 (3268/408/409 rows).
    A fraction ``noise`` of the training and validation targets is then replaced by draws
    from ``N(noise_mean, noise_std**2)`` (the paper's N(5, 5), standard deviation 5).
    This is the setting of the paper's robust-regression table (20%, 40%, 80% noise,
    seeds 0-4).

    Parameters
    ----------
    seed : int, default 0
        Seed of the shuffle and of the noise draws (the paper's trial index).
    noise : float in [0, 1], default 0.0
        Fraction of training and of validation rows whose target is corrupted
        (``int(noise * n_rows)`` rows in each split).
    genie : bool, default False
        Oracle variant ("Genie ERM"): drop the rows that would have been corrupted instead
        of corrupting them. (The authors' script drops them from the training split only
        and keeps the validation split whole; here both splits lose them, which does not
        change the training data or the test split.)
    split : three floats, default (0.8, 0.1, 0.1)
        Train / validation / test fractions; cut points are ``int(n * split[0])`` and
        ``int(n * (split[0] + split[1]))``.
    noise_mean, noise_std : float, default 5.0
        Mean and standard deviation of the replacement targets.
    return_mask : bool, default False
        If True, return ``(data, data.noisy_train)`` instead of ``data``.

    Returns
    -------
    DatasetSplit
        ``X_*`` of shape ``(n, 411)`` and ``y_*`` of shape ``(n,)``, float64, plus the
        boolean masks ``noisy_train``/``noisy_val``. Each call returns fresh copies.

    See Also
    --------
    tiltlab.reproduce.robust_regression : The paper's experiment on it.
    tiltlab.baselines : The other methods of that experiment.

    Examples
    --------
    >>> from tiltlab.datasets import load_drug_discovery
    >>> data = load_drug_discovery(seed=0, noise=0.2)
    >>> data.X_train.shape, data.X_val.shape, data.X_test.shape
    ((3268, 411), (408, 411), (409, 411))
    >>> int(data.noisy_train.sum()), int(data.noisy_val.sum())
    (653, 81)
    """
    X, y = _drug_raw()
    X = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)
    names = tuple(f"fingerprint_{j}" for j in range(X.shape[1] - 1)) + ("intercept",)
    data = _regression_split(
        X,
        y,
        seed=seed,
        noise=noise,
        genie=genie,
        split=split,
        noise_mean=noise_mean,
        noise_std=noise_std,
        feature_names=names,
        name="Drug Discovery (QSAR, Olier et al. 2018)",
    )
    return _finish(data, return_mask)


def load_abalone(
    *,
    seed: int = 0,
    noise: float = 0.0,
    genie: bool = False,
    split=(0.8, 0.1, 0.1),
    noise_mean: float = 5.0,
    noise_std: float = 5.0,
    corruption: str = "gaussian",
    n_train: int | None = None,
    return_mask: bool = False,
):
    """UCI abalone regression data (ring count) with the same noisy-target protocol.

    Preprocessing follows the reference code: sex becomes 1 for male and 0 otherwise, the
    8 features are z-scored over all 4177 rows (``(x - mean) / (std + 1e-6)``, population
    std, computed in float64 where the reference used float32), an intercept column is
    appended (9 columns), rows are shuffled with ``RandomState(seed)`` and split 80/10/10
    (3341/418/418 rows).

    Parameters
    ----------
    seed, noise, genie, split, noise_mean, noise_std, return_mask
        As in :func:`load_drug_discovery`.
    corruption : {"gaussian", "scale"}, default "gaussian"
        ``"gaussian"``: replace noisy targets by draws from ``N(noise_mean, noise_std**2)``.
        ``"scale"``: the feature-and-target noise of the paper's appendix (after Yu et al.,
        2012): multiply the noisy rows' features (not the intercept) by 100 and their
        targets by 10000. Use it with ``n_train=100, noise=0.05``.
    n_train : int, optional
        Keep only the first ``n_train`` rows of the training split (before corruption).

    Returns
    -------
    DatasetSplit
        ``X_*`` of shape ``(n, 9)``, ``y_*`` of shape ``(n,)``, float64.

    See Also
    --------
    tiltlab.reproduce.abalone : The paper's experiment on it.

    Examples
    --------
    >>> from tiltlab.datasets import load_abalone
    >>> data = load_abalone(seed=1, noise=0.4)
    >>> data.X_train.shape, data.X_test.shape
    ((3341, 9), (418, 9))
    >>> small = load_abalone(noise=0.05, corruption="scale", n_train=100)
    >>> small.X_train.shape, int(small.noisy_train.sum())
    ((100, 9), 5)
    """
    if corruption not in ("gaussian", "scale"):
        raise ValueError(f"`corruption` must be 'gaussian' or 'scale', got {corruption!r}")
    X, y = _abalone_raw()
    X = (X - X.mean(axis=0)) / (X.std(axis=0) + 1e-6)
    X = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)
    scale = corruption == "scale"
    data = _regression_split(
        X,
        y,
        seed=seed,
        noise=noise,
        genie=genie,
        split=split,
        noise_mean=noise_mean,
        noise_std=noise_std,
        corrupt_features=100.0 if scale else None,
        corrupt_targets=10000.0 if scale else None,
        n_train=n_train,
        feature_names=ABALONE_FEATURES,
        name="UCI abalone",
    )
    return _finish(data, return_mask)


def load_hiv1(
    *,
    seed: int = 0,
    noise: float = 0.0,
    genie: bool = False,
    split=(0.8, 0.1, 0.1),
    imbalance: float | None = None,
    intercept: bool = False,
    return_mask: bool = False,
):
    """UCI HIV-1 protease cleavage classification data (6590 octamers, 160 binary features).

    Each octamer is one-hot encoded position by position over :data:`AMINO_ACIDS`
    (8 x 20 = 160 columns, feature ``20 * position + letter``; each row sums to 8). The
    four files are read in sorted name order, label ``-1`` becomes 0 and ``1`` becomes 1
    (1360 rows of class 1, the rare class, against 5230 of class 0: about 1:4; the paper's
    tables call the rare class "Y = 0", but its code, like this loader, encodes it as 1).
    Rows are shuffled with ``RandomState(seed)`` and split 80/10/10 (5272/659/659 rows).

    Optional corruptions, applied to the training split (noise also to validation), in the
    order of the reference code:

    * ``imbalance``: keep all class-0 training rows and only the first
      ``int(imbalance * n_class0)`` class-1 rows (``imbalance=0.05`` gives the paper's
      1:20), then reshuffle the training rows with ``RandomState(seed + 123456)``.
    * ``noise``: the first ``int(noise * n)`` training and validation rows get labels
      drawn at random from the training class proportions (``RandomState(seed)``), the
      reference code's way of reshuffling labels. A redrawn label may equal the old one,
      so ``noisy_train`` marks rows *resampled*, not rows *flipped*.

    Parameters
    ----------
    seed, genie, split, return_mask
        As in :func:`load_drug_discovery`.
    noise : float in [0, 1], default 0.0
        Label-noise fraction (the paper uses 0.3).
    imbalance : float in (0, 1], optional
        Rare-to-common ratio to impose on the training split (the test split keeps the
        natural 1:4).
    intercept : bool, default False
        Append a column of ones (161 features).

    Returns
    -------
    DatasetSplit
        ``X_*`` of shape ``(n, 160)`` (or 161), ``y_*`` in ``{0.0, 1.0}``, float64.

    See Also
    --------
    tiltlab.reproduce.hiv1_fairness : The paper's fairness experiment on it.
    tiltlab.reproduce.hierarchical : Its hierarchical experiment.

    Examples
    --------
    >>> from tiltlab.datasets import load_hiv1
    >>> data = load_hiv1(seed=0)
    >>> data.X_train.shape, data.X_val.shape, data.X_test.shape
    ((5272, 160), (659, 160), (659, 160))
    >>> skewed = load_hiv1(seed=0, imbalance=0.05, noise=0.3)
    >>> float(skewed.y_train.mean()) < 0.1
    True
    """
    seed = _check_seed(seed)
    noise = _check_fraction(noise, "noise")
    if imbalance is not None and not 0.0 < float(imbalance) <= 1.0:
        raise ValueError(f"`imbalance` must lie in (0, 1], got {imbalance!r}")
    X, y = _hiv1_raw()
    names = tuple(f"pos{p + 1}_{c}" for p in range(8) for c in AMINO_ACIDS)
    if intercept:
        X = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)
        names = names + ("intercept",)
    perm = np.random.RandomState(seed).permutation(X.shape[0])
    X, y = X[perm], y[perm]
    a, b = _split_points(X.shape[0], split)
    X_tr, y_tr = X[:a], y[:a]
    X_va, y_va = X[a:b], y[a:b]
    X_te, y_te = X[b:], y[b:]

    notes = []
    if imbalance is not None:
        common = np.flatnonzero(y_tr == 0)
        rare = np.flatnonzero(y_tr == 1)[: int(common.size * float(imbalance))]
        keep = np.concatenate([common, rare])
        reorder = np.random.RandomState(seed + 123456).permutation(keep.size)
        X_tr, y_tr = X_tr[keep][reorder], y_tr[keep][reorder]
        notes.append(f"training split subsampled to {rare.size}:{common.size} (class 1:class 0)")

    k_tr = int(X_tr.shape[0] * noise)
    k_va = int(X_va.shape[0] * noise)
    noisy_tr = np.zeros(X_tr.shape[0], dtype=bool)
    noisy_va = np.zeros(X_va.shape[0], dtype=bool)
    if genie:
        X_tr, y_tr, noisy_tr = X_tr[k_tr:], y_tr[k_tr:], noisy_tr[k_tr:]
        X_va, y_va, noisy_va = X_va[k_va:], y_va[k_va:], noisy_va[k_va:]
        notes.append(f"{k_tr} training and {k_va} validation rows dropped (genie)")
    elif k_tr or k_va:
        rng = np.random.RandomState(seed)
        p_rare = float(y_tr.mean())
        y_tr[:k_tr] = rng.choice([0.0, 1.0], k_tr, p=[1.0 - p_rare, p_rare])
        y_va[:k_va] = rng.choice([0.0, 1.0], k_va, p=[1.0 - p_rare, p_rare])
        noisy_tr[:k_tr] = True
        noisy_va[:k_va] = True
        notes.append(f"{k_tr} training and {k_va} validation labels redrawn at random")
    description = (
        f"UCI HIV-1 protease cleavage: {X.shape[0]} octamers x {X.shape[1]} one-hot features, "
        f"shuffled with seed {seed}, split {X_tr.shape[0]}/{X_va.shape[0]}/{X_te.shape[0]}"
        + ("; " + "; ".join(notes) if notes else "")
        + ". The test split is clean."
    )
    data = DatasetSplit(X_tr, y_tr, X_va, y_va, X_te, y_te, noisy_tr, noisy_va, names, description)
    return _finish(data, return_mask)

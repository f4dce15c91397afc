"""Data sets split into natural groups, for fair PCA (one data matrix per group).

* :func:`abalone_by_sex` - the shipped UCI abalone measurements, grouped by sex (male,
  female, infant);
* :func:`wine_by_cultivar` - scikit-learn's bundled wine recognition data, grouped by
  cultivar (needs scikit-learn);
* :func:`load_csv_groups` - a local folder of CSV files, one group per file (for example
  the preprocessed Default Credit groups ``A.csv``/``B.csv`` of Samadi et al.'s fair-PCA
  code, which tiltlab does not ship).

Every loader returns a :class:`GroupedData` of host-side NumPy ``float64`` matrices.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = ["GroupedData", "abalone_by_sex", "load_csv_groups", "wine_by_cultivar"]


@dataclass(frozen=True)
class GroupedData:
    """One data matrix per group, with names.

    Attributes
    ----------
    name : str
        The data set.
    group_names : tuple of str
        One name per group.
    groups : tuple of ndarray
        ``(n_g, d)`` float64 matrices, in the order of ``group_names``.
    feature_names : tuple of str
        One name per column.

    See Also
    --------
    abalone_by_sex, wine_by_cultivar, load_csv_groups : The loaders that return it.

    Examples
    --------
    >>> from tiltlab.datasets import abalone_by_sex
    >>> data = abalone_by_sex()
    >>> len(data.groups) == len(data.group_names) == len(data.sizes)
    True
    """

    name: str
    group_names: tuple[str, ...]
    groups: tuple[np.ndarray, ...]
    feature_names: tuple[str, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Rows per group."""
        return tuple(int(g.shape[0]) for g in self.groups)


def _standardise(X: np.ndarray, labels: np.ndarray, order) -> tuple[np.ndarray, ...]:
    """z-score every column over all rows (pooled), then split by label."""
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return tuple(np.ascontiguousarray(X[labels == g]) for g in order)


def abalone_by_sex() -> GroupedData:
    """The 4177 shipped abalone rows as three groups by sex: male, female, infant.

    The seven physical measurements (the ring count is left out) are z-scored over all
    rows together, as Samadi et al. standardise their data before fair PCA, then split.

    Returns
    -------
    GroupedData
        Groups ``("male", "female", "infant")`` of 1528, 1307 and 1342 rows, 7 columns.

    See Also
    --------
    wine_by_cultivar, load_csv_groups
    load_abalone : The same rows as a regression data set.

    Examples
    --------
    >>> from tiltlab.datasets import abalone_by_sex
    >>> data = abalone_by_sex()
    >>> data.group_names, data.sizes, data.groups[0].shape[1]
    (('male', 'female', 'infant'), (1528, 1307, 1342), 7)
    """
    from ._loaders import _data_file

    rows, sex = [], []
    text = _data_file("abalone.data").read_text(encoding="ascii")
    for line in text.splitlines():
        if line.strip():
            fields = line.strip().split(",")
            sex.append(fields[0])
            rows.append([float(v) for v in fields[1:8]])
    X = np.asarray(rows, dtype=np.float64)
    groups = _standardise(X, np.asarray(sex), ("M", "F", "I"))
    features = ("length", "diameter", "height", "whole_weight", "shucked_weight",
                "viscera_weight", "shell_weight")  # fmt: skip
    return GroupedData("abalone", ("male", "female", "infant"), groups, features)


def wine_by_cultivar() -> GroupedData:
    """scikit-learn's bundled wine data (178 x 13) as three groups by cultivar.

    The 13 chemical measurements are z-scored over all rows together, then split.
    Needs scikit-learn (``pip install scikit-learn``, or the ``sklearn`` extra).

    Returns
    -------
    GroupedData
        Groups ``("cultivar 0", "cultivar 1", "cultivar 2")`` of 59, 71 and 48 rows.

    See Also
    --------
    abalone_by_sex, load_csv_groups

    Examples
    --------
    >>> from tiltlab.datasets import wine_by_cultivar
    >>> wine_by_cultivar().sizes
    (59, 71, 48)
    """
    try:
        from sklearn.datasets import load_wine
    except ImportError as exc:  # pragma: no cover - scikit-learn is in the test extra
        raise ImportError(
            "the wine data come with scikit-learn: pip install scikit-learn"
        ) from exc
    bunch = load_wine()
    X = np.asarray(bunch.data, dtype=np.float64)
    groups = _standardise(X, np.asarray(bunch.target), (0, 1, 2))
    names = ("cultivar 0", "cultivar 1", "cultivar 2")
    return GroupedData("wine", names, groups, tuple(bunch.feature_names))


def load_csv_groups(data_dir: str | os.PathLike, *, name: str | None = None) -> GroupedData:
    """Groups from a folder of CSV files, one group per file (file name = group name).

    Every ``*.csv`` file in ``data_dir`` (sorted by name) holds one group: a header row,
    then one row per sample of comma-separated numbers, the same number of columns in
    every file. The data are used as they are (no centring or scaling): this is the
    layout of the preprocessed Default Credit groups (``A.csv``, ``B.csv``: 21 standardised
    features, the data split by education) in Samadi et al.'s fair-PCA code.

    Parameters
    ----------
    data_dir : path
        The folder.
    name : str, optional
        Name of the data set (default: the folder's name).

    Returns
    -------
    GroupedData
        One group per CSV file, named after the file, in sorted order.

    See Also
    --------
    abalone_by_sex, wine_by_cultivar

    Examples
    --------
    >>> import os, tempfile
    >>> from tiltlab.datasets import load_csv_groups
    >>> folder = tempfile.mkdtemp()
    >>> for g, rows in (("A", "1,2\\n3,4\\n"), ("B", "5,6\\n")):
    ...     with open(os.path.join(folder, g + ".csv"), "w") as fh:
    ...         _ = fh.write("x1,x2\\n" + rows)
    >>> data = load_csv_groups(folder)
    >>> data.group_names, data.sizes
    (('A', 'B'), (2, 1))
    """
    folder = os.fspath(data_dir)
    if not os.path.isdir(folder):
        raise ValueError(f"`data_dir` {folder!r} is not a folder")
    files = sorted(f for f in os.listdir(folder) if f.lower().endswith(".csv"))
    if not files:
        raise ValueError(f"`data_dir` {folder!r} holds no .csv file (one file per group)")
    groups, header = [], None
    for f in files:
        path = os.path.join(folder, f)
        with open(path, encoding="utf-8") as fh:
            first = fh.readline().strip().split(",")
        try:
            X = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, dtype=np.float64)
        except ValueError as exc:
            raise ValueError(f"`data_dir` file {f}: not a header row then numbers ({exc})") from exc
        if X.shape[0] == 0:
            raise ValueError(f"`data_dir` file {f} has no data rows")
        if not np.all(np.isfinite(X)):
            raise ValueError(f"`data_dir` file {f} holds non-finite values")
        if groups and X.shape[1] != groups[0].shape[1]:
            raise ValueError(
                f"`data_dir` files must have the same number of columns: {files[0]} has "
                f"{groups[0].shape[1]}, {f} has {X.shape[1]}"
            )
        header = header or tuple(first)
        groups.append(X)
    names = tuple(os.path.splitext(f)[0] for f in files)
    title = name or os.path.basename(os.path.abspath(folder))
    return GroupedData(title, names, tuple(groups), header)

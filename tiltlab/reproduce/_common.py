"""What every reproduction shares: the result schema, seeds, progress bars and tables.

Every experiment returns a :class:`~tiltlab.reproduce.Reproduction`, whose ``rows`` follow
one schema so that results can be compared by a program::

    {"experiment": NAME,
     "rows": [{"method", "setting", "metric", "split",
               "mean", "se", "n_seeds", "paper_mean", "paper_se"}, ...]}

``mean`` and ``se`` are the mean and standard error (``std(ddof=1) / sqrt(n)``) over the
seeds; ``se`` is ``None`` for a single seed, ``paper_mean``/``paper_se`` are ``None`` where
the paper prints no number. Experiments that report per-group statistics (the deep ones:
classes, annotators) add ``"group_reports": {caption: {"tilts", "group", "risk", "mass",
"weight", "ess", "size", ...}}`` (see :func:`tiltlab.diagnostics.group_report`). The JSON
never contains NaN or infinities (they become ``null``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._tables import format_grid

__all__ = [
    "ROW_KEYS",
    "Reproduction",
    "check_choices",
    "format_grid",
    "make_row",
    "mean_se",
    "progress_bar",
    "require_matplotlib",
    "seed_list",
    "single_blas_thread",
    "write_json",
]

#: The keys of every row, in order.
ROW_KEYS = (
    "method",
    "setting",
    "metric",
    "split",
    "mean",
    "se",
    "n_seeds",
    "paper_mean",
    "paper_se",
)


def _finite_or_none(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _json_values(value: Any) -> Any:
    """Numbers, labels and sequences of them as JSON values (non-finite numbers: None)."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _finite_or_none(value)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_json_values(v) for v in value]
    return str(value)


def mean_se(values: Iterable[float]) -> tuple[float | None, float | None, int]:
    """Mean, standard error of the mean and count of the finite ``values``.

    The standard error is ``std(ddof=1) / sqrt(n)``; it is ``None`` for fewer than two
    values, and the mean is ``None`` for none.

    Parameters
    ----------
    values : iterable of float
        Per-seed values; NaN and infinities are dropped.

    Returns
    -------
    mean : float or None
        The mean of the finite values (``None`` if there are none).
    se : float or None
        Its standard error (``None`` for fewer than two values).
    n : int
        The number of finite values.

    See Also
    --------
    make_row : A schema row from per-seed values.

    Examples
    --------
    >>> from tiltlab.reproduce import mean_se
    >>> mean_se([1.0, 2.0, 3.0])
    (2.0, 0.5773502691896258, 3)
    >>> mean_se([4.0])
    (4.0, None, 1)
    """
    v = np.asarray([float(x) for x in values], dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None, None, 0
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else None
    return float(v.mean()), se, int(v.size)


def make_row(
    method: str,
    setting: str,
    metric: str,
    split: str,
    values: Iterable[float],
    paper: tuple[float | None, float | None] | None = None,
) -> dict:
    """One schema row from the per-seed ``values`` and the paper's ``(mean, se)``.

    Parameters
    ----------
    method : str
        The method (a row of the paper's table, e.g. ``"TERM"``).
    setting : str
        The setting (e.g. the noise level).
    metric : str
        What is measured (e.g. ``"test_rmse"``).
    split : str
        The data split measured on (``"train"``, ``"val"`` or ``"test"``).
    values : iterable of float
        The per-seed values (see :func:`mean_se`).
    paper : tuple of (float or None, float or None), optional
        The paper's mean and standard error, where it prints them.

    Returns
    -------
    dict
        A row with the keys :data:`~tiltlab.reproduce.ROW_KEYS`.

    See Also
    --------
    mean_se : The summary of the per-seed values.
    Reproduction : The result whose ``rows`` these are.

    Examples
    --------
    >>> from tiltlab.reproduce import make_row
    >>> row = make_row("ERM", "clean", "test_rmse", "test", [1.0, 3.0], (2.1, None))
    >>> row["mean"], row["se"], row["n_seeds"], row["paper_mean"], row["paper_se"]
    (2.0, 1.0, 2, 2.1, None)
    """
    mean, se, n = mean_se(values)
    pm, ps = paper if paper is not None else (None, None)
    return {
        "method": str(method),
        "setting": str(setting),
        "metric": str(metric),
        "split": str(split),
        "mean": mean,
        "se": se,
        "n_seeds": n,
        "paper_mean": _finite_or_none(pm),
        "paper_se": _finite_or_none(ps),
    }


def check_choices(values: Sequence[str], allowed: Sequence[str], name: str) -> list[str]:
    """``values`` as a list, checked to be a non-empty subset of ``allowed``.

    Parameters
    ----------
    values : sequence of str
        The user's choice (methods, scenarios...).
    allowed : sequence of str
        What the experiment offers.
    name : str
        The argument's name, quoted in the error.

    Returns
    -------
    list of str
        ``values``, in the given order.

    Raises
    ------
    ValueError
        If ``values`` is empty or names something not in ``allowed``.

    See Also
    --------
    seed_list : The other argument every experiment checks.

    Examples
    --------
    >>> from tiltlab.reproduce._common import check_choices
    >>> check_choices(["ERM"], ("ERM", "TERM"), "methods")
    ['ERM']
    >>> check_choices(["nope"], ("ERM", "TERM"), "methods")
    Traceback (most recent call last):
    ...
    ValueError: `methods` must be a non-empty subset of ['ERM', 'TERM']; unknown: ['nope']
    """
    chosen = list(values)
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        raise ValueError(
            f"`{name}` must be a non-empty subset of {list(allowed)}; unknown: {unknown}"
        )
    return chosen


def seed_list(seeds: int | Sequence[int]) -> list[int]:
    """``range(seeds)`` for a count, the seeds themselves for a sequence.

    Parameters
    ----------
    seeds : int or sequence of int
        A number of seeds (at least 1) or the non-negative seeds themselves.

    Returns
    -------
    list of int
        The seeds.

    Raises
    ------
    TypeError
        If `seeds` is a bool.
    ValueError
        If `seeds` is a count below 1, or an empty list or one with a negative seed.

    See Also
    --------
    mean_se : Summary over the seeds.

    Examples
    --------
    >>> from tiltlab.reproduce import seed_list
    >>> seed_list(3)
    [0, 1, 2]
    >>> seed_list([7, 11])
    [7, 11]
    """
    if isinstance(seeds, bool):
        raise TypeError(f"`seeds` must be an int or a sequence of ints, got {seeds!r}")
    if isinstance(seeds, (int, np.integer)):
        if seeds < 1:
            raise ValueError(f"`seeds` must be at least 1, got {int(seeds)}")
        return list(range(int(seeds)))
    out = [int(s) for s in seeds]
    if not out:
        raise ValueError("`seeds` must name at least one seed")
    if min(out) < 0:
        raise ValueError(f"`seeds` must be non-negative, got {out}")
    return out


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str, refresh: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(enabled: bool, total: int, desc: str) -> Any:
    """A tqdm bar (``update``, ``set_postfix_str``, ``close``), or a silent stand-in.

    Parameters
    ----------
    enabled : bool
        Whether to show a bar (on standard error); tqdm is imported only then.
    total : int
        The number of steps.
    desc : str
        The label shown before the bar.

    Returns
    -------
    object
        An object with the methods ``update(n=1)``, ``set_postfix_str(s)`` and ``close()``.

    See Also
    --------
    single_blas_thread : The other execution helper of the experiments.

    Examples
    --------
    >>> from tiltlab.reproduce._common import progress_bar
    >>> bar = progress_bar(False, total=3, desc="seeds")
    >>> bar.update(); bar.close()
    """
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextmanager
def single_blas_thread() -> Iterator[None]:
    """One BLAS thread in this process, and in processes started inside the block.

    The reproductions' problems are small (at most 3268 x 411); on a shared 2-core machine
    a second OpenBLAS thread was measured to cost far more than it saves (one seed of the
    robust-regression table: 106 s of CPU with two threads, 18 s with one), and
    parallelism comes from worker processes instead. Uses ``threadpoolctl`` when it is
    installed (it comes with scikit-learn); the environment variables set here reach
    child processes started with ``spawn`` either way.

    Yields
    ------
    None
        The environment variables and thread limits are restored on exit.

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment inside this context.

    Examples
    --------
    >>> import os
    >>> from tiltlab.reproduce import single_blas_thread
    >>> with single_blas_thread():
    ...     os.environ["OMP_NUM_THREADS"]
    '1'
    """
    saved = {k: os.environ.get(k) for k in _THREAD_VARIABLES}
    os.environ.update({k: "1" for k in _THREAD_VARIABLES})
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            yield
        else:
            with threadpool_limits(limits=1, user_api="blas"):
                yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def require_matplotlib() -> Any:
    """Import matplotlib with the Agg backend, or raise a clear ``ImportError``.

    Returns
    -------
    module
        :mod:`matplotlib.pyplot`, with the non-interactive Agg backend selected.

    Raises
    ------
    ImportError
        If matplotlib is not installed.

    See Also
    --------
    Reproduction.plot : Draws an experiment's figures with it.

    Examples
    --------
    >>> from tiltlab.reproduce._common import require_matplotlib
    >>> plt = require_matplotlib()  # doctest: +SKIP
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(
            "figures need matplotlib, which is not installed: pip install matplotlib"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass
class Reproduction:
    """The outcome of one reproduction: schema rows, the text to print and the figures.

    Attributes
    ----------
    experiment : str
        The command's name (``"hiv1-fairness"``, ...).
    rows : list of dict
        Rows with the keys :data:`~tiltlab.reproduce.ROW_KEYS`.
    title : str
        One-line description printed above the table.
    table : str
        The rows as text, ours beside the paper's.
    notes : str
        Where and why we differ from the paper, and the protocol in brief.
    curves : dict
        Whatever the figures are drawn from (paths, histories); not part of the JSON.
    group_reports : dict, optional
        Caption -> a per-group report on the host (lists, as
        :func:`tiltlab.diagnostics.group_report` gives them, with its ``"tilts"``);
        printed for the worst and best groups and part of the JSON.
    plotter : callable, optional
        ``plotter(reproduction, directory) -> list of paths`` writes the PNG figures.

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment by its command name.
    make_row : Builds the rows.

    Examples
    --------
    >>> from tiltlab.reproduce import Reproduction, make_row
    >>> rep = Reproduction("demo", [make_row("ERM", "clean", "rmse", "test", [1.0, 3.0])],
    ...                    title="A demo", table="ERM  2.0 (1.0)")
    >>> rep.to_dict()["rows"][0]["mean"]
    2.0
    >>> print(rep.report())
    A demo
    <BLANKLINE>
    ERM  2.0 (1.0)
    >>> rep.plot("unused-folder")  # no plotter: no figures
    []
    """

    experiment: str
    rows: list[dict]
    title: str = ""
    table: str = ""
    notes: str = ""
    curves: dict = field(default_factory=dict)
    plotter: Callable[[Reproduction, str], list[str]] | None = None
    group_reports: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON schema: ``{"experiment": ..., "rows": [...]}`` with ``None`` for NaN.

        Returns
        -------
        dict
            The experiment's name and its rows, each with exactly the keys
            :data:`~tiltlab.reproduce.ROW_KEYS`, and ``"group_reports"`` where the
            experiment has them; non-finite numbers become ``None``.

        See Also
        --------
        write_json : Writes this dictionary as strict JSON.

        Examples
        --------
        >>> from tiltlab.reproduce import Reproduction, make_row
        >>> row = make_row("ERM", "clean", "rmse", "test", [float("nan")])
        >>> Reproduction("demo", [row]).to_dict()["rows"][0]["mean"] is None
        True
        """
        rows = []
        for r in self.rows:
            out = {}
            for k in ROW_KEYS:
                v = r.get(k)
                if k in ("mean", "se", "paper_mean", "paper_se"):
                    v = _finite_or_none(v)
                elif k == "n_seeds":
                    v = int(v) if v is not None else 0
                out[k] = v
            rows.append(out)
        payload: dict = {"experiment": self.experiment, "rows": rows}
        if self.group_reports:
            payload["group_reports"] = {
                caption: {k: _json_values(v) for k, v in rep.items()}
                for caption, rep in self.group_reports.items()
            }
        return payload

    def report(self) -> str:
        """Title, table and notes, as the command prints them.

        Returns
        -------
        str
            The title, a blank line, the table, and the notes (if any) after another blank
            line.

        See Also
        --------
        to_dict : The same result as data.

        Examples
        --------
        >>> from tiltlab.reproduce import Reproduction
        >>> rep = Reproduction("demo", [], title="Title", table="table", notes="notes")
        >>> print(rep.report())
        Title
        <BLANKLINE>
        table
        <BLANKLINE>
        notes
        """
        parts = [self.title, "", self.table]
        if self.notes:
            parts += ["", self.notes]
        if self.group_reports:
            from ..diagnostics import format_group_report

            for caption, rep in self.group_reports.items():
                parts += ["", f"{caption}:", format_group_report(rep, worst=3, best=3)]
        return "\n".join(parts)

    def plot(self, directory: str) -> list[str]:
        """Write the figures (PNG) into ``directory``; returns their paths.

        Parameters
        ----------
        directory : str
            The folder to write into (created if missing, only when there are figures).

        Returns
        -------
        list of str
            The paths of the written figures (empty when the experiment has none).

        Raises
        ------
        ImportError
            If the experiment has figures and matplotlib is not installed.

        See Also
        --------
        report : The printed table.

        Examples
        --------
        >>> from tiltlab.reproduce import Reproduction
        >>> Reproduction("demo", []).plot("unused-folder")
        []
        """
        if self.plotter is None:
            return []
        require_matplotlib()
        os.makedirs(directory, exist_ok=True)
        return self.plotter(self, directory)


def write_json(payload: dict, path: str) -> None:
    """Write ``payload`` as strict JSON (``allow_nan=False``: NaN must already be null).

    Parameters
    ----------
    payload : dict
        What to write, typically :meth:`Reproduction.to_dict`.
    path : str
        The file to write (overwritten).

    Raises
    ------
    ValueError
        If `payload` contains NaN or an infinity.

    See Also
    --------
    Reproduction.to_dict : The payload with NaN already turned into ``None``.

    Examples
    --------
    >>> import json, os, tempfile
    >>> from tiltlab.reproduce import write_json
    >>> path = os.path.join(tempfile.mkdtemp(), "result.json")
    >>> write_json({"experiment": "demo", "rows": []}, path)
    >>> with open(path) as fh:
    ...     json.load(fh)["experiment"]
    'demo'
    """
    text = json.dumps(payload, indent=2, allow_nan=False)
    with open(path, "w") as fh:
        fh.write(text + "\n")

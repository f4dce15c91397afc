"""What every reproduction shares: the result schema, seeds, progress bars and tables.

Every experiment returns a :class:`Reproduction`, whose ``rows`` follow one schema so that
results can be compared by a program::

    {"experiment": NAME,
     "rows": [{"method", "setting", "metric", "split",
               "mean", "se", "n_seeds", "paper_mean", "paper_se"}, ...]}

``mean`` and ``se`` are the mean and standard error (``std(ddof=1) / sqrt(n)``) over the
seeds; ``se`` is ``None`` for a single seed, ``paper_mean``/``paper_se`` are ``None`` where
the paper prints no number. The JSON never contains NaN or infinities (they become
``null``).
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

__all__ = [
    "ROW_KEYS",
    "Reproduction",
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


def mean_se(values: Iterable[float]) -> tuple[float | None, float | None, int]:
    """Mean, standard error of the mean and count of the finite ``values``.

    The standard error is ``std(ddof=1) / sqrt(n)``; it is ``None`` for fewer than two
    values, and the mean is ``None`` for none.

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


def seed_list(seeds: int | Sequence[int]) -> list[int]:
    """``range(seeds)`` for a count, the seeds themselves for a sequence.

    Raises ``ValueError`` (naming ``seeds``) for a count below 1, an empty or negative list.
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
    """A tqdm bar (``update``, ``set_postfix_str``, ``close``), or a silent stand-in."""
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
    """Import matplotlib with the Agg backend, or raise a clear ``ImportError``."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(
            "figures need matplotlib, which is not installed: pip install 'tiltlab[plot]'"
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
        Rows with the keys :data:`ROW_KEYS`.
    title : str
        One-line description printed above the table.
    table : str
        The rows as text, ours beside the paper's.
    notes : str
        Where and why we differ from the paper, and the protocol in brief.
    curves : dict
        Whatever the figures are drawn from (paths, histories); not part of the JSON.
    plotter : callable, optional
        ``plotter(reproduction, directory) -> list of paths`` writes the PNG figures.
    """

    experiment: str
    rows: list[dict]
    title: str = ""
    table: str = ""
    notes: str = ""
    curves: dict = field(default_factory=dict)
    plotter: Callable[[Reproduction, str], list[str]] | None = None

    def to_dict(self) -> dict:
        """The JSON schema: ``{"experiment": ..., "rows": [...]}`` with ``None`` for NaN."""
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
        return {"experiment": self.experiment, "rows": rows}

    def report(self) -> str:
        """Title, table and notes, as the command prints them."""
        parts = [self.title, "", self.table]
        if self.notes:
            parts += ["", self.notes]
        return "\n".join(parts)

    def plot(self, directory: str) -> list[str]:
        """Write the figures (PNG) into ``directory``; returns their paths."""
        if self.plotter is None:
            return []
        require_matplotlib()
        os.makedirs(directory, exist_ok=True)
        return self.plotter(self, directory)


def write_json(payload: dict, path: str) -> None:
    """Write ``payload`` as strict JSON (``allow_nan=False``: NaN must already be null)."""
    text = json.dumps(payload, indent=2, allow_nan=False)
    with open(path, "w") as fh:
        fh.write(text + "\n")


def _cell(mean: float | None, se: float | None, digits: int, show_se: bool = True) -> str:
    if mean is None:
        return "-"
    text = f"{mean:.{digits}f}"
    if se is not None and show_se:
        text += f" ({se:.{digits}f})"
    return text


def format_grid(
    rows: Sequence[dict],
    *,
    row_of: Callable[[dict], str],
    col_of: Callable[[dict], str],
    block_of: Callable[[dict], str] | None = None,
    digits: int = 3,
    row_header: str = "method",
    show_se: bool = True,
) -> str:
    """Rows as a text grid: ``mean (se)`` with the paper's ``[mean]`` beside it.

    Row, column and block labels come from the callables, in order of first appearance;
    ``show_se=False`` prints the means only (for wide grids; the JSON keeps the errors).
    """
    blocks: dict[str, list[dict]] = {}
    for r in rows:
        blocks.setdefault(block_of(r) if block_of else "", []).append(r)
    out: list[str] = []
    for name, part in blocks.items():
        row_labels = list(dict.fromkeys(row_of(r) for r in part))
        col_labels = list(dict.fromkeys(col_of(r) for r in part))
        cells = {(row_of(r), col_of(r)): r for r in part}
        has_paper = {
            c: any(r["paper_mean"] is not None for r in part if col_of(r) == c) for c in col_labels
        }

        def text(r: dict | None, c: str, has_paper: dict = has_paper) -> str:
            if r is None:
                return ""
            s = _cell(r["mean"], r["se"], digits, show_se)
            if has_paper[c]:
                p = r["paper_mean"]
                s += f" [{p:.{digits}f}]" if p is not None else " [-]"
            return s

        grid = [[text(cells.get((rl, c)), c) for c in col_labels] for rl in row_labels]
        widths = [max(len(c), *(len(g[j]) for g in grid)) for j, c in enumerate(col_labels)]
        w0 = max(len(row_header), *(len(rl) for rl in row_labels))
        head = f"{row_header:<{w0}}" + "".join(
            f" | {c:>{w}}" for c, w in zip(col_labels, widths, strict=True)
        )
        if name:
            out.append(name)
        out += [head, "-" * len(head)]
        for rl, g in zip(row_labels, grid, strict=True):
            out.append(
                f"{rl:<{w0}}" + "".join(f" | {s:>{w}}" for s, w in zip(g, widths, strict=True))
            )
        out.append("")
    return "\n".join(out).rstrip("\n")

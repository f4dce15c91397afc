"""Figures shared by several reproductions."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_accuracy_curves"]


def plot_accuracy_curves(
    rep: Any, levels: list[float], directory: str, *, xlabel: str, title: str, filename: str
) -> list[str]:
    """Mean test accuracy of each method against a share (in percent), as one PNG.

    Parameters
    ----------
    rep : tiltlab.reproduce.Reproduction
        A reproduction whose ``curves["accuracy"]`` maps ``(method, level)`` to the
        per-seed accuracies.
    levels : list of float
        The shares on the x axis (0 to 1).
    directory : str
        Where the figure is written.
    xlabel, title : str
        Axis label and title.
    filename : str
        Name of the PNG file.

    Returns
    -------
    list of str
        The path of the figure.

    See Also
    --------
    tiltlab.reproduce.Reproduction.plot : Calls the experiments' plotters.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import tempfile
    >>> from tiltlab.reproduce import Reproduction
    >>> from tiltlab.reproduce._figures import plot_accuracy_curves
    >>> rep = Reproduction("demo", [{"method": "ERM"}],
    ...                    curves={"accuracy": {("ERM", 0.5): [0.9]}})
    >>> paths = plot_accuracy_curves(rep, [0.5], tempfile.mkdtemp(), xlabel="x", title="t",
    ...                              filename="demo.png")
    >>> paths[0].endswith("demo.png")
    True
    """
    import os

    from ._common import require_matplotlib

    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=150)
    for m in dict.fromkeys(r["method"] for r in rep.rows):
        means = [np.mean(rep.curves["accuracy"][(m, p)]) for p in levels]
        ax.plot([100 * p for p in levels], means, marker="o", label=m)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("clean test accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(directory, filename)
    fig.savefig(path)
    plt.close(fig)
    return [path]

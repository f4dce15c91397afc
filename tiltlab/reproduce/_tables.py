"""Text tables of reproduction rows: ``mean (se) [paper]`` grids."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["format_grid"]


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

    Parameters
    ----------
    rows : sequence of dict
        Schema rows (see :func:`make_row`).
    row_of, col_of : callable
        ``row -> str``: the label of the grid row and column of a schema row.
    block_of : callable, optional
        ``row -> str``: the block (a separate grid under its own heading).
    digits : int, default 3
        Decimal places.
    row_header : str, default "method"
        The header of the label column.
    show_se : bool, default True
        Print ``mean (se)`` rather than the mean alone.

    Returns
    -------
    str
        The grid(s), one line per row label.

    See Also
    --------
    make_row : The rows shown here.

    Examples
    --------
    >>> from tiltlab.reproduce import make_row
    >>> from tiltlab.reproduce._common import format_grid
    >>> rows = [make_row("ERM", "clean", "rmse", "test", [1.0, 3.0], (2.1, None))]
    >>> print(format_grid(rows, row_of=lambda r: r["method"],
    ...                   col_of=lambda r: r["setting"]))
    method |                 clean
    ------------------------------
    ERM    | 2.000 (1.000) [2.100]
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

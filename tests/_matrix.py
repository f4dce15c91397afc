"""Parameter grids for the tests: the full product, or a covering design of it.

A test grid over several parameters (engines x cases x tilts x splits x dtypes) multiplies
cases that run the same code path. :func:`covering` keeps every value of every parameter
and every *pair* of values of two parameters (a pairwise covering design), plus the full
product of the parameter groups named in ``full`` (where the numerics live, e.g. each
engine at each case and tilt), and drops the rest of the product, which only repeats
them. With ``TILTLAB_FULL_MATRIX=1`` (the GPU check script sets it) it is the full
product.

The design is built greedily and deterministically (the same rows in every process, so
that test ids are stable, e.g. for a rerun of recorded ids): take the first interaction
not yet covered, then give each free parameter the value that covers the most new
interactions (ties: the first value).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

#: the full products everywhere (the GPU check script sets ``TILTLAB_FULL_MATRIX=1``)
FULL_MATRIX = os.environ.get("TILTLAB_FULL_MATRIX") == "1"


def covering(
    factors: dict[str, Sequence[Any]],
    *,
    full: Sequence[Sequence[str]] = (),
    full_matrix: bool | None = None,
) -> list[tuple]:
    """Rows ``(v_1, ..., v_k)`` (one value per factor, in the order of ``factors``) that
    contain every pair of values of two factors and every combination of the factor
    groups in ``full``; the full product when ``full_matrix`` (default: ``FULL_MATRIX``).

    >>> rows = covering({"a": [0, 1], "b": "xyz", "c": [True, False]}, full_matrix=False)
    >>> len(rows) < 2 * 3 * 2
    True
    >>> {(a, b) for a, b, _ in rows} == {(a, b) for a in (0, 1) for b in "xyz"}
    True
    """
    names = list(factors)
    values = [list(factors[n]) for n in names]
    if full_matrix is None:
        full_matrix = FULL_MATRIX
    if full_matrix or len(names) < 3:
        return list(itertools.product(*values))
    groups = {tuple(g) for g in itertools.combinations(range(len(names)), 2)}
    for g in full:
        groups.add(tuple(sorted(names.index(n) for n in g)))
    groups = sorted(groups)
    uncovered = {
        (g, combo)
        for g in groups
        for combo in itertools.product(*(range(len(values[i])) for i in g))
    }
    by_factor = {i: [g for g in groups if i in g] for i in range(len(names))}

    def gain(row, i):
        # the uncovered interactions that setting factor i completes in the row
        return sum(
            (g, tuple(row[j] for j in g)) in uncovered
            for g in by_factor[i]
            if all(row[j] is not None for j in g)
        )

    rows = []
    while uncovered:
        g, combo = min(uncovered)
        row: list = [None] * len(names)
        for i, v in zip(g, combo, strict=True):
            row[i] = v
        for i in range(len(names)):
            if row[i] is not None:
                continue
            best, best_gain = 0, -1
            for v in range(len(values[i])):
                row[i] = v
                n = gain(row, i)
                if n > best_gain:
                    best, best_gain = v, n
            row[i] = best
        for gg in groups:
            uncovered.discard((gg, tuple(row[j] for j in gg)))
        rows.append(tuple(values[i][v] for i, v in enumerate(row)))
    return rows


#: the array backends of the ``xp`` fixture (``conftest.py``), the reference first
BACKENDS = ["numpy", "array_api_strict", "torch", "dask", "cupy"]


def backend_grid(
    factors: dict[str, Sequence[Any]],
    *,
    full: Sequence[Sequence[str]] = (),
    full_matrix: bool | None = None,
) -> list[tuple]:
    """Rows ``(backend, v_1, ..., v_k)`` for ``@pytest.mark.parametrize(("xp", ...), rows,
    indirect=["xp"])``: the full product of ``factors`` on NumPy (the reference backend,
    and the cheap one), and on the other backends a covering design (:func:`covering` with
    the backend as one more factor): each backend meets every value of every factor and
    the full product of each ``full`` group, and every pair of values of two factors is
    met on some backend besides NumPy; the full product on every backend when
    ``full_matrix``."""
    if full_matrix is None:
        full_matrix = FULL_MATRIX
    product = list(itertools.product(*(list(v) for v in factors.values())))
    if full_matrix:
        return [(b, *row) for b in BACKENDS for row in product]
    others = covering(
        {"xp": BACKENDS[1:], **factors},
        full=[("xp", *g) for g in full],
        full_matrix=False,
    )
    return [("numpy", *row) for row in product] + others

"""Records of the property checks: :class:`PropertyCheck`, the property names, the
violation accumulator and :func:`format_checks`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PropertyCheck", "PROPERTIES", "format_checks"]


_SAFETY = 10.0
_EPS = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class PropertyCheck:
    """Outcome of one property check along a tilt path.

    Attributes
    ----------
    name : str
        Short identifier (see :data:`PROPERTIES`).
    holds : bool
        True when every comparison passed within its tolerance (or the check did not
        apply; the description then says why).
    worst_violation : float
        The largest amount by which a comparison failed, in the units of the checked
        quantity; 0 when the property holds.
    description : str
        What was checked, on which tilts, and notes (not-a-theorem warnings, skips).
    reference : str
        The paper's statement it checks (theorem title and label).
    tolerance : float
        The tolerance of the worst comparison (of the worst failing one, if any).
    parts : tuple of (str, bool, float)
        For statements made of several halves (the trade-offs): ``(label, holds,
        worst_violation)`` of each half, e.g. ``("min", False, 5e-4), ("mean", True, 0.0)``.
    """

    name: str
    holds: bool
    worst_violation: float
    description: str
    reference: str
    tolerance: float = 0.0
    parts: tuple = ()


#: Names of the checks of :func:`check_path`, in the order they are reported.
PROPERTIES: tuple[str, ...] = (
    "stationarity",
    "objective_monotone_in_t",
    "optimal_objective_monotone",
    "risk_sign",
    "risk_sign_local",
    "max_mean_tradeoff",
    "min_mean_tradeoff",
    "variance_decreasing",
    "variance_local",
    "cosine_increasing",
    "cosine_local",
    "entropy_increasing",
    "entropy_local",
    "gradient_fd",
    "hessian_fd",
    "solution_derivative_fd",
    "quantile_ordering",
)

_NOT_A_THEOREM = (
    " Not a theorem: the paper's proof treats a product of two positive semi-definite "
    "matrices as sign-definite; it can fail on valid data (see tiltlab.theory)."
)


class _Violations:
    """Accumulates comparisons: (amount by which a statement fails, tolerance)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_tol = 0.0
        self.max_ratio = -np.inf
        self.count = 0

    def add(self, excess: Any, tol: Any) -> None:
        excess = np.atleast_1d(np.asarray(excess, dtype=np.float64))
        tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), excess.shape)
        if excess.size == 0:
            return
        self.count += excess.size
        bad = excess > tol
        if np.any(bad):
            k = int(np.argmax(np.where(bad, excess, -np.inf)))
            if excess[k] > self.worst:
                self.worst, self.worst_tol = float(excess[k]), float(tol[k])
        elif self.worst == 0.0:
            k = int(np.argmax(excess - tol))
            self.worst_tol = max(self.worst_tol, float(tol[k]))

    def record(
        self, name: str, description: str, reference: str, parts: tuple = ()
    ) -> PropertyCheck:
        return PropertyCheck(
            name=name,
            holds=self.worst == 0.0,
            worst_violation=self.worst,
            description=description,
            reference=reference,
            tolerance=self.worst_tol,
            parts=parts,
        )


def format_checks(records: Iterable[PropertyCheck], *, descriptions: bool = False) -> str:
    """A plain-text table of :func:`check_path` records.

    Parameters
    ----------
    records : iterable of PropertyCheck
    descriptions : bool, default False
        Also list each record's description under the table.

    Returns
    -------
    str

    See Also
    --------
    check_path : Makes the records.

    Examples
    --------
    >>> from tiltlab.theory import PropertyCheck, format_checks
    >>> rec = PropertyCheck("demo", False, 0.25, "a demo record", "Theorem X", 1e-9)
    >>> print(format_checks([rec]))  # doctest: +NORMALIZE_WHITESPACE
    property  holds  worst violation  tolerance  reference
    --------  -----  ---------------  ---------  ---------
    demo      NO     2.50e-01         1.00e-09   Theorem X
    """
    records = list(records)
    rows = [("property", "holds", "worst violation", "tolerance", "reference")]
    for r in records:
        rows.append(
            (
                r.name,
                "yes" if r.holds else "NO",
                f"{r.worst_violation:.2e}",
                f"{r.tolerance:.2e}",
                r.reference,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for j, row in enumerate(rows):
        cells = [row[i].ljust(widths[i]) for i in range(4)] + [row[4]]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join(["-" * widths[i] for i in range(4)] + ["-" * 9]))
    if descriptions:
        lines.append("")
        lines.extend(f"{r.name}: {r.description}" for r in records)
    return "\n".join(lines)

"""The quantile-ordering check (:math:`Q^0 \\le Q^1 \\le Q^2 \\le Q^3`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .records import PropertyCheck, _Violations

__all__: list[str] = []


def _check_quantiles(path: Any, a: Any, q0: Any) -> PropertyCheck:
    ref = "Theorem 'Q0 <= Q1 <= Q2 <= Q3' (thm:Q-opt) and Theorem thm:Q (the tail bound)"
    if a is None:
        return PropertyCheck(
            "quantile_ordering",
            True,
            0.0,
            "Skipped: pass `a` (thresholds) to check Q1 <= Q2 <= Q3 (and `q0`, or an "
            "objective for which tiltlab.bounds.min_tail_fraction applies, for Q0).",
            ref,
        )
    from ..bounds import min_tail_fraction, quantile_curves

    curves = quantile_curves(path, a)
    note = ""
    if q0 is None:
        try:
            q0 = min_tail_fraction(path.objective, curves["a"])
        except (NotImplementedError, ValueError, TypeError) as exc:
            note = f" Q0 not computed ({exc}); only Q1 <= Q2 <= Q3 was checked."
    v = _Violations()
    if q0 is not None:
        q0 = np.broadcast_to(np.asarray(q0, dtype=np.float64), curves["Q1"].shape)
        v.add(q0 - curves["Q1"], 1e-12)
    v.add(curves["Q1"] - curves["Q2"], 1e-12)
    v.add(curves["Q2"] - curves["Q3"], 1e-12 * np.maximum(1.0, np.abs(curves["Q3"])))
    return v.record(
        "quantile_ordering",
        f"Q0 <= Q1 <= Q2 <= Q3 at {np.size(curves['a'])} thresholds (Q1..Q3 over the path's "
        "tilts, tiltlab.bounds.quantile_curves; Q0 exact, tiltlab.bounds.min_tail_fraction)."
        + note,
        ref,
    )

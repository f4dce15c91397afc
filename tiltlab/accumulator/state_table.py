"""The scalar formulas of the tilted state, each written once: the weight of one loss, its
fold, the move of a shift (and its factor), the merge and the finish.

A state at the tilt ``t`` with shift ``c`` (on the tilt's side of every loss, so that
``u = t (l - c) <= 0``) holds ``mass = sum p``, ``s = sum p exp(u)``, ``q = sum p
expm1(u)`` (kept near ``t = 0``: ``|t|`` times the spread at most 1) and ``lsum = sum p
(l - c)`` (see :mod:`tiltlab.accumulator`). Each entry of :data:`STATE_TABLE` is one step
of its arithmetic: named scalar arguments (``flags`` are conditions), a few named
intermediates (``let``) and named results, in the expression vocabulary of the loss table
(:mod:`tiltlab.losses.table`) with four more functions:

* ``log1p(x)`` for any ``x > -1``;
* ``gap(t, a, b)``: ``t (a - b)``; the C dialect takes it in halves where ``a - b``
  overflows and the product does not, and gives 0 for ``a == b`` at every tilt (an
  infinite tilt weighs the extreme losses only), the other dialects multiply;
* ``add_scaled(c, x, t)``: ``c + x / t``; the C dialect takes it in halves where ``x / t``
  overflows and the sum does not;
* a flag as the condition of ``where``.

What stays with the callers is the control around the steps: the empty state (the
identity of the merge, whose infinite shift is set, never multiplied), which shift is
beyond which, when ``q`` is dropped (NaN) and the infinite tilt's extremes, each a test
on the host or in the kernel.

``python -m tiltlab.losses._generate`` writes every dialect from this table: the
reference functions of :mod:`tiltlab.accumulator._state_formulas` (Python floats and
:mod:`mpmath`), the numba functions of the compiled CPU kernels
(``tiltlab/_cpu_kernels/_state_steps.py``, each in a :mod:`math` form for float64
scalars and a ``_t`` form in the precision of its arguments with the vectorisable
functions of the kernels' block loops) and the C functions ``tl_state_<name>`` of the
CUDA header ``tiltlab/_cupy/tilt.cuh``. A test checks that regenerating reproduces the
checked-in files byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__: list[str] = []  # a contract for the generator and the tests, not public API


@dataclass(frozen=True)
class StateFormula:
    """One step of the state's arithmetic: arguments, intermediates and named results."""

    name: str
    #: the real arguments, in the order of the generated functions' parameters
    args: tuple[str, ...]
    #: the results, ``(name, expression)``, returned (C: stored) in this order
    out: tuple[tuple[str, str], ...]
    let: tuple[tuple[str, str], ...] = ()
    #: condition arguments (after the real ones)
    flags: tuple[str, ...] = ()
    doc: str = ""


STATE_TABLE: tuple[StateFormula, ...] = (
    StateFormula(
        "weight",
        args=("t", "l", "c"),
        flags=("small_tilt",),
        let=(("u", "gap(t, l, c)"), ("e1", "where(small_tilt, expm1(u), 0)")),
        out=(("e", "where(small_tilt, e1 + 1, exp(u))"), ("e1", "e1")),
        doc="the weight e = exp(u) of one loss l at the shift c, u = t (l - c) <= 0, and "
        "e1 = expm1(u); near t = 0 (small_tilt: u in [-1, 0]) e = e1 + 1 (one transcendental), "
        "else e1 = 0 (the state drops q)",
    ),
    StateFormula(
        "fold",
        args=("p", "l", "c", "e", "e1", "mass", "s", "q", "lsum"),
        out=(
            ("mass", "mass + p"),
            ("s", "s + p * e"),
            ("q", "q + p * e1"),
            ("lsum", "lsum + p * (l - c)"),
        ),
        doc="the fold of one loss l of prior weight p and weights e, e1 (weight) into the "
        "sums of a state of shift c",
    ),
    StateFormula(
        "move",
        args=("t", "c", "to", "mass", "s", "q", "lsum"),
        let=(("u", "gap(t, c, to)"), ("r", "exp(u)")),
        out=(
            ("r", "r"),
            ("s", "s * r"),
            ("q", "mass * expm1(u) + q * r"),
            ("lsum", "lsum + mass * (c - to)"),
        ),
        doc="the sums of a state moved from the shift c to the shift to (on the tilt's "
        "side of c: u = t (c - to) <= 0); r = exp(u) scales every weighted sum, q gains "
        "mass expm1(u), a term of its own sign (no cancellation)",
    ),
    StateFormula(
        "factor",
        args=("t", "c", "to"),
        out=(("r", "exp(gap(t, c, to))"),),
        doc="the factor exp(t (c - to)) that moves weighted sums from the shift c to the "
        "shift to (move's r, for sums kept apart from a state's)",
    ),
    StateFormula(
        "merge",
        args=("mass_a", "s_a", "q_a", "lsum_a", "mass_b", "s_b", "q_b", "lsum_b"),
        out=(
            ("mass", "mass_a + mass_b"),
            ("s", "s_a + s_b"),
            ("q", "q_a + q_b"),
            ("lsum", "lsum_a + lsum_b"),
        ),
        doc="the merge of two states moved to one shift (move): their sums added",
    ),
    StateFormula(
        "finish",
        args=("t", "c", "hi", "lo", "mass", "s", "q", "lsum"),
        flags=("extreme", "flat", "small_tilt"),
        out=(
            (
                "risk",
                "where(extreme, where(t > 0, hi, lo), where(flat, c + lsum / mass, "
                "where(small_tilt, add_scaled(c, log1p(q / mass), t), "
                "add_scaled(c, log(s / mass), t))))",
            ),
        ),
        doc="the tilted risk of a state: its largest (smallest) loss at an infinite tilt "
        "(extreme), the mean c + lsum / mass at t = 0 and where |t| (hi - lo) is below "
        "rounding (flat), c + log1p(q / mass) / t while |t| (hi - lo) <= 1 and q is kept "
        "(small_tilt), else c + log(s / mass) / t",
    ),
)

#: the table by name
STATE_FORMULAS: dict[str, StateFormula] = {f.name: f for f in STATE_TABLE}

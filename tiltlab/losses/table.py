"""The scalar losses, each written once: value and derivatives in the predictor ``z``.

Every loss of one predictor per sample is one :class:`Formula` of :data:`TABLE`: its label
set, its parameters (with their default and open domain), a few named intermediate
quantities (``let``) and the value ``l(z, y)``, the first derivative ``d1 = dl/dz`` and the
second derivative ``d2``, as expressions of a tiny vocabulary:

* numbers, ``z``, ``y``, the loss's parameters and the names bound earlier by ``let``;
* ``+ - * /``, unary ``-`` and one comparison ``< <= > >= ==`` (a condition);
* ``exp``, ``expm1``, ``log``, ``log1p_unit`` (``log1p`` of an argument in ``[0, 1]``),
  ``abs``, ``sign`` (0 at 0), ``max(a, b)`` and ``where(condition, a, b)``.

The order of the operations is the order written: every dialect evaluates the same tree,
so the numerics are those of the formula as written here (choose stable forms: the
softplus as ``max(z, 0) + log1p(exp(-|z|))``, ``expm1`` where a difference of
exponentials would cancel). Every branch of a ``where`` is evaluated by the array
dialect, so a branch must be defined (if discarded) for every label and predictor.
At a kink the derivatives take one documented side (the ``doc`` of the entry).

``python -m tiltlab.losses._generate`` writes every dialect from this table: the reference
functions of :mod:`tiltlab.losses.pointwise` (Python floats and :mod:`mpmath`), the
array-API functions of the loss classes, the numba block functions of the compiled CPU
kernels and the C functions of the CUDA header ``tiltlab/_cupy/tilt.cuh``. A test checks
that regenerating reproduces the checked-in files byte for byte. The multinomial loss
(a vector of ``K`` scores per sample) is not a scalar formula and stays written by hand
in each dialect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__: list[str] = []  # a contract for the generator and the tests, not public API


@dataclass(frozen=True)
class Param:
    """A loss parameter: its name, default and open domain ``lo < value < hi``."""

    name: str
    default: float
    lo: float = 0.0
    hi: float = math.inf


@dataclass(frozen=True)
class Formula:
    """One scalar loss: labels, parameters, intermediate names and three expressions."""

    name: str
    #: "real", "nonnegative" (real and >= 0) or "binary" (0 or 1)
    labels: str
    value: str
    d1: str
    d2: str
    let: tuple[tuple[str, str], ...] = ()
    #: at most one parameter (the kernels pass one number)
    params: tuple[Param, ...] = ()
    #: what the loss is, and the side its derivatives take at a kink
    doc: str = ""
    #: a ``let`` name the CPU kernels compute for a whole block in a loop of its own
    #: (a transcendental of ``z`` alone vectorises there)
    first: str | None = None


TABLE: tuple[Formula, ...] = (
    Formula(
        "squared",
        "real",
        let=(("r", "z - y"),),
        value="r * r",
        d1="2 * r",
        d2="2",
        doc="squared error (z - y)^2 (no factor 1/2)",
    ),
    Formula(
        "absolute",
        "real",
        let=(("r", "z - y"),),
        value="abs(r)",
        d1="sign(r)",
        d2="0",
        doc="absolute error |z - y|; d1 = sign(z - y), 0 at the kink",
    ),
    Formula(
        "huber",
        "real",
        params=(Param("delta", 1.0),),
        let=(("r", "z - y"), ("a", "abs(r)"), ("inside", "a <= delta")),
        value="where(inside, 0.5 * r * r, delta * (a - 0.5 * delta))",
        d1="where(inside, r, delta * sign(r))",
        d2="where(inside, 1, 0)",
        doc="Huber: r^2/2 for |r| <= delta, else delta (|r| - delta/2); the quadratic side "
        "at |r| = delta",
    ),
    Formula(
        "logistic",
        "binary",
        let=(
            ("e", "exp(-abs(z))"),
            ("inv", "1 / (1 + e)"),
            ("small", "e * inv"),
            ("pos", "z >= 0"),
            ("s", "where(pos, inv, small)"),
            ("sc", "where(pos, small, inv)"),
        ),
        value="(max(z, 0) - y * z) + log1p_unit(e)",
        d1="(1 - y) * s - y * sc",
        d2="s * sc",
        doc="logistic: softplus(z) - y z; the sigmoid pair s(z), s(-z) from exp(-|z|) "
        "(never overflows), d1 = s(z) - y without cancellation",
        first="e",
    ),
    Formula(
        "hinge",
        "binary",
        let=(("sgn", "2 * y - 1"), ("g", "1 - sgn * z"), ("on", "g > 0")),
        value="max(g, 0)",
        d1="where(on, -sgn, 0)",
        d2="0",
        doc="hinge: max(0, 1 - s z), s = 2y - 1; the flat side at a zero margin",
    ),
    Formula(
        "squared_hinge",
        "binary",
        let=(("sgn", "2 * y - 1"), ("g", "1 - sgn * z"), ("on", "g > 0"), ("h", "max(g, 0)")),
        value="h * h",
        d1="-2 * sgn * h",
        d2="where(on, 2, 0)",
        doc="squared hinge: max(0, 1 - s z)^2, s = 2y - 1; the flat side at a zero margin",
    ),
    Formula(
        "poisson",
        "nonnegative",
        let=(
            ("ez", "exp(z)"),
            ("pos", "y > 0"),
            ("w", "z - log(where(pos, y, 1))"),
            ("far", "w > 8"),
            ("em", "expm1(where(far, 0, w))"),
        ),
        value="where(pos, where(far, ez - y * (1 + w), y * (em - w)), ez)",
        d1="where(pos, where(far, ez - y, y * em), ez)",
        d2="ez",
        doc="half Poisson deviance, log link: exp(z) - y - y (z - log y) = y (expm1(w) - w), "
        "w = z - log y (exp(z) at y = 0); beyond w = 8 (no cancellation left) as exp(z) - y "
        "- y w, since y expm1(w) overflows for small y where exp(z) does not; smooth",
    ),
    Formula(
        "pinball",
        "real",
        params=(Param("quantile", 0.5, 0.0, 1.0),),
        let=(("r", "y - z"),),
        value="max(quantile * r, (quantile - 1) * r)",
        d1="where(r > 0, -quantile, where(r < 0, 1 - quantile, 0))",
        d2="0",
        doc="pinball (quantile): max(q r, (q - 1) r), r = y - z; d1 = 0 at the kink, as the "
        "absolute loss's (which is twice the pinball loss at q = 1/2)",
    ),
)

#: the table by name
FORMULAS: dict[str, Formula] = {f.name: f for f in TABLE}

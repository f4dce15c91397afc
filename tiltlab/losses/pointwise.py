"""Every registered loss at one point: the executable contract of the losses, written once.

For each name of :data:`~tiltlab.losses.LOSS_NAMES` this module gives the value ``l(z, y)``
and its first and second derivatives in the predictor ``z`` at *one* point, as plain
scalar code: the same function evaluates in Python floats (``m=math``) and, given the
:mod:`mpmath` module (``m=mpmath``), in any working precision (the tests use 50 digits).
The scalar losses' functions are generated from the table of :mod:`tiltlab.losses.table`
(``_point_formulas``), which every engine's code comes from; the multinomial loss is
written here.
It is the reference every engine is checked against, point by point: the array-API
classes of this package, the compiled CPU kernels, the CUDA device functions and
anything added later (see ``CONTRIBUTING.md``, *The executable contract*); the tests
check it in turn against the losses' definitions written out in mpmath and against
``mpmath.diff``. It is not used on the hot path.

Each loss is a :class:`PointLoss`: its name, its label set (``"real"``,
``"nonnegative"``, ``"binary"``: 0 or 1, ``"class"``: integers in ``[0, K)``), its
parameters with their defaults (Huber's ``delta``, the pinball ``quantile``) and three
functions ``value(z, y, m, **params)``, ``d1`` and ``d2``. Where the loss has a kink the
derivatives take the documented one-sided choice of the classes: ``sign(0) = 0`` for the
absolute loss, the quadratic side at ``|z - y| = delta`` for Huber, the flat side at a
zero margin for the hinge losses (first and second derivative 0), and 0 at ``y = z`` for
the pinball loss. For the multinomial loss ``z`` is a sequence of ``K`` scores, ``d1`` a
list of ``K`` numbers and ``d2`` the ``K x K`` Hessian (a list of rows).

The formulas are the stable ones (``log1p(exp(-|z|))`` for the softplus, the sigmoid from
``exp(-|z|)``, the true class's gradient as minus the mass of the others), so that the
float evaluation keeps full relative precision too.

Examples
--------
>>> import math
>>> import mpmath
>>> from tiltlab.losses.pointwise import point
>>> point("logistic", 0.0, 1, m=math)
(0.6931471805599453, -0.5, 0.25)
>>> with mpmath.workdps(30):
...     print(point("huber", 3, 0, m=mpmath, delta=2.0)[0])
4.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _point_formulas
from .table import TABLE

__all__: list[str] = []  # a contract for engines and tests, not part of the public API


@dataclass(frozen=True)
class PointLoss:
    """One loss at one point: label set, parameters and the three scalar functions."""

    name: str
    #: "real", "nonnegative" (real, >= 0), "binary" (0 or 1) or "class" (integers in [0, K))
    labels: str
    value: Callable[..., Any]
    d1: Callable[..., Any]
    d2: Callable[..., Any]
    #: parameters and their defaults (passed to the functions as keywords)
    params: Mapping[str, float] = field(default_factory=dict)
    #: whether ``z`` is a vector of class scores (the multinomial loss)
    vector: bool = False


def _num(m: Any, x: Any) -> Any:
    """``x`` as a number of the namespace ``m`` (exact: floats convert without rounding)."""
    return m.mpf(x) if hasattr(m, "mpf") else float(x)


def _sign(r: Any) -> int:
    return 1 if r > 0 else (-1 if r < 0 else 0)


# -- the scalar losses: generated from the table (tiltlab/losses/table.py) -----------------


def _scalar(f: Any) -> PointLoss:
    fns = [getattr(_point_formulas, f"{out}_{f.name}") for out in ("value", "d1", "d2")]
    return PointLoss(f.name, f.labels, *fns, {p.name: p.default for p in f.params})


# -- multinomial --------------------------------------------------------------------------


def _softmax_parts(z: Sequence, y: int, m: Any) -> tuple[Any, list, Any]:
    """``(top, e, rest)``: the largest score, ``exp(z_k - top)`` and the sum of ``e`` over
    the classes other than the first arg-max (so that ``log(sum e) = log1p(rest)``)."""
    top_k = max(range(len(z)), key=lambda k: (z[k], -k))
    top = z[top_k]
    e = [m.exp(zk - top) for zk in z]
    rest = _fsum(m, [ek for k, ek in enumerate(e) if k != top_k])
    return top, e, rest


def _fsum(m: Any, values: list) -> Any:
    return m.fsum(values) if values else _num(m, 0)


def _multi_value(z, y, m):
    top, _, rest = _softmax_parts(z, y, m)
    return (top - z[y]) + m.log1p(rest)


def _multi_d1(z, y, m):
    _, e, rest = _softmax_parts(z, y, m)
    total = 1 + rest
    out = [ek / total for ek in e]
    # the true class: softmax - 1 = -(mass of the other classes), no cancellation
    out[y] = -_fsum(m, [ek for k, ek in enumerate(e) if k != y]) / total
    return out


def _multi_d2(z, y, m):
    _, e, rest = _softmax_parts(z, y, m)
    total = 1 + rest
    s = [ek / total for ek in e]
    K = len(s)
    # the diagonal s_i (1 - s_i) as s_i times the mass of the other classes (no cancellation)
    others = [_fsum(m, [ek for k, ek in enumerate(e) if k != i]) / total for i in range(K)]
    return [[s[i] * others[i] if i == j else -s[i] * s[j] for j in range(K)] for i in range(K)]


#: the contract of every registered loss (a test checks the names match the registry)
POINT_LOSSES: dict[str, PointLoss] = {
    p.name: p
    for p in (
        *(_scalar(f) for f in TABLE),
        PointLoss("multinomial", "class", _multi_value, _multi_d1, _multi_d2, vector=True),
    )
}


def valid_label(name: str, y: Any, n_classes: int | None = None) -> bool:
    """Whether ``y`` is in the label set of the loss ``name`` (``n_classes`` for "class").

    Examples
    --------
    >>> from tiltlab.losses.pointwise import valid_label
    >>> valid_label("hinge", 1), valid_label("hinge", 0.5), valid_label("squared", 0.5)
    (True, False, True)
    """
    kind = POINT_LOSSES[name].labels
    if kind == "real":
        return math.isfinite(float(y))
    if kind == "nonnegative":
        return math.isfinite(float(y)) and float(y) >= 0
    if kind == "binary":
        return float(y) in (0.0, 1.0)
    k = float(y)
    return k == int(k) and 0 <= k and (n_classes is None or k < n_classes)


def point(name: str, z: Any, y: Any, *, m: Any = math, **params: Any) -> tuple[Any, Any, Any]:
    """``(value, d1, d2)`` of the loss ``name`` at one point, in the arithmetic of ``m``.

    Parameters
    ----------
    name : str
        A registered loss name.
    z : number, or sequence of K numbers for the multinomial loss
        The predictor (converted exactly to ``m``'s numbers).
    y : number
        A label of the loss's label set (an integer class for the multinomial loss).
    m : module, default :mod:`math`
        :mod:`math` (Python floats) or :mod:`mpmath` (the working precision of its
        context, e.g. ``mpmath.workdps(50)``).
    **params
        The loss's parameters (Huber's ``delta``); the defaults otherwise.

    Returns
    -------
    tuple
        The value, the first derivative (a list for the multinomial loss) and the
        second derivative (the ``K x K`` Hessian as a list of rows there).

    Raises
    ------
    ValueError
        For a name without a contract, a label outside the loss's set or an unknown
        parameter.

    Examples
    --------
    >>> from tiltlab.losses.pointwise import point
    >>> point("squared", 3.0, 1.0)
    (4.0, 4.0, 2.0)
    >>> point("multinomial", [0.0, 0.0], 1)[1]
    [0.5, -0.5]
    """
    if name not in POINT_LOSSES:
        raise ValueError(f"`name`: no point contract for {name!r}; known: {sorted(POINT_LOSSES)}")
    pl = POINT_LOSSES[name]
    unknown = set(params) - set(pl.params)
    if unknown:
        raise ValueError(f"`params`: the {name} loss takes no {sorted(unknown)}")
    kw = {**pl.params, **params}
    if pl.vector:
        zz = [_num(m, v) for v in z]
        if not valid_label(name, y, len(zz)):
            raise ValueError(f"`y`: {y!r} is not a class label in [0, {len(zz)})")
        yy = int(y)
    else:
        zz = _num(m, z)
        if not valid_label(name, y):
            raise ValueError(f"`y`: {y!r} is not a {pl.labels} label of the {name} loss")
        yy = _num(m, y)
    return pl.value(zz, yy, m, **kw), pl.d1(zz, yy, m, **kw), pl.d2(zz, yy, m, **kw)

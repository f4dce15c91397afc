"""The base of the scalar losses of :mod:`tiltlab.losses.table`: a loss class takes its
value and derivatives from the array-API functions generated from its table entry."""

from __future__ import annotations

import math
from typing import Any

from . import _xp_formulas
from .base import Loss
from .table import FORMULAS

__all__: list[str] = []  # the base of the classes; the classes are the public names


def check_param(loss: str, name: str, value: Any) -> float:
    """``value`` as a float in the open domain the table gives the parameter ``name``."""
    spec = next(p for p in FORMULAS[loss].params if p.name == name)
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}` must be a real number, got {value!r}") from None
    if not (spec.lo < v < spec.hi) or math.isnan(v):
        if spec.lo == 0 and spec.hi == math.inf:
            raise ValueError(f"`{name}` must be a positive finite number, got {value!r}")
        raise ValueError(f"`{name}` must lie in ({spec.lo:g}, {spec.hi:g}), got {value!r}")
    return v


class FormulaLoss(Loss):
    """A loss of the table: label set from the entry, value and derivatives from the
    generated array-API functions, its parameters as attributes of the same names."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        entry = FORMULAS.get(cls.__dict__.get("name", ""))
        if entry is not None:
            cls.label_kind = entry.labels

    def parameters(self) -> dict[str, float]:
        """The loss's parameters by name (those of its table entry).

        Examples
        --------
        >>> from tiltlab.losses import get_loss
        >>> get_loss("huber", delta=2.0).parameters()
        {'delta': 2.0}
        >>> get_loss("squared").parameters()
        {}
        """
        return {p.name: getattr(self, p.name) for p in FORMULAS[self.name].params}

    def _value(self, z, y, xp):
        return getattr(_xp_formulas, f"value_{self.name}")(z, y, xp, **self.parameters())

    def _value_and_d1(self, z, y, xp):
        return getattr(_xp_formulas, f"value_d1_{self.name}")(z, y, xp, **self.parameters())

    def _derivatives(self, z, y, xp):
        return getattr(_xp_formulas, f"derivatives_{self.name}")(z, y, xp, **self.parameters())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.parameters().items())
        return f"{type(self).__name__}({args})"

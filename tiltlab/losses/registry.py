"""Loss names and :func:`get_loss`, which builds a loss from its name."""

from __future__ import annotations

from typing import Any

from .base import Loss
from .classification import HingeLoss, LogisticLoss, MultinomialLoss, SquaredHingeLoss
from .custom import ParameterLoss
from .regression import AbsoluteLoss, HuberLoss, PinballLoss, PoissonLoss, SquaredLoss

__all__ = ["LOSS_NAMES", "get_loss"]


# ----------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[Loss]] = {
    "squared": SquaredLoss,
    "absolute": AbsoluteLoss,
    "huber": HuberLoss,
    "logistic": LogisticLoss,
    "hinge": HingeLoss,
    "squared_hinge": SquaredHingeLoss,
    "multinomial": MultinomialLoss,
    "poisson": PoissonLoss,
    "pinball": PinballLoss,
}

#: Names accepted by :func:`get_loss`.
LOSS_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_loss(name_or_loss: str | Loss | ParameterLoss, **params: Any) -> Loss | ParameterLoss:
    """Return a loss object from its name, or a :class:`Loss` instance unchanged.

    Parameters
    ----------
    name_or_loss : str or Loss
        One of ``"squared"``, ``"absolute"``, ``"huber"``, ``"logistic"``,
        ``"hinge"``, ``"squared_hinge"``, ``"multinomial"``, ``"poisson"``,
        ``"pinball"`` (case-insensitive;
        ``-`` may replace ``_``), or a :class:`Loss` (including :class:`CallableLoss`
        and :class:`FairPCALoss`), which is returned as is.
    **params
        Parameters of the loss class: ``delta`` for Huber, ``quantile`` for pinball,
        ``n_classes`` for multinomial.

    Returns
    -------
    Loss

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones).
    TypeError
        For parameters the loss does not take, or parameters given with an instance.

    Examples
    --------
    >>> from tiltlab.losses import get_loss
    >>> get_loss("huber", delta=2.0)
    HuberLoss(delta=2.0)
    >>> get_loss("multinomial", n_classes=3).n_outputs
    3
    """
    if isinstance(name_or_loss, (Loss, ParameterLoss)):
        if params:
            raise TypeError(
                "`params` cannot be combined with a Loss instance; set them on the instance"
            )
        return name_or_loss
    if not isinstance(name_or_loss, str):
        raise TypeError(
            f"`loss` must be a loss name or a Loss instance, got {type(name_or_loss).__name__}"
        )
    key = name_or_loss.strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        raise ValueError(
            f"`loss`: unknown loss {name_or_loss!r}; valid names are {', '.join(LOSS_NAMES)}"
        )
    cls = _REGISTRY[key]
    try:
        return cls(**params)
    except TypeError as exc:
        raise TypeError(f"`params`: invalid parameters for the {key} loss: {exc}") from None

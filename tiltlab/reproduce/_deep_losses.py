"""Per-sample losses of the deep reproductions' baselines (PyTorch).

Each factory returns ``criterion(logits, target) -> (batch,)``, the per-sample loss that
a plain mean (:func:`mean_of`) or a :class:`tiltlab.torch.TiltedLoss` reduces. PyTorch is
imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "cross_entropy",
    "focal_loss",
    "generalized_cross_entropy",
    "mean_of",
    "symmetric_cross_entropy",
]


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a test dependency
        raise ImportError(
            "the deep-learning reproductions need PyTorch: pip install torch"
        ) from None
    return torch


# --------------------------------------------------------------------------- per-sample losses


def generalized_cross_entropy(q: float) -> Callable[[Any, Any], Any]:
    """Zhang and Sabuncu's GCE, ``(1 - p_y^q) / q`` per sample (CE as q -> 0, MAE at q = 1).

    Parameters
    ----------
    q : float
        The exponent, in ``(0, 1]``.

    Returns
    -------
    callable
        ``criterion(logits, target)``: the per-sample losses, a tensor of shape ``(batch,)``.

    See Also
    --------
    symmetric_cross_entropy, focal_loss, cross_entropy

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce.deep import generalized_cross_entropy
    >>> loss = generalized_cross_entropy(1.0)(torch.zeros(1, 4), torch.tensor([2]))
    >>> round(float(loss[0]), 6)
    0.75
    """
    torch = _torch()

    def gce(logits: Any, target: Any) -> Any:
        p = torch.softmax(logits, dim=1).gather(1, target[:, None])[:, 0]
        return (1.0 - p.clamp_min(1e-12) ** q) / q

    return gce


def symmetric_cross_entropy(
    alpha: float = 0.1, beta: float = 1.0, log_zero: float = -4.0
) -> Callable[[Any, Any], Any]:
    """Wang et al.'s symmetric CE: ``alpha CE + beta RCE`` with ``log 0 = log_zero``.

    The reverse cross-entropy of a one-hot label is ``-log_zero (1 - p_y)``.

    Parameters
    ----------
    alpha : float, default 0.1
        Weight of the cross-entropy.
    beta : float, default 1.0
        Weight of the reverse cross-entropy.
    log_zero : float, default -4.0
        The value that stands for ``log 0`` in the reverse cross-entropy.

    Returns
    -------
    callable
        ``criterion(logits, target)``: the per-sample losses, a tensor of shape ``(batch,)``.

    See Also
    --------
    generalized_cross_entropy, focal_loss, cross_entropy

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce.deep import symmetric_cross_entropy
    >>> loss = symmetric_cross_entropy(0.0, 1.0)(torch.zeros(1, 4), torch.tensor([2]))
    >>> round(float(loss[0]), 6)
    3.0
    """
    torch = _torch()

    def sce(logits: Any, target: Any) -> Any:
        logp = torch.log_softmax(logits, dim=1)
        ce = -logp.gather(1, target[:, None])[:, 0]
        p_y = logp.gather(1, target[:, None])[:, 0].exp()
        return alpha * ce + beta * (-log_zero) * (1.0 - p_y)

    return sce


def focal_loss(gamma: float = 2.0, class_weight: Any = None) -> Callable[[Any, Any], Any]:
    """Lin et al.'s focal loss, ``-a_y (1 - p_y)^gamma log p_y`` per sample.

    Parameters
    ----------
    gamma : float, default 2.0
        Focusing parameter (``0``: cross-entropy).
    class_weight : array_like, optional
        The weight ``a_y`` of each class (default: 1 for all).

    Returns
    -------
    callable
        ``criterion(logits, target)``: the per-sample losses, a tensor of shape ``(batch,)``.

    See Also
    --------
    cross_entropy, generalized_cross_entropy, symmetric_cross_entropy

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce.deep import focal_loss
    >>> loss = focal_loss(0.0)(torch.zeros(1, 2), torch.tensor([1]))
    >>> round(float(loss[0]), 6) == round(float(torch.log(torch.tensor(2.0))), 6)
    True
    """
    torch = _torch()

    def focal(logits: Any, target: Any) -> Any:
        logp = torch.log_softmax(logits, dim=1).gather(1, target[:, None])[:, 0]
        out = -((1.0 - logp.exp()).clamp_min(0.0) ** gamma) * logp
        if class_weight is not None:
            out = out * torch.as_tensor(class_weight, dtype=out.dtype, device=out.device)[target]
        return out

    return focal


def cross_entropy(class_weight: Any = None) -> Callable[[Any, Any], Any]:
    """Per-sample cross-entropy, optionally weighted by class (``a_y CE``).

    Parameters
    ----------
    class_weight : array_like, optional
        The weight ``a_y`` of each class (default: 1 for all).

    Returns
    -------
    callable
        ``criterion(logits, target)``: the per-sample losses, a tensor of shape ``(batch,)``.

    See Also
    --------
    focal_loss, mean_of

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce.deep import cross_entropy
    >>> loss = cross_entropy([1.0, 3.0])(torch.zeros(2, 2), torch.tensor([0, 1]))
    >>> [round(v, 4) for v in loss.tolist()]  # log 2 and 3 log 2
    [0.6931, 2.0794]
    """
    torch = _torch()

    def ce(logits: Any, target: Any) -> Any:
        out = torch.nn.functional.cross_entropy(logits, target, reduction="none")
        if class_weight is not None:
            out = out * torch.as_tensor(class_weight, dtype=out.dtype, device=out.device)[target]
        return out

    return ce


def mean_of(criterion: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    """The plain (ERM) batch objective of a per-sample criterion.

    Parameters
    ----------
    criterion : callable
        ``criterion(logits, target)`` returning per-sample losses.

    Returns
    -------
    callable
        ``objective(logits, target, groups=None)``: the mean loss of the batch (`groups`
        is ignored), as :func:`train` expects.

    See Also
    --------
    train : Minimises such an objective.
    tiltlab.torch.TiltedLoss : The tilted objective with the same interface.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce.deep import cross_entropy, mean_of
    >>> value = mean_of(cross_entropy())(torch.zeros(3, 2), torch.tensor([0, 1, 0]))
    >>> round(float(value), 4)
    0.6931
    """

    def objective(logits: Any, target: Any, groups: Any = None) -> Any:
        return criterion(logits, target).mean()

    return objective

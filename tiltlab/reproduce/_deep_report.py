"""Per-group reports and ESS-chosen tilts for the deep reproductions (PyTorch).

:func:`training_report` evaluates a trained network's per-sample losses on its training
data and reports what a hierarchical tilt does to each group (classes, annotators) with
:func:`tiltlab.diagnostics.group_report`; :class:`ESSTiltedLoss` is a tilted loss whose tilt
is re-chosen on every batch so that the batch's tilted weights keep a given effective
sample size (:func:`tiltlab.tilt_for_ess`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..diagnostics import effective_sample_size, group_report
from ..risk import hierarchical_weights, tilt_for_ess
from ._deep_losses import _torch

__all__ = ["ESSTiltedLoss", "training_losses", "training_report"]


def training_losses(
    model: Any, X: np.ndarray, y: np.ndarray, criterion: Any = None, device: str = "cpu"
) -> np.ndarray:
    """Per-sample losses of a trained network on ``(X, y)``, as float64 on the host.

    Parameters
    ----------
    model : torch.nn.Module
        The network.
    X : numpy.ndarray, shape (n, n_features)
        Features (float32).
    y : numpy.ndarray of int, shape (n,)
        Labels (the ones the network was trained on).
    criterion : callable, optional
        ``criterion(logits, target)`` per sample; default the cross-entropy.
    device : str, default "cpu"
        The device the model is on.

    Returns
    -------
    numpy.ndarray of float64, shape (n,)
        The losses.

    See Also
    --------
    training_report : What a tilt does to each group of these losses.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce._deep import make_model
    >>> from tiltlab.reproduce._deep_report import training_losses
    >>> net = make_model("mlp", 4, 3, (1, 2, 2), seed=0)
    >>> X, y = np.zeros((5, 4), np.float32), np.array([0, 1, 2, 0, 1])
    >>> l = training_losses(net, X, y)
    >>> l.dtype, l.shape
    (dtype('float64'), (5,))
    """
    torch = _torch()
    crit = torch.nn.CrossEntropyLoss(reduction="none") if criterion is None else criterion
    with torch.no_grad():
        logits = model(torch.as_tensor(X, device=device))
        losses = crit(logits, torch.as_tensor(y, device=device))
    return losses.detach().cpu().double().numpy()


def training_report(losses: np.ndarray, groups: np.ndarray, tilts: Sequence[float]) -> dict:
    """A :func:`~tiltlab.diagnostics.group_report` as host lists, with the tilts and the
    effective sample size of all the samples' weights.

    Parameters
    ----------
    losses : numpy.ndarray, shape (n,)
        Per-sample losses (:func:`training_losses`).
    groups : numpy.ndarray, shape (n,)
        Group labels (classes, annotators).
    tilts : sequence of float
        ``(t, tau)``: group-level and sample-level tilt; ``(t, t)`` is the sample-level
        tilt ``t`` seen per group.

    Returns
    -------
    dict
        The report's entries as lists, ``"tilts"``, and ``"ess_all"``: the effective
        sample size of the per-sample weights (:func:`tiltlab.hierarchical_weights`)
        as a fraction of ``n``.

    See Also
    --------
    tiltlab.diagnostics.group_report : The report.
    tiltlab.diagnostics.format_group_report : Prints it.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce._deep_report import training_report
    >>> rep = training_report(np.array([0.1, 0.2, 3.0, 0.3]), np.array([0, 0, 1, 1]), (-2, -2))
    >>> rep["group"], [round(w, 3) for w in rep["weight"]]
    ([0, 1], [0.73, 0.27])
    """
    tilts = [float(v) for v in tilts]
    rep = group_report(losses, groups, tilts)
    w = hierarchical_weights(losses, groups, tilts)
    out = {"tilts": tilts}
    for key, value in rep.items():
        out[key] = np.asarray(value).tolist()
    out["ess_all"] = float(effective_sample_size(w)) / losses.size
    return out


class ESSTiltedLoss:
    """A sample-level tilted loss whose tilt keeps a set share of each batch.

    On each call the batch's per-sample losses (detached) give the tilt
    ``t = tilt_for_ess(losses, fraction(step), sign=sign)`` at which the batch's tilted
    weights have the effective sample size ``fraction(step) * batch``; the wrapped
    :class:`tiltlab.torch.TiltedLoss` then uses that tilt (with its running normaliser)
    for the step. A fraction of 1 gives ``t = 0`` (ERM).

    Parameters
    ----------
    criterion : callable
        ``criterion(logits, target)`` per sample.
    fraction : float or callable
        The effective sample size as a share of the batch, or a schedule of the step.
    sign : {-1, +1}, default -1
        The sign of the tilt.

    Attributes
    ----------
    tilts : list of float
        The tilt chosen at each step.

    See Also
    --------
    tiltlab.tilt_for_ess : Solves for the tilt.
    tiltlab.torch.TiltedLoss : The loss it wraps.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.reproduce._deep_report import ESSTiltedLoss
    >>> loss = ESSTiltedLoss(torch.nn.CrossEntropyLoss(reduction="none"), 0.6)
    >>> logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 0.1]])
    >>> value = loss(logits, torch.tensor([0, 1, 1, 0]))
    >>> bool(loss.tilts[0] < 0)
    True
    """

    def __init__(self, criterion: Callable, fraction: Any, *, sign: int = -1):
        from ..torch import TiltedLoss

        self.criterion = criterion
        self.fraction = fraction if callable(fraction) else (lambda step, f=float(fraction): f)
        self.sign = sign
        self.tilts: list[float] = []
        self._loss = TiltedLoss(criterion, t=0.0)

    def to(self, device: Any) -> ESSTiltedLoss:
        """Move the wrapped loss's state to ``device``; returns ``self``.

        Parameters
        ----------
        device : str or torch.device
            The device.

        Returns
        -------
        ESSTiltedLoss
            ``self``.

        See Also
        --------
        tiltlab.torch.TiltedLoss

        Examples
        --------
        >>> import torch
        >>> from tiltlab.reproduce._deep_report import ESSTiltedLoss
        >>> loss = ESSTiltedLoss(torch.nn.CrossEntropyLoss(reduction="none"), 0.5)
        >>> loss.to("cpu") is loss
        True
        """
        self._loss.to(device)
        return self

    def __call__(self, logits: Any, target: Any, groups: Any = None) -> Any:
        f = float(self.fraction(len(self.tilts)))
        losses = self.criterion(logits, target).detach().double()
        try:
            t = 0.0 if f >= 1.0 else float(tilt_for_ess(losses, f, sign=self.sign))
        except ValueError:  # a batch of equal (or too few distinct) losses: no tilt
            t = 0.0
        self.tilts.append(t)
        self._loss.t = t
        return self._loss(logits, target)

"""Per-group reports for the deep reproductions (PyTorch).

:func:`training_report` evaluates a trained network's per-sample losses on its training
data and reports what a hierarchical tilt does to each group (classes, annotators) with
:func:`tiltlab.diagnostics.group_report`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..diagnostics import effective_sample_size, group_report
from ..risk import hierarchical_weights
from ._deep_losses import _torch

__all__ = ["training_losses", "training_report"]


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
    >>> from tiltlab.reproduce.deep import make_model
    >>> from tiltlab.reproduce.deep import training_losses
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
    >>> from tiltlab.reproduce.deep import training_report
    >>> rep = training_report(np.array([0.1, 0.2, 3.0, 0.3]), np.array([0, 0, 1, 1]),
    ...                       (-2, -2))
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

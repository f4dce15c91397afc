"""Data of the paper's trade-off figure: :func:`tradeoff_curves`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .path_data import _entropy, _host, _tilted_risks, _tilted_weights

__all__ = ["tradeoff_curves"]


def tradeoff_curves(path: Any) -> dict[str, np.ndarray]:
    """Data of the paper's trade-off figure: loss statistics at the path's solutions.

    Parameters
    ----------
    path : TiltPath

    Returns
    -------
    dict of ndarray
        Sorted by tilt (repeated tilts dropped), one entry per tilt: ``"t"``, ``"mean"``,
        ``"max"``, ``"min"``, ``"variance"`` of the losses (prior-weighted mean and
        variance; the losses of the loss function, without the ridge), ``"cosine"`` (the
        cosine similarity with the all-ones vector, ``E l / sqrt(E l^2)``; NaN where all
        losses are zero), ``"entropy"`` (of the path's own tilted weights
        ``w(t; theta(t))``, ``log N`` at ``t = 0``), ``"risk"`` (the tilted risk
        ``R(t; theta(t))``) and ``"objective"`` (``R`` plus the ridge penalty).

    See Also
    --------
    tiltlab.plot.plot_tradeoffs : Draws them.
    check_path : Checks the paper's claims about them.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.theory import tradeoff_curves
    >>> X = np.c_[np.linspace(0, 1, 20), np.ones(20)]
    >>> y = X[:, 0] + np.where(np.arange(20) < 3, 2.0, 0.0)
    >>> path = tl.tilt_path(tl.TiltedObjective("squared", X, y), [2.0, 0.0, -1.0])
    >>> c = tradeoff_curves(path)
    >>> c["t"].tolist(), bool(c["max"][2] <= c["max"][1])
    ([-1.0, 0.0, 2.0], True)
    """
    for attr in ("ts", "x", "objective"):
        if not hasattr(path, attr):
            raise TypeError(f"`path` must be a TiltPath (from tiltlab.tilt_path); no `{attr}`")
    obj = path.objective
    ts = np.asarray(path.ts, dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    keep = np.concatenate([[True], np.diff(ts[order]) > 0])
    idx = order[keep]
    L = np.stack([_host(obj.losses(path.x[int(k), ...])) for k in idx])
    n = L.shape[1]
    prior = obj.prior() if hasattr(obj, "prior") else None
    p = np.full(n, 1.0 / n) if prior is None else _host(prior)
    t = ts[idx]
    mean = L @ p
    rms = np.sqrt((L * L) @ p)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosine = np.where(rms > 0, mean / np.where(rms > 0, rms, 1.0), np.nan)
    R = np.diag(_tilted_risks(L, p, t))
    l2 = float(getattr(obj, "l2", 0.0))
    pen = np.array([0.5 * l2 * float(np.sum(_host(path.x[int(k), ...]) ** 2)) for k in idx])
    entropy = np.array([_entropy(_tilted_weights(L[j], p, t[j])) for j in range(t.size)])
    return {
        "t": t,
        "mean": mean,
        "max": L.max(axis=1),
        "min": L.min(axis=1),
        "variance": ((L - mean[:, None]) ** 2) @ p,
        "cosine": cosine,
        "entropy": entropy,
        "risk": R,
        "objective": R + pen,
    }

"""The tilted reduction's rule for arrays of states, without host reads: the finish of
vectorised kernels (a grid of tilts, ``torch.compile``, autograd through ``t``); see
:mod:`tiltlab.accumulator`."""

from __future__ import annotations

from typing import Any

from ._support import _add_scaled

__all__ = ["series_threshold", "finish_risk", "risk_of_exponents"]


def series_threshold(dtype: Any, xp: Any) -> float:
    """``|t| (hi - lo)`` below which the cumulant series ``mean + t k2 / 2 + t^2 k3 / 6``
    is exact to rounding (its next term is ``(|t| spread)^3 spread / 24``).

    Examples
    --------
    >>> import numpy as np
    >>> round(series_threshold(np.float64, np), 7)
    1.75e-05
    """
    return float((24.0 * float(xp.finfo(dtype).eps)) ** (1.0 / 3.0))


def finish_risk(
    t: Any,
    c: Any,
    scale: Any,
    q: Any,
    s: Any,
    mean: Any,
    xp: Any,
    *,
    tiny: float,
    series: tuple | None = None,
) -> Any:
    """The tilted risk from normalised sums, chosen element by element on device.

    ``t`` (finite, non-zero placeholders where the caller substitutes its own limits),
    ``c`` the shift, ``scale = |t| (hi - lo)``, ``q = sum p expm1(u)`` and
    ``s = sum p exp(u)`` with a prior summing to one, ``mean`` the prior-weighted mean.
    ``series = (t_exact, k2, k3, near)`` switches on the cumulant series where ``near``
    (``|t_exact| (hi - lo)`` below :func:`series_threshold`; ``t_exact`` may be 0 and
    carries autograd), so that the derivative in ``t`` is right at and near zero.

    Examples
    --------
    >>> import numpy as np
    >>> l, t = np.array([0.0, 1.0]), 0.5
    >>> u = t * (l - 1.0)
    >>> r = finish_risk(t, 1.0, 0.5, np.mean(np.expm1(u)), np.mean(np.exp(u)), 0.5, np,
    ...                 tiny=1e-154)
    >>> bool(np.isclose(r, np.log(np.mean(np.exp(t * l))) / t))
    True
    """
    small = scale <= 1
    logz = xp.where(
        small,
        xp.log1p(xp.where(small, q, xp.zeros_like(q))),
        xp.log(xp.where(small, xp.ones_like(s), s)),
    )
    r = _add_scaled(c, logz, t, xp)
    r = xp.where(scale < tiny, mean + xp.zeros_like(r), r)
    if series is not None:
        t_exact, k2, k3, near = series
        r_series = mean + t_exact * (k2 * 0.5 + t_exact * (k3 / 6.0))
        r = xp.where(near, r_series, r)
    return r


def risk_of_exponents(
    u: Any,
    p: Any,
    c: Any,
    scale: Any,
    mean: Any,
    t: Any,
    xp: Any,
    *,
    tiny: float,
    series: tuple | None = None,
) -> Any:
    """The tilted risk along the last axis from the shifted exponents ``u = t (l - c)``
    (``<= 0``) and a normalised prior ``p`` (None: uniform): the two normalisers of
    :func:`finish_risk`, formed in one place.

    Examples
    --------
    >>> import numpy as np
    >>> l, t = np.array([0.0, 1.0]), 2.0
    >>> r = risk_of_exponents(t * (l - 1.0), None, 1.0, 2.0, 0.5, t, np, tiny=1e-154)
    >>> bool(np.isclose(r, np.log(np.mean(np.exp(t * l))) / t))
    True
    """

    def wmean(a):
        return xp.mean(a, axis=-1) if p is None else xp.sum(p * a, axis=-1)

    q = wmean(xp.expm1(u))
    z = wmean(xp.exp(u))
    return finish_risk(t, c, scale, q, z, mean, xp, tiny=tiny, series=series)

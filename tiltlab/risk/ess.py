r"""The tilt at a given effective sample size: :func:`tilt_for_ess`.

The effective sample size (Kish) of the tilted weights, as a fraction of the data, is

.. math:: F(t) = \frac{\left(\sum_i p_i e^{t\ell_i}\right)^2}{\sum_i p_i e^{2t\ell_i}}
          = e^{2K(t) - K(2t)}, \qquad K(s) = \log \sum_i p_i e^{s\ell_i},

for prior weights :math:`p` summing to one (``1/N`` each by default, where it is
:math:`(\sum_i w_i)^2 / (N\sum_i w_i^2)`). Its logarithm has the derivative
:math:`2(\mu(t) - \mu(2t))`, with :math:`\mu(s) = K'(s)` the tilted mean of the losses, which
is non-decreasing in ``s`` (its derivative is the tilted variance). So ``F`` is
non-increasing in ``|t|`` for either sign of ``t``, strictly unless the losses are equal on
the support of ``p``: it falls from 1 at ``t = 0`` to the prior mass of the samples tied at
the largest loss (``t -> +inf``) or the smallest one (``t -> -inf``). That makes
``F(t) = fraction`` a one-dimensional monotone root, solved here by Brent's method in
``log|t|``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .._compat import device, materialize, namespace_of, real_number, scalar, to_numpy
from .inputs import prepare_losses, prepare_prior

__all__ = ["tilt_for_ess"]

#: absolute tolerance on log|t| (relative on t) of the root finder
_XTOL = 1e-12
#: steps of log|t| taken while bracketing the root, and their number at most
_STEP = 2.0
_MAX_STEPS = 200


def _check_sign(sign: Any) -> int:
    if isinstance(sign, bool) or not isinstance(sign, numbers.Real):
        raise TypeError(f"`sign` must be -1 or +1, got {sign!r}")
    if sign not in (-1, 1):
        raise ValueError(f"`sign` must be -1 (down-weight large losses) or +1, got {sign!r}")
    return int(sign)


def _wide(l: Any, xp: Any) -> Any:
    """``l`` in float64 where the device has it (the root is asked to 1e-8 in ``t``,
    finer than float32's rounding); otherwise as it is."""
    if l.dtype == xp.float64:
        return l
    try:
        return xp.astype(l, xp.float64)
    except (TypeError, RuntimeError, ValueError):  # pragma: no cover - no float64 (MPS)
        return l


class _LogESS:
    """``log F(t)`` for one tilt at a time, from the losses shifted by their extreme on
    the support (so every exponent is <= 0), each evaluation one pass over the data."""

    def __init__(self, l: Any, p: Any, sign: int, xp: Any):
        self.xp, self.p = xp, p
        on = None if p is None else p > 0
        fill = -math.inf if sign > 0 else math.inf
        masked = l if on is None else xp.where(on, l, scalar(fill, l, xp))
        c = xp.max(masked) if sign > 0 else xp.min(masked)
        d = l - c  # <= 0 for sign +1, >= 0 for sign -1, on the support
        if on is not None:
            d = xp.where(on, d, xp.zeros_like(d))
        tied = d == 0
        if on is not None:
            tied = tied & on
        share = (
            xp.mean(xp.astype(tied, l.dtype))
            if p is None
            else xp.sum(xp.where(tied, p, xp.zeros_like(p)))
        )
        self.d = d
        # F -> the prior mass of the tied extreme samples as |t| -> inf
        self.limit = float(share)
        spread = float(xp.max(xp.abs(d)))
        mean = float(xp.mean(l) if p is None else xp.sum(p * l))
        var = float(xp.mean((l - mean) ** 2) if p is None else xp.sum(p * (l - mean) ** 2))
        self.spread, self.var = spread, var

    def __call__(self, t: float) -> float:
        xp, d = self.xp, self.d
        u = scalar(t, d, xp) * d  # <= 0
        # small |t| * spread: S_k - 1 from expm1, so that log1p keeps log F exact near
        # t = 0; otherwise S_k from exp (positive terms, exact relative to P_star)
        near = abs(t) * self.spread <= 1.0
        e1, e2 = (xp.expm1(u), xp.expm1(u + u)) if near else (xp.exp(u), xp.exp(u + u))
        if self.p is None:
            sums = xp.stack([xp.mean(e1), xp.mean(e2)])
        else:
            sums = xp.stack([xp.sum(self.p * e1), xp.sum(self.p * e2)])
        s1, s2 = (float(v) for v in to_numpy(sums))
        # log F = 2 log S1 - log S2
        if near:
            return 2.0 * math.log1p(s1) - math.log1p(s2)
        return 2.0 * math.log(s1) - math.log(s2)


def _solve(g: _LogESS, f: float, s: int, big: float) -> float:
    """The tilt of sign ``s`` with ``log F(t) = log f``: a bracket in ``log|t|``, then
    Brent's method (``f`` lies strictly between the limit of ``F`` and 1)."""
    logf = math.log(f)

    def h(x: float) -> float:  # decreasing in x = log|t|
        return g(s * math.exp(x)) - logf

    # start at the small-tilt estimate log F ~ -var t^2, then walk to a bracket
    scale = math.sqrt(g.var) if g.var > 0 else g.spread
    x0 = 0.5 * math.log(-logf) - math.log(scale)
    top = math.log(math.sqrt(big) / g.spread)
    x0 = min(x0, top)
    lo = hi = x0
    if h(x0) > 0:
        for _ in range(_MAX_STEPS):
            hi = min(hi + _STEP, top)
            if h(hi) <= 0:
                break
            lo = hi
            if hi >= top:
                hi = None
                break
        else:  # pragma: no cover - the steps reach `top` first
            hi = None
        if hi is None:
            raise ValueError(
                f"`fraction`={f!r} lies too close to its limit {g.limit!r} to be reached "
                f"at a finite tilt in floating-point arithmetic"
            )
    else:
        for _ in range(_MAX_STEPS):
            lo = lo - _STEP
            if h(lo) > 0:
                break
            hi = lo
        else:
            raise ValueError(  # pragma: no cover - F -> 1 as t -> 0, so h(lo) > 0
                f"`fraction`={f!r} is too close to 1 to be resolved"
            )
    from scipy.optimize import brentq  # imported here: `import tiltlab` stays light

    x = brentq(h, lo, hi, xtol=_XTOL, rtol=4 * 2.0**-52, maxiter=200)
    return s * math.exp(x)


def tilt_for_ess(
    losses: Any,
    fraction: Any,
    *,
    sign: int = -1,
    weights: Any = None,
    xp: Any = None,
) -> Any:
    r"""The tilt of a given sign at which the tilted weights keep ``fraction`` of the data.

    Solves :math:`F(t) = \text{fraction}` for ``t`` of the sign ``sign``, where

    .. math:: F(t) = \frac{\left(\sum_i p_i e^{t\ell_i}\right)^2}
                          {\sum_i p_i e^{2t\ell_i}}

    is the effective sample size :math:`(\sum_i w_i)^2/\sum_i w_i^2` of the tilted weights
    :math:`w_i \propto e^{t\ell_i}` divided by the number of samples ``N`` (uniform prior,
    ``p_i = 1/N``). With prior ``weights`` the samples count with those frequencies:
    ``F`` is the effective sample size fraction of a data set in which sample ``i``
    appears in proportion to ``p_i`` (integer weights: ``p_i`` copies), which is 1 at
    ``t = 0`` whatever the prior. ``F`` falls monotonically in ``|t|`` on either side
    (module notes), from 1 to the prior mass :math:`P_\star` of the samples tied at the
    largest loss (``sign=+1``) or the smallest one (``sign=-1``); that is ``k/N`` for
    ``k`` tied samples under the uniform prior, usually ``1/N``.

    Parameters
    ----------
    losses : array, shape (N,)
        Per-sample losses (finite).
    fraction : float
        The effective sample size as a share of the data, in :math:`(P_\star, 1]`;
        ``1`` gives ``t = 0``.
    sign : {-1, +1}, optional
        The sign of the tilt: ``-1`` (default) down-weights large losses (outliers,
        noisy labels), ``+1`` up-weights them (the worst cases, fairness).
    weights : array, shape (N,), optional
        Non-negative prior weights (frequencies), normalised to sum to one. Samples of
        zero weight do not count.
    xp : namespace, optional
        The array namespace; inferred from ``losses`` by default.

    Returns
    -------
    array
        The tilt, a 0-d array in the namespace, dtype and device of ``losses``
        (integer losses: the namespace's default float). It is found to a relative
        error of about ``1e-12`` in float64 arithmetic (float32 and 16-bit losses are
        evaluated in float64 where the device has it and the result rounded), as long
        as ``F`` can be told from 1 and from :math:`P_\star` in that arithmetic.

    Raises
    ------
    ValueError
        ``fraction`` outside ``(0, 1]``, or not above :math:`P_\star` (no finite tilt
        reaches it: in particular equal losses keep ``F = 1`` at every tilt, so then only
        ``fraction=1`` is accepted, and gives 0); ``sign`` not -1 or +1; empty,
        non-finite or not 1-d ``losses``; bad ``weights``.
    TypeError
        A ``fraction`` or ``sign`` that is not a real number.

    See Also
    --------
    tiltlab.diagnostics.effective_sample_size : Kish's effective sample size of weights.
    tilted_weights : The weights whose effective size this fixes.

    Notes
    -----
    Each evaluation of ``F`` is one pass over the losses (two exponentials per sample,
    shifted by the extreme loss so that none overflows, with ``expm1``/``log1p`` so that
    ``F`` keeps its precision near ``t = 0``) and one read of two numbers on the host;
    the root takes a few dozen evaluations. Dask losses are computed once and kept in
    memory for them.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import tilt_for_ess, tilted_weights
    >>> from tiltlab.diagnostics import effective_sample_size
    >>> l = np.array([0.1, 0.3, 0.2, 0.4, 5.0, 0.25, 0.15, 6.0])
    >>> t = tilt_for_ess(l, 0.5)  # half of the data, down-weighting large losses
    >>> bool(t < 0)
    True
    >>> ess = effective_sample_size(tilted_weights(l, t))
    >>> bool(np.isclose(ess / l.size, 0.5))
    True
    >>> float(tilt_for_ess(l, 1.0))
    0.0
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    s = _check_sign(sign)
    f = real_number(fraction, "fraction")
    if not 0.0 < f <= 1.0:
        raise ValueError(f"`fraction` must lie in (0, 1], got {f!r}")
    l = prepare_losses(losses, xp, True)
    if l.ndim != 1:
        raise ValueError(f"`losses` must be 1-d (one loss per sample), got shape {tuple(l.shape)}")
    out_dtype = l.dtype
    p = prepare_prior(weights, l, xp)
    lw = _wide(l, xp)
    if p is not None:
        p = xp.astype(p, lw.dtype) if p.dtype != lw.dtype else p
    lw, p = materialize(lw, p) if p is not None else (materialize(lw)[0], None)
    if f == 1.0:
        return xp.asarray(0.0, dtype=out_dtype, device=device(l))
    g = _LogESS(lw, p, s, xp)
    if not f > g.limit:
        who = "largest" if s > 0 else "smallest"
        raise ValueError(
            f"`fraction`={f!r} is not attainable with sign={s:+d}: the effective sample size "
            f"falls from 1 at t = 0 to {g.limit!r} (the share of the samples tied at the "
            f"{who} loss) as |t| grows; pass a fraction above it"
            + (" (the losses are all equal: only fraction=1 is)" if g.limit >= 1.0 else "")
        )
    t = _solve(g, f, s, float(xp.finfo(lw.dtype).max))
    return xp.asarray(t, dtype=out_dtype, device=device(l))

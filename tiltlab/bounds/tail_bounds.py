"""Upper bounds on tail fractions and k-losses from tilted risks.

:func:`tilted_tail_bound` (the TERM paper's bound on ``Q(a)`` for every real tilt),
:func:`chernoff_bound` (the classical exponential bound it improves on for ``t > 0``) and
:func:`k_loss_bound` (bounds on the k-th smallest loss).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import (
    device,
    namespace_of,
    tiny_sqrt,
    to_numpy,
)
from ..risk import (
    prepare_tilt,
    risk_kernel,
)
from ._common import (
    _bshape,
    _check_k,
    _floor,
    _guarded_exp,
    _infinite_tilt_limit,
    _points,
    _samples_last,
    _tail_bound_kernel,
)

__all__ = ["tilted_tail_bound", "chernoff_bound", "k_loss_bound"]


# ---------------------------------------------------------------------------
# public API: tail bounds from tilted risks


def tilted_tail_bound(
    losses: Any,
    a: Any,
    t: Any,
    *,
    floor: Any = 0.0,
    axis: int = -1,
    weights: Any = None,
    xp: Any = None,
) -> Any:
    r"""The TERM tail bound :math:`Q(a) \le \frac{e^{tR(t)} - e^{tF}}{e^{ta} - e^{tF}}`.

    The theorem of the paper's superquantile appendix: for every real ``t``, every
    ``a > F`` and losses no smaller than ``F``, the share of losses at or above ``a``
    is at most this ratio, where ``R(t)`` is the tilted risk and ``F`` the ``floor``
    (``F(-inf)``). It is evaluated in log space, so large ``|t|`` never overflows:

    * ``t > 0``: ``exp(t (R - a)) * (1 - e^{-t (R - F)}) / (1 - e^{-t (a - F)})``;
    * ``t < 0``: ``(1 - e^{t (R - F)}) / (1 - e^{t (a - F)})``;
    * ``t = 0``: Markov's inequality ``(R(0) - F) / (a - F)`` (the continuous
      extension; tilts whose ``|t| (a - F)`` underflow use it too);
    * ``t = +inf``: the limit, ``+inf`` for ``a < max``, else ``Q(a)`` itself;
      ``t = -inf``: the share of losses strictly above ``F``.

    Nothing is clipped: the value exceeds one (and may be ``+inf`` once it overflows)
    where the bound is vacuous, for instance whenever ``a < R(t)``.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite, non-empty and ``>= floor``.
    a : float or 1-d array
        Threshold(s), finite and ``> floor``.
    t : float or 1-d array
        Tilt(s), any real value or ``+-inf``; not NaN.
    floor : float or array, optional
        ``F``, a lower bound on every loss (for every parameter value, if the bound is
        used across parameters). Default 0, right for non-negative losses. A scalar
        or an array broadcasting to the batch shape of ``losses``.
    axis, weights, xp
        As for :func:`tail_fraction`. With ``weights``, ``Q`` and ``R`` are both taken
        under the prior; the theorem holds unchanged.

    Returns
    -------
    array
        Shape ``t.shape + a.shape + batch`` (tilt axis first, then thresholds); the
        namespace, dtype and device of ``losses``.

    Raises
    ------
    ValueError
        ``a <= floor``; ``floor`` above the smallest loss; NaN ``t``; non-finite
        ``a``, ``floor`` or ``losses``.

    See Also
    --------
    chernoff_bound : The classical bound it sharpens.
    tail_fraction : The quantity it bounds.
    quantile_curves : The bound along a tilt path.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import tail_fraction, tilted_tail_bound
    >>> l = np.array([0.1, 0.2, 0.3, 2.0])
    >>> float(tail_fraction(l, 1.5))
    0.25
    >>> b = tilted_tail_bound(l, 1.5, np.array([-5.0, 0.0, 1.0, 5.0]))
    >>> bool(np.all(b >= 0.25)), round(float(b[1]), 4)  # t = 0: mean / a
    (True, 0.4333)
    >>> float(tilted_tail_bound(l, 1.5, 1e4)) > 1  # vacuous once R(t) > a: not clipped
    True
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    tt, _ = prepare_tilt(t, xp, l)
    aa = _points(a, xp, l, "a")
    F = _floor(floor, xp, l, p)
    if not bool(xp.all(_bshape(aa, 0, l.ndim - 1, xp) > F)):
        raise ValueError("`a` must be greater than `floor` (the bound needs a > F(-inf))")
    return _tail_bound_kernel(l, p, aa, tt, F, to_numpy(tt), xp)


def chernoff_bound(
    losses: Any, a: Any, t: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""Chernoff bound :math:`Q(a) \le e^{t (R(t) - a)}` for ``t >= 0``.

    Markov's inequality applied to :math:`e^{t\ell}`. It needs no floor, and it is never
    tighter than :func:`tilted_tail_bound` with any valid floor wherever either is below
    one (the two agree as ``F -> -inf``). ``t = 0`` gives the trivial bound 1;
    ``t = +inf`` the limit (``+inf`` for ``a < max``, else ``Q(a)``). Values that
    overflow are returned as ``+inf``; nothing is clipped.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    a : float or 1-d array
        Threshold(s), finite.
    t : float or 1-d array
        Non-negative tilt(s) (``+inf`` allowed).
    axis, weights, xp
        As for :func:`tail_fraction`.

    Returns
    -------
    array
        Shape ``t.shape + a.shape + batch``; namespace, dtype and device of ``losses``.

    Raises
    ------
    ValueError
        Negative or NaN ``t``; non-finite ``a`` or ``losses``.

    See Also
    --------
    tilted_tail_bound : The sharper bound from the tilted risk.
    tail_fraction : The quantity it bounds.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import chernoff_bound
    >>> l = np.array([0.0, 0.0, 0.0, 1.0])
    >>> round(float(chernoff_bound(l, 1.0, 2.0)), 6)  # (3 + e^2) / 4 / e^2
    0.351501
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    tt, _ = prepare_tilt(t, xp, l)
    aa = _points(a, xp, l, "a")
    t_host = to_numpy(tt)
    if np.any(t_host < 0):
        raise ValueError("`t` must be non-negative for the Chernoff bound on Q(a)")
    T, A, nb = tt.ndim, aa.ndim, l.ndim - 1
    R = risk_kernel(l, p, tt, xp)
    Rb = xp.reshape(R, tuple(tt.shape) + (1,) * A + tuple(l.shape[:-1]))
    ab = _bshape(aa, T, nb, xp)
    tb = _bshape(tt, 0, A + nb, xp)
    fin = xp.isfinite(tb)
    e = xp.where(fin, tb, xp.zeros_like(tb)) * (Rb - ab)
    out = _guarded_exp(e, xp.ones_like(e), xp)
    if np.any(np.isinf(t_host)):
        r_inf = risk_kernel(l, p, xp.asarray(xp.inf, dtype=l.dtype, device=device(l)), xp)
        lim = _infinite_tilt_limit(l, p, aa, r_inf, xp, T)
        out = xp.where(tb == xp.inf, lim + xp.zeros_like(out), out)
    return out


def k_loss_bound(
    losses: Any,
    k: int,
    t: Any,
    *,
    floor: Any = 0.0,
    axis: int = -1,
    paper_constant: bool = False,
    xp: Any = None,
) -> Any:
    r"""Upper bound on the k-th smallest loss :math:`R_{(k)}` from the tilted risk.

    With ``c = N / (N - k + 1)``, ``u = t (R(t) - F)`` and ``F`` the ``floor``:

    * ``t > 0``: :math:`R_{(k)} \le R(t) + \frac1t \log\bigl(c - (c - 1) e^{-u}\bigr)
      = F + \frac1t \log\bigl(1 + c (e^{u} - 1)\bigr)`;
    * ``t < 0``: :math:`R_{(k)} \le F + \frac1t \log\bigl(1 + c (e^{u} - 1)\bigr)` when
      ``1 + c (e^u - 1) > 0``, else ``+inf`` (no information);
    * ``t = 0``: Markov, :math:`R_{(k)} \le F + c (R(0) - F)`, the limit from both
      sides; ``t = +inf``: the maximum; ``t = -inf``: the limit, ``R_(k)`` itself when
      the ``k - 1`` smallest losses equal ``F``, else ``+inf``.

    For ``t < 0`` the argument ``1 + c (e^u - 1)`` cancels badly when formed from ``R(t)``
    (it can be far smaller than its terms), so that branch is evaluated from the sorted
    losses, ``sum_i e^{t (l_i - F)} - (k - 1)`` split into the ``k - 1`` smallest terms
    (as ``expm1``) and the rest, in log space; the value is the same bound.

    ``k = 1`` gives ``R(t)`` itself at every tilt (``min <= R(t)``) and ``k = N``, for
    ``t > 0``, a bound below the classical ``max <= R(t) + log(N) / t``. With
    ``paper_constant=True`` read ``k`` for ``k - 1`` in these statements.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis`` (uniform weights), finite and ``>= floor``.
    k : int
        Rank in ``[1, N]`` (``[1, N - 1]`` with ``paper_constant=True``).
    t : float or 1-d array
        Tilt(s); a 1-d grid adds a leading axis. Not NaN.
    floor : float or array, optional
        ``F = F(-inf)``, a lower bound on every loss (default 0).
    axis : int, optional
        The sample axis (default: last).
    paper_constant : bool, optional
        Use the paper's constant ``N / (N - k)`` instead of ``N / (N - k + 1)``
        (a valid but looser bound; see Notes). Default False.
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        Shape ``t.shape + batch``; namespace, dtype and device of ``losses``.

    Raises
    ------
    ValueError
        ``k`` out of range; ``floor`` above the smallest loss; NaN ``t``.

    See Also
    --------
    k_loss : The quantity it bounds.
    tilted_tail_bound : The tail bound it inverts.

    Notes
    -----
    Both bounds follow from :func:`tilted_tail_bound` with ``a = R_(k)``, where the
    tail share is :math:`Q(R_{(k)}) \ge (N - k + 1)/N` (the k-th smallest loss and
    the ``N - k`` above it). The paper's corollaries instead set
    ``Q(R_(k)) = (N - k)/N``, one sample short: their implicit form
    :math:`|e^{(R_{(k)} - F)t} - 1| \le \frac{N}{N-k}|e^{(R(t) - F)t} - 1|` and explicit
    form :math:`R_{(k)} \le F + \frac1t\log\frac{e^{(R(t)-F)t} - k/N}{1 - k/N}` remain
    true (the constant ``N/(N-k)`` only exceeds the right one) but are looser and
    exclude ``k = N`` (the paper states them for ``k`` in ``{2, ..., N - 1}``); the
    derivation with ``(N - k + 1)/N`` gives ``(e^{u} - (k-1)/N) / (1 - (k-1)/N)`` inside
    the logarithm and holds for every ``k`` in ``[1, N]``. It cannot be improved as a
    function of ``R(t)``, ``F``, ``N`` and ``k`` alone: with ``k - 1`` losses at ``F`` and
    the other ``N - k + 1`` equal to ``b``, it returns ``b = R_(k)`` at every tilt.
    The implicit form is stated for ``t > 0``, where its absolute values do nothing; it
    also holds for ``t < 0`` (with the sharp constant too), which is the ``t < 0``
    branch above. Either way it bounds ``R_(k)`` from above only, never from below.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import k_loss, k_loss_bound
    >>> l = np.array([0.1, 0.4, 0.5, 0.9, 3.0])
    >>> float(k_loss(l, 4))
    0.9
    >>> b = k_loss_bound(l, 4, np.array([-2.0, 0.0, 1.0, 4.0]))
    >>> bool(np.all(b >= 0.9))
    True
    """
    xp = namespace_of(losses=losses) if xp is None else xp
    l, _ = _samples_last(losses, axis, None, xp)
    n = l.shape[-1]
    kk = _check_k(k, n)
    if paper_constant and kk == n:
        raise ValueError("`k` must be at most N - 1 with paper_constant=True (N / (N - k))")
    tt, _ = prepare_tilt(t, xp, l)
    F = _floor(floor, xp, l, None)
    above = n - kk if paper_constant else n - kk + 1  # samples known to be >= R_(k)
    return _k_bound_kernel(l, F, tt, n - above, to_numpy(tt), xp)


def _log1mexp(x: Any, xp: Any) -> Any:
    """log(1 - e^x) for x < 0, accurate on both sides of -log 2."""
    near = x > -math.log(2.0)
    xn = xp.where(near, x, -xp.ones_like(x))
    xf = xp.where(near, -xp.ones_like(x), x)
    return xp.where(near, xp.log(-xp.expm1(xn)), xp.log1p(-xp.exp(xf)))


def _k_bound_kernel(l, F, tt, j, t_host, xp):
    """k-loss bound with ``j`` samples allowed below R_(k) (j = k - 1 sharp, k paper):
    ``F + log((sum_i e^{t (l_i - F)} - j) / (N - j)) / t``; tilt axis leads."""
    n = l.shape[-1]
    c = n / (n - j)
    T, nb = tt.ndim, l.ndim - 1
    dev = device(l)
    R = risk_kernel(l, None, tt, xp)
    Fb = _bshape(F, T, 0, xp)
    R = xp.maximum(R, Fb)  # exact maths: R >= min >= F
    tb = _bshape(tt, 0, nb, xp)
    fin = xp.isfinite(tb) & (tb != 0)
    tabs = xp.abs(xp.where(fin, tb, xp.ones_like(tb)))
    lmax = xp.max(l, axis=-1)
    small = (tabs * (lmax - F) < tiny_sqrt(l.dtype, xp)) | (tb == 0)
    # t > 0: R + log(c - (c - 1) e^{-u}) / t, u = t (R - F); the argument lies in [1, c]
    u = tabs * (R - Fb)
    pos = R + xp.log1p(-(c - 1) * xp.expm1(-u)) / tabs
    # t < 0: 1 + c (e^u - 1) cancels as it nears 0 when formed from R, so use the sorted
    # losses: with d_i = l_(i) - F, S = sum_{i<=j} expm1(-|t| d_i) + sum_{i>j} e^{-|t| d_i},
    # and bound = l_(j+1) - (log1p(P1 / (N - j)) + log(1 - e^lam)) / |t|, where
    # P1 = sum_{i>j} expm1(-|t| (d_i - d_(j+1))) and lam = log(-S_low) + |t| d_(j+1) - log P
    ls = xp.sort(l, axis=-1)
    pivot = ls[..., j]
    if not np.any(t_host < 0):
        return _k_bound_finish(pos, pos, R, Fb, c, tb, small, lmax, l, F, pivot, j, t_host, xp)
    low = xp.arange(n, device=dev) < j
    tcol = tabs[..., None]
    zero = xp.zeros((), dtype=l.dtype, device=dev)
    d = ls - F[..., None]
    s_low = xp.sum(xp.where(low, xp.expm1(-tcol * d), zero), axis=-1)
    gap = xp.where(low, zero, ls - pivot[..., None])  # >= 0 above the pivot
    p1 = xp.sum(xp.where(low, zero, xp.expm1(-tcol * gap)), axis=-1)
    log_p = math.log(n - j) + xp.log1p(p1 / (n - j))
    has_low = s_low < 0
    lam = xp.log(xp.where(has_low, -s_low, xp.ones_like(s_low))) + tabs * (pivot - F) - log_p
    lam = xp.where(has_low, lam, -xp.ones_like(lam))
    feasible = ~has_low | (lam < 0)
    lam = xp.where(feasible, lam, -xp.ones_like(lam))
    corr = xp.where(has_low, _log1mexp(lam, xp), xp.zeros_like(lam))
    neg = pivot - (xp.log1p(p1 / (n - j)) + corr) / tabs
    neg = xp.where(feasible, neg, xp.full_like(neg, xp.inf))
    return _k_bound_finish(pos, neg, R, Fb, c, tb, small, lmax, l, F, pivot, j, t_host, xp)


def _k_bound_finish(pos, neg, R, Fb, c, tb, small, lmax, l, F, pivot, j, t_host, xp):
    """Select the branch of each tilt and put in the t = 0 and t = +-inf limits."""
    out = xp.where(tb > 0, pos, neg)
    out = xp.where(small, Fb + c * (R - Fb), out)
    if np.any(t_host == np.inf):
        out = xp.where(tb == xp.inf, lmax + xp.zeros_like(out), out)
    if np.any(t_host == -np.inf):
        count = xp.sum(xp.astype(l <= F[..., None], l.dtype), axis=-1)
        # the low sum tends to -(number of the j smallest losses above F): finite, and then
        # the bound tends to l_(j+1), exactly when the j smallest losses all equal F
        lim = xp.where(count >= j, pivot, xp.full_like(pivot, xp.inf))
        out = xp.where(tb == -xp.inf, lim + xp.zeros_like(out), out)
    return out

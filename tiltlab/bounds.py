r"""Tail fractions, quantile risks and the tail bounds that tilted risks give.

Everything here is a function of one loss vector ``l`` (samples along ``axis``) and,
where it makes sense, prior weights ``p`` (non-negative, normalised to sum one; uniform
by default). Notation follows the TERM paper's appendix "TERM as an Approximate
Superquantile Method":

* ``Q(a) = sum_i p_i [l_i >= a]``, the share of the losses at or above ``a``
  (:func:`tail_fraction`); ``R_(k)``, the k-th smallest loss (:func:`k_loss`);
* ``R(t) = (1/t) log sum_i p_i exp(t l_i)``, the tilted risk (:func:`tiltlab.tilted_risk`);
* ``F`` the floor ``F(-inf)``: a number no larger than any loss, for every parameter
  value (the paper's ``min_theta min_i f(x_i; theta)``; 0 for non-negative losses).

Quantile conventions
--------------------
``alpha`` is a *confidence level* in ``[0, 1)``, the share of the mass that is cut away
from below: ``value_at_risk(l, alpha)`` is the lower ``alpha``-quantile
``min{c : P(l <= c) >= alpha}``, ``superquantile(l, alpha)`` (CVaR) the average of the
top ``1 - alpha`` of the mass and ``entropic_value_at_risk(l, alpha)`` Ahmadi-Javid's
EVaR at confidence ``alpha``. ``alpha = 0`` gives the minimum (VaR) and the mean
(CVaR, EVaR); all three tend to the maximum as ``alpha -> 1``, and
``VaR <= CVaR <= EVaR <= max`` always.

Tail bounds
-----------
For every real ``t`` and ``a > F`` the paper's theorem gives

    Q(a) <= (exp(t R(t)) - exp(t F)) / (exp(t a) - exp(t F))

(:func:`tilted_tail_bound`, continuous at ``t = 0`` where it is Markov's inequality
``(R(0) - F) / (a - F)``). For ``t > 0`` it is never weaker than the Chernoff bound
``Q(a) <= exp(t (R(t) - a))`` (:func:`chernoff_bound`) whenever either is below one.
Setting ``a = R_(k)`` gives upper bounds on the k-loss (:func:`k_loss_bound`); see its
notes for how they relate to the paper's corollaries.

Backends
--------
NumPy, CuPy, PyTorch, array-api-strict and Dask through array-api-compat; results keep
the namespace, floating dtype and device of ``losses``. :func:`entropic_value_at_risk`
solves its one-dimensional minimisation on the host in float64 and returns the result
in the input's namespace.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ._compat import (
    as_float_array,
    as_parameter,
    check_finite,
    device,
    host_real,
    is_array_api_obj,
    namespace_of,
    normalize_axis,
    tiny_sqrt,
    to_numpy,
)
from .risk import (
    _moments,
    _risk_kernel,
    _weights_kernel,
    _wsum,
    prepare_losses,
    prepare_prior,
    prepare_tilt,
)

__all__ = [
    "tail_fraction",
    "k_loss",
    "value_at_risk",
    "superquantile",
    "tilted_tail_bound",
    "chernoff_bound",
    "k_loss_bound",
    "entropic_value_at_risk",
    "kl_dro_dual",
    "worst_case_distribution",
    "kl_divergence",
]


# ---------------------------------------------------------------------------
# input handling


def _samples_last(losses: Any, axis: int, weights: Any, xp: Any) -> tuple[Any, Any]:
    """Validated losses with the sample axis moved last, and the normalised prior."""
    l = prepare_losses(losses, xp, True)
    ax = normalize_axis(axis, l.ndim)
    if ax != l.ndim - 1:
        l = xp.moveaxis(l, ax, -1)
    return l, prepare_prior(weights, l, xp, ax)


def _points(value: Any, xp: Any, like: Any, name: str) -> Any:
    """A finite scalar or 1-d array of thresholds in the dtype/device of ``like``.

    Like tilts, thresholds are parameters: numbers or arrays of any library are
    converted to ``like``'s namespace.
    """
    arr = as_parameter(value, xp, like, name=name)
    check_finite(arr, xp, name=name)
    return arr


def _host_levels(alpha: Any) -> np.ndarray:
    """Confidence level(s) as a float64 host array (0-d or 1-d), validated in [0, 1)."""
    if isinstance(alpha, bool) or alpha is None:
        raise TypeError(f"`alpha` must be a number in [0, 1) or a 1-d array, got {alpha!r}")
    try:
        arr = np.asarray(to_numpy(alpha) if is_array_api_obj(alpha) else alpha)
    except (TypeError, ValueError) as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"`alpha` must be a number in [0, 1): {exc}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"`alpha` must be real, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size == 0):
        raise ValueError(f"`alpha` must be a scalar or a non-empty 1-d array, got {arr.shape}")
    if np.any(np.isnan(arr)) or np.any(arr < 0) or np.any(arr >= 1):
        raise ValueError(f"`alpha` must lie in [0, 1) (a confidence level), got {alpha!r}")
    return arr


def _check_k(k: Any, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"`k` must be an integer in [1, {n}], got {k!r}")
    if not 1 <= k <= n:
        raise ValueError(f"`k` must lie in [1, N] = [1, {n}] (1 = smallest loss), got {k}")
    return int(k)


def _floor(floor: Any, xp: Any, l: Any, p: Any) -> Any:
    """The floor F as an array of the batch shape; must not exceed the smallest loss."""
    if isinstance(floor, bool) or floor is None:
        raise TypeError(f"`floor` must be a real number, got {floor!r}")
    if is_array_api_obj(floor) and namespace_of(floor=floor) is xp:
        f = as_float_array(floor, xp, name="floor")
        f = xp.astype(f, l.dtype) if f.dtype != l.dtype else f
    else:  # a number, or a parameter array of another library
        f = xp.asarray(
            host_real(floor, "floor", "a real number or an array").astype(np.float64),
            dtype=l.dtype,
            device=device(l),
        )
    check_finite(f, xp, name="floor")
    batch = tuple(l.shape[:-1])
    try:
        f = xp.broadcast_to(f, batch)
    except (ValueError, RuntimeError) as exc:
        raise ValueError(
            f"`floor` of shape {tuple(f.shape)} does not broadcast to the batch shape {batch} "
            "of `losses`"
        ) from exc
    _, lmin = _moments(l, p, xp)
    if not bool(xp.all(f <= lmin)):
        raise ValueError(
            "`floor` exceeds the smallest loss; it must be a lower bound F(-inf) on every "
            "loss (pass floor <= min(losses), e.g. the infimum of the loss function)"
        )
    return f


# ---------------------------------------------------------------------------
# kernels (samples on the last axis)


def _bshape(x: Any, lead: int, trail: int, xp: Any) -> Any:
    """Reshape ``x`` with ``lead`` leading and ``trail`` trailing singleton axes."""
    return xp.reshape(x, (1,) * lead + tuple(x.shape) + (1,) * trail)


def _tail_kernel(l: Any, p: Any, aa: Any, xp: Any) -> Any:
    """Q(a) with the threshold axis (if any) leading: shape a.shape + batch."""
    ab = _bshape(aa, 0, l.ndim, xp)
    hit = xp.astype(l >= ab, l.dtype)
    return _wsum(hit, p, xp)


def _take_along_last(x: Any, idx: Any, xp: Any) -> Any:
    """``take_along_axis(x, idx, axis=-1)`` also where the namespace lacks it (Dask)."""
    if x.ndim == 1:
        return xp.take(x, idx, axis=0)
    if hasattr(xp, "take_along_axis"):
        return xp.take_along_axis(x, idx, axis=-1)
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    offs = xp.reshape(
        xp.arange(rows, dtype=idx.dtype, device=device(idx)) * n, tuple(x.shape[:-1]) + (1,)
    )
    flat = xp.take(xp.reshape(x, (-1,)), xp.reshape(idx + offs, (-1,)), axis=0)
    return xp.reshape(flat, tuple(x.shape))


def _sorted_desc(l: Any, p: Any, xp: Any) -> tuple[Any, Any]:
    """Losses sorted in decreasing order, with their prior weights (None if uniform)."""
    if p is None:
        return xp.sort(l, axis=-1, descending=True), None
    order = xp.argsort(l, axis=-1, descending=True, stable=True)
    pb = xp.broadcast_to(p, tuple(l.shape)) if p.ndim != l.ndim else p
    return _take_along_last(l, order, xp), _take_along_last(pb, order, xp)


def _top_mass(alpha: np.ndarray, n: int, weighted: bool) -> np.ndarray:
    """Mass 1 - alpha to keep, in count units (N (1 - alpha), exactly rounded) when
    the prior is uniform; +inf at alpha = 0 so that every sample is kept."""
    flat = alpha.reshape(-1)
    out = np.empty(flat.shape)
    for i, a in enumerate(flat.tolist()):
        if a == 0:
            out[i] = math.inf
        elif weighted:
            out[i] = 1.0 - a
        else:
            out[i] = float((1 - Fraction(a)) * n)
    return out.reshape(alpha.shape)


def _superquantile_kernel(l: Any, p: Any, alpha: np.ndarray, xp: Any) -> Any:
    """Average of the top (1 - alpha) mass; alpha axis (if any) leads."""
    ld, pd = _sorted_desc(l, p, xp)
    n = l.shape[-1]
    dev = device(l)
    smass = xp.asarray(_top_mass(alpha, n, p is not None), dtype=l.dtype, device=dev)
    smass = _bshape(smass, 0, l.ndim, xp)
    if pd is None:
        # count units: the j-th largest loss has exactly j samples above it
        above = xp.arange(n, dtype=l.dtype, device=dev)
        cap = xp.ones_like(ld)
    else:
        above = xp.cumulative_sum(pd, axis=-1, include_initial=True)[..., :-1]
        cap = pd
    # share of each sorted sample inside the top mass (the VaR atom gets a fraction)
    zero = xp.zeros((), dtype=l.dtype, device=dev)
    m = xp.minimum(xp.maximum(smass - above, zero), cap)
    return xp.sum(m * ld, axis=-1) / xp.sum(m, axis=-1)


def _var_kernel(l: Any, p: Any, alpha: np.ndarray, xp: Any) -> Any:
    """Lower alpha-quantile min{c : P(l <= c) >= alpha}; alpha axis (if any) leads."""
    ld, pd = _sorted_desc(l, p, xp)
    n = l.shape[-1]
    dev = device(l)
    if pd is None:
        # the VaR is the j-th largest loss, j = floor(N (1 - alpha)) (0-based), exactly
        flat = alpha.reshape(-1).tolist()
        js = [min(math.floor((1 - Fraction(a)) * n), n - 1) for a in flat]
        out = xp.take(ld, xp.asarray(js, device=dev), axis=-1)
        out = xp.moveaxis(out, -1, 0)
        return xp.reshape(out, tuple(alpha.shape) + tuple(l.shape[:-1]))
    smass = xp.asarray(_top_mass(alpha, n, True), dtype=l.dtype, device=dev)
    smass = _bshape(smass, 0, l.ndim, xp)
    above = xp.cumulative_sum(pd, axis=-1, include_initial=True)[..., :-1]
    # a sample qualifies when the mass strictly above it is at most 1 - alpha
    ok = (above <= smass) & (pd > 0)
    inf = xp.asarray(xp.inf, dtype=l.dtype, device=dev)
    return xp.min(xp.where(ok, ld, inf), axis=-1)


def _logmax(dtype: Any, xp: Any) -> float:
    """A little below log(largest finite number of ``dtype``)."""
    return math.log(float(xp.finfo(dtype).max)) - 1.0


def _guarded_exp(e: Any, factor: Any, xp: Any) -> Any:
    """``exp(e) * factor`` (factor >= 0), +inf where it would overflow, without warnings."""
    lm = _logmax(e.dtype, xp)
    pos = factor > 0
    log_total = e + xp.log(xp.where(pos, factor, xp.ones_like(factor)))
    big = pos & (log_total > lm)
    val = xp.exp(xp.where(big | ~pos, xp.zeros_like(e), e)) * factor
    return xp.where(big, xp.full_like(val, xp.inf), val)


def _infinite_tilt_limit(l: Any, p: Any, aa: Any, R_inf: Any, xp: Any, T: int) -> Any:
    """Limit of exp(t (R(t) - a)) (and of the tilted bound) as t -> +inf:
    +inf for a < max, the mass at a (the mass at the maximum, or 0) for a >= max."""
    A, nb = aa.ndim, l.ndim - 1
    q = _bshape(_tail_kernel(l, p, aa, xp), T, 0, xp)
    mx = _bshape(R_inf, T + A, 0, xp)
    ab = _bshape(aa, T, nb, xp)
    return xp.where(ab < mx, xp.full_like(q, xp.inf), q)


def _tail_bound_kernel(l, p, aa, tt, F, t_host, xp):
    T, A, nb = tt.ndim, aa.ndim, l.ndim - 1
    R = _risk_kernel(l, p, tt, xp)
    Rb = xp.reshape(R, tuple(tt.shape) + (1,) * A + tuple(l.shape[:-1]))
    Fb = _bshape(F, T + A, 0, xp)
    Rb = xp.maximum(Rb, Fb)  # R >= min(l) >= F exactly; guard against last-ulp rounding
    ab = _bshape(aa, T, nb, xp)
    tb = _bshape(tt, 0, A + nb, xp)
    one = xp.ones_like(tb)
    fin = xp.isfinite(tb) & (tb != 0)
    tabs = xp.abs(xp.where(fin, tb, one))
    span = ab - Fb  # > 0
    u = tabs * (Rb - Fb)  # >= 0
    v = tabs * span  # > 0
    small = (tabs * span < tiny_sqrt(l.dtype, xp)) | (tb == 0)
    v_safe = xp.where(small, xp.ones_like(v), v)
    # t < 0: (1 - e^{-u}) / (1 - e^{-v}) with u, v the magnitudes of t (R - F), t (a - F);
    # t > 0: the same ratio times exp(t (R - a)) (numerator and denominator divided by
    # e^{t R} and e^{t a}), so that no exponential of a positive argument is formed
    ratio = xp.expm1(-u) / xp.expm1(-v_safe)
    pos = _guarded_exp(tabs * (Rb - ab), ratio, xp)
    out = xp.where(tb > 0, pos, ratio)
    out = xp.where(small, (Rb - Fb) / span + xp.zeros_like(out), out)
    if np.any(np.isinf(t_host)):
        if np.any(t_host == np.inf):
            r_inf = _risk_kernel(l, p, xp.asarray(xp.inf, dtype=l.dtype, device=device(l)), xp)
            lim = _infinite_tilt_limit(l, p, aa, r_inf, xp, T)
            out = xp.where(tb == xp.inf, lim + xp.zeros_like(out), out)
        if np.any(t_host == -np.inf):
            # e^{t (R - F)} -> mass at F: the bound tends to the mass strictly above F
            at_floor = _wsum(xp.astype(l <= F[..., None], l.dtype), p, xp)
            lim = _bshape(1 - at_floor, T + A, 0, xp)
            out = xp.where(tb == -xp.inf, lim + xp.zeros_like(out), out)
    return out


# ---------------------------------------------------------------------------
# public API: tail fraction and quantile risks


def tail_fraction(
    losses: Any, a: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""Share of the losses at or above ``a``: :math:`Q(a) = \sum_i p_i\,[\ell_i \ge a]`.

    Parameters
    ----------
    losses : array
        Per-sample losses, samples along ``axis``; finite and non-empty.
    a : float, 0-d or 1-d array
        Threshold(s), finite. A 1-d array of length A gives a result with a leading axis
        of length A. Like tilts, thresholds (and floors) may come from any library; they
        are converted to the namespace of ``losses``.
    axis : int, optional
        The sample axis (default: last).
    weights : array, optional
        Non-negative prior weights (1-d, one per sample, or the shape of ``losses`` with
        the samples along ``axis``), normalised to sum one. Default: uniform, so ``Q(a)``
        is a multiple of ``1/N``.
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        ``Q(a)`` in the namespace, floating dtype and device of ``losses``; shape
        ``a.shape + batch`` where ``batch`` is the shape of ``losses`` without ``axis``.

    Raises
    ------
    ValueError
        Empty or non-finite ``losses``, non-finite ``a``, bad ``weights``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import tail_fraction
    >>> l = np.array([0.5, 1.0, 2.0, 4.0])
    >>> float(tail_fraction(l, 1.0))
    0.75
    >>> tail_fraction(l, np.array([0.0, 3.0, 5.0])).tolist()
    [1.0, 0.25, 0.0]
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    aa = _points(a, xp, l, "a")
    return _tail_kernel(l, p, aa, xp)


def k_loss(losses: Any, k: int, *, axis: int = -1, xp: Any = None) -> Any:
    r"""The k-th smallest loss :math:`R_{(k)}` (``k = 1``: minimum, ``k = N``: maximum).

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    k : int
        Rank, 1-based, in ``[1, N]``.
    axis : int, optional
        The sample axis (default: last).
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        The k-loss, shape ``batch`` (``losses`` without ``axis``), in the namespace,
        dtype and device of ``losses``.

    Raises
    ------
    TypeError
        ``k`` not an integer.
    ValueError
        ``k`` outside ``[1, N]``; empty or non-finite ``losses``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import k_loss
    >>> l = np.array([3.0, 1.0, 2.0])
    >>> float(k_loss(l, 1)), float(k_loss(l, 2)), float(k_loss(l, 3))
    (1.0, 2.0, 3.0)
    """
    xp = namespace_of(losses=losses) if xp is None else xp
    l, _ = _samples_last(losses, axis, None, xp)
    kk = _check_k(k, l.shape[-1])
    return xp.sort(l, axis=-1)[..., kk - 1]


def value_at_risk(
    losses: Any, alpha: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""Value-at-risk: the lower ``alpha``-quantile :math:`\min\{c : P(\ell \le c) \ge \alpha\}`.

    ``alpha`` is the confidence level in ``[0, 1)``; ``alpha = 0`` gives the smallest
    loss (over samples with positive weight), and the value tends to the largest loss
    as ``alpha -> 1``. It is the left end of the set of minimisers ``c`` of the
    Rockafellar-Uryasev objective in :func:`superquantile`. With uniform weights the
    rank is computed exactly from ``alpha`` (``alpha = 0.7``, ``N = 10`` picks the 7th
    smallest loss although ``0.7 * 10`` rounds above 7 in floating point).

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    alpha : float or 1-d array
        Confidence level(s) in ``[0, 1)``; a 1-d array adds a leading axis.
    axis, weights, xp
        As for :func:`tail_fraction`.

    Returns
    -------
    array
        Shape ``alpha.shape + batch``; namespace, dtype and device of ``losses``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import value_at_risk
    >>> l = np.array([1.0, 2.0, 3.0, 4.0])
    >>> value_at_risk(l, np.array([0.0, 0.5, 0.6, 0.99])).tolist()
    [1.0, 2.0, 3.0, 4.0]
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    al = _host_levels(alpha)
    return _var_kernel(l, p, al, xp)


def superquantile(
    losses: Any, alpha: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""Superquantile (CVaR) at confidence level ``alpha``: the mean of the top ``1 - alpha``.

    The Rockafellar-Uryasev value

    .. math:: \mathrm{CVaR}_\alpha(\ell) = \min_c\; c + \frac{E_p[(\ell - c)_+]}{1 - \alpha},

    computed exactly for the discrete distribution ``sum_i p_i delta_{l_i}``: the
    largest losses are averaged until they hold mass ``1 - alpha``, the atom at the VaR
    entering with the fraction of its mass that is needed. ``superquantile(l, 0)`` is
    the (weighted) mean; the value is non-decreasing in ``alpha``, lies between
    :func:`value_at_risk` and the maximum, and tends to the maximum as ``alpha -> 1``.
    For uniform weights the kept mass ``N (1 - alpha)`` is formed exactly from ``alpha``.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    alpha : float or 1-d array
        Confidence level(s) in ``[0, 1)``; a 1-d array adds a leading axis.
    axis, weights, xp
        As for :func:`tail_fraction`.

    Returns
    -------
    array
        Shape ``alpha.shape + batch``; namespace, dtype and device of ``losses``.

    Raises
    ------
    ValueError
        ``alpha`` outside ``[0, 1)``; empty or non-finite ``losses``; bad ``weights``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import superquantile
    >>> l = np.array([1.0, 2.0, 3.0, 4.0])
    >>> float(superquantile(l, 0.0)), float(superquantile(l, 0.5))
    (2.5, 3.5)
    >>> float(superquantile(l, 0.625))  # top 1.5 samples: (4 + 0.5 * 3) / 1.5
    3.6666666666666665
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    al = _host_levels(alpha)
    return _superquantile_kernel(l, p, al, xp)


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
    R = _risk_kernel(l, p, tt, xp)
    Rb = xp.reshape(R, tuple(tt.shape) + (1,) * A + tuple(l.shape[:-1]))
    ab = _bshape(aa, T, nb, xp)
    tb = _bshape(tt, 0, A + nb, xp)
    fin = xp.isfinite(tb)
    e = xp.where(fin, tb, xp.zeros_like(tb)) * (Rb - ab)
    out = _guarded_exp(e, xp.ones_like(e), xp)
    if np.any(np.isinf(t_host)):
        r_inf = _risk_kernel(l, p, xp.asarray(xp.inf, dtype=l.dtype, device=device(l)), xp)
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
    R = _risk_kernel(l, None, tt, xp)
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


# ---------------------------------------------------------------------------
# public API: entropic value-at-risk and the KL-DRO view


def _evar_row(l: np.ndarray, p: np.ndarray | None, alpha: float, xp_np: Any) -> tuple[float, float]:
    """EVaR of one loss row on the host (float64); returns (value, minimising tilt)."""
    from scipy.optimize import brentq

    if alpha == 0:
        return float(np.mean(l) if p is None else np.sum(p * l)), 0.0
    support = l if p is None else l[p > 0]
    lmax, lmin = float(np.max(support)), float(np.min(support))
    at_max = np.count_nonzero(l == lmax) / l.size if p is None else float(np.sum(p[l == lmax]))
    if at_max >= 1.0 - alpha or lmax == lmin:
        # KL(w_t || p) never reaches log(1/(1-alpha)): the infimum is the limit t -> inf
        return lmax, math.inf
    level = -math.log1p(-alpha)
    la = xp_np.asarray(l)
    pa = None if p is None else xp_np.asarray(p)

    def risk(t: float) -> float:
        return float(_risk_kernel(la, pa, xp_np.asarray(t), xp_np))

    def excess_kl(s: float) -> float:
        # d/dt [R(t) + level/t] has the sign of KL(w_t || p) - level, which increases in t
        t = math.exp(s)
        tt = xp_np.asarray(t)
        r = float(_risk_kernel(la, pa, tt, xp_np))
        w = np.asarray(_weights_kernel(la, pa, tt, xp_np))
        return float(np.sum(w * (t * (l - r)))) - level

    lo = hi = -math.log(lmax - lmin)
    while excess_kl(lo) >= 0 and lo > -700:
        lo -= 2.0
    while excess_kl(hi) <= 0:
        if hi > 700:
            return lmax, math.inf
        hi += 2.0
    s = brentq(excess_kl, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    t = math.exp(s)
    return min(risk(t) + level / t, lmax), t


def entropic_value_at_risk(
    losses: Any,
    alpha: Any,
    *,
    axis: int = -1,
    weights: Any = None,
    return_tilt: bool = False,
    xp: Any = None,
) -> Any:
    r"""Entropic value-at-risk at confidence level ``alpha``.

    .. math:: \mathrm{EVaR}_\alpha(\ell) = \inf_{t > 0}\; R(t) + \frac{\log(1/(1-\alpha))}{t}
              = \sup\{E_q[\ell] : \mathrm{KL}(q \| p) \le \log(1/(1-\alpha))\},

    Ahmadi-Javid's (2012) EVaR written with the confidence level ``alpha`` (his
    ``EVaR_{1-a}`` uses ``a = 1 - alpha``); ``R`` is the tilted risk under the prior.
    It is the tightest Chernoff bound on the VaR, so ``VaR <= CVaR <= EVaR <= max``.
    ``alpha = 0`` gives the mean (the infimum as ``t -> 0``); when the mass at the
    largest loss is at least ``1 - alpha`` the infimum is the maximum, reached as
    ``t -> inf``.

    The objective is unimodal in ``t``: its derivative has the sign of
    ``KL(w_t || p) - log(1/(1-alpha))`` (``w_t`` the tilted weights), which increases
    with ``t``. The root is found by Brent's method in ``log t`` on a bracket, in float64
    on the host, and the objective is evaluated there.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    alpha : float or 1-d array
        Confidence level(s) in ``[0, 1)``; a 1-d array adds a leading axis.
    axis, weights, xp
        As for :func:`tail_fraction`.
    return_tilt : bool, optional
        Also return the minimising tilt (``0`` at ``alpha = 0``, ``inf`` when the
        infimum is the maximum).

    Returns
    -------
    value : array
        Shape ``alpha.shape + batch`` (0-d for a single row and level), in the
        namespace, dtype and device of ``losses``.
    tilt : array
        Only with ``return_tilt=True``; same shape, namespace and dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import entropic_value_at_risk, superquantile
    >>> l = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    >>> ev, t = entropic_value_at_risk(l, 0.5, return_tilt=True)
    >>> bool(superquantile(l, 0.5) <= ev <= 10.0), bool(t > 0)
    (True, True)
    >>> float(entropic_value_at_risk(l, 0.0))  # the mean
    3.2
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    al = _host_levels(alpha)
    xp_np = namespace_of(x=np.zeros(1))
    l_h = np.asarray(to_numpy(l), dtype=np.float64)
    p_h = None if p is None else np.asarray(to_numpy(p), dtype=np.float64)
    if p_h is not None:
        p_h = np.broadcast_to(p_h, l_h.shape)
    batch = l_h.shape[:-1]
    rows = l_h.reshape(-1, l_h.shape[-1])
    prow = None if p_h is None else p_h.reshape(-1, l_h.shape[-1])
    vals = np.empty(al.shape + (rows.shape[0],))
    tilts = np.empty_like(vals)
    for ia, a_lev in np.ndenumerate(al):
        for r in range(rows.shape[0]):
            v, tl_ = _evar_row(rows[r], None if prow is None else prow[r], float(a_lev), xp_np)
            vals[ia + (r,)] = v
            tilts[ia + (r,)] = tl_
    shape = al.shape + batch
    value = xp.asarray(vals.reshape(shape).tolist(), dtype=l.dtype, device=device(l))
    if not return_tilt:
        return value
    tilt = xp.asarray(tilts.reshape(shape).tolist(), dtype=l.dtype, device=device(l))
    return value, tilt


def kl_dro_dual(
    losses: Any, t: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> tuple[Any, Any]:
    r"""The tilted risk as a KL-regularised distributionally robust risk.

    By the Donsker-Varadhan formula, for ``t > 0``

    .. math:: R(t) = \max_q\; E_q[\ell] - \frac{\mathrm{KL}(q \| p)}{t},

    over distributions ``q`` on the samples, attained at the tilted weights
    ``q_i = p_i e^{t\ell_i} / \sum_j p_j e^{t\ell_j}``. For ``t < 0`` the same formula
    holds with ``min`` (``R(t) = min_q E_q[l] + KL(q||p)/|t|``), ``t = 0`` forces
    ``q = p`` (the mean), and ``t = +-inf`` drops the penalty (``q`` on the extreme
    losses).

    Parameters
    ----------
    losses, t, axis, weights, xp
        As for :func:`tiltlab.tilted_risk`.

    Returns
    -------
    value : array
        ``R(t)``, the optimal value (shape ``t.shape + batch``).
    q : array
        The optimal distribution, the tilted weights (shape ``t.shape + losses.shape``
        with the samples on the last axis).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import kl_divergence, kl_dro_dual
    >>> l = np.array([0.0, 1.0, 3.0])
    >>> value, q = kl_dro_dual(l, 2.0)
    >>> bool(np.isclose(value, q @ l - kl_divergence(q) / 2.0))
    True
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    tt, _ = prepare_tilt(t, xp, l)
    return _risk_kernel(l, p, tt, xp), _weights_kernel(l, p, tt, xp)


def worst_case_distribution(
    losses: Any, t: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""The maximiser ``q`` of :math:`E_q[\ell] - \mathrm{KL}(q\|p)/t` (``t > 0``).

    The tilted weights: the worst-case reweighting of the prior within the KL penalty
    (for ``t < 0`` the minimiser, the best case). See :func:`kl_dro_dual`.

    Parameters
    ----------
    losses, t, axis, weights, xp
        As for :func:`tiltlab.tilted_risk`.

    Returns
    -------
    array
        ``q`` with the samples on the last axis (a tilt grid leads).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import worst_case_distribution
    >>> q = worst_case_distribution(np.array([0.0, 0.0, 1.0]), 50.0)
    >>> [round(v, 6) for v in q.tolist()]
    [0.0, 0.0, 1.0]
    """
    return kl_dro_dual(losses, t, axis=axis, weights=weights, xp=xp)[1]


def kl_divergence(q: Any, p: Any = None, *, axis: int = -1, xp: Any = None) -> Any:
    r"""Kullback-Leibler divergence :math:`\mathrm{KL}(q\|p) = \sum_i q_i \log(q_i/p_i)`.

    ``q`` and ``p`` are non-negative weights, each normalised to sum one along
    ``axis`` (``p`` uniform by default). Terms with ``q_i = 0`` contribute 0; a ``q_i > 0``
    with ``p_i = 0`` gives ``+inf``.

    Parameters
    ----------
    q : array
        Weights, samples along ``axis``.
    p : array, optional
        Reference weights, 1-d with one entry per sample or of the shape of ``q``.
    axis : int, optional
        The sample axis (default: last).
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        Shape of ``q`` without ``axis``; namespace, dtype and device of ``q``.

    Raises
    ------
    ValueError
        Empty, negative, non-finite or all-zero ``q`` or ``p``; mismatched shapes.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import kl_divergence
    >>> round(float(kl_divergence(np.array([1.0, 0.0]), np.array([0.5, 0.5]))), 12)
    0.69314718056
    """
    xp = namespace_of(q=q, p=p) if xp is None else xp
    qq = as_float_array(q, xp, name="q")
    if qq.ndim == 0 or any(s == 0 for s in qq.shape):
        raise ValueError(f"`q` must be a non-empty array, got shape {tuple(qq.shape)}")
    ax = normalize_axis(axis, qq.ndim)
    if ax != qq.ndim - 1:
        qq = xp.moveaxis(qq, ax, -1)
    check_finite(qq, xp, name="q")
    if not bool(xp.all(qq >= 0)):
        raise ValueError("`q` must be non-negative")
    tq = xp.sum(qq, axis=-1, keepdims=True)
    if not bool(xp.all(tq > 0)):
        raise ValueError("`q` must not be all zero")
    qq = qq / tq
    if p is None:
        pp = xp.full_like(qq, 1.0 / qq.shape[-1])
    else:
        pp = as_float_array(p, xp, name="p", dev=device(qq))
        pp = xp.astype(pp, qq.dtype) if pp.dtype != qq.dtype else pp
        if pp.ndim == 0:
            raise ValueError("`p` must be an array with one entry per sample")
        if pp.ndim > 1 and ax != qq.ndim - 1:
            pp = xp.moveaxis(pp, ax, -1)  # a 1-d p already lines up with the sample axis
        if pp.shape[-1] != qq.shape[-1] or (pp.ndim != 1 and tuple(pp.shape) != tuple(qq.shape)):
            raise ValueError(
                f"`p` of shape {tuple(pp.shape)} does not match `q` of shape {tuple(qq.shape)} "
                "(axis moved last); pass one entry per sample or the shape of `q`"
            )
        check_finite(pp, xp, name="p")
        if not bool(xp.all(pp >= 0)):
            raise ValueError("`p` must be non-negative")
        tp = xp.sum(pp, axis=-1, keepdims=True)
        if not bool(xp.all(tp > 0)):
            raise ValueError("`p` must not be all zero")
        pp = xp.broadcast_to(pp / tp, tuple(qq.shape))
    on = qq > 0
    ok = pp > 0
    one = xp.ones_like(qq)
    terms = qq * (xp.log(xp.where(on, qq, one)) - xp.log(xp.where(ok, pp, one)))
    terms = xp.where(on, terms, xp.zeros_like(terms))
    terms = xp.where(on & ~ok, xp.full_like(terms, xp.inf), terms)
    return xp.sum(terms, axis=-1)


# ---------------------------------------------------------------------------
# CURVES ALONG A TILT PATH: Q1, Q2, Q3 (quantile_curves) and the exact Q0 (min_tail_fraction)
#
# Host-side NumPy/SciPy code: a path's solutions and an objective's data are moved to the
# host in float64 (``to_numpy``) whatever their backend, and the results are NumPy arrays.
# Q0 is a combinatorial problem (a maximum feasible subsystem), solved exactly for small
# problems only; see the notes of ``min_tail_fraction``.
# ---------------------------------------------------------------------------

__all__ += ["quantile_curves", "min_tail_fraction"]

#: Relative margin that makes "loss < a" a closed constraint (see ``min_tail_fraction``).
_STRICT_MARGIN = 1e-6
#: Most candidate vertices and reference subsets the linear-case enumeration may visit.
_MAX_CANDIDATES = 2_000_000
#: Critical levels within this relative distance of sqrt(a) are taken as equal to it.
_TIE = 1e-10


def _host_thresholds(a: Any) -> np.ndarray:
    """Thresholds as a finite float64 host array (0-d or 1-d)."""
    if isinstance(a, bool) or a is None:
        raise TypeError(f"`a` must be a real number or a 1-d array, got {a!r}")
    arr = host_real(a, "a", "a real number or a 1-d array").astype(np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size == 0):
        raise ValueError(f"`a` must be a scalar or a non-empty 1-d array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("`a` must be finite")
    return arr


def _path_losses(path: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(ts, losses of shape (T, N), prior or None) of a tilt path, on the host."""
    for attr in ("ts", "x", "objective"):
        if not hasattr(path, attr):
            raise TypeError(f"`path` must be a TiltPath (from tiltlab.tilt_path); no `{attr}`")
    ts = np.asarray(path.ts, dtype=np.float64)
    obj = path.objective
    rows = [
        np.asarray(to_numpy(obj.losses(path.x[k, ...])), dtype=np.float64) for k in range(ts.size)
    ]
    prior = obj.prior() if hasattr(obj, "prior") else None
    p = None if prior is None else np.asarray(to_numpy(prior), dtype=np.float64)
    return ts, np.stack(rows, axis=0), p


def quantile_curves(path: Any, a: Any, *, floor: Any = None) -> dict[str, np.ndarray]:
    r"""The paper's curves :math:`Q^1, Q^2, Q^3` (and :math:`\tilde t`) along a tilt path.

    With :math:`Q(a;\theta)` the share of losses at or above ``a``
    (:func:`tail_fraction`) and :math:`\breve\theta(t)` the path's solutions
    (appendix "TERM as an Approximate Superquantile Method", theorem "Q^0 <= Q^1 <= Q^2 <=
    Q^3"):

    * :math:`Q^1(a) = \min_t Q(a; \breve\theta(t))`, the best tail share on the path;
    * :math:`Q^3(a) = \min_t \widetilde Q(a; t, \breve\theta(t))`, the smallest value of the
      tilted tail bound (:func:`tilted_tail_bound`) at the path's own solutions, and
      :math:`\tilde t(a)` the tilt that attains it;
    * :math:`Q^2(a) = Q(a; \breve\theta(\tilde t(a)))`, the tail share of that solution.

    The minima run over the path's tilts (a grid), so they are the paper's infima
    restricted to the grid; :math:`Q^1 \le Q^2 \le Q^3` holds exactly for every grid
    (``Q^2`` is one of the values ``Q^1`` minimises over, and the bound holds for every
    tilt and parameter). The losses are those of the objective's loss function (the ridge
    penalty is not a loss), weighted by the objective's prior when it has one.

    Parameters
    ----------
    path : TiltPath
        Output of :func:`tiltlab.tilt_path` (any backend; the losses are moved to the
        host in float64).
    a : float or 1-d array
        Thresholds; every one must exceed the floor.
    floor : float, optional
        ``F``, a lower bound on every loss for every parameter value (the paper's
        :math:`\widehat F(-\infty)`). Default 0, which requires the path's losses to be
        non-negative (pass ``floor`` explicitly for losses that can be negative).

    Returns
    -------
    dict of ndarray
        ``"a"`` (the thresholds), ``"Q1"``, ``"Q2"``, ``"Q3"`` and ``"t_tilde"``, each of
        the shape of ``a``; ``"Q_path"`` and ``"bound_path"``, shape ``a.shape + (T,)``,
        the tail share and the bound at each path solution. Ties in :math:`\tilde t` go to
        the first tilt in path order. ``Q3`` is not clipped: values above one mean the
        bound is vacuous there.

    Raises
    ------
    TypeError
        ``path`` is not a tilt path, ``a`` not numeric.
    ValueError
        A threshold at or below the floor; negative losses with the default floor.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.bounds import quantile_curves
    >>> X = np.c_[np.linspace(0, 1, 20), np.ones(20)]
    >>> y = 2 * X[:, 0] + np.where(np.arange(20) < 4, 3.0, 0.0)
    >>> path = tl.tilt_path(tl.TiltedObjective("squared", X, y, l2=1e-3), [-1.0, 0.0, 1.0])
    >>> c = quantile_curves(path, [0.5, 2.0])
    >>> bool(np.all(c["Q1"] <= c["Q2"])) and bool(np.all(c["Q2"] <= c["Q3"]))
    True
    """
    aa = _host_thresholds(a)
    ts, L, p = _path_losses(path)
    lmin = float(L.min())
    if floor is None:
        if lmin < 0:
            raise ValueError(
                "the path has negative losses; pass `floor`, a lower bound F(-inf) on every "
                "loss for every parameter value"
            )
        F = 0.0
    else:
        F = float(floor)
        if not np.isfinite(F):
            raise ValueError("`floor` must be finite")
        if F > lmin:
            raise ValueError(
                f"`floor`={F} exceeds the smallest loss on the path ({lmin}); it must be a "
                "lower bound on every loss"
            )
    if np.any(aa <= F):
        raise ValueError(f"every threshold `a` must exceed the floor F={F} (the bound needs a > F)")
    a1 = np.atleast_1d(aa)
    Q = np.asarray(tail_fraction(L, a1, weights=p), dtype=np.float64)  # (A, T)
    bound = np.stack(
        [
            np.asarray(tilted_tail_bound(L[k], a1, float(t), floor=F, weights=p))
            for k, t in enumerate(ts)
        ],
        axis=-1,
    )  # (A, T)
    best = np.argmin(bound, axis=-1)
    rows = np.arange(a1.size)
    shape = aa.shape
    return {
        "a": aa.copy(),
        "Q1": Q.min(axis=-1).reshape(shape),
        "Q2": Q[rows, best].reshape(shape),
        "Q3": bound[rows, best].reshape(shape),
        "t_tilde": ts[best].reshape(shape),
        "Q_path": Q.reshape(shape + (ts.size,)),
        "bound_path": bound.reshape(shape + (ts.size,)),
    }


# -- exact Q0: 2-D (and 1-D) point estimation ---------------------------------------


def _critical_radii(P: np.ndarray) -> np.ndarray:
    """Radii at which the most points a closed disk can cover may change (sorted)."""
    n = P.shape[0]
    i, j = np.triu_indices(n, 1)
    radii = [0.5 * np.linalg.norm(P[i] - P[j], axis=1)]
    if P.shape[1] == 2 and n >= 3:
        T = _combinations(n, 3)
        A, B, C = P[T[:, 0]], P[T[:, 1]], P[T[:, 2]]
        ab = np.linalg.norm(A - B, axis=1)
        bc = np.linalg.norm(B - C, axis=1)
        ca = np.linalg.norm(C - A, axis=1)
        cross = np.abs((B - A)[:, 0] * (C - A)[:, 1] - (B - A)[:, 1] * (C - A)[:, 0])
        ok = cross > 1e-14 * np.maximum(ab * ca, 1e-300)
        radii.append(ab[ok] * bc[ok] * ca[ok] / (2.0 * cross[ok]))  # circumradius
    return np.unique(np.concatenate(radii))


def _combinations(n: int, m: int) -> np.ndarray:
    """All m-subsets of range(n) as rows of an integer array of shape (C(n, m), m)."""
    import itertools

    flat = itertools.chain.from_iterable(itertools.combinations(range(n), m))
    return np.fromiter(flat, dtype=np.intp, count=math.comb(n, m) * m).reshape(-1, m)


def _disk_best(P: np.ndarray, p: np.ndarray, rho: float) -> tuple[float, np.ndarray]:
    """Largest prior mass a closed disk of radius ``rho`` covers, and its centre."""
    n = P.shape[0]
    centres = [P]
    if n >= 2:
        i, j = np.triu_indices(n, 1)
        diff = P[j] - P[i]
        dist = np.linalg.norm(diff, axis=1)
        ok = (dist <= 2.0 * rho) & (dist > 0)
        mid = 0.5 * (P[i][ok] + P[j][ok])
        h = np.sqrt(np.maximum(rho * rho - 0.25 * dist[ok] ** 2, 0.0))
        perp = np.stack([-diff[ok][:, 1], diff[ok][:, 0]], axis=1) / dist[ok][:, None]
        centres += [mid + h[:, None] * perp, mid - h[:, None] * perp]
    C = np.concatenate(centres, axis=0)
    best_mass, best_c = -1.0, P[0]
    lim = rho * rho * (1.0 + 1e-12) + 1e-300
    for s in range(0, C.shape[0], 4096):
        blk = C[s : s + 4096]
        d2 = ((blk[:, None, :] - P[None, :, :]) ** 2).sum(axis=-1)
        mass = (d2 <= lim) @ p
        k = int(np.argmax(mass))
        if mass[k] > best_mass:
            best_mass, best_c = float(mass[k]), blk[k]
    return best_mass, best_c


def _q0_points(P: np.ndarray, p: np.ndarray, aa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact Q0 for the losses ||x_i - theta||^2 (points in 1-D or 2-D)."""
    n, d = P.shape
    out = np.ones(aa.size)
    thetas = np.tile(P.mean(axis=0), (aa.size, 1))
    radii = _critical_radii(P) if d == 2 else None
    order = np.argsort(P[:, 0]) if d == 1 else None
    for k, a_k in enumerate(aa.reshape(-1)):
        if a_k <= 0:
            continue  # every loss is >= 0 >= a: Q = 1
        r = math.sqrt(a_k)
        if d == 1:
            x = P[order, 0]
            w = p[order]
            cum = np.concatenate([[0.0], np.cumsum(w)])
            ends = np.searchsorted(x, x + 2.0 * r, side="left")  # points in [x_i, x_i + 2r)
            mass = cum[ends] - cum[np.arange(n)]
            i = int(np.argmax(mass))
            centre = np.array([0.5 * (x[i] + x[ends[i] - 1])])
        else:
            assert radii is not None  # computed above for d == 2
            # radii within a relative _TIE of r count as equal to r (rounding in their
            # computation must not turn a tie at the boundary into a strict inclusion)
            below = radii[radii < r * (1.0 - _TIE)]
            # the most points a closed disk covers is constant between consecutive critical
            # radii, so any radius in (largest critical radius below r, r) gives the supremum
            # over radii < r, which is the most points an open disk of radius r covers
            rho = 0.5 * (below[-1] + r) if below.size else 0.5 * r
            _, centre = _disk_best(P, p, rho)
        loss = ((P - centre) ** 2).sum(axis=1)
        out[k] = float(p[loss >= a_k].sum())
        thetas[k] = centre
    return out.reshape(aa.shape), thetas.reshape(aa.shape + (d,))


# -- exact Q0: linear regression with the squared loss ----------------------------------


def _row_space(X: np.ndarray) -> np.ndarray:
    """Orthonormal basis (d, r) of the row space of X."""
    _, S, Vt = np.linalg.svd(X, full_matrices=False)
    r = int(np.sum(S > 1e-12 * S[0])) if S.size and S[0] > 0 else 0
    if r == 0:
        raise ValueError("`X` of the objective is all zero; Q0 is trivial and not computed")
    return Vt[:r].T


def _enumeration_size(n: int, r: int) -> int:
    """Candidate vertices plus reference subsets visited by the enumeration."""
    vertices = sum(math.comb(n, m) * 2**m for m in range(1, r + 1))
    references = sum(math.comb(n, m + 1) for m in range(1, r + 1))
    return vertices + references


def _vertex_systems(Xr: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For every linearly independent row subset B (sizes 1..r): B, pinv(X_B), signs."""
    import itertools

    n, r = Xr.shape
    scale = float(np.linalg.norm(Xr, 2))
    out = []
    for m in range(1, min(r, n) + 1):
        B = _combinations(n, m)
        XB = Xr[B]  # (K, m, r)
        sv = np.linalg.svd(XB, compute_uv=False)
        keep = sv[:, -1] > 1e-10 * scale
        B, XB = B[keep], XB[keep]
        if B.shape[0] == 0:
            continue
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=m)))  # (2^m, m)
        out.append((B, np.linalg.pinv(XB), signs))
    return out


def _vertices(systems, y: np.ndarray, s: float):
    """Blocks of candidate vertices pinv(X_B) (y_B +- s)."""
    for B, Pinv, signs in systems:
        yB = y[B]
        for sg in signs:
            V = np.einsum("kij,kj->ki", Pinv, yB + s * sg)
            for c in range(0, V.shape[0], 20000):
                yield V[c : c + 20000]


def _critical_levels(Xr: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Chebyshev (minimax) residuals of the row subsets T with |T| = rank(X_T) + 1, sorted.

    The smallest ``s`` for which a set ``S`` of samples fits in a strip
    ``|x_i theta - y_i| <= s`` is the Chebyshev residual of ``S``, attained on such a
    subset ``T`` (a basic solution of the LP dual), where it is ``|lam . y_T| / ||lam||_1``
    with ``lam`` spanning the left null space of ``X_T``.
    """
    n, r = Xr.shape
    scale = float(np.linalg.norm(Xr, 2))
    levels = [np.zeros(1)]
    for m in range(1, min(r, n - 1) + 1):
        T = _combinations(n, m + 1)
        for c in range(0, T.shape[0], 50000):
            blk = T[c : c + 50000]
            U, S, _ = np.linalg.svd(Xr[blk], full_matrices=True)  # U: (K, m+1, m+1)
            # rank exactly m: m singular values above the noise level (S has min(m+1, r))
            big = np.sum(S > 1e-10 * scale, axis=1)
            ok = big == m
            lam = U[:, :, -1]
            h = np.abs(np.sum(lam * y[blk], axis=1)) / np.sum(np.abs(lam), axis=1)
            levels.append(h[ok])
    return np.unique(np.concatenate(levels))


def _q0_linear_enumerate(Xr, y, p, aa):
    """Exact Q0 by enumerating the vertices of the strip arrangement (small rank)."""
    systems = _vertex_systems(Xr)
    levels = _critical_levels(Xr, y)
    out = np.ones(aa.size)
    phis = np.zeros((aa.size, Xr.shape[1]))
    for k, a_k in enumerate(aa.reshape(-1)):
        if a_k <= 0:
            continue
        s = math.sqrt(a_k)
        # the most mass a closed strip of half-width s' can hold changes only at critical
        # levels, so any s' between the largest level below s and s gives the supremum over
        # s' < s: the most mass an open strip of half-width s holds
        below = levels[levels < s * (1.0 - _TIE)]
        s_in = 0.5 * (below[-1] + s) if below.size else 0.5 * s
        best, phi = -1.0, np.zeros(Xr.shape[1])
        for V in _vertices(systems, y, s_in):
            mass = (np.abs(V @ Xr.T - y) <= s_in * (1.0 + 1e-12)) @ p
            j = int(np.argmax(mass))
            if mass[j] > best:
                best, phi = float(mass[j]), V[j]
        out[k] = float(p[(Xr @ phi - y) ** 2 >= a_k].sum())
        phis[k] = phi
    return out, phis


def _box_from_vertices(Xr, y, p, s, systems):
    """Box (lo, hi) that contains a minimiser of the tail share (see min_tail_fraction)."""
    verts, closed_mass, strict_best = [], [], 0.0
    for V in _vertices(systems, y, s):
        R = np.abs(V @ Xr.T - y)
        verts.append(V)
        closed_mass.append((R <= s * (1 + 1e-9) + 1e-12) @ p)
        strict_best = max(strict_best, float(((R < s * (1 - 1e-9)) @ p).max()))
    V = np.concatenate(verts)
    keep = np.concatenate(closed_mass) >= strict_best - 1e-12
    lo, hi = V[keep].min(axis=0), V[keep].max(axis=0)
    pad = 1e-6 * (hi - lo) + 1e-9 * (1.0 + np.abs(lo) + np.abs(hi))
    return lo - pad, hi + pad


def _milp_tail(Xr, y, p, s, lo, hi, margin, time_limit):
    """min sum p_i z_i  s.t. |x_i phi - y_i| <= s - margin + M_i z_i, phi in [lo, hi]."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, r = Xr.shape
    centre, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    M = np.maximum(np.abs(Xr) @ half + np.abs(Xr @ centre - y) - s + margin, 0.0)
    D = np.diag(M)
    A = np.block([[Xr, -D], [-Xr, -D]])
    ub = np.concatenate([y + s - margin, -y + s - margin])
    with _quiet_stdout():  # HiGHS prints MIP debug lines to the C-level stdout
        res = milp(
            np.concatenate([np.zeros(r), p]),
            integrality=np.concatenate([np.zeros(r), np.ones(n)]),
            bounds=Bounds(np.concatenate([lo, np.zeros(n)]), np.concatenate([hi, np.ones(n)])),
            constraints=LinearConstraint(A, -np.inf, ub),
            options={"time_limit": float(time_limit), "mip_rel_gap": 0.0},
        )
    if res.status == 1:
        raise RuntimeError(
            f"the MILP for Q0 hit `time_limit`={time_limit} s before proving optimality; raise "
            "it or use fewer samples"
        )
    if res.x is None or res.status != 0:  # pragma: no cover - the problem is always feasible
        raise RuntimeError(f"the MILP for Q0 failed: {res.message}")
    return res.x[:r], res.x[r:] < 0.5


class _quiet_stdout:
    """Silence writes to file descriptor 1 (C libraries) for the duration of a block."""

    def __enter__(self):
        import os
        import sys

        sys.stdout.flush()
        try:
            self._saved = os.dup(1)
        except OSError:  # pragma: no cover - no fd 1 (embedded interpreters)
            self._saved = None
            return self
        self._null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self._null, 1)
        return self

    def __exit__(self, *exc):
        import os

        if self._saved is not None:
            os.dup2(self._saved, 1)
            os.close(self._saved)
            os.close(self._null)
        return False


def _polish(Xr, y, s, lo, hi, inside):
    """A point with |x_i phi - y_i| <= s - delta on ``inside``, delta as large as possible."""
    from scipy.optimize import linprog

    r = Xr.shape[1]
    Xi, yi = Xr[inside], y[inside]
    ones = np.ones((Xi.shape[0], 1))
    A = np.block([[Xi, ones], [-Xi, ones]])
    ub = np.concatenate([yi + s, -yi + s])
    c = np.zeros(r + 1)
    c[-1] = -1.0
    res = linprog(c, A_ub=A, b_ub=ub, bounds=list(zip(lo, hi, strict=True)) + [(None, s)])
    return (res.x[:r], float(res.x[-1])) if res.status == 0 else (None, -np.inf)


def _q0_linear_milp(Xr, y, p, aa, box, time_limit):
    """Q0 by the big-M MILP; ``box`` is (lo, hi) or None (box from the vertices)."""
    systems = _vertex_systems(Xr) if box is None else None
    out = np.ones(aa.size)
    phis = np.zeros((aa.size, Xr.shape[1]))
    for k, a_k in enumerate(aa.reshape(-1)):
        if a_k <= 0:
            continue
        s = math.sqrt(a_k)
        margin = _STRICT_MARGIN * max(1.0, s)
        lo, hi = _box_from_vertices(Xr, y, p, s, systems) if box is None else box
        phi, inside = _milp_tail(Xr, y, p, s, lo, hi, margin, time_limit)
        q_milp = float(p[~inside].sum())
        q = float(p[(Xr @ phi - y) ** 2 >= a_k].sum())
        if q > q_milp + 1e-12:
            # the solver's integrality/feasibility tolerances let a "fitted" residual reach
            # sqrt(a): re-centre the fitted set with an LP, then re-check exactly
            phi2, delta = _polish(Xr, y, s, lo, hi, inside)
            if phi2 is not None and delta > 0:
                phi = phi2
                q = float(p[(Xr @ phi - y) ** 2 >= a_k].sum())
        out[k] = q
        phis[k] = phi
    return out, phis


def _q0_linear(X, y, p, aa, method, theta_bound, time_limit):
    n, d = X.shape
    if theta_bound is not None:
        b = np.broadcast_to(np.asarray(theta_bound, dtype=np.float64), (d,))
        if not np.all(np.isfinite(b)) or np.any(b <= 0):
            raise ValueError(
                "`theta_bound` must be positive and finite (scalar or one per feature)"
            )
        if method == "enumerate":
            raise ValueError("`theta_bound` is for method='milp'")
        q, th = _q0_linear_milp(X, y, p, aa, (-b, b), time_limit)
        return q.reshape(aa.shape), th.reshape(aa.shape + (d,))
    V = _row_space(X)
    Xr = X @ V
    size = _enumeration_size(n, Xr.shape[1])
    if size > _MAX_CANDIDATES:
        raise ValueError(
            f"too large to solve exactly: the enumeration (which also bounds the MILP's "
            f"parameters) visits {size} vertices and subsets for N={n} samples of rank "
            f"{Xr.shape[1]}; at most {_MAX_CANDIDATES} are allowed. Use fewer samples or "
            "features, or method='milp' with a `theta_bound` known to hold a minimiser."
        )
    if method == "milp":
        q, phi = _q0_linear_milp(Xr, y, p, aa, None, time_limit)
    else:
        q, phi = _q0_linear_enumerate(Xr, y, p, aa)
    return q.reshape(aa.shape), (phi @ V.T).reshape(aa.shape + (d,))


def min_tail_fraction(
    objective: Any,
    a: Any,
    *,
    method: str = "auto",
    weights: Any = None,
    theta_bound: Any = None,
    max_samples: int = 200,
    time_limit: float = 60.0,
    return_minimizers: bool = False,
) -> Any:
    r"""Exact :math:`Q^0(a) = \min_\theta Q(a;\theta)` for small problems.

    :math:`Q(a;\theta)` is the share of samples whose loss is at least ``a``; its global
    minimum over the parameters is the paper's :math:`Q^0`, the reference for the TERM
    curves :math:`Q^1 \le Q^2 \le Q^3` (:func:`quantile_curves`). It is a non-convex
    combinatorial problem (a maximum feasible subsystem); two cases are solved exactly.
    The value returned is always attained: it is the tail share, recomputed from the
    losses, of the minimiser found (``return_minimizers=True`` returns it).

    **Linear regression, squared loss** (``objective`` a :class:`~tiltlab.TiltedObjective`
    with ``loss="squared"``; its tilt and ridge penalty play no role). A sample stays
    below ``a`` iff :math:`|x_i\theta - y_i| < s`, :math:`s = \sqrt a`, so
    :math:`1 - Q^0(a)` is the largest prior mass of samples an open strip of half-width
    ``s`` around a hyperplane can hold. ``theta`` is written in the row space of ``X``
    (directions ``X`` cannot see change no loss), of dimension ``r``.

    * ``method="enumerate"`` (exact): for a *closed* strip of half-width ``s'`` the best
      set ``S`` of samples is fitted by a bounded polytope of ``theta`` (in the row
      space of ``X_S``), whose vertices solve ``x_i theta = y_i +- s'`` on a linearly
      independent subset ``B`` of ``S``: ``theta = pinv(X_B)(y_B +- s')``. Enumerating these
      candidate vertices and counting the samples each fits gives the closed-strip
      optimum. That optimum changes with ``s'`` only at *critical levels*, the Chebyshev
      residuals of subsets ``T`` with ``|T| = rank(X_T) + 1`` (``|lam . y_T| / ||lam||_1``,
      ``lam`` the left null vector of ``X_T``), so evaluating it at ``s'`` halfway between
      the largest critical level below ``s`` and ``s`` gives the open-strip optimum
      exactly. Levels within a relative ``1e-10`` of ``s`` count as equal to it (they are
      computed in floating point). Cost: ``sum_{m<=r} C(N, m) (2^m + 1)``, about ``2 N^2``
      for a feature plus an intercept and ``N^3`` for two features plus an intercept.
    * ``method="milp"``: the mixed-integer program

      .. math:: \min \sum_i p_i z_i \quad\text{s.t.}\quad
                \pm(x_i\theta - y_i) \le s - m + M_i z_i,\;
                z_i \in \{0, 1\},\; \theta \in [\ell, u],

      solved with :func:`scipy.optimize.milp` (HiGHS, relative gap 0). The strict
      inequality is made closed with a margin ``m = 1e-6 max(1, s)`` (a residual within
      ``m`` of ``s`` counts as in the tail). *Box and big-M:* the vertices above (with
      ``s' = s``) of the best set's polytope each fit at least as much mass as the best
      strictly feasible candidate vertex, a lower bound on the optimum; so the box
      spanned by the candidate vertices that fit that much mass contains a minimiser, and
      ``M_i`` is the largest ``|x_i theta - y_i| - s + m`` over it (tight: of the order of
      the residuals). With ``theta_bound`` the box is ``[-theta_bound, theta_bound]``
      instead (no enumeration, for more features; then the result is exact only if the
      box holds a global minimiser, which the caller guarantees). HiGHS's minimiser is
      re-checked exactly (and re-centred by an LP when its tolerances let a fitted
      residual touch ``s``). Caution: on a degenerate instance (equally spaced ``x``,
      alternating ``y``, scipy 1.17.1) HiGHS reported a non-optimal point as optimal,
      which is why ``"auto"`` prefers the enumeration.
    * ``method="auto"`` (default): the enumeration when its size is at most two million
      candidates, otherwise ``ValueError`` (use ``"milp"`` with ``theta_bound``).

    **Point estimation** (``objective`` an ``(N, 2)`` or ``(N, 1)`` array of points, the
    loss :math:`\|x_i - \theta\|^2` of :func:`tiltlab.datasets.point_estimation_losses`).
    The best ``theta`` centres an open disk of radius ``s`` holding the most mass. The most
    mass a *closed* disk of radius ``rho`` holds is attained by a disk centred on a point
    or with two points on its boundary (slide, then rotate an optimal disk), so
    enumerating those ``O(N^2)`` centres finds it in ``O(N^3)``; it changes only at half
    pairwise distances and circumradii of triples, so evaluating it halfway between the
    largest such radius below ``s`` and ``s`` gives the open-disk optimum exactly (the
    same ``1e-10`` tie rule). In 1-D a sliding window over the sorted points does it.
    ``method`` is ignored.

    Parameters
    ----------
    objective : TiltedObjective or array of shape (N, 2) or (N, 1)
        A sample-level objective with the squared loss of a linear model, or the points
        of a point-estimation problem.
    a : float or 1-d array
        Thresholds. ``a <= 0`` gives 1 (every loss is non-negative).
    method : {"auto", "enumerate", "milp"}, default "auto"
        Linear case only (see above).
    weights : array of shape (N,), optional
        Prior weights for the point-estimation case (an objective brings its own prior);
        :math:`Q` is then the prior mass at or above ``a``.
    theta_bound : float or array of shape (d,), optional
        ``method="milp"``: a box ``|theta_j| <= theta_bound_j`` known to contain a global
        minimiser, replacing the enumerated box.
    max_samples : int, default 200
        Larger problems raise ``ValueError`` rather than run for a long time.
    time_limit : float, default 60
        Seconds allowed for each MILP; one that stops before proving optimality raises
        ``RuntimeError``.
    return_minimizers : bool, default False
        Also return the minimisers :math:`\theta^0(a)`.

    Returns
    -------
    Q0 : ndarray
        Shape of ``a``, float64. NumPy and SciPy only: the data are moved to the host.
    theta0 : ndarray
        Only with ``return_minimizers=True``: shape ``a.shape + (d,)``.

    Raises
    ------
    ValueError
        More than ``max_samples`` samples or too many candidates ("too large to solve
        exactly"), bad ``a``, ``method`` or ``theta_bound``.
    NotImplementedError
        Other losses, multi-output or hierarchical objectives, points in 3 or more
        dimensions: no exact method is implemented for them.
    RuntimeError
        A MILP that hit ``time_limit``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import min_tail_fraction
    >>> points = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, 0.8], [5.0, 5.0]])
    >>> min_tail_fraction(points, np.array([0.2, 0.25, 0.5])).tolist()  # radius sqrt(a)
    [0.75, 0.5, 0.25]
    >>> import tiltlab as tl
    >>> X = np.c_[np.arange(6.0), np.ones(6)]
    >>> y = np.array([0.0, 1.0, 2.0, 3.0, 10.0, -10.0])
    >>> float(min_tail_fraction(tl.TiltedObjective("squared", X, y), 0.01))
    0.3333333333333333
    """
    aa = _host_thresholds(a)
    if method not in ("auto", "enumerate", "milp"):
        raise ValueError(f"`method` must be 'auto', 'enumerate' or 'milp', got {method!r}")
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)):
        raise TypeError(f"`max_samples` must be an integer, got {max_samples!r}")
    if not time_limit > 0:
        raise ValueError(f"`time_limit` must be positive, got {time_limit!r}")
    if is_array_api_obj(objective) or isinstance(objective, (list, tuple, np.ndarray)):
        P = _host_points(objective)
        n = P.shape[0]
        p = _host_prior(weights, n)
        _check_size(n, max_samples)
        q0, thetas = _q0_points(P, p, aa)
    else:
        X, y, p = _linear_problem(objective, weights)
        _check_size(X.shape[0], max_samples)
        q0, thetas = _q0_linear(X, y, p, aa, method, theta_bound, time_limit)
    return (q0, thetas) if return_minimizers else q0


def _check_size(n: int, max_samples: int) -> None:
    if n > max_samples:
        raise ValueError(
            f"too large to solve exactly: {n} samples > `max_samples`={max_samples} (the "
            "exact methods are combinatorial; raise `max_samples` to try anyway)"
        )


def _host_points(objective: Any) -> np.ndarray:
    P = np.asarray(to_numpy(objective) if is_array_api_obj(objective) else objective)
    if P.dtype.kind not in "iuf":
        raise TypeError(f"`objective` points must be real numbers, got dtype {P.dtype}")
    P = P.astype(np.float64)
    if P.ndim != 2 or P.shape[0] == 0:
        raise ValueError(f"points must have shape (N, 1) or (N, 2), got {P.shape}")
    if P.shape[1] > 2:
        raise NotImplementedError(
            f"exact Q0 for point estimation is implemented in 1-D and 2-D, not in {P.shape[1]}-D"
        )
    if not np.all(np.isfinite(P)):
        raise ValueError("points must be finite")
    return P


def _host_prior(weights: Any, n: int) -> np.ndarray:
    if weights is None:
        return np.full(n, 1.0 / n)
    p = host_real(weights, "weights", "N finite non-negative numbers").astype(np.float64)
    if p.shape != (n,) or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("`weights` must be N finite non-negative numbers, not all zero")
    return p / p.sum()


def _linear_problem(obj: Any, weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    loss = getattr(obj, "loss", None)
    if loss is None or not hasattr(obj, "losses"):
        raise TypeError(
            "`objective` must be a TiltedObjective (squared loss) or an array of points"
        )
    if getattr(obj, "is_hierarchical", False):
        raise NotImplementedError("exact Q0 is implemented for sample-level objectives")
    if loss.name != "squared" or not loss.is_linear or len(obj.shape) != 1:
        raise NotImplementedError(
            f"exact Q0 is implemented for the squared loss of a linear model and for point "
            f"estimation, not for the {loss.name!r} loss"
        )
    if weights is not None:
        raise ValueError("`weights` is for points; an objective brings its own prior")
    X = np.asarray(to_numpy(obj.X), dtype=np.float64)
    y = np.asarray(to_numpy(obj.y), dtype=np.float64)
    prior = obj.prior()
    n = X.shape[0]
    p = np.full(n, 1.0 / n) if prior is None else np.asarray(to_numpy(prior), dtype=np.float64)
    return X, y, p

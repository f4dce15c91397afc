r"""The tilt at a given effective sample size (:func:`tilt_for_ess`) or at a given KL
divergence from the prior (:func:`tilt_for_kl`).

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

The KL divergence of the tilted weights from the prior,

.. math:: D(t) = \mathrm{KL}(w_t \,\|\, p) = \sum_i w_i \log\frac{w_i}{p_i}
          = t\,E_{w_t}[\ell] - t R(t) = t K'(t) - K(t),

has the derivative :math:`t K''(t) \ge 0`: it rises from 0 at ``t = 0`` to
:math:`\log(1/P_\star)` as ``t -> inf`` (:math:`P_\star` the prior mass tied at the
largest loss), and ``D(t) = radius`` is solved the same way. It is evaluated as
:math:`\sum_i p_i \psi(v_i)` with :math:`v_i = \log(w_i/p_i)` and
:math:`\psi(v) = 1 + (v - 1)e^v \ge 0` (which adds :math:`\sum_i p_i - \sum_i w_i = 0`
to the definition): a sum of non-negative terms, with a series for ``psi`` near 0, so
that ``D`` keeps its relative precision as ``t -> 0`` (to about ``1e-13``).

Both roots are scale-free (``F`` and ``D`` depend on ``t`` and the losses through
``t * losses`` only): the losses are scaled by a power of two that brings their spread
to ``[1/2, 1)`` before solving, and the tilt is scaled back, so that spreads near the
float maximum or among the subnormal numbers are solved as any other.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .._compat import device, materialize, namespace_of, real_number, scalar, to_numpy
from ..accumulator.packed import exponent_terms, log_normaliser, log_normaliser_of
from .inputs import prepare_losses, prepare_prior

__all__ = ["tilt_for_ess", "tilt_for_kl"]

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


def _power_of_two_scale(l: Any, p: Any, xp: Any) -> tuple[Any, int]:
    """``(l * 2**k, k)`` with the spread of ``l`` on the support of ``p`` scaled into
    ``[1/2, 1)`` (``k = 0`` for equal losses): exact, save losses that become subnormal,
    which are then far below the spread and do not change the tilted weights."""
    on = None if p is None else p > 0
    hi_l = l if on is None else xp.where(on, l, scalar(-math.inf, l, xp))
    lo_l = l if on is None else xp.where(on, l, scalar(math.inf, l, xp))
    lmax, lmin = (float(v) for v in to_numpy(xp.stack([xp.max(hi_l), xp.min(lo_l)])))
    half = lmax / 2 - lmin / 2  # half the spread: finite for every pair of finite floats
    if not half > 0:
        if not lmax > lmin:  # equal losses
            return l, 0
        # a spread of the smallest subnormal, whose half rounds to 0 (lmax - lmin is exact)
        k = -math.frexp(lmax - lmin)[1]
    else:
        k = -(math.frexp(half)[1] + 1)
    if k == 0:
        return l, 0
    # 2**k in at most two factors, each a normal float
    first = max(min(k, 1000), -1000)
    out = l * 2.0**first
    if k != first:
        out = out * 2.0 ** (k - first)
    return out, k


#: Taylor coefficients (k - 1) / k! of psi(v) = 1 + (v - 1) e^v = sum_{k>=2} (k-1) v^k / k!
#: (to k = 8: the next term is below 1e-26 of psi for |v| < _SERIES)
_PSI = tuple((k - 1) / math.factorial(k) for k in range(2, 9))
_SERIES = 1e-3


def _host_log(x: float, near: bool) -> float:
    """``log S`` from the host number ``x``: ``S - 1`` when ``near``, else ``S``."""
    return log_normaliser(x if near else None, None if near else x, near, math)


class _LogESS:
    """``log F(t)`` and ``KL(w_t || p)`` for one tilt at a time, from the losses shifted
    by their extreme on the support (so every exponent is <= 0), each evaluation one pass
    over the data. The losses are scaled by ``2**k`` first (module notes): the tilts
    asked and found here are those of the scaled losses."""

    def __init__(self, l: Any, p: Any, sign: int, xp: Any):
        self.xp, self.p = xp, p
        l, self.k = _power_of_two_scale(l, p, xp)
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
        mean = xp.mean(l) if p is None else xp.sum(p * l)
        dev = l - mean
        var = xp.mean(dev * dev) if p is None else xp.sum(p * dev * dev)
        # one read on the host (to_numpy also leaves any autograd graph behind)
        host = to_numpy(xp.stack([share, xp.max(xp.abs(d)), var]))
        # F -> the prior mass of the tied extreme samples as |t| -> inf
        self.limit, self.spread, self.var = (float(v) for v in host)

    def _sum(self, v: Any) -> Any:
        return _expect(v, self.p, self.xp)

    def _log_norm(self, u: Any, near: bool) -> Any:
        """``log sum_i p_i e^{u_i}`` (``u <= 0``), through ``expm1``/``log1p`` when near."""
        return log_normaliser_of(u, self._sum, near, self.xp)

    def __call__(self, t: float) -> float:
        xp, d = self.xp, self.d
        u = scalar(t, d, xp) * d  # <= 0
        # small |t| * spread: S_k - 1 from expm1, so that log1p keeps log F exact near
        # t = 0; otherwise S_k from exp (positive terms, exact relative to P_star)
        near = abs(t) * self.spread <= 1.0
        ex, em = exponent_terms(u, xp, squares=False)
        # expm1(2u) = expm1(u) (exp(u) + 1): a product of accurate factors, no cancellation
        e1, e2 = (em, em * (ex + 1.0)) if near else (ex, ex * ex)
        sums = xp.stack([self._sum(e1), self._sum(e2)])
        s1, s2 = (float(v) for v in to_numpy(sums))
        # log F = 2 log S1 - log S2, each log by the rule (host numbers: `math`)
        return 2.0 * _host_log(s1, near) - _host_log(s2, near)

    def kl(self, t: float) -> float:
        """``KL(w_t || p) = sum_i p_i psi(v_i)``, ``v_i = t d_i - log sum_j p_j e^{t d_j}``."""
        xp, d = self.xp, self.d
        u = scalar(t, d, xp) * d
        v = u - self._log_norm(u, abs(t) * self.spread <= 1.0)
        # psi(v) = v expm1(v) - (expm1(v) - v): the difference loses about eps / |v| of
        # its relative precision, so below |v| = 1e-3 the series takes over
        em = xp.expm1(v)
        tiny = xp.abs(v) < _SERIES
        small = xp.where(tiny, v, xp.zeros_like(v))
        acc = xp.full_like(v, _PSI[-1])
        for c in _PSI[-2::-1]:
            acc = acc * small + c
        psi = xp.where(tiny, small * small * acc, v * em - (em - v))
        if self.p is not None:
            psi = xp.where(self.p > 0, psi, xp.zeros_like(psi))
        return float(to_numpy(self._sum(psi)))


def _expect(v: Any, p: Any, xp: Any) -> Any:
    """``sum_i p_i v_i`` (the mean under the uniform prior ``p = None``)."""
    return xp.mean(v) if p is None else xp.sum(p * v)


def _solve(g: _LogESS, f: float, s: int, big: float) -> float:
    """The tilt of sign ``s`` with ``log F(t) = log f``: a bracket in ``log|t|``, then
    Brent's method (``f`` lies strictly between the limit of ``F`` and 1)."""
    logf = math.log(f)

    def h(x: float) -> float:  # decreasing in x = log|t|
        return g(s * math.exp(x)) - logf

    # start at the small-tilt estimate log F ~ -var t^2, then walk to a bracket
    scale = math.sqrt(g.var) if g.var > 0 else g.spread
    x0 = 0.5 * math.log(-logf) - math.log(scale)
    top = math.log(0.25 * big / g.spread)  # |t d| <= big / 4: 2 t d stays finite
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
        (integer losses: the namespace's default float). The losses may spread over the
        whole float range (from subnormal spreads to spreads near the float maximum):
        the root is solved on losses scaled by a power of two. Against 50-digit bisection its
        relative error in float64 arithmetic is about ``1e-13`` for fractions between
        0.1 and 0.999, and ``1e-11`` for fractions within ``1e-10`` of 1 or of their
        limit, as long as ``F`` can be told from 1 and from :math:`P_\star` in that
        arithmetic. Float32 and 16-bit losses are evaluated in float64 where the device
        has it, and the result is rounded to their dtype.

    Raises
    ------
    ValueError
        ``fraction`` outside ``(0, 1]``, or not above :math:`P_\star` (no finite tilt
        reaches it: in particular equal losses keep ``F = 1`` at every tilt, so then only
        ``fraction=1`` is accepted, and gives 0), or reached only at a tilt outside the
        range of the dtype (losses spread by a few subnormal numbers, or fractions very
        near their limit); ``sign`` not -1 or +1; empty,
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
    the root took 11 or 12 evaluations for a million exponential losses and fractions from
    0.9 to 0.1. Dask losses are computed once and kept in memory for them. The result
    carries no gradient (PyTorch losses that require one are read without it).

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
    l, lw, p = _prepared(losses, weights, xp)
    out_dtype = l.dtype
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
    t = _unscale(t, g.k, out_dtype, xp, "fraction")
    return xp.asarray(t, dtype=out_dtype, device=device(l))


def _unscale(t: float, k: int, dtype: Any, xp: Any, name: str) -> float:
    """The tilt ``t * 2**k`` of the unscaled losses, or a ``ValueError`` naming ``name``
    where it lies outside the range of ``dtype`` (it would round to 0 or overflow)."""
    try:
        out = math.ldexp(t, k)
    except OverflowError:
        out = math.inf
    info = xp.finfo(dtype)
    if not abs(out) <= float(info.max) or (t != 0 and out == 0):
        raise ValueError(
            f"`{name}` is reached at the tilt {t!r} * 2**{k}, which lies outside the range "
            f"of {dtype}: the losses' spread is too close to the limits of the float range"
        )
    return out


def tilt_for_kl(losses: Any, radius: Any, *, weights: Any = None, xp: Any = None) -> Any:
    r"""The tilt ``t >= 0`` at which the tilted weights lie at KL divergence ``radius``
    from the prior.

    Solves :math:`\mathrm{KL}(w_t \,\|\, p) = \text{radius}` for ``t``, with
    :math:`w_{t,i} = p_i e^{t\ell_i} / \sum_j p_j e^{t\ell_j}`. The divergence
    :math:`t E_{w_t}[\ell] - t R(t)` (``R`` the tilted risk) rises monotonically from 0 at
    ``t = 0`` to :math:`\log(1/P_\star)` as ``t -> inf``, :math:`P_\star` the prior mass
    of the samples tied at the largest loss (``k/N`` for ``k`` ties under the uniform
    prior). This ``t`` is the minimiser of :math:`R(t) + \text{radius}/t`, whose value is
    the worst case :math:`\sup\{E_q[\ell] : \mathrm{KL}(q\|p) \le \text{radius}\}`
    attained at :math:`q = w_t` (:func:`tiltlab.bounds.entropic_value_at_risk` with
    ``radius=``).

    Parameters
    ----------
    losses : array, shape (N,)
        Per-sample losses (finite).
    radius : float
        The KL radius, ``>= 0``: ``0`` gives ``t = 0``; a radius at or above
        :math:`\log(1/P_\star)` gives ``t = inf`` (the worst case puts the prior's mass
        on the largest losses, at divergence :math:`\log(1/P_\star) \le` ``radius``),
        as do equal losses at any positive radius.
    weights : array, shape (N,), optional
        Non-negative prior weights, normalised to sum to one (uniform by default).
    xp : namespace, optional
        The array namespace; inferred from ``losses`` by default.

    Returns
    -------
    array
        The tilt, a 0-d array in the namespace, dtype and device of ``losses`` (integer
        losses: the namespace's default float), as :func:`tilt_for_ess` returns it.
        In float64 arithmetic it is within ``1e-10`` (relative) of the 50-digit root
        wherever the divergence at the root is not within rounding of its limit. Float32
        and 16-bit losses are solved in float64 where the device has it.

    Raises
    ------
    ValueError
        ``radius`` negative or NaN; a radius below its limit that no tilt in the
        floating-point range reaches; empty, non-finite or not 1-d ``losses``; bad
        ``weights``.
    TypeError
        A ``radius`` that is not a real number.

    See Also
    --------
    tilt_for_ess : The tilt at a given effective sample size.
    tiltlab.bounds.kl_divergence : The divergence itself.
    tiltlab.minimize_dro : Fits a model at a KL radius.

    Notes
    -----
    Each evaluation of the divergence is one pass over the losses and one read on the
    host; Brent's method in ``log t`` from the small-tilt estimate
    :math:`t \approx \sqrt{2\,\text{radius}/\mathrm{Var}(\ell)}`.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import tilt_for_kl, tilted_weights
    >>> from tiltlab.bounds import kl_divergence
    >>> l = np.array([0.1, 0.3, 0.2, 0.4, 5.0, 0.25, 0.15, 6.0])
    >>> t = tilt_for_kl(l, 0.1)
    >>> bool(np.isclose(kl_divergence(tilted_weights(l, t)), 0.1, rtol=1e-10))
    True
    >>> float(tilt_for_kl(l, 0.0)), float(tilt_for_kl(l, np.log(8.0)))
    (0.0, inf)
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    r = real_number(radius, "radius")
    if not r >= 0.0:
        raise ValueError(f"`radius` must be a non-negative number, got {r!r}")
    l, lw, p = _prepared(losses, weights, xp)
    out_dtype = l.dtype
    if r == 0.0:
        return xp.asarray(0.0, dtype=out_dtype, device=device(l))
    g = _LogESS(lw, p, 1, xp)
    # equal losses (spread 0) keep the prior at every tilt: no positive radius is reached,
    # whatever rounding left in the tied mass
    if g.spread == 0 or g.limit >= 1.0 or r >= -math.log(g.limit):
        return xp.asarray(math.inf, dtype=out_dtype, device=device(l))
    t = _solve_kl(g, r, float(xp.finfo(lw.dtype).max))
    t = _unscale(t, g.k, out_dtype, xp, "radius")
    return xp.asarray(t, dtype=out_dtype, device=device(l))



def _prepared(losses: Any, weights: Any, xp: Any) -> tuple[Any, Any, Any]:
    """The validated 1-d ``losses``, the same widened for the root search (float64 where
    the device has it) and the prior in that dtype, materialised (one graph on Dask)."""
    l = prepare_losses(losses, xp, True)
    if l.ndim != 1:
        raise ValueError(f"`losses` must be 1-d (one loss per sample), got shape {tuple(l.shape)}")
    p = prepare_prior(weights, l, xp)
    lw = _wide(l, xp)
    if p is not None:
        p = xp.astype(p, lw.dtype) if p.dtype != lw.dtype else p
    lw, p = materialize(lw, p) if p is not None else (materialize(lw)[0], None)
    return l, lw, p

def _solve_kl(g: _LogESS, r: float, big: float) -> float:
    """The tilt (of the scaled losses) with ``KL(w_t || p) = r``, ``0 < r < log(1/P*)``:
    a bracket in ``log t`` from the small-tilt estimate, then Brent's method."""
    logr = math.log(r)

    def h(x: float) -> float:  # increasing in x = log t
        kl = g.kl(math.exp(x))
        return (math.log(kl) if kl > 0 else -math.inf) - logr

    top = math.log(0.25 * big / g.spread)  # |t d| <= big / 4: 2 t d stays finite
    scale = math.sqrt(g.var) if g.var > 0 else g.spread
    lo = hi = min(0.5 * math.log(2.0 * r) - math.log(scale), top)
    if h(hi) < 0:
        while True:
            lo, hi = hi, min(hi + _STEP, top)
            if h(hi) >= 0:
                break
            if hi >= top:
                raise ValueError(
                    f"`radius`={r!r} lies too close to its limit {-math.log(g.limit)!r} "
                    "to be reached at a finite tilt in floating-point arithmetic"
                )
    else:
        for _ in range(_MAX_STEPS):
            lo = lo - _STEP
            if h(lo) < 0:
                break
            hi = lo
        else:  # pragma: no cover - KL -> 0 as t -> 0
            raise ValueError(f"`radius`={r!r} is too small to be resolved")
    from scipy.optimize import brentq  # imported here: `import tiltlab` stays light

    return math.exp(brentq(h, lo, hi, xtol=_XTOL, rtol=4 * 2.0**-52, maxiter=200))

"""The tilted state as one array: its field layout, and a merge and finish without host reads.

This module is the one home of the tilted reduction's rule for arrays (the mean at
``t = 0``, the ``log1p``/``expm1`` form while ``|t| (hi - lo) <= 1``, the shifted log
otherwise, the extremes at ``t = +-inf``) where no value may be read on the host: the
minibatch estimators, the PyTorch module's single-process and data-parallel steps
(``torch.compile`` traces them without graph breaks), the vectorised kernels of
:mod:`tiltlab.risk` (a grid of tilts, autograd through ``t``). The eager
:class:`~tiltlab.accumulator.TiltState` keeps the same fields with its shifts and regime
flags on the host, and takes its per-sample terms (:func:`normaliser_term`), the factors
and sums of its merge (:func:`exponent_terms`, :func:`moved_sums`) and its logs
(:func:`log_normaliser`) from here: every ``expm1`` and ``log1p`` of the rule is in this
module.

The layout
----------
The state of ``G`` groups (``G = 1`` for one set of samples) is one array of shape
``(N_FIELDS, G)``, in the dtype of the losses, whose rows are :data:`FIELDS`:

========  ============================================================================
``hi``    the largest loss of the group (``-finfo.max`` for a group without samples)
``lo``    the smallest loss (``+finfo.max`` without samples)
``mass``  the prior mass of the group's samples (their count: unit prior weights)
``s``     ``sum p exp(u)`` with ``u = t (l - c) <= 0``, ``c`` the *shift* (``hi`` for
          ``t > 0``, else ``lo``); at ``t = +-inf`` the mass of the losses equal to ``c``,
          at ``t = 0`` the mass
``q``     ``sum p expm1(u)`` (in ``[-mass, 0]``): near ``t = 0`` the risk
          ``c + log1p(q / mass) / t`` keeps full relative precision; 0 at ``t = 0`` and
          ``+-inf``
``lsum``  ``sum p (l - c)``: the mean is ``c + lsum / mass``
``s2``    ``sum p exp(2 u)``: the effective sample size of the tilted weights is
          ``s**2 / s2`` (the mass at ``t = 0``, ``s`` at ``+-inf``)
========  ============================================================================

``hi``, ``lo``, ``mass``, ``s``, ``q`` and ``lsum`` mean what the fields of
:class:`~tiltlab.accumulator.TiltState` mean, and what the columns 1 to 6 of the states
of the compiled CPU kernels (``shift, hi, lo, mass, s, q, lsum, bad, av``) mean: those
kernels also store the shift (here it follows from ``hi``, ``lo`` and the sign of ``t``),
a non-finite flag (here a NaN or an infinity in ``hi``/``lo``) and a Hessian-vector
product's sum (not a scalar field of this state), and keep ``q`` only where the spread
allows it, as ``TiltState`` does. A group without samples is marked by the finite
extremes ``-+finfo.max`` (not ``-+inf``), so that a check that every field is finite finds
the non-finite losses alone.

:func:`block` forms the state of a batch, :func:`merge` the state of the union of
disjoint batches (exact up to rounding, in any order and grouping) and :func:`finish`
the risk. The tilt is a Python number (its special values are then Python branches, few
array operations) or a 0-d array (every branch an ``xp.where``, nothing read).
"""

from __future__ import annotations

import math
from typing import Any

from .._compat import apply_inplace
from .._compat import device as _compat_device
from ._support import _add_scaled

__all__ = [
    "FIELDS",
    "N_FIELDS",
    "block",
    "merge",
    "finish",
    "ess_fraction",
    "log_normaliser",
    "log_normaliser_of",
    "finish_risk",
    "risk_of_exponents",
    "series_threshold",
    "tilted_columns",
    "running_update",
    "exponent_terms",
    "normaliser_term",
    "moved_sums",
    "shift",
    "total",
    "tilt_parts",
    "fit_tilt",
    "accumulation_dtype",
    "is_number",
    "const",
]

#: the rows of a packed state, in order
FIELDS = ("hi", "lo", "mass", "s", "q", "lsum", "s2")
HI, LO, MASS, S, Q, LSUM, S2 = range(7)
#: the number of rows of a packed state
N_FIELDS = len(FIELDS)


# ---------------------------------------------------------------------------------------
# small helpers of array code without host reads


def device(x: Any) -> Any:
    """The device of ``x``; a tensor's own attribute for PyTorch (the generic helper goes
    through cached type checks that ``torch.compile`` warns about)."""
    if type(x).__module__.startswith("torch"):
        return x.device
    return _compat_device(x)


def const(value: float, like: Any, xp: Any) -> Any:
    """A 0-d array holding ``value`` in the dtype and on the device of ``like``.

    Examples
    --------
    >>> import numpy as np
    >>> const(2.0, np.ones(3, dtype=np.float32), np).dtype
    dtype('float32')
    """
    return xp.asarray(value, dtype=like.dtype, device=device(like))


def is_number(t: Any) -> bool:
    """Whether the tilt is a Python number (not an array).

    Examples
    --------
    >>> import numpy as np
    >>> is_number(0.5), is_number(np.asarray(0.5))
    (True, False)
    """
    return isinstance(t, (int, float))


def accumulation_dtype(dtype: Any, xp: Any) -> Any:
    """The dtype a state of losses of ``dtype`` is accumulated in: float32 for
    half-precision floats (float16, bfloat16), else ``dtype`` itself.

    Examples
    --------
    >>> import numpy as np
    >>> accumulation_dtype(np.float16, np), accumulation_dtype(np.float64, np)
    (<class 'numpy.float32'>, <class 'numpy.float64'>)
    """
    if xp.finfo(dtype).bits < 32:
        return xp.float32
    return dtype


def fit_tilt(t: float, dtype: Any, xp: Any) -> float:
    """A Python tilt beyond the range of ``dtype`` acts there as ``+-inf``.

    Examples
    --------
    >>> import numpy as np
    >>> fit_tilt(1e300, np.float32, np), fit_tilt(1e300, np.float64, np)
    (inf, 1e+300)
    """
    # 65504 is the largest float16: below it every floating dtype holds t (no finfo call)
    if math.isfinite(t) and abs(t) > 65504.0 and abs(t) > float(xp.finfo(dtype).max):
        return math.copysign(math.inf, t)
    return t


def tilt_parts(t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """``(t_fin, is_zero, regular)`` of a 0-d array tilt: ``t`` with 0 and ``+-inf``
    replaced by 1, and where it is 0, and where it is finite and non-zero.

    Examples
    --------
    >>> import numpy as np
    >>> [bool(x) if x.dtype == bool else float(x) for x in tilt_parts(np.asarray(0.0), np)]
    [1.0, True, False]
    """
    one = const(1.0, t, xp)
    regular = xp.isfinite(t) & (t != 0)
    return xp.where(regular, t, one), t == 0, regular


# ---------------------------------------------------------------------------------------
# the rule


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


def log_normaliser(
    q: Any, s: Any, near: Any, xp: Any, *, guarded: bool = True, overwrite: bool = False
) -> Any:
    """``log(sum p exp(u))`` of a normalised prior from its two sums: ``log1p(q)`` where
    ``near`` (``q = sum p expm1(u)``, exact near ``t = 0``), else ``log(s)``
    (``s = sum p exp(u)``). The branch not taken sees a harmless argument, so that neither
    its value nor its gradient is NaN; ``guarded=False`` drops that guard, for a driver
    whose sums are in range already (``q > -1``, ``s > 0``) and carry no gradient. A
    Python bool ``near`` (a flag read on the host, as the eager state keeps it) evaluates
    the branch taken alone (the other sum may then be None); with ``overwrite`` that sum
    is a temporary the caller owns, and its log is written over it where the library
    allows (NumPy, CuPy, PyTorch without autograd).

    This is the small-tilt choice of every tilted risk: ``near`` is ``|t| (hi - lo) <= 1``
    (then every ``u`` lies in ``[-1, 0]`` and ``s >= 1/e``), or for a driver that did not
    keep the spread, ``s >= 1/2``; either form is exact to rounding where it is taken.

    Examples
    --------
    >>> import numpy as np
    >>> u = np.array([-1e-12, 0.0])
    >>> float(log_normaliser(np.mean(np.expm1(u)), np.mean(np.exp(u)), True, np))
    -4.99999999999875e-13
    >>> float(np.log(np.mean(np.exp(u))))  # the log of the plain sum loses 4 digits
    -5.000444502912955e-13
    """
    if isinstance(near, bool):
        if overwrite:
            return apply_inplace(xp.log1p, q, xp) if near else apply_inplace(xp.log, s, xp)
        return xp.log1p(q) if near else xp.log(s)
    if not guarded:
        return xp.where(near, xp.log1p(q), xp.log(s))
    return xp.where(
        near,
        xp.log1p(xp.where(near, q, xp.zeros_like(q))),
        xp.log(xp.where(near, xp.ones_like(s), s)),
    )


def _risk(c: Any, logz: Any, t: Any, scale: Any, mean: Any, tiny: float, xp: Any) -> Any:
    """``c + logz / t``, or the mean where ``|t| (hi - lo)`` is below ``sqrt(tiny)`` (the
    shifted values are subnormal there; the mean is the risk to rounding)."""
    r = _add_scaled(c, logz, t, xp)
    return xp.where(scale < tiny, mean + xp.zeros_like(r), r)


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
    r = _risk(c, log_normaliser(q, s, scale <= 1, xp), t, scale, mean, tiny, xp)
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

    ex, em = _terms(u, xp)
    return finish_risk(t, c, scale, wmean(em), wmean(ex), mean, xp, tiny=tiny, series=series)


def _terms(u: Any, xp: Any) -> tuple[Any, Any]:
    """The per-sample terms ``exp(u)`` and ``expm1(u)`` of the fields ``s`` and ``q``."""
    return xp.exp(u), xp.expm1(u)


def log_normaliser_of(u: Any, total: Any, near: bool, xp: Any) -> Any:
    """``log(sum p exp(u))`` of shifted exponents ``u <= 0`` for a host flag ``near``
    (``|t| (hi - lo) <= 1``): ``total`` maps the per-sample terms to their prior-weighted
    sum, and only the sum the rule takes is formed (:func:`log_normaliser`).

    Examples
    --------
    >>> import numpy as np
    >>> float(log_normaliser_of(np.array([-1e-12, 0.0]), np.mean, True, np))
    -4.99999999999875e-13
    """
    near = bool(near)
    z = total(normaliser_term(u, near, xp))
    return log_normaliser(z, z, near, xp)


def exponent_terms(u: Any, xp: Any, *, squares: bool = True) -> tuple[Any, ...]:
    """The per-sample terms of the fields ``s``, ``q`` and ``s2`` for the shifted exponents
    ``u = t (l - c) <= 0``: ``exp(u)``, ``expm1(u)`` and, with ``squares``, ``exp(2 u)``
    (for drivers that sum them their own way, such as one scatter-add per field).

    Examples
    --------
    >>> import numpy as np
    >>> [float(x) for x in exponent_terms(np.asarray(0.0), np)]
    [1.0, 0.0, 1.0]

    With ``squares=False`` they are also the factors ``exp(d)``, ``expm1(d)`` that move a
    state to another shift (:func:`moved_sums`); ``xp`` may then be :mod:`math` for a
    Python float ``d`` (a factor read on the host):

    >>> import math
    >>> exponent_terms(-0.5, math, squares=False) == (math.exp(-0.5), math.expm1(-0.5))
    True
    """
    ex, em = _terms(u, xp)
    return (ex, em, ex * ex) if squares else (ex, em)


def normaliser_term(u: Any, near: bool, xp: Any, *, overwrite: bool = False) -> Any:
    """The per-sample term of the one sum the rule takes for a host flag ``near``
    (``|t| (hi - lo) <= 1``): ``expm1(u)`` (the field ``q``) where ``near``, else
    ``exp(u)`` (the field ``s``), for shifted exponents ``u = t (l - c) <= 0``. For drivers
    that read the regime on the host and form one sum (:func:`exponent_terms` forms
    both).

    Parameters
    ----------
    u : array
        The shifted exponents.
    near : bool
        The small-tilt regime, read on the host.
    xp : namespace
        The array namespace of ``u``.
    overwrite : bool, optional
        ``u`` is a temporary the caller owns: the term is written over it where the
        library allows (NumPy, CuPy, PyTorch without autograd), else a new array.

    Returns
    -------
    array
        ``expm1(u)`` or ``exp(u)``; with ``near``, ``exp(u)`` is ``1 + expm1(u)`` without
        cancellation (every ``u`` lies in ``[-1, 0]``).

    Examples
    --------
    >>> import numpy as np
    >>> u = np.array([-1e-12, 0.0])
    >>> normaliser_term(u, True, np).tolist(), normaliser_term(u, False, np).tolist()
    ([-9.999999999995e-13, 0.0], [0.999999999999, 1.0])
    """
    fn = xp.expm1 if near else xp.exp
    return apply_inplace(fn, u, xp) if overwrite else fn(u)


def moved_sums(
    f: Any, fm: Any, gap: Any, mass: Any, s: Any, q: Any = None, lsum: Any = None
) -> tuple[Any, Any, Any]:
    """The sums ``(s, q, lsum)`` of a state (or of each of its groups) moved from its shift
    ``c_k`` to a shift ``c`` with ``d = t (c_k - c) <= 0``: ``s f``, ``q f + mass fm`` (terms
    of one sign: no cancellation) and ``lsum + mass gap``, where ``f, fm = exp(d),
    expm1(d)`` (:func:`exponent_terms` with ``squares=False``) and ``gap = c_k - c``. A sum
    given as None stays None (the eager state keeps ``q`` and ``lsum`` only in the regimes
    that need them); the field ``s2`` moves by ``f**2``.

    Parameters
    ----------
    f, fm : array or float
        ``exp(d)`` and ``expm1(d)``.
    gap : array or float
        ``c_k - c`` (only used for ``lsum``).
    mass, s, q, lsum : array
        The state's fields at its shift ``c_k``.

    Returns
    -------
    s, q, lsum : array or None
        The same fields at the shift ``c``.

    Examples
    --------
    >>> import numpy as np
    >>> l, t = np.array([0.0, 1.0]), 2.0
    >>> hi, lo, mass, s, q, lsum, s2 = block(l, None, t, np)  # shifted by hi = 1
    >>> f, fm = exponent_terms(np.asarray(t * (1.0 - 3.0)), np, squares=False)
    >>> s, q, lsum = moved_sums(f, fm, 1.0 - 3.0, mass, s, q, lsum)
    >>> u = t * (l - 3.0)  # the same losses shifted by 3
    >>> bool(np.allclose([s[0], q[0], lsum[0]], [np.exp(u).sum(), np.expm1(u).sum(), -5.0]))
    True
    """
    return (
        s * f,
        None if q is None else q * f + mass * fm,
        None if lsum is None else lsum + mass * gap,
    )


def _tiny(dtype: Any, xp: Any) -> float:
    return math.sqrt(float(xp.finfo(dtype).smallest_normal))


# ---------------------------------------------------------------------------------------
# block, merge, finish


def block(values: Any, mask: Any, t: Any, xp: Any) -> Any:
    """The packed state ``(N_FIELDS, G)`` of one batch of losses.

    Parameters
    ----------
    values : array, shape (B,)
        The losses (B may be 0).
    mask : array, shape (B, G), or None
        One-hot group membership in the losses' dtype (None: one group of every loss).
    t : float or 0-d array
        The tilt (0 and ``+-inf`` included).
    xp : namespace
        The array namespace of ``values``.

    Returns
    -------
    array, shape (N_FIELDS, G)
        The rows :data:`FIELDS`; a group without samples has the state of no samples
        (merged with others it changes nothing).

    Examples
    --------
    >>> import numpy as np
    >>> st = block(np.array([0.0, 1.0, 4.0]), None, 1.0, np)
    >>> r, present, _ = finish(st, 1.0, np)
    >>> bool(np.isclose(r[0], np.log(np.mean(np.exp([0.0, 1.0, 4.0])))))
    True
    """
    dtype = values.dtype
    if values.shape[0] == 0:
        g = 1 if mask is None else mask.shape[1]
        zeros = xp.zeros((g,), dtype=dtype, device=device(values))
        big = float(xp.finfo(dtype).max)
        return xp.stack([zeros - big, zeros + big, zeros, zeros, zeros, zeros, zeros])
    v = xp.reshape(values, (-1, 1))
    zero = const(0.0, values, xp)
    if mask is None:
        on = None
        hi, lo = xp.max(v, axis=0), xp.min(v, axis=0)
        n = xp.reshape(const(float(values.shape[0]), values, xp), (1,))
    else:
        on = mask > 0
        big = const(float(xp.finfo(dtype).max), values, xp)
        hi = xp.max(xp.where(on, v, -big), axis=0)
        lo = xp.min(xp.where(on, v, big), axis=0)
        n = xp.sum(mask, axis=0)

    def msum(x: Any) -> Any:
        return xp.sum(x if mask is None else mask * x, axis=0)

    if is_number(t):
        c = hi if t > 0 else lo
        if on is not None:  # an absent group's shift is +-big: keep t * (v - c) finite
            c = xp.where(n > 0, c, zero)
        d = v - c
        if on is not None:
            d = xp.where(on, d, zero)
        lsum = msum(d)
        if t == 0:
            s, q, s2 = n, xp.zeros_like(n), n
        elif math.isinf(t):
            s, q = msum(xp.astype(v == c, dtype)), xp.zeros_like(n)
            s2 = s
        else:
            ex, em, ex2 = exponent_terms(t * d, xp)
            s, q, s2 = msum(ex), msum(em), msum(ex2)
    else:
        t_fin, is_zero, regular = tilt_parts(t, xp)
        c = xp.where(t > 0, hi, lo)
        if on is not None:
            c = xp.where(n > 0, c, zero)
        d = v - c
        if on is not None:
            d = xp.where(on, d, zero)
        lsum = msum(d)
        ties = msum(xp.astype(v == c, dtype))
        # at t = 0 and +-inf the exponent is 0 (its sums are replaced below): no overflow
        ex, em, ex2 = exponent_terms(xp.where(regular, t_fin * d, zero), xp)
        s = xp.where(regular, msum(ex), xp.where(is_zero, n, ties))
        q = xp.where(regular, msum(em), zero)
        s2 = xp.where(regular, msum(ex2), xp.where(is_zero, n, ties))
    return xp.stack([hi, lo, n, s, q, lsum, s2])


def merge(stacked: Any, t: Any, xp: Any) -> Any:
    """The packed state of the union of disjoint batches.

    The parts are moved to the common shift ``c`` by ``f = exp(t (c_k - c)) <= 1``: ``s``
    by ``f``, ``s2`` by ``f**2``, ``q`` to ``q_k f + mass_k expm1(t (c_k - c))`` (terms of
    one sign: no cancellation), ``lsum`` to ``lsum_k + mass_k (c_k - c)``. The result is
    the state of one pass over the union, up to rounding, whatever the order and grouping
    of the merges.

    Parameters
    ----------
    stacked : array, shape (P, N_FIELDS, G)
        The states of ``P`` disjoint batches.
    t : float or 0-d array
        Their tilt.
    xp : namespace
        The array namespace of ``stacked``.

    Returns
    -------
    array, shape (N_FIELDS, G)

    Examples
    --------
    >>> import numpy as np
    >>> l = np.array([0.0, 1.0, 4.0])
    >>> parts = np.stack([block(l[:1], None, 2.0, np), block(l[1:], None, 2.0, np)])
    >>> bool(np.allclose(merge(parts, 2.0, np), block(l, None, 2.0, np)))
    True
    """
    hi_k, lo_k, n_k, s_k, q_k, lsum_k, s2_k = (stacked[:, i, ...] for i in range(N_FIELDS))
    hi, lo = xp.max(hi_k, axis=0), xp.min(lo_k, axis=0)
    n = xp.sum(n_k, axis=0)
    zero = const(0.0, stacked, xp)
    on = n_k > 0
    if is_number(t):
        c_k, c = (hi_k, hi) if t > 0 else (lo_k, lo)
        gap = xp.where(on, xp.where(on, c_k, c) - c, zero)
        lsum = xp.sum(lsum_k + n_k * gap, axis=0)
        if t == 0:
            return xp.stack([hi, lo, n, n, xp.zeros_like(n), lsum, n])
        if math.isinf(t):
            s = xp.sum(xp.where(c_k == c, s_k, zero), axis=0)
            return xp.stack([hi, lo, n, s, xp.zeros_like(n), lsum, s])
        d = t * gap
    else:
        t_fin, is_zero, regular = tilt_parts(t, xp)
        c_k, c = xp.where(t > 0, hi_k, lo_k), xp.where(t > 0, hi, lo)
        gap = xp.where(on, xp.where(on, c_k, c) - c, zero)
        lsum = xp.sum(lsum_k + n_k * gap, axis=0)
        d = xp.where(regular, t_fin * gap, zero)
    f, fm = _terms(d, xp)
    s_m, q_m, _ = moved_sums(f, fm, gap, n_k, s_k, q_k)
    s, q = xp.sum(s_m, axis=0), xp.sum(q_m, axis=0)
    s2 = xp.sum(s2_k * f * f, axis=0)
    if not is_number(t):
        ties = xp.sum(xp.where(c_k == c, s_k, zero), axis=0)
        s = xp.where(regular, s, xp.where(is_zero, n, ties))
        q = xp.where(regular, q, zero)
        s2 = xp.where(regular, s2, xp.where(is_zero, n, ties))
    return xp.stack([hi, lo, n, s, q, lsum, s2])


def shift(state: Any, t: Any, xp: Any) -> Any:
    """The shift ``c`` of each group (``hi`` for ``t > 0``, else ``lo``).

    Examples
    --------
    >>> import numpy as np
    >>> st = block(np.array([1.0, 3.0]), None, -2.0, np)
    >>> shift(st, -2.0, np).tolist(), shift(st, 2.0, np).tolist()
    ([1.0], [3.0])
    """
    if is_number(t):
        return state[HI, ...] if t > 0 else state[LO, ...]
    return xp.where(t > 0, state[HI, ...], state[LO, ...])


def finish(state: Any, t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """The tilted risk of each group of a packed state.

    Parameters
    ----------
    state : array, shape (N_FIELDS, G)
        A packed state (:func:`block`, :func:`merge`).
    t : float or 0-d array
        Its tilt.
    xp : namespace
        The array namespace of ``state``.

    Returns
    -------
    risk : array, shape (G,)
        The tilted risk (the mean at ``t = 0``, the extreme at ``+-inf``); 0 for a group
        without samples.
    present : array of bool, shape (G,)
        Which groups have samples.
    log_mean : array, shape (G,)
        ``log(s / mass)``, so that the risk is ``shift + log_mean / t`` (0 at ``t = 0`` and
        ``+-inf`` and for groups without samples).

    Examples
    --------
    >>> import numpy as np
    >>> r, present, _ = finish(block(np.array([1.0, 3.0]), None, 0.0, np), 0.0, np)
    >>> r.tolist(), present.tolist()
    ([2.0], [True])
    """
    hi, lo, n, s, q, lsum = (state[i, ...] for i in (HI, LO, MASS, S, Q, LSUM))
    one, zero = const(1.0, state, xp), const(0.0, state, xp)
    present = n > 0
    n_safe = xp.where(present, n, one)
    c = shift(state, t, xp)
    mean = c + lsum / n_safe
    if is_number(t):
        fi = xp.finfo(state.dtype)
        if abs(t) < float(fi.smallest_normal) * float(fi.eps):  # zero in this dtype
            return xp.where(present, mean, zero), present, xp.zeros_like(n)
        if math.isinf(t):
            return xp.where(present, c, zero), present, xp.zeros_like(n)
        t_fin = t
        scale = abs(t) * (hi - xp.where(present, lo, hi))
    else:
        t_fin, is_zero, regular = tilt_parts(t, xp)
        scale = xp.abs(t_fin) * (hi - xp.where(present, lo, hi))
    near = scale <= 1
    log_mean = log_normaliser(q / n_safe, xp.where(present, s / n_safe, one), near, xp)
    risk = _risk(c, log_mean, t_fin, scale, mean, _tiny(state.dtype, xp), xp)
    if not is_number(t):
        risk = xp.where(is_zero, mean, risk)
        risk = xp.where(t == xp.inf, hi, xp.where(t == -xp.inf, lo, risk))
        log_mean = xp.where(regular, log_mean, zero)
    return xp.where(present, risk, zero), present, xp.where(present, log_mean, zero)


def total(state: Any, t: Any, xp: Any) -> Any:
    """The prior-weighted sum of the losses of each group, ``mass c + lsum``.

    Examples
    --------
    >>> import numpy as np
    >>> total(block(np.array([1.0, 3.0, 8.0]), None, 0.5, np), 0.5, np).tolist()
    [12.0]
    """
    n = state[MASS, ...]
    c = xp.where(n > 0, shift(state, t, xp), const(0.0, state, xp))
    return n * c + state[LSUM, ...]


def ess_fraction(state: Any, xp: Any) -> Any:
    """The effective sample size of each group's tilted weights as a fraction of its mass:
    ``s**2 / (mass s2)`` (1 at ``t = 0``; NaN for a group without samples).

    Examples
    --------
    >>> import numpy as np
    >>> ess_fraction(block(np.array([0.0, 0.0]), None, 3.0, np), np).tolist()
    [1.0]
    """
    s, n, s2 = state[S, ...], state[MASS, ...], state[S2, ...]
    present = n > 0
    one = const(1.0, state, xp)
    frac = (s / xp.where(present, n, one)) * (s / xp.where(present, s2, one))
    return xp.where(present, xp.minimum(frac, one), const(math.nan, state, xp))


# ---------------------------------------------------------------------------------------
# the one-pass form over columns, and the running average of two risks


def tilted_columns(values: Any, mass: Any, t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """Tilted risk and weights of each column of a table of prior masses, in one pass.

    Parameters
    ----------
    values : array, shape (B, 1) or (B, K)
        Values (losses, or group risks), broadcast against ``mass``.
    mass : array, shape (B, K)
        Non-negative prior mass of each row in each column (0: not a member).
    t : 0-d array
        The tilt (0 and +-inf included).
    xp : namespace
        The array namespace.

    Returns
    -------
    risk : array, shape (K,)
        ``(1/t) log(sum_i m_i exp(t v_i) / sum_i m_i)``; 0 for a column without mass.
    weights : array, shape (B, K)
        ``m_i exp(t v_i) / sum_j m_j exp(t v_j)`` (the prior restricted to the tied
        extremes at +-inf, the prior at 0); zero columns where a column has no mass.
    total : array, shape (K,)
        The mass of each column.

    Examples
    --------
    >>> import numpy as np
    >>> r, w, m = tilted_columns(np.array([[0.0], [2.0]]), np.ones((2, 1)),
    ...                          np.asarray(1.0), np)
    >>> bool(np.isclose(r[0], np.log((1 + np.e**2) / 2))), m.tolist()
    (True, [2.0])
    """
    zero, one = const(0.0, mass, xp), const(1.0, mass, xp)
    big = const(xp.finfo(mass.dtype).max, mass, xp)
    on = mass > 0
    total = xp.sum(mass, axis=0)
    present = total > 0
    total_safe = xp.where(present, total, one)
    vmax = xp.where(present, xp.max(xp.where(on, values, -big), axis=0), zero)
    vmin = xp.where(present, xp.min(xp.where(on, values, big), axis=0), zero)
    mean = xp.sum(xp.where(on, mass * values, zero), axis=0) / total_safe
    t_fin, is_zero, regular = tilt_parts(t, xp)
    c = xp.where(t_fin > 0, vmax, vmin)
    # u <= 0 on every member: no exponential can overflow, even in branches not chosen
    u = xp.where(on, t_fin * (values - c), zero)
    scale = xp.abs(t_fin) * (vmax - vmin)
    ex, em = _terms(u, xp)
    q = xp.sum(mass * em, axis=0) / total_safe  # in (-1, 0]
    s = xp.where(present, xp.sum(mass * ex, axis=0) / total_safe, one)  # in (0, 1]
    logz = log_normaliser(q, s, scale <= 1, xp)
    risk = _risk(c, logz, t_fin, scale, mean, _tiny(mass.dtype, xp), xp)
    risk = xp.where(is_zero, mean, risk)
    risk = xp.where(t == xp.inf, vmax, risk)
    risk = xp.where(t == -xp.inf, vmin, risk)

    tilted = mass * ex
    w_regular = tilted / xp.where(present, xp.sum(tilted, axis=0), one)
    w_prior = mass / total_safe
    extreme = xp.where(t > 0, vmax, vmin)
    tied = xp.where(on & (values == extreme), mass, zero)
    w_tied = tied / xp.where(present, xp.sum(tied, axis=0), one)
    weights = xp.where(regular, w_regular, xp.where(is_zero, w_prior, w_tied))
    return xp.where(present, risk, zero), weights, total


def running_update(previous: Any, batch: Any, t: Any, lam: float, xp: Any) -> Any:
    """The tilted average ``(1/t) log((1-lam) e^{t prev} + lam e^{t batch})`` of two
    risks (the running normaliser of the minibatch estimators).

    Written as ``prev + f(t (batch - prev)) / t`` with ``f(u) = log1p(lam expm1(u))`` for
    u <= 0 and ``u + log1p((1-lam) expm1(-u))`` for u > 0: no overflow at any ``t * loss``
    and full relative precision as t -> 0, where it becomes the linear average
    ``prev + lam (batch - prev)`` (used exactly at t = 0, and with its first correction
    where ``lam t (batch - prev)`` is subnormal, e.g. at a subnormal t). At +-inf it keeps
    ``batch``.

    Examples
    --------
    >>> import numpy as np
    >>> r = running_update(np.asarray(0.0), np.asarray(1.0), 2.0, 0.5, np)
    >>> bool(np.isclose(r, np.log(0.5 + 0.5 * np.exp(2.0)) / 2.0))
    True
    """
    if lam == 1.0:  # no memory: every batch is its own normaliser (the plug-in)
        return batch
    gap = batch - previous
    if is_number(t):  # a Python tilt: its special values are branches
        if t == 0:
            return previous + lam * gap
        if math.isinf(t):
            return batch
        if abs(t) < float(xp.finfo(gap.dtype).smallest_normal):
            # t is zero or subnormal in the losses' dtype (1e-300 in float32): t * gap and
            # the division by t are formed in float64, where t is a normal number (one
            # subnormal there too takes the series of `_running_step`)
            wide = xp.astype(gap, xp.float64)
            return previous + xp.astype(_running_step(wide, t, lam, xp), gap.dtype)
        return previous + _running_step(gap, t, lam, xp)
    t_fin, is_zero, regular = tilt_parts(t, xp)
    out = xp.where(regular, previous + _running_step(gap, t_fin, lam, xp), batch)
    return xp.where(is_zero, previous + lam * gap, out)


def _running_step(gap: Any, t: Any, lam: float, xp: Any) -> Any:
    """``f(u) / t`` of :func:`running_update` (``u = t * gap``, t finite and non-zero).

    Where ``lam * u`` is subnormal (``t`` subnormal, or a small ``t * gap``), ``f(u)``
    has lost bits and the division by ``t`` would magnify the loss (``u`` is even 0 at
    ``t = 5e-324``): there the series ``f(u) / t = lam gap (1 + (1 - lam) u / 2 +
    O(u^2))``, exact to rounding for ``|u| < sqrt(eps)``, is taken instead; it needs no
    division by ``t``.
    """
    u = t * gap
    info = xp.finfo(u.dtype)
    tiny, below = float(info.smallest_normal), math.sqrt(float(info.eps))
    if tiny < lam * below:
        below = tiny / lam
    series = (lam * gap) * (1.0 + (0.5 * (1.0 - lam)) * u)
    return xp.where(xp.abs(u) < below, series, _running_f(u, lam, xp) / t)


def _running_f(u: Any, lam: float, xp: Any) -> Any:
    """``log((1 - lam) + lam e^u)`` without overflow, exact to rounding at every u."""
    u_neg = xp.where(u <= 0, u, const(0.0, u, xp))
    u_pos = xp.where(u > 0, u, const(0.0, u, xp))
    shrink = lam * xp.expm1(u_neg)  # in (-lam, 0]
    # far below, log1p(shrink) would lose the small 1 - lam + lam e^u: take the log directly
    f_neg = xp.where(shrink > -0.5, xp.log1p(shrink), xp.log((1.0 - lam) + lam * xp.exp(u_neg)))
    return xp.where(u <= 0, f_neg, u_pos + xp.log1p((1.0 - lam) * xp.expm1(-u_pos)))

"""The tilted risk of every group of a partition with one shift for all groups, repaired
where that shift is not exact (see :func:`group_risk`), and the same for groups given by
integer codes, with each sample's weight (see :func:`labelled_level`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import segments as _kernels
from .._compat import is_numpy_namespace, tiny_sqrt
from ..segments import Segments
from ._rule import TiltState
from ._support import _extremes, _nonfinite, spread_overflows
from .packed import log_normaliser, normaliser_term

__all__ = [
    "RHO",
    "LabelledLevel",
    "group_risk",
    "label_codes",
    "labelled_level",
    "labelled_risk",
    "pooled_risk",
    "shared_shift_risk",
]

#: a group's shared-shift risk is kept when ``|R - c| (+ 1/|t|)`` is at most ``RHO |R|``
RHO = 8.0
#: for weights alone: a group is kept when its weight at the top tilt ``t'`` is off by at
#: most this many roundings, ``|t'| (|R - c| + 1/|t|) <= RHO_WEIGHTS``
RHO_WEIGHTS = 32.0


def _underflow_limit(dtype: Any) -> float:
    """Largest ``|t| |R - c|`` for which every exponential that matters to a group (within
    a rounding of its largest one) is still a normal number of ``dtype``."""
    fi = np.finfo(dtype)
    return -math.log(float(fi.tiny)) + math.log(float(fi.eps)) - 8.0


def _normal_floor(dtype: Any) -> float:
    """The least exponent ``u`` whose ``exp(u)`` is a normal number of ``dtype`` (with a
    margin of one): below it a weight would lose its relative accuracy."""
    return math.log(float(np.finfo(dtype).tiny)) + 1.0


def _host(*arrays: Any) -> bool:
    """Whether every given array (None aside) is a NumPy array: the labelled routes are
    NumPy host routes and decline (return None) anything else, which the general route
    then serves on its own backend."""
    return all(a is None or isinstance(a, np.ndarray) for a in arrays)


def _shift(t: float, hi: float, lo: float, mode: str, dtype: Any) -> float:
    """The shared shift ``c``: zero (no subtraction, and the least rounding in the
    exponents) unless the exponents ``t (l - c)`` would then leave their range: half the
    log of the dtype's largest number for the exponentials, ``[-1, 1]`` for the ``expm1``
    sums (then the point of ``[lo, hi]`` nearest zero)."""
    if mode == "mean":
        return 0.0
    if mode == "q":
        c = 0.0 if abs(t) * max(abs(hi), abs(lo)) <= 1.0 else min(max(0.0, lo), hi)
    else:
        room = 0.5 * math.log(float(np.finfo(dtype).max)) / abs(t)
        c = max(0.0, hi - room) if t > 0 else min(0.0, lo + room)
    return float(np.asarray(c, dtype=dtype))


def group_risk(losses: Any, t: float, prior: Any, segments: Segments, xp: Any, *,
               unit: float | None = None) -> Any:
    """The tilted risk of every group of ``segments`` (NaN for groups without support).

    The same numbers as ``TiltState.from_block(losses, t, prior, segments=segments,
    unit=unit).risk()``, computed on NumPy 1-d losses by :func:`shared_shift_risk` (one
    vectorised exponential per loss and one segment sum) and by the group state elsewhere.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import Segments
    >>> seg = Segments.from_codes([0, 0, 1])
    >>> r = group_risk(np.array([1.0, 3.0, 5.0]), 2.0, None, seg, np)
    >>> bool(np.allclose(r, [np.log((np.exp(2) + np.exp(6)) / 2) / 2, 5.0]))
    True
    """
    t = float(t)
    if is_numpy_namespace(xp) and losses.ndim == 1 and math.isfinite(t):
        out = shared_shift_risk(losses, t, prior, segments)
        if out is not None:
            return out[0]
    st = TiltState.from_block(losses, t, prior, segments=segments, xp=xp, unit=unit)
    return st.risk(xp, losses.dtype)


def shared_shift_risk(l: np.ndarray, t: float, p: np.ndarray | None, seg: Segments):
    """``(risk, repaired)``: the tilted risk of every group of ``seg`` (NumPy, 1-d), and
    the indices of the groups that had to be recomputed with their own shift.

    Every loss is shifted by one number ``c`` for all groups (zero where the exponents
    allow it, see ``_shift``) instead of its group's extreme, so that the
    exponentials are one vectorised pass with no gather, and one segment sum gives every
    group's normaliser. The regime (the mean, ``log1p`` of the ``expm1`` sums, or the log
    of the ``exp`` sums) is the one the rule of :mod:`tiltlab.accumulator` picks for the
    spread of all losses, which bounds every group's spread. Against the group's own
    shift this adds a rounding error of about ``eps (|R - c| + 1/|t|)`` to the group's
    risk ``R`` (the exponents are longer by the distance between the shifts, and in the
    log regime the rounding of each exponential is no longer relative to the group's
    largest), so a group is kept only where that is at most ``RHO eps |R|`` and no
    exponential that matters to it is subnormal (``t (R - c)`` above minus the dtype's
    underflow limit). The other groups (in practice: risks near zero, or groups whose
    exponentials underflow at large ``|t|``) are recomputed by the group state with their
    own shift, from their samples alone (one pass over the codes to find them).

    Returns None for arrays other than NumPy's and when the spread of all losses
    overflows (the caller uses the group state). Raises
    :class:`~tiltlab.accumulator.NonFiniteLosses` for NaN or infinite losses on the
    support of ``p``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.segments import Segments
    >>> seg = Segments.from_codes([0, 0, 1])
    >>> r, repaired = shared_shift_risk(np.array([1.0, 3.0, 900.0]), 2.0, None, seg)
    >>> repaired.tolist()  # group 0 lies 720 below the shift: its exponentials underflow
    [0]
    >>> bool(np.isclose(r[0], np.log((np.exp(2) + np.exp(6)) / 2) / 2))
    True
    """
    if not _host(l, p):
        return None
    plan = _plan(l, t, p)
    if plan is None:
        return None
    mass = seg.counts if p is None else _kernels.segment_sums(seg.codes, p, seg.n_groups)
    d = _exponentials(l, t, p, *plan)
    # float64 sums (float32 exponentials are added without rounding to float32)
    z = _kernels.segment_sums(seg.codes, d, seg.n_groups, weights=p)
    del d
    r, repaired = _finish(z, mass, t, *plan, l.dtype)
    if repaired.size:
        r[repaired] = _own_shift(l, t, p, seg.codes, seg.counts, repaired)
    return r.astype(l.dtype, copy=False), repaired


def labelled_risk(l: np.ndarray, t: float, labels: np.ndarray):
    """``(risk, counts)`` of the groups of integer ``labels`` under the uniform prior
    (NumPy, 1-d), in the order of their labels, or None where this route does not apply
    (other backends included: the general route serves them).

    The risks of :func:`shared_shift_risk` without building a partition first: the labels
    serve as codes (groups whose label is unused are empty and dropped at the end), and
    each group's count and normaliser come from one compiled pass over the labels and the
    exponentials. None when the compiled kernels are not used for ``l``'s length, when a
    label is negative or not below ``2 N + 1024``, or when the spread of the losses
    overflows (the callers build the partition then). Raises
    :class:`~tiltlab.accumulator.NonFiniteLosses` for NaN or infinite losses.

    Examples
    --------
    >>> import numpy as np
    >>> l = np.linspace(0.0, 1.0, 1 << 16)
    >>> r, counts = labelled_risk(l, 2.0, np.arange(l.size) % 3 * 5)
    >>> counts.tolist()
    [21846.0, 21845.0, 21845.0]
    >>> from scipy.special import logsumexp
    >>> bool(np.isclose(r[1], (logsumexp(2 * l[1::3]) - np.log(21845)) / 2))
    True
    """
    if not _host(l, labels):
        return None
    coded = label_codes(labels, int(l.shape[0]))
    if coded is None:
        return None
    level = labelled_level(l, t, *coded)
    return None if level is None else (level.risk, level.mass)


def label_codes(labels: np.ndarray, n: int) -> tuple[np.ndarray, int] | None:
    """``(codes, n_codes)``: integer ``labels`` as int64 group codes in ``[0, n_codes)``
    for the compiled labelled route, or None where that route does not take them: not
    integers, ``n`` below the kernels' size, a negative label or one not below
    ``2 n + 1024`` (a table that large is not worth it), or labels that are not a NumPy array."""
    if not _host(labels) or labels.dtype.kind not in "iu" or labels.ndim != 1:
        return None
    if not _kernels.use_kernels(n):
        return None
    codes = np.ascontiguousarray(labels, dtype=np.int64)
    lo, top = _kernels.int_range(codes)
    if lo < 0 or top >= 2 * n + 1024:
        return None
    return codes, int(top) + 1


class LabelledLevel:
    """One grouping level evaluated under a shared shift (see :func:`labelled_level`):
    the risks and masses of the groups present, and their members' weights on request.

    ``risk`` (``l``'s dtype) and ``mass`` (float64 sample counts) list the groups with
    samples in the order of their codes; :meth:`weights` spreads weights given to those
    groups over their samples.

    Attributes
    ----------
    risk : numpy.ndarray
        The tilted risk of each group with samples, in the order of their codes.
    mass : numpy.ndarray
        The number of samples of each of those groups (float64).

    Examples
    --------
    >>> import numpy as np
    >>> level = labelled_level(np.array([1.0, 1.0, 4.0]), 0.0, np.array([0, 0, 2]), 3,
    ...                        weights=True)
    >>> level.risk.tolist(), level.mass.tolist()  # code 1 has no samples
    ([1.0, 4.0], [2.0, 1.0])
    >>> level.weights(np.array([0.5, 0.5])).tolist()
    [0.25, 0.25, 0.5]
    """

    __slots__ = ("risk", "mass", "_parts")

    def __init__(self, risk: np.ndarray, mass: np.ndarray, parts: tuple):
        self.risk, self.mass, self._parts = risk, mass, parts

    def weights(self, top: np.ndarray) -> np.ndarray:
        """Per-sample weights: each group's weight ``top`` (one per present group, summing
        to one) times the sample's tilted share within its group.

        Call it once (it reuses the level's exponentials in place).
        """
        mode, d, z, codes, where, bad, repaired, onehot = self._parts
        if d is None:
            raise ValueError("the level was evaluated without `weights=True`")
        self._parts = (mode,) + (None,) * 7
        dtype = self.risk.dtype
        top64 = np.asarray(top, dtype=np.float64)
        zs = z if where is None else z[where]
        if mode == "q":
            zs = zs + self.mass  # sum exp(u) = count + sum expm1(u)
        elif mode == "mean":
            zs = self.mass
        with np.errstate(divide="ignore", invalid="ignore"):
            f = top64 / zs  # each group's weight per unit of its terms
        # a factor below the smallest normal number while the group's exponentials are
        # large (a heavily down-weighted group, t large): scale by the normaliser first,
        # then by the group's weight, so that no weight that is a normal number is lost
        split = False
        if mode == "s":
            low = (f < np.finfo(dtype).tiny) & (top64 > 0)
            low[bad] = False
            split = bool(np.any(low))
        if bad.size:
            f[bad] = 0.0  # their members are set from their own shift below
        if split:
            with np.errstate(divide="ignore"):
                inv = 1.0 / zs
            f_top = top64.copy()
            if bad.size:
                inv[bad] = 0.0
                f_top[bad] = 0.0
            if where is not None:
                inv = _scatter(inv, where, z.shape[0])
                f_top = _scatter(f_top, where, z.shape[0])
        if where is not None:
            f = _scatter(f, where, z.shape[0])
        g = inv if split else f
        if mode == "mean":
            w = (onehot @ g if onehot is not None else np.take(g, codes)).astype(dtype)
        else:
            if mode == "q":
                d += 1.0  # exp(u) = 1 + expm1(u), |u| <= 1: no cancellation
            w = _scale(d, codes, g, onehot)
        if split:
            w = _scale(w, codes, f_top, onehot)
        if bad.size:
            items, sub_codes, cond = repaired
            w[items] = cond * top64[bad][sub_codes].astype(dtype, copy=False)
        return w


def _scale(values: np.ndarray, codes: np.ndarray, factors: np.ndarray, onehot: Any):
    """``values * factors[codes]`` written over ``values`` (the one-hot indicator, when
    given, gathers by a matrix-vector product)."""
    if onehot is not None:
        values *= (onehot @ factors).astype(values.dtype, copy=False)
        return values
    return _kernels.scale_by_group(values, codes, factors)


def _scatter(values: np.ndarray, where: np.ndarray, size: int) -> np.ndarray:
    """``values`` placed at ``where`` in a zero array of length ``size``."""
    out = np.zeros(size)
    out[where] = values
    return out


def labelled_level(l: np.ndarray, t: float, codes: np.ndarray, n_groups: int,
                   counts: np.ndarray | None = None, *, weights: bool = False,
                   onehot: np.ndarray | None = None,
                   members: Callable[[], tuple] | None = None,
                   weights_only: float | None = None) -> LabelledLevel | None:
    """The tilted risk of every group given by int64 ``codes`` in ``[0, n_groups)``
    under the uniform prior (NumPy, 1-d losses ``l``), with one shared shift
    (:func:`shared_shift_risk`'s rule, its acceptance test and its repair), and, with
    ``weights``, what it takes to spread group weights over the samples: the
    exponentials and the groups' normalisers, so that each sample's weight is one
    gather and one product.

    ``counts`` (float64, per code, all positive: every code has samples, as in a group
    tree) are counted in the same pass as the sums when None (codes may then be unused);
    ``onehot`` (an ``N x G`` float64 indicator of the codes) replaces the scatter sums and
    the gather by two matrix-vector products (few groups, short inputs); ``members``, if
    given, returns ``(order, starts)``: the samples sorted by code (a stable sort) and
    the position where each code starts, so that the groups the shared shift does not
    serve are recomputed from their samples without a scan over the codes.
    ``weights_only`` (the tilt of the level above) says the risks serve only to weigh
    the groups at that tilt: a group is then recomputed only where its weight would be
    off by more than ``RHO_WEIGHTS`` roundings (the risks returned keep that accuracy
    only).
    Groups without
    samples are left out of the result. The compiled kernels run when ``l`` is long
    enough (``use_kernels`` of the compiled segment kernels), NumPy otherwise.

    Returns None where the route does not apply: arrays other than NumPy's, the spread
    of the losses overflows,
    or ``weights`` are asked for and some exponential under the shared shift would not
    be a normal number (the weights of such samples would lose their relative accuracy);
    the callers use the group state then. Raises
    :class:`~tiltlab.accumulator.NonFiniteLosses` for NaN or infinite losses.

    Examples
    --------
    >>> import numpy as np
    >>> l, codes = np.array([0.0, 1.0, 5.0]), np.array([0, 0, 1])
    >>> level = labelled_level(l, 2.0, codes, 2, weights=True)
    >>> bool(np.isclose(level.risk[0], np.log((1 + np.exp(2)) / 2) / 2))
    True
    >>> w = level.weights(np.array([0.5, 0.5]))
    >>> bool(np.allclose(w, [0.5 / (1 + np.e**2), 0.5 * np.e**2 / (1 + np.e**2), 0.5]))
    True
    """
    if not _host(l, codes, counts):
        return None
    n = int(l.shape[0])
    compiled = _kernels.use_kernels(n)
    plan = _plan_range(l, t, None)
    if plan is None:
        return None
    mode, c, hi, lo = plan
    if weights and mode == "s" and min(t * (hi - c), t * (lo - c)) < _normal_floor(l.dtype):
        # the risks' shift leaves exponentials below the normal range: the other end of
        # the range (the largest exponent at half the log of the largest number) may keep
        # them all normal
        room = 0.5 * math.log(float(np.finfo(l.dtype).max)) / abs(t)
        c = float(np.asarray(hi - room if t > 0 else lo + room, dtype=l.dtype))
        if min(t * (hi - c), t * (lo - c)) < _normal_floor(l.dtype):
            return None
    d = _exponentials(l, t, None, mode, c)
    given_counts = counts is not None
    if onehot is not None:
        z = d @ onehot if d.dtype == np.float64 else d.astype(np.float64) @ onehot
        if counts is None:
            counts = onehot.sum(axis=0)
    elif counts is None:
        counts, z = _kernels.segment_counts_sums(codes, d, n_groups)
    else:
        z = _kernels.segment_sums(codes, d, n_groups)
    if not weights:
        del d
        d = None
    # the present groups' means, their logs (NumPy's vectorised log), then the risks and
    # the acceptance test in one pass over the groups
    if given_counts:  # every code has samples: no compaction
        r, mass, where = z / counts, counts, None
    else:
        r, mass, where = _kernels.present_means(counts, z, compiled=compiled)
        if where.shape[0] == n_groups:
            where = None  # every group has samples
    if mode != "mean":
        with np.errstate(divide="ignore"):
            log_normaliser(r, r, mode == "q", np, overwrite=True)
    floor = -_underflow_limit(l.dtype) if mode == "s" else None
    k = 1.0 / abs(t) if mode == "s" else 0.0
    bad = _kernels.accept_shared_shift(r, None if mode == "mean" else t, c, k, RHO, floor,
                                       compiled=compiled)
    if weights_only is not None and bad.size:
        # the risks only weigh the groups at the top tilt: a group's weight is off by
        # |top tilt| times its risk's error, eps (|R - c| + k), which the bar bounds
        with np.errstate(invalid="ignore"):
            err = abs(weights_only) * (np.abs(r[bad] - c) + k)
            bad = bad[~(err <= RHO_WEIGHTS)]  # (NaN: a sum that under- or overflowed)
    repaired = None
    if bad.size:
        groups = bad if where is None else where[bad]
        out = _own_shift(l, t, None, codes, counts, groups, want=weights,
                         members=None if members is None else members())
        if weights:
            r[bad], repaired = out[0], out[1:]
        else:
            r[bad] = out
    parts = (mode, d, z, codes, where, bad, repaired, onehot)
    return LabelledLevel(r.astype(l.dtype, copy=False), mass, parts)


def pooled_risk(v: np.ndarray, t: float, mass: np.ndarray):
    """The tilted risk of the values ``v`` (NumPy, 1-d) with positive float64 masses
    ``mass`` under one shared shift, as a 0-d array of ``v``'s dtype; None where that
    shift does not give it to the accuracy bar of :func:`shared_shift_risk` (or the
    spread of ``v`` overflows, or ``v`` is not a NumPy array): the caller then uses the
    tilted accumulator.

    The top level of a hierarchy whose group risks :func:`labelled_risk` gave: one
    exponential per value and one float64 sum of its products with the masses.

    Examples
    --------
    >>> import numpy as np
    >>> r = pooled_risk(np.array([1.0, 3.0]), 2.0, np.array([1.0, 3.0]))
    >>> bool(np.isclose(r, np.log((np.exp(2) + 3 * np.exp(6)) / 4) / 2))
    True
    """
    if not _host(v, mass):
        return None
    plan = _plan(v, t, None)
    if plan is None:
        return None
    mode, c = plan
    d = _exponentials(v, t, None, mode, c)
    # float64 products (``mass`` is float64) and NumPy's pairwise sum, not a BLAS dot
    # product: the same rounding on any number of threads
    q = np.array([np.sum(d * mass) / mass.sum()])
    if mode != "mean":
        with np.errstate(divide="ignore", invalid="ignore"):
            log_normaliser(q, q, mode == "q", np, overwrite=True)
    floor = -_underflow_limit(v.dtype) if mode == "s" else None
    k = 1.0 / abs(t) if mode == "s" else 0.0
    if _kernels.accept_shared_shift(q, None if mode == "mean" else t, c, k, RHO, floor).size:
        return None
    return np.asarray(q[0], dtype=v.dtype)


def _plan(l: np.ndarray, t: float, p: np.ndarray | None):
    """``(mode, c)``: the regime and the shared shift of :func:`shared_shift_risk`, or
    None when the spread of the losses on the support of ``p`` overflows."""
    plan = _plan_range(l, t, p)
    return None if plan is None else plan[:2]


def _plan_range(l: np.ndarray, t: float, p: np.ndarray | None):
    """``(mode, c, hi, lo)``: :func:`_plan` and the extremes of the losses."""
    hi, lo = (float(l.max()), float(l.min())) if p is None else _extremes(l, p, np)
    if not (math.isfinite(hi) and math.isfinite(lo)):
        raise _nonfinite()
    if spread_overflows(hi, lo, l.dtype, np):  # l - c would overflow in l's dtype
        return None
    scale = abs(t) * (hi - lo)
    mode = "mean" if t == 0.0 or scale < tiny_sqrt(l.dtype, np) else "q" if scale <= 1.0 else "s"
    return mode, _shift(t, hi, lo, mode, l.dtype), hi, lo


def _exponentials(l: np.ndarray, t: float, p: np.ndarray | None, mode: str, c: float):
    """The terms of every loss under the shared shift ``c``: ``exp(t (l - c))``,
    ``expm1(t (l - c))`` or ``l`` by ``mode`` (zero off the support of ``p``)."""
    with np.errstate(over="ignore", invalid="ignore"):  # off the support only
        if c == 0.0:
            d = l if mode == "mean" else l * l.dtype.type(t)
        else:
            d = l - l.dtype.type(c)
            if mode != "mean":
                d *= l.dtype.type(t)
        if mode != "mean":
            d = normaliser_term(d, mode == "q", np, overwrite=True)
    if p is not None:
        d = np.where(p > 0, d, l.dtype.type(0))
    return d


def _finish(z: np.ndarray, mass: np.ndarray, t: float, mode: str, c: float, dtype: Any):
    """``(risk, repaired)`` from the groups' float64 sums ``z`` (overwritten) and masses:
    the risks under the shared shift, and the groups with mass whose risk it does not
    give to the accuracy bar of :func:`shared_shift_risk`."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = np.divide(z, mass, out=z)  # few temporaries: G may be large
        fine = None
        if mode != "mean":
            log_normaliser(d, d, mode == "q", np, overwrite=True)
        if mode == "s":
            fine = d >= -_underflow_limit(dtype)  # (False where z = 0 or NaN)
        if mode != "mean":
            d /= t
        k = 1.0 / abs(t) if mode == "s" else 0.0
        if c == 0.0:  # r = d: |d| + k <= RHO |d| reads |d| >= k / (RHO - 1)
            r = d
            ok = np.abs(d) >= k / (RHO - 1.0)  # False where r is NaN (no support)
        else:
            r = d + c
            err = np.abs(d, out=d)
            err += k
            bound = np.abs(r)
            bound *= RHO
            ok = err <= bound
        ok &= np.isfinite(r) if fine is None else fine
    bad = np.flatnonzero(~ok)
    return r, bad[mass[bad] > 0]


def _own_shift(l: np.ndarray, t: float, p: Any, codes: np.ndarray, counts: np.ndarray,
               groups: np.ndarray, want: bool = False, members: tuple | None = None):
    """The risks of ``groups`` (ascending, of the partition given by ``codes`` and the
    ``counts`` of every code) from their own samples, by the group state (float64).
    ``members`` (``(order, starts)``: the samples sorted by code and where each code
    starts among them) finds the groups' samples without a scan over the codes.

    With ``want``, ``(risks, items, positions, shares)``: also the members' indices, the
    position of each member's group in ``groups`` and its tilted share within the group
    (in ``l``'s dtype).
    """
    sizes = counts[groups].astype(np.int64)
    if members is None:
        flags = np.zeros(counts.shape[0], dtype=bool)
        flags[groups] = True
        items = _kernels.members_of(codes, flags, int(sizes.sum()))
        # the members' positions among the (ascending) groups: no array of every group's
        # size
        pos = np.searchsorted(groups, codes[items])
    else:  # the samples sorted by group: each group's members are one slice
        order, starts = members
        ends = np.cumsum(sizes)
        pos = np.repeat(np.arange(groups.shape[0]), sizes)
        items = order[np.repeat(starts[groups] - (ends - sizes), sizes)
                      + np.arange(int(ends[-1]) if ends.size else 0)]
    sub = Segments._trusted(pos, sizes)
    pr = None if p is None else p[items]
    unit = 1.0 / max(int(items.size), 1) if t == 0.0 and p is None else None
    kept: list = []

    def keep(pe):
        kept.append(pe)
        return ()

    st = TiltState.from_block(l[items], t, pr, segments=sub, xp=np, unit=unit,
                              sums=keep if want else None)
    risks = st.risk(np, l.dtype).astype(np.float64)
    if not want:
        return risks
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = kept[0] / np.asarray(st.s, dtype=l.dtype)[pos]
    return risks, items, pos, shares.astype(l.dtype, copy=False)

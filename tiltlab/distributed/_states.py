"""Per-chunk tilted states (samples, or the innermost groups of a hierarchy) on Dask.

The sample-level objective reduces one :class:`~tiltlab.accumulator.TiltState` per chunk.
A hierarchical objective needs one state per *innermost group*: samples of a group may lie
in any chunk, so each chunk builds the group form of the same state
(:meth:`~tiltlab.accumulator.TiltState.from_block` with ``segments``: per-group extremes,
masses, normalisers and scalar sums; ``-inf``/``+inf`` extremes for a group with no
sample in the chunk). The states merge exactly, group by group, so the chunks of a Dask
array combine in any tree. Every function here runs on concrete chunks (NumPy or CuPy)
inside a worker task and returns NumPy arrays: only ``O(G + d)`` numbers travel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import device, library_namespace, to_numpy
from ..accumulator import GroupState, NonFiniteLosses, TiltState
from ..objective.blocks import block_rows, hvp_coefficients
from ..segments import Segments

__all__ = [
    "GroupState",
    "group_state",
    "merge_groups",
    "group_risks",
    "chunk_sample_state",
    "merge_states",
    "MeanState",
    "EMPTY",
    "FAN_IN",
    "reduce_to",
    "tree_reduce",
]

#: states merged per reduction task
FAN_IN = 8



def group_state(
    l: Any, p: Any, seg: Segments, t: float, xp: Any, *, sums: Any = None,
    unit: float | None = None,
) -> GroupState:
    """States of the groups of ``seg`` from one chunk's losses ``l`` (prior ``p`` or None).

    ``sums(pe)`` maps the unnormalised weights ``p_i exp(u_i)`` to a tuple of per-group
    sums (arrays with the group axis first). Raises :class:`NonFiniteLosses` for NaN or
    infinite losses on the support. The result holds NumPy arrays.
    """
    return GroupState.from_block(l, t, p, sums=sums, segments=seg, xp=xp, unit=unit).to_host()


def merge_groups(a: GroupState, b: GroupState) -> GroupState:
    """Merge two group states of the same tilt, group by group (exact up to rounding)."""
    return a.merge(b)


def group_risks(st: GroupState, dtype: Any) -> np.ndarray:
    """Tilted risk of every group (the finaliser of a group state)."""
    return np.asarray(st.risk(np, np.dtype(dtype)))


# ---------------------------------------------------------------------------
# per-chunk kernels (run inside worker tasks on concrete chunks)


def _ns(a: Any) -> Any:
    return library_namespace(a)


def _derivs(loss: Any, Xb: Any, yb: Any, th: Any, V: Any, mode: str, xp: Any) -> dict:
    """Predictor, losses and the derivative pieces a mode needs, for one block of rows."""
    multi = th.ndim == 2
    out: dict = {"multi": multi}
    if mode in ("value", "risk"):
        out["ell"] = loss.value(Xb @ th, yb, validate=False, xp=xp)
        return out
    if mode == "grad":
        out["ell"], out["d1"] = loss.value_and_d1(Xb @ th, yb, validate=False, xp=xp)
        return out
    if mode == "hess":
        z = Xb @ th
        out["ell"], out["d1"], out["d2"] = loss.derivatives(z, yb, validate=False, xp=xp)
        return out
    # hvp: one product with [theta, V]
    k = th.shape[1] if multi else 1
    TV = xp.concat([th, V], axis=1) if multi else xp.stack([th, V], axis=1)
    zu = Xb @ TV
    z, u = (zu[:, :k], zu[:, k:]) if multi else (zu[:, 0], zu[:, 1])
    ell, d1, d2 = loss.derivatives(z, yb, validate=False, xp=xp)
    out.update(ell=ell, d1=d1, d2=d2, u=u)
    if multi:
        out["hz"] = loss.hvp_z(z, yb, u, validate=False, xp=xp)
        out["a"] = xp.sum(d1 * u, axis=1)
    else:
        out["a"] = d1 * u
    return out


def _params(theta: Any, V: Any, Xb: Any, xp: Any) -> tuple[Any, Any]:
    dev = device(Xb)
    th = xp.asarray(np.asarray(theta), dtype=Xb.dtype, device=dev)
    v = None if V is None else xp.asarray(np.asarray(V), dtype=Xb.dtype, device=dev)
    return th, v


def _check_weights(pb: Any, xp: Any) -> None:
    if not bool(xp.all(xp.isfinite(pb))):
        what = "NaN" if bool(xp.any(xp.isnan(pb))) else "infinite"
        raise ValueError(f"`weights` contains {what} values; pass finite values")
    if not bool(xp.all(pb >= 0)):
        raise ValueError("`weights` must be non-negative")


#: bytes of ``X`` per sub-block inside a chunk on CPU (cache-sized, as the eager engine)
SUB_BLOCK_BYTES = 1 << 21


def aligned(a: Any) -> Any:
    """``a``, copied if it is a NumPy array at a misaligned address.

    Chunks unpickled from a message buffer (Dask's transfers) can start at an address
    that is not a multiple of the item size; NumPy and BLAS then take slow paths (four
    times slower here on float64 chunks).
    """
    if isinstance(a, np.ndarray) and not a.flags.aligned:
        return np.require(a, requirements="A")
    return a


def _sub_blocks(Xb: Any, *rest: Any):
    """Row slices of a chunk small enough to stay in cache between ``X @ theta`` and
    ``X^T c`` (the whole chunk on GPU backends, whose kernels block internally)."""
    from .._compat import is_cupy_namespace

    Xb = aligned(Xb)
    rest = tuple(aligned(a) for a in rest)

    n, d = int(Xb.shape[0]), int(Xb.shape[1])
    xp = _ns(Xb)
    if is_cupy_namespace(xp):
        B = n
    else:
        B = block_rows(n, d, Xb.dtype, xp, device(Xb), target_bytes=SUB_BLOCK_BYTES)
    for r0 in range(0, n, B):
        r1 = min(n, r0 + B)
        if (r0, r1) == (0, n):
            yield (Xb,) + rest
        else:
            yield (Xb[r0:r1, ...],) + tuple(None if a is None else a[r0:r1, ...] for a in rest)


def chunk_sample_state(Xb: Any, yb: Any, pb: Any, theta: Any, V: Any, loss: Any, t: float,
                       mode: str, fused: bool = False) -> Any:
    """One chunk's :class:`TiltState` for a sample-level objective (None: non-finite).

    With ``fused``, a compiled engine forms it when one serves the chunk (the fused CPU
    kernels for NumPy chunks, the engine registered for the chunk's library otherwise:
    :func:`~tiltlab.distributed._chunk_engine.chunk_state`); else, and for whatever they
    decline, the generic route: array-API expressions merged over cache-sized sub-blocks
    (see :func:`_block_sample_state` for ``mode``)."""
    if fused:
        from ._chunk_engine import DECLINE, chunk_state

        st = chunk_state(aligned(Xb), aligned(yb), aligned(pb), theta, V, loss, t, mode)
        if st is not DECLINE:
            return st
    return merge_states(*[
        _block_sample_state(X1, y1, p1, theta, V, loss, t, mode)
        for X1, y1, p1 in _sub_blocks(Xb, yb, pb)
    ])


def _block_sample_state(Xb: Any, yb: Any, pb: Any, theta: Any, V: Any, loss: Any, t: float,
                        mode: str) -> Any:
    """One chunk's :class:`TiltState` for a sample-level objective (None: non-finite).

    ``mode``: ``"value"`` (no sums), ``"grad"`` (``X^T (pe l')``), ``"hvp"`` (the
    pieces of a Hessian-vector product along ``V``) or ``"hess"`` (``X^T diag X`` and the
    gradient, scalar predictors).
    """
    xp = _ns(Xb)
    th, v = _params(theta, V, Xb, xp)
    D = _derivs(loss, Xb, yb, th, v, mode, xp)
    multi = D["multi"]
    sums = None
    if mode == "grad":
        d1 = D["d1"]

        def sums(pe):
            return (Xb.T @ (pe[:, None] * d1 if multi else pe * d1),)
    elif mode == "hvp":
        d1, d2, u, a = D["d1"], D["d2"], D["u"], D["a"]

        def sums(pe):
            c, gcoef = hvp_coefficients(pe, d1, d2, u, a, D["hz"] if multi else None, t)
            return (Xb.T @ c, Xb.T @ gcoef, xp.sum(pe * a))
    elif mode == "hess":
        d1, d2 = D["d1"], D["d2"]

        def sums(pe):
            diag = pe * (d2 + t * d1 * d1) if t != 0.0 else pe * d2
            return (Xb.T @ (diag[:, None] * Xb), Xb.T @ (pe * d1))
    return _sample_state(D["ell"], pb, t, xp, sums)


#: a chunk whose prior weights are all zero (merges as the neutral element)
EMPTY = "empty"


def _sample_state(
    ell: Any, pb: Any, t: float, xp: Any, sums: Any, *, raise_nonfinite: bool = False,
    unit: float | None = None,
) -> Any:
    if raise_nonfinite and pb is not None and not bool(xp.all(xp.isfinite(ell))):
        _raise_nonfinite(ell, xp)  # zero-weight samples too, as on the eager backends
    if pb is not None:
        _check_weights(pb, xp)
        if not bool(xp.any(pb > 0)):
            return EMPTY
    try:
        st = TiltState.from_block(ell, t, pb, sums=sums, xp=xp, unit=unit)
    except NonFiniteLosses:
        if raise_nonfinite:
            _raise_nonfinite(ell, xp)
        return None
    return st.to_host()


def _raise_nonfinite(ell: Any, xp: Any) -> None:
    what = "NaN" if bool(xp.any(xp.isnan(ell))) else "infinite"
    raise ValueError(
        f"`losses` contains {what} values; pass finite values (or check_finite=False to "
        "skip this check)"
    )


def _accumulated(lb: Any, pb: Any, xp: Any) -> tuple[Any, Any]:
    """Losses (and prior) in the dtype their state accumulates in: float64 for integer
    losses, float32 for 16-bit ones, their own otherwise."""
    if not xp.isdtype(lb.dtype, "real floating"):
        lb = xp.astype(lb, xp.float64)
    elif xp.finfo(lb.dtype).bits == 16:
        lb = xp.astype(lb, xp.float32)
    return lb, (None if pb is None else xp.astype(pb, lb.dtype))


def chunk_loss_state(lb: Any, pb: Any, t: float, unit: float | None = None,
                     check: bool = True) -> Any:
    """One chunk's :class:`TiltState` of given losses (for :func:`tiltlab.tilted_risk`;
    a :class:`MeanState` at ``t = 0``); :data:`EMPTY` for an empty chunk. ``unit``: the
    weight of a sample at ``t = 0``."""
    xp = _ns(lb)
    if int(lb.shape[0]) == 0:
        return EMPTY
    lb, pb = _accumulated(lb, pb, xp)
    if t == 0.0:
        return _mean_state_or_none(lb, pb, None, xp, raise_nonfinite=check, unit=unit)
    return _sample_state(lb, pb, t, xp, None, raise_nonfinite=check, unit=unit)


def _group_state_or_none(ell, pb, seg, tau, xp, sums, *, raise_nonfinite: bool = False,
                         unit: float | None = None):
    if raise_nonfinite and pb is not None and not bool(xp.all(xp.isfinite(ell))):
        _raise_nonfinite(ell, xp)  # zero-weight samples too, as on the eager backends
    if pb is not None:
        _check_weights(pb, xp)
    try:
        return group_state(ell, pb, seg, tau, xp, sums=sums, unit=unit)
    except NonFiniteLosses:
        if raise_nonfinite:
            _raise_nonfinite(ell, xp)
        return None


def chunk_loss_group_state(lb: Any, pb: Any, cb: Any, tau: float, n_groups: int,
                           unit: float | None = None):
    """One chunk's :class:`GroupState` of given losses (for hierarchical_risk); :data:`EMPTY`
    for an empty chunk. ``unit``: the weight of a sample at ``tau = 0``."""
    xp = _ns(lb)
    if int(lb.shape[0]) == 0:
        return EMPTY
    lb, pb = _accumulated(lb, pb, xp)
    seg = Segments.from_codes(to_numpy(cb), n_groups)
    return _group_state_or_none(lb, pb, seg, tau, xp, None, raise_nonfinite=True, unit=unit)


def merge_states(*states: Any) -> Any:
    """Merge chunk states (TiltState or GroupState); None (non-finite) absorbs and
    :data:`EMPTY` (a chunk without prior mass) is neutral."""
    if any(s is None for s in states):
        return None
    states = tuple(s for s in states if not isinstance(s, str))
    if not states:
        return EMPTY
    out = states[0]
    for s in states[1:]:
        out = out.merge(s)
    return out


def tree_reduce(parts: list, combine: Any, fan_in: int = FAN_IN) -> Any:
    """Combine Delayed values with ``combine(*group)`` in a tree of the given fan-in."""
    from dask import delayed

    if not parts:
        raise ValueError("nothing to reduce")
    fn = delayed(combine, pure=False)
    while len(parts) > 1:
        parts = [fn(*parts[i : i + fan_in]) for i in range(0, len(parts), fan_in)]
    return parts[0]


def reduce_to(parts: list, combine: Any, fan_in: int = FAN_IN) -> list:
    """Combine Delayed values in a tree until at most ``fan_in`` are left (the last
    combination is left to the task that consumes them)."""
    from dask import delayed

    fn = delayed(combine, pure=False)
    while len(parts) > fan_in:
        parts = [fn(*parts[i : i + fan_in]) for i in range(0, len(parts), fan_in)]
    return parts


# ---------------------------------------------------------------------------------------
# the state at t = 0 (the risk functions)


@dataclass(frozen=True)
class MeanState:
    """The state at ``t = 0`` of a chunk's samples (or of each of its groups): the extremes,
    the prior mass and the prior-weighted mean.

    The mean lies within the range of the losses even where they span more than the float
    maximum, and sums of differences to one loss then overflow. Inside a chunk it is the
    accumulator's state at ``t = 0``; where its sum overflows, that of the halved losses
    under a prior of total mass one, doubled. Two states merge as a convex combination of
    their means, halved where the difference of the means overflows, so that no term
    leaves the range of the losses. Fields are host values in float64 (one entry per group
    for a group form); a group without prior mass has mean 0 and risk NaN.

    Examples
    --------
    >>> import numpy as np
    >>> big = np.finfo(np.float64).max
    >>> a = MeanState.from_block(np.array([0.9 * big]), None, None, np, None)
    >>> b = MeanState.from_block(np.array([-0.9 * big, 0.6 * big]), None, None, np, None)
    >>> bool(np.isclose(a.merge(b).risk(np, np.float64), 0.2 * big))
    True
    """

    hi: Any
    lo: Any
    mass: Any
    mean: Any

    @classmethod
    def from_block(
        cls, l: Any, p: Any, seg: Segments | None, xp: Any, unit: float | None
    ) -> MeanState:
        """The state of one chunk's finite losses ``l`` (prior ``p`` or None; per group of
        ``seg`` when given). ``unit``: the mass of a sample without prior (default 1).
        Raises :class:`~tiltlab.accumulator.NonFiniteLosses` for non-finite losses on the
        support."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            st = TiltState.from_block(l, 0.0, p, segments=seg, xp=xp, unit=unit)
            mass, mean = _host64(st.mass), _host64(st.risk(xp, l.dtype))
            on = mass > 0.0
            if not np.all(np.isfinite(mean[on])):  # a sum beyond the float maximum
                w, per = _unit_total(l, p, xp)
                half = TiltState.from_block(l * 0.5, 0.0, w, segments=seg, xp=xp, unit=per)
                mean = 2.0 * _host64(half.risk(xp, l.dtype))
        return cls(hi=st.hi, lo=st.lo, mass=mass, mean=np.where(on, mean, 0.0))

    def merge(self, other: MeanState) -> MeanState:
        """The state of the samples of both (group by group for a group form)."""
        a, b = self, other
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            mass = a.mass + b.mass
            share = np.where(mass > 0.0, b.mass / mass, 0.0)
            gap = b.mean - a.mean
            near = a.mean + gap * share
            far = (a.mean * 0.5 + (b.mean * 0.5 - a.mean * 0.5) * share) * 2.0
            mean = np.where(np.isfinite(gap), near, far)
        hi, lo = np.maximum(a.hi, b.hi), np.minimum(a.lo, b.lo)
        return MeanState(hi=hi, lo=lo, mass=mass, mean=mean)

    def risk(self, xp: Any = None, dtype: Any = None) -> np.ndarray:
        """The prior-weighted mean (NaN for a group without prior mass) in ``dtype``
        (default float64), a NumPy array."""
        dt = np.dtype(np.float64 if dtype is None else dtype)
        with np.errstate(over="ignore"):
            return np.asarray(np.where(self.mass > 0.0, self.mean, np.nan), dtype=dt)

    def placed(self, index: np.ndarray, G: int) -> MeanState:
        """The state of these groups placed at ``index`` among ``G`` groups (the others
        without samples)."""

        def put(a, fill):
            out = np.full(G, fill, dtype=np.float64)
            out[index] = a
            return out

        return MeanState(
            hi=put(self.hi, -np.inf),
            lo=put(self.lo, np.inf),
            mass=put(self.mass, 0.0),
            mean=put(self.mean, 0.0),
        )


def _host64(a: Any) -> np.ndarray:
    return np.asarray(to_numpy(a), dtype=np.float64)


def _unit_total(l: Any, p: Any, xp: Any) -> tuple[Any, float | None]:
    """``(prior, unit)`` of a total mass of one for the chunk (its prior rescaled, or unit
    weights of ``1 / n``): every weighted difference is then at most the spread."""
    if p is None:
        return None, 1.0 / float(l.shape[-1])
    w = p / xp.max(p)  # the chunk has prior mass: its largest weight is positive
    return w / xp.sum(w), None


def _mean_state_or_none(
    ell: Any, pb: Any, seg: Segments | None, xp: Any, *, raise_nonfinite: bool, unit: float | None
) -> Any:
    """:class:`MeanState` of one chunk, validated as the other chunk states are
    (:data:`EMPTY` for a chunk of samples without prior mass, None for non-finite losses
    unless ``raise_nonfinite``)."""
    if raise_nonfinite and pb is not None and not bool(xp.all(xp.isfinite(ell))):
        _raise_nonfinite(ell, xp)  # zero-weight samples too, as on the eager backends
    if pb is not None:
        _check_weights(pb, xp)
        if seg is None and not bool(xp.any(pb > 0)):
            return EMPTY
    try:
        return MeanState.from_block(ell, pb, seg, xp, unit)
    except NonFiniteLosses:
        if raise_nonfinite:
            _raise_nonfinite(ell, xp)
        return None


# ---------------------------------------------------------------------------------------
# group states keyed by label (hierarchical_risk with integer group codes of any range)


def _chunk_labels(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, inverse)``: the distinct labels of one chunk (ascending) and each sample's
    index among them (no sort for dense non-negative codes)."""
    if codes.size and int(codes.min()) >= 0 and int(codes.max()) < 2 * codes.size + 1024:
        counts = np.bincount(codes)
        labels = np.flatnonzero(counts)
        remap = np.zeros(counts.shape[0], dtype=np.int64)
        remap[labels] = np.arange(labels.shape[0])
        return labels, remap[codes]
    labels, inverse = np.unique(codes, return_inverse=True)
    return labels, inverse.reshape(-1).astype(np.int64)


def chunk_label_state(lb: Any, pb: Any, cb: Any, tau: float, unit: float | None,
                      check: bool) -> Any:
    """One chunk's group states keyed by the group labels it holds (hierarchical_risk).

    ``cb`` holds integer labels of the chunk's samples (any range). Returns
    ``(labels, state, counts)`` with the labels ascending, a
    :class:`~tiltlab.accumulator.GroupState` over them (a :class:`MeanState` at
    ``tau = 0``) and their sample counts;
    :data:`EMPTY` for an empty chunk; None for non-finite losses when ``check`` is
    False (a ``ValueError`` otherwise).
    """
    xp = _ns(lb)
    c = np.asarray(to_numpy(cb))
    if c.ndim != 1 or int(c.shape[0]) != int(lb.shape[0]):
        raise ValueError(
            f"`groups` has a chunk of {c.shape[0]} labels where `losses` has "
            f"{lb.shape[0]} samples; give both the same chunks"
        )
    if c.dtype.kind not in "iu":
        raise TypeError(f"`groups` must hold integer labels here, got dtype {c.dtype}")
    if int(lb.shape[0]) == 0:
        return EMPTY
    lb, pb = _accumulated(lb, pb, xp)
    labels, inverse = _chunk_labels(c.astype(np.int64, copy=False))
    seg = Segments.from_codes(inverse, int(labels.shape[0]))
    if not check and not bool(xp.all(xp.isfinite(lb))):
        return None
    if tau == 0.0:
        st = _mean_state_or_none(lb, pb, seg, xp, raise_nonfinite=check, unit=unit)
    else:
        st = _group_state_or_none(lb, pb, seg, tau, xp, None, raise_nonfinite=check, unit=unit)
    if st is None:
        return None
    return labels, st, seg.counts


def _spread(st: GroupState, index: np.ndarray, G: int) -> GroupState:
    """The state of ``st``'s groups placed at ``index`` among ``G`` groups (the others
    empty: extremes -inf/+inf, zero sums)."""
    from dataclasses import replace

    if isinstance(st, MeanState):
        return st.placed(index, G)

    def put(a, fill):
        if a is None:
            return None
        a = np.asarray(a)
        out = np.full((G,) + a.shape[1:], fill, dtype=a.dtype)
        out[index] = a
        return out

    return replace(st, hi=put(st.hi, -np.inf), lo=put(st.lo, np.inf), mass=put(st.mass, 0),
                   s=put(st.s, 0), q=put(st.q, 0), lsum=put(st.lsum, 0),
                   sums=tuple(put(v, 0) for v in st.sums))


def merge_label_states(*parts: Any) -> Any:
    """Merge the results of :func:`chunk_label_state` over the union of their labels
    (None absorbs, :data:`EMPTY` is neutral)."""
    if any(p is None for p in parts):
        return None
    parts = tuple(p for p in parts if not isinstance(p, str))
    if not parts:
        return EMPTY
    if len(parts) == 1:
        return parts[0]
    labels = parts[0][0]
    for p in parts[1:]:
        labels = np.union1d(labels, p[0])
    G = int(labels.shape[0])
    counts = np.zeros(G, dtype=np.int64)
    states = []
    for lab, st, cnt in parts:
        index = np.searchsorted(labels, lab)
        counts[index] += cnt
        states.append(_spread(st, index, G))
    return labels, merge_states(*states), counts


# ---------------------------------------------------------------------------------------
# several tilts at once, and N-d losses (tilted_risk)


def chunk_loss_states(lb: Any, pb: Any, ts: list, unit: float | None = None,
                      check: bool = True) -> list:
    """:func:`chunk_loss_state` at each tilt of ``ts`` (one list entry per tilt)."""
    return [chunk_loss_state(lb, pb, t, unit, check) for t in ts]


def chunk_row_states(lb: Any, pb: Any, ts: list, unit: float | None) -> list:
    """Per-row states of one 2-d chunk of losses (rows: the batch, columns: samples), one
    :class:`~tiltlab.accumulator.GroupState` (at ``t = 0`` a :class:`MeanState`) per tilt
    with the rows as groups; ``pb`` is
    the chunk's slice of 1-d prior weights (or None). Non-finite losses raise."""
    xp = _ns(lb)
    mb, nb = int(lb.shape[0]), int(lb.shape[1])
    if mb * nb == 0:
        return [EMPTY] * len(ts)
    if not xp.isdtype(lb.dtype, "real floating"):
        lb = xp.astype(lb, xp.float64)
    elif xp.finfo(lb.dtype).bits == 16:  # accumulate 16-bit losses in float32
        lb = xp.astype(lb, xp.float32)
    flat = xp.reshape(lb, (mb * nb,))
    p = None
    if pb is not None:
        p = xp.reshape(xp.broadcast_to(xp.astype(pb, lb.dtype)[None, :], (mb, nb)), (mb * nb,))
    seg = Segments.from_codes(np.repeat(np.arange(mb, dtype=np.int64), nb), mb)
    return [
        _mean_state_or_none(flat, p, seg, xp, raise_nonfinite=True, unit=unit)
        if t == 0.0
        else _group_state_or_none(flat, p, seg, t, xp, None, raise_nonfinite=True, unit=unit)
        for t in ts
    ]


def merge_state_lists(*parts: list) -> list:
    """Merge per-tilt lists of chunk states, tilt by tilt."""
    return [merge_states(*states) for states in zip(*parts, strict=True)]

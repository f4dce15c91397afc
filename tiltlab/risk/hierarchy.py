"""Hierarchical tilting: tilted risks over nested groups of samples.

:class:`GroupTree` and :func:`build_tree` (the group structure, built once on the host
from label arrays), :func:`hierarchy_eval` (risk and weights without validation, reused by
:class:`~tiltlab.TiltedObjective`) and the public :func:`hierarchical_risk` and
:func:`hierarchical_weights`. One grouping level of NumPy 1-d losses under the uniform
prior takes the labelled route of :mod:`tiltlab.risk._labelled` (group codes straight to
group risks and weights); everything else the tree of group states here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import segments as _segments
from .._compat import (
    check_finite,
    device,
    host_labels,
    is_array_api_obj,
    is_numpy_namespace,
    namespace_of,
    seq_of_arrays,
    tiny_sqrt,
)
from ..accumulator import (
    NonFiniteLosses,
    TiltState,
    finish_risk,
    group_risk,
    series_threshold,
    spread_overflows,
)
from ..accumulator.packed import exponent_terms
from ..segments import Segments, int_range, nest_parents, segment_counts
from ._dispatch import HIERARCHICAL_RISK, HIERARCHICAL_WEIGHTS
from ._labelled import (  # _weights_from_state: re-exported by the package
    _weights_from_state,  # noqa: F401
    labelled_eval,
    labelled_two_levels_risk,
    labelled_two_levels_weights,
    risk_weights_scalar,
    tilts_in_precision,
)
from .fast_path import _quiet
from .inputs import narrow, prepare_losses, prepare_prior, prepare_tilts, widen_half
from .kernels import risk_kernel, weights_kernel

__all__ = [
    "GroupTree",
    "build_tree",
    "segment_sum",
    "broadcast_groups",
    "risk_weights_scalar",
    "risk_and_weights",
    "hierarchy_eval",
    "check_group_mass",
    "hierarchical_risk",
    "hierarchical_weights",
]


# ---------------------------------------------------------------------------
# hierarchical tilting


def _codes_of(labels: np.ndarray) -> np.ndarray:
    """Integer codes in [0, G) for a label array (no sort for integer labels)."""
    return _codes_and_counts(labels)[0]


def _codes_and_counts(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes in [0, G) for a label array (in the order of the sorted labels) and
    the number of samples with each code.

    Non-negative integer labels below ``2 N + 1024`` are counted in one pass and
    renumbered without a sort (a cumulative sum over the labels' range drops the unused
    ones); other labels go through ``np.unique``.
    """
    if labels.dtype.kind in "iu" and labels.size:
        lo, top = int_range(labels)
        if lo >= 0 and top < 2 * labels.size + 1024:
            codes = np.ascontiguousarray(labels, dtype=np.int64)
            counts = segment_counts(codes, top + 1)
            if counts.all():
                return codes, counts
            present = counts > 0
            rank = np.cumsum(present) - 1
            return rank[codes], counts[present]
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return inverse.reshape(-1).astype(np.int64), counts


def _build_levels(groups: Any, n: int) -> list[Segments]:
    """Levels innermost first (children -> groups) from label arrays given outermost first."""
    return _levels_and_layouts(groups, n)[0]


def _levels_and_layouts(groups: Any, n: int) -> tuple[list[Segments], list[Segments]]:
    """The levels (innermost first, children -> groups) and the sample layouts (innermost
    first, samples -> the groups of each level) of label arrays given outermost first."""
    if groups is None:
        raise TypeError("`groups` is required")
    label_arrays = list(groups) if seq_of_arrays(groups) else [groups]
    labels = []
    for k, g in enumerate(label_arrays):
        a = host_labels(g, name="groups" if len(label_arrays) == 1 else f"groups[{k}]")
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(
                f"`groups` level {k} must be a 1-d label array of length {n} (one label per "
                f"sample), got shape {a.shape}"
            )
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise ValueError(f"`groups` level {k} contains NaN or infinite labels")
        if a.dtype.kind == "O" and any(v is None for v in a):
            raise TypeError(f"`groups` level {k} contains None labels")
        labels.append(a)
    coded = [_codes_and_counts(a) for a in labels]
    codes = [c for c, _ in coded]
    parents = []
    for k in range(1, len(codes)):
        outer, inner = codes[k - 1], codes[k]
        parent, item = nest_parents(inner, outer, len(coded[k][1]))
        if item >= 0:
            label = np.unique(labels[k])[int(inner[item])]
            label = label.item() if isinstance(label, np.generic) else label
            raise ValueError(
                f"`groups` levels are not nested: a group of level {k} (label "
                f"{label!r}) spans several groups of level {k - 1}"
            )
        parents.append(parent)
    # levels from the inside out: samples -> innermost groups -> ... -> outermost groups
    levels = [Segments._trusted(codes[-1], coded[-1][1])]
    for k in range(len(codes) - 2, -1, -1):
        levels.append(Segments.from_codes(parents[k], len(coded[k][1])))
    # each level's own codes are the samples' codes of its groups (counted above)
    layouts = [levels[0]] + [Segments._trusted(c, m) for c, m in reversed(coded[:-1])]
    return levels, layouts


@dataclass(frozen=True)
class GroupTree:
    """Group structure of a hierarchy, built once on the host from label arrays.

    ``levels`` (innermost first) map the nodes of one level to the groups of the next and
    drive the bottom-up evaluation; ``sample_layouts`` (innermost first) map samples
    directly to the nodes of each grouping level, for segment sums over samples
    (Hessians of hierarchical objectives). Both are :class:`~tiltlab.segments.Segments`:
    reductions cost O(N) whatever the group sizes.
    """

    n_samples: int
    levels: tuple
    sample_layouts: tuple

    @property
    def depth(self) -> int:
        """Number of grouping levels (tilts needed: depth + 1)."""
        return len(self.levels)


def build_tree(groups: Any, n: int) -> GroupTree:
    """Validate label arrays (outermost first) and build a :class:`GroupTree`."""
    levels, layouts = _levels_and_layouts(groups, n)
    return GroupTree(n_samples=n, levels=tuple(levels), sample_layouts=tuple(layouts))


def segment_sum(values: Any, layout: Segments, xp: Any) -> Any:
    """Sum ``values`` (..., N) over the groups of a sample layout -> (..., G)."""
    return _segments.segment_sum(values, layout, xp)


def broadcast_groups(values: Any, layout: Segments, xp: Any) -> Any:
    """Per-group ``values`` (..., G) repeated to one entry per sample (..., N)."""
    return _segments.expand(values, layout, xp)


def group_level(v: Any, m: Any, M: Any, seg: Segments, tau: float, xp: Any, want: bool):
    """Tilted risk of each group of ``seg`` at tilt ``tau``, and the conditional weights.

    ``v`` (..., n) are the children's values, ``m`` their non-negative masses (an array,
    or one Python float shared by all children: the uniform prior, which skips the masking
    of zero-mass children) and ``M`` (..., G) the groups' masses. Returns ``(R_g, w_cond)``
    with ``w_cond`` the weight of each child within its group (None unless ``want``).
    Finite tilts are the group form of the tilted reduction
    (:meth:`~tiltlab.accumulator.TiltState.from_block` with ``segments``), ``tau = 0``
    the prior-weighted means (:func:`_mean_level`).
    """
    uniform = isinstance(m, float)
    prior = None if uniform else m
    if math.isinf(tau):
        return _extreme_level(v, m, seg, tau, xp, want, uniform)
    if tau == 0.0:
        return _mean_level(v, m, M, seg, xp, want, uniform)
    if not want:
        return group_risk(v, tau, prior, seg, xp, unit=m if uniform else None), None
    keep: list = []

    def sums(pe):  # keep the unnormalised weights of the children (no extra pass)
        keep.append(pe)
        return ()

    st = TiltState.from_block(v, tau, prior, sums=sums, segments=seg, xp=xp,
                              unit=m if uniform else None)
    R = st.risk(xp, v.dtype)
    return R, keep[0] / _segments.expand(st.s, seg, xp)


def _mean_level(v: Any, m: Any, M: Any, seg: Segments, xp: Any, want: bool, uniform: bool):
    """One level at ``tau = 0``: the prior-weighted mean of each group, and the prior as
    the conditional weights.

    Where the spread of the children overflows their dtype, a group's mean may lie more
    than the float maximum above its smallest child, beyond what the state's sum relative
    to that shift holds: the means are then those of the halved children, doubled (exact:
    scaling by 2 commutes with rounding, and a mean lies between the extremes)."""
    prior, unit = (None, m) if uniform else (m, None)
    if want:
        st = TiltState.from_block(v, 0.0, prior, segments=seg, xp=xp, unit=unit)
        huge = spread_overflows(st.hi, st.lo, v.dtype, xp)
        R = st.risk(xp, v.dtype)
    else:  # finite children have finite means unless the spread overflows
        R = group_risk(v, 0.0, prior, seg, xp, unit=unit)
        huge = not bool(xp.all(xp.isfinite(R)))
    if huge:
        st = TiltState.from_block(v * 0.5, 0.0, prior, segments=seg, xp=xp, unit=unit)
        R = st.risk(xp, v.dtype) * 2.0
    return R, (m / _segments.expand(M, seg, xp) if want else None)


def _extreme_level(v: Any, m: Any, seg: Segments, tau: float, xp: Any, want: bool,
                   uniform: bool):
    """One level at ``tau = +-inf``: the extreme child of each group, and the prior
    restricted to the tied extremes."""
    on = None if uniform else m > 0
    dev = device(v)
    if on is None:
        R = (_segments.segment_max if tau > 0 else _segments.segment_min)(v, seg, xp)
    else:
        fill = xp.asarray(-xp.inf if tau > 0 else xp.inf, dtype=v.dtype, device=dev)
        pick = _segments.segment_max if tau > 0 else _segments.segment_min
        R = pick(xp.where(on, v, fill), seg, xp)
    if not want:
        return R, None
    ext = v == _segments.expand(R, seg, xp)
    if on is not None:
        ext = ext & on
    ones = xp.ones_like(v)
    mm = xp.where(ext, ones * m if uniform else m * ones, xp.zeros_like(v))
    return R, mm / _segments.expand(_segments.segment_sum(mm, seg, xp), seg, xp)


def risk_and_weights(l: Any, p: Any, t: Any, xp: Any) -> tuple[Any, Any]:
    """Sample-level risk and weights along the last axis, without validation.

    ``p`` is a normalised prior or None; ``t`` a 0-d array of ``l``'s dtype. For
    internal callers (objectives, solvers) that validated their inputs once.
    """
    return risk_kernel(l, p, t, xp), weights_kernel(l, p, t, xp)


def level_masses(p: Any, tree: GroupTree, like: Any, xp: Any) -> list[Any]:
    """Masses of the children of every level (innermost first) and of the top groups.

    For the uniform prior (``p`` None) the first entry is None: every sample has the
    mass ``1 / N``, which :func:`hierarchy_eval` passes as one number.
    """
    if p is None:
        n = tree.n_samples
        key = ("uniform-masses", xp.__name__, str(device(like)), str(like.dtype))
        cache = tree.levels[0]._cache
        if key not in cache:
            host = [tree.levels[0].counts / n]
            for lev in tree.levels[1:]:
                host.append(np.bincount(lev.codes, weights=host[-1], minlength=lev.n_groups))
            cache[key] = [None] + [xp.asarray(h, dtype=like.dtype, device=device(like))
                                   for h in host]
        return cache[key]
    masses = [p]
    for lev in tree.levels:
        masses.append(_segments.segment_sum(masses[-1], lev, xp))
    return masses


def hierarchy_eval(l: Any, p: Any, tree: GroupTree, ts: Sequence[float], xp: Any, *,
                   weights: bool = True, route: str = "auto"):
    """Hierarchical risk and per-sample weights, without validation.

    ``ts`` holds ``tree.depth + 1`` floats, outermost first; ``p`` a normalised prior
    or None. Returns ``(risk, weights)`` (weights None unless ``weights``).

    ``route="auto"`` takes the labelled route for one grouping level of NumPy 1-d
    losses under the uniform prior at finite tilts (``labelled_eval``: one shared shift,
    one pass for the group normalisers, one gather for the weights) and the tree of
    group states otherwise; ``route="tree"`` always takes the tree (what the fast
    route is tested against).
    """
    if route not in ("auto", "tree"):
        raise ValueError(f"`route` must be 'auto' or 'tree', got {route!r}")
    if route == "auto" and p is None and tree.depth == 1 and l.ndim == 1 and is_numpy_namespace(xp):
        out = labelled_eval(l, tree, ts, xp, weights)
        if out is not None:
            return out
    masses = level_masses(p, tree, l, xp)
    values = l
    conditional = []
    for depth, lev in enumerate(tree.levels):
        tau = float(ts[len(tree.levels) - depth])
        m = masses[depth]
        if depth == 0 and p is None:
            m = 1.0 / tree.n_samples  # uniform prior: one shared mass, nothing to mask
        R, w = group_level(values, m, masses[depth + 1], lev, tau, xp, weights)
        conditional.append((lev, w))
        values = R
    top_mass = masses[-1]
    if top_mass.ndim < values.ndim:
        top_mass = top_mass + xp.zeros_like(values)
    risk, w_top = risk_weights_scalar(values, top_mass, float(ts[0]), xp, weights=weights)
    if not weights:
        return risk, None
    w = w_top
    for lev, cond in reversed(conditional):
        w = _segments.expand(w, lev, xp) * cond
    return risk, w


def check_group_mass(p: Any, tree: GroupTree, xp: Any) -> None:
    """Every group of every level needs positive prior mass."""
    if p is None:
        return
    for lay in tree.sample_layouts:
        if not bool(xp.all(segment_sum(p, lay, xp) > 0)):
            raise ValueError(
                "`weights` give a group zero total weight (an empty group); every group needs "
                "at least one sample with positive weight"
            )


def _prepare_hierarchy(losses: Any, groups: Any, tilts: Any, weights: Any, xp: Any, check: bool):
    """Validated ``(losses, prior, tree, tilts, dtype)`` for the public hierarchical
    functions (16-bit losses widened to float32; ``dtype`` is their own, else None; the
    tilts rounded to the precision of the losses)."""
    l, half = widen_half(prepare_losses(losses, xp, False), xp)
    tree = build_tree(groups, l.shape[-1])
    ts = tilts_in_precision(prepare_tilts(tilts, tree.depth), l, xp)
    p = prepare_prior(weights, l, xp)
    # NumPy 1-d losses with the uniform prior at a finite innermost tilt: the first level
    # reads their extremes and rejects NaN and infinity there (no separate pass)
    checked_later = (is_numpy_namespace(xp) and l.ndim == 1 and p is None
                     and math.isfinite(ts[-1]))
    if check and not checked_later:
        check_finite(l, xp, name="losses", skip="check_finite=False")
    check_group_mass(p, tree, xp)
    return l, p, tree, ts, half


def hierarchical_risk(
    losses: Any,
    groups: Any,
    tilts: Any,
    *,
    weights: Any = None,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Hierarchical (multi-objective) tilted risk of any depth.

    With one grouping level and ``tilts = (t, tau)`` this is the paper's class-level
    objective

    .. math:: J(t, \tau) = \frac1t \log \sum_g P_g\, e^{t R_g(\tau)}, \qquad
              R_g(\tau) = \frac1\tau \log \sum_{x\in g} \frac{p_x}{P_g} e^{\tau \ell_x},

    with group masses :math:`P_g = \sum_{x \in g} p_x` (``|g|/N`` for uniform priors).
    Deeper hierarchies nest the same construction: ``tilts = (m, t, tau)`` for two grouping
    levels, outermost first. Every tilt may be 0 or +-inf (their exact limits).

    Parameters
    ----------
    losses : array, shape (..., N)
        Per-sample losses, samples along the last axis.
    groups : array or sequence of arrays
        One label array of length N (two levels), or a sequence of label arrays,
        outermost first, each level nested in the one before (every inner label lies in
        one outer group). Labels may be any sortable values.
    tilts : sequence of float
        One more entry than grouping levels, outermost first. PyTorch tilts that require
        grad (a 1-d tensor, or 0-d tensors in the sequence) are differentiated through,
        as in :func:`~tiltlab.tilted_risk` (``torch.autograd.grad`` of the risk gives the
        derivative in each tilt).
    weights : array, optional
        Prior sample weights (default uniform).
    check_finite : bool, optional
        Reject NaN/infinite losses (default). With ``False``, NaN or infinite losses give
        a NaN result on every backend.
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        The hierarchical risk (shape ``losses.shape[:-1]``).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import hierarchical_risk, tilted_risk
    >>> l = np.array([0.1, 0.5, 2.0, 3.0])
    >>> g = np.array([0, 0, 1, 1])
    >>> bool(np.isclose(hierarchical_risk(l, g, (1.5, 1.5)), tilted_risk(l, 1.5)))
    True
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    impl = HIERARCHICAL_RISK.dispatch(xp)  # a library with its own evaluation (Dask)
    if impl is not None:
        out = impl(losses, groups, tilts, weights=weights, check_finite=check_finite)
        if out is not None:
            return out
    if weights is None and check_finite and is_numpy_namespace(xp):
        out = labelled_two_levels_risk(losses, groups, tilts, xp)
        if out is not None:
            return out
    l, p, tree, ts, half = _prepare_hierarchy(losses, groups, tilts, weights, xp, check_finite)
    tts = _autograd_tilts(tilts, l, xp)
    if tts is not None:  # tilts that carry autograd: a differentiable evaluation
        if check_finite is False and not bool(xp.all(xp.isfinite(l))):
            return narrow(_eval_or_nan(l, p, tree, ts, xp, False, False), half, xp)
        return narrow(_autograd_eval(l, p, tree, ts, tts, xp), half, xp)
    return narrow(_eval_or_nan(l, p, tree, ts, xp, False, check_finite), half, xp)


def _autograd_tilts(tilts: Any, like: Any, xp: Any) -> list | None:
    """The tilts as 0-d arrays of ``like``'s dtype, outermost first, when any of them
    carries autograd (a PyTorch tensor that requires grad), else None."""
    if is_array_api_obj(tilts):
        if not getattr(tilts, "requires_grad", False):
            return None
        entries = [tilts[k] for k in range(tilts.shape[0])]
    else:
        entries = list(tilts)
        if not any(getattr(v, "requires_grad", False) for v in entries):
            return None
    out = []
    for v in entries:
        if getattr(v, "requires_grad", False):
            v = xp.reshape(v, ())
            out.append(v if v.dtype == like.dtype else xp.astype(v, like.dtype))
        else:
            out.append(xp.asarray(float(v), dtype=like.dtype, device=device(like)))
    return out


def _autograd_eval(
    l: Any, p: Any, tree: GroupTree, ts: Sequence[float], tts: list, xp: Any
) -> Any:
    """The hierarchical risk as a differentiable function of the tilt arrays ``tts``.

    The same values as :func:`hierarchy_eval` (``ts`` are the tilts on the host, which
    choose the branches); each group level is the vectorised form of the tilted
    reduction (:func:`tiltlab.accumulator.finish_risk` on group sums, with the cumulant
    series near a zero tilt, so that the derivative there is the group variance over 2)
    and the top level the sample-level kernel, which differentiates through its tilt as
    :func:`tilted_risk` does.
    """
    masses = level_masses(p, tree, l, xp)
    values = l
    for depth, lev in enumerate(tree.levels):
        k = len(tree.levels) - depth
        m = masses[depth]
        if depth == 0 and p is None:
            m = 1.0 / tree.n_samples
        values = _autograd_level(values, m, masses[depth + 1], lev, ts[k], tts[k], xp)
    top_mass = masses[-1]
    if top_mass.ndim < values.ndim:
        top_mass = top_mass + xp.zeros_like(values)
    return risk_kernel(values, top_mass, tts[0], xp)


def _autograd_level(v: Any, m: Any, M: Any, seg: Segments, tau: float, tt: Any, xp: Any):
    """Tilted risk of every group of ``seg`` at the tilt array ``tt`` (host value ``tau``),
    differentiable in ``tt`` and ``v`` (see :func:`group_level` for the arguments)."""
    if math.isinf(tau):  # the extreme child: does not depend on the tilt (derivative 0)
        R = _extreme_level(v, m, seg, tau, xp, False, isinstance(m, float))[0]
        return R + xp.where(xp.isfinite(tt), tt, xp.zeros_like(tt)) * 0.0
    Mx = _segments.expand(M, seg, xp)
    if isinstance(m, float):
        pm, on = m / Mx, None
        hi = _segments.segment_max(v, seg, xp)
        lo = _segments.segment_min(v, seg, xp)
    else:
        on = m > 0
        pm = xp.where(on, m / Mx, xp.zeros_like(Mx))
        inf = xp.asarray(xp.inf, dtype=v.dtype, device=device(v))
        hi = _segments.segment_max(xp.where(on, v, -inf), seg, xp)
        lo = _segments.segment_min(xp.where(on, v, inf), seg, xp)

    def gsum(a):  # sum over each group of the prior-weighted children
        if on is not None:
            a = xp.where(on, a, xp.zeros_like(a))
        return _segments.segment_sum(pm * a, seg, xp)

    one = xp.ones_like(tt)
    t_fin = tt if tau != 0.0 else one  # a placeholder at 0: the series takes over there
    c = hi if tau >= 0.0 else lo
    u = (t_fin * (v * 0.5 - _segments.expand(c, seg, xp) * 0.5)) * 2.0  # <= 0, halved: exact
    if on is not None:  # children without mass: a finite exponent (no NaN in the backward)
        u = xp.where(on, u, xp.zeros_like(u))
    mean = gsum(v)
    d = v - _segments.expand(mean, seg, xp)
    spread = (hi * 0.5 - lo * 0.5) * 2.0
    near = xp.abs(tt) * spread < series_threshold(v.dtype, xp)
    series = (tt, gsum(d * d), gsum(d * d * d), near)
    ex, em = exponent_terms(u, xp, squares=False)
    q, z = gsum(em), gsum(ex)
    scale = xp.abs(t_fin) * spread
    return finish_risk(t_fin, c, scale, q, z, mean, xp, tiny=tiny_sqrt(v.dtype, xp), series=series)


def hierarchical_weights(
    losses: Any,
    groups: Any,
    tilts: Any,
    *,
    weights: Any = None,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Per-sample weights of the hierarchical tilted risk.

    The weights satisfy :math:`\nabla J = \sum_x w_x \nabla \ell_x` (the paper's
    hierarchical gradient lemma) and sum to one. Each weight is the product, along the
    sample's path in the hierarchy, of its tilted weight within its group and of each
    group's tilted weight within its parent.

    Parameters
    ----------
    losses, groups, tilts, weights, check_finite, xp
        As for :func:`hierarchical_risk`.

    Returns
    -------
    array
        Weights of the shape of ``losses``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import hierarchical_weights
    >>> w = hierarchical_weights(np.array([0.1, 0.5, 2.0, 3.0]), [0, 0, 1, 1], (0.0, 0.0))
    >>> w.tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    impl = HIERARCHICAL_WEIGHTS.dispatch(xp)  # a library with its own evaluation (CuPy)
    if impl is not None:
        out = impl(losses, groups, tilts, weights=weights, check_finite=check_finite)
        if out is not None:
            return out
    if weights is None and check_finite and is_numpy_namespace(xp):
        out = labelled_two_levels_weights(losses, groups, tilts, xp)
        if out is not None:
            return out
    l, p, tree, ts, half = _prepare_hierarchy(losses, groups, tilts, weights, xp, check_finite)
    return narrow(_eval_or_nan(l, p, tree, ts, xp, True, check_finite), half, xp)


def _eval_or_nan(l: Any, p: Any, tree: GroupTree, ts: Any, xp: Any, want: bool,
                 check: bool) -> Any:
    """The hierarchical risk (or weights); NaN for non-finite losses when unchecked."""
    if not check and not bool(xp.all(xp.isfinite(l))):
        nan = xp.asarray(math.nan, dtype=l.dtype, device=device(l))
        return nan + (xp.zeros_like(l) if want else xp.zeros_like(l[..., 0]))
    try:
        with _quiet(xp, not check):
            out = hierarchy_eval(l, p, tree, ts, xp, weights=want)
    except NonFiniteLosses:
        if check:
            raise
        nan = xp.asarray(math.nan, dtype=l.dtype, device=device(l))
        return nan + (xp.zeros_like(l) if want else xp.zeros_like(l[..., 0]))
    return out[1] if want else out[0]

r"""Per-group reports of a hierarchical tilt: :func:`group_report`, :func:`format_group_report`.

For losses grouped by labels (classes, annotators, devices) and tilts ``(t, tau)``, the
hierarchical risk is the ``t``-tilted risk of the groups' ``tau``-tilted risks
:math:`R_g(\tau)` under the group masses :math:`P_g`. A report says, per group, what the
two tilts do with it: its risk, its mass, its weight in the outer tilt and how many of its
samples the inner tilt effectively keeps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import segments as _segments
from .._compat import device, host_labels, namespace_of, seq_of_arrays, to_numpy
from ..risk import (
    build_tree,
    check_group_mass,
    group_level,
    level_masses,
    prepare_losses,
    prepare_prior,
    prepare_tilts,
    risk_weights_scalar,
)

__all__ = ["group_report", "format_group_report"]

#: the keys of a report, in order
REPORT_KEYS = ("group", "risk", "mass", "weight", "ess", "size")


def _outer_labels(groups: Any) -> np.ndarray:
    """The outermost level's distinct labels, in the order of the tree's group codes."""
    outer = groups[0] if seq_of_arrays(groups) else groups
    return np.unique(host_labels(outer, name="groups"))


def group_report(
    losses: Any, groups: Any, tilts: Any, *, weights: Any = None, xp: Any = None
) -> dict:
    r"""What a hierarchical tilt does to each group: risk, mass, weight and kept samples.

    With one grouping level and ``tilts = (t, tau)`` the hierarchical risk
    (:func:`tiltlab.hierarchical_risk`) is :math:`J = \frac1t\log\sum_g P_g e^{tR_g}`, with
    :math:`R_g` the ``tau``-tilted risk of group ``g`` and :math:`P_g` its prior mass.
    The report gives, for each group ``g`` (one entry per group, in the sorted order of
    the labels):

    * ``"group"``: the label;
    * ``"risk"``: :math:`R_g(\tau)`;
    * ``"mass"``: :math:`P_g`, the group's share of the samples (of the prior weight);
    * ``"weight"``: :math:`P_g e^{tR_g} / \sum_h P_h e^{tR_h}`, the group's weight in the
      outer tilt (the weights sum to 1; they are the per-sample weights of
      :func:`tiltlab.hierarchical_weights` summed over the group);
    * ``"ess"``: the effective sample size of the sample weights inside the group, as a
      fraction of the group's size: :math:`(\sum_x v_x)^2 / (|g| \sum_x v_x^2)` with
      :math:`v_x = e^{\tau\ell_x}` for the uniform prior; with prior weights the samples
      count in proportion to their weight, as in :func:`tiltlab.tilt_for_ess` (1 at
      ``tau = 0`` in both cases);
    * ``"size"``: the number of samples in the group.

    So ``tilted_risk(report["risk"], t, weights=report["mass"])`` is the hierarchical risk.

    Deeper hierarchies (a sequence of label arrays, ``tilts`` one longer) are reported at
    their outermost level: ``"risk"`` is then the hierarchical risk of the group's subtree
    under the inner tilts, ``"weight"`` its outer weight, and ``"ess"`` the effective size
    of the product weights of its samples (all inner levels together); report an inner
    level by calling the function on one outer group's samples.

    Parameters
    ----------
    losses : array, shape (N,)
        Per-sample losses (finite).
    groups : array or sequence of arrays
        Group labels, one per sample (or nested levels, outermost first), as for
        :func:`tiltlab.hierarchical_risk`.
    tilts : sequence of float
        ``(t, tau)``: the outer (group) tilt and the inner (sample) tilt; one more entry
        per extra level. Infinite tilts give their limits.
    weights : array, shape (N,), optional
        Non-negative prior sample weights (default uniform).
    xp : namespace, optional
        Inferred from ``losses``.

    Returns
    -------
    dict
        ``"risk"``, ``"mass"``, ``"weight"`` and ``"ess"``: arrays of shape ``(G,)`` in
        the namespace, dtype and device of ``losses``; ``"size"``: integer counts of the
        same namespace and device; ``"group"``: the labels as a NumPy array (labels may
        be strings).

    Raises
    ------
    ValueError
        Empty, non-finite or not 1-d ``losses``; labels of the wrong length or not
        nested; the wrong number of tilts; bad ``weights`` or a group without weight.

    See Also
    --------
    format_group_report : The report as a table of the worst and best groups.
    tiltlab.plot.plot_group_report : The report as a figure.
    tiltlab.hierarchical_weights : The per-sample weights.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import hierarchical_risk, tilted_risk
    >>> from tiltlab.diagnostics import group_report
    >>> l = np.array([0.1, 0.2, 0.3, 2.0, 2.5, 9.0])
    >>> g = np.array(["a", "a", "a", "b", "b", "b"])
    >>> rep = group_report(l, g, (1.0, -1.0))
    >>> rep["group"].tolist(), rep["size"].tolist()
    (['a', 'b'], [3, 3])
    >>> bool(np.isclose(rep["weight"].sum(), 1.0))
    True
    >>> bool(rep["ess"][1] < rep["ess"][0])  # tau < 0 down-weights the 9.0 in group b
    True
    >>> J = tilted_risk(rep["risk"], 1.0, weights=rep["mass"])
    >>> bool(np.isclose(J, hierarchical_risk(l, g, (1.0, -1.0))))
    True
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l = prepare_losses(losses, xp, True)
    if l.ndim != 1:
        raise ValueError(f"`losses` must be 1-d (one loss per sample), got shape {tuple(l.shape)}")
    tree = build_tree(groups, l.shape[0])
    ts = prepare_tilts(tilts, tree.depth)
    p = prepare_prior(weights, l, xp)
    check_group_mass(p, tree, xp)
    masses = level_masses(p, tree, l, xp)
    values, conditional = l, []
    for depth, lev in enumerate(tree.levels):
        tau = ts[len(tree.levels) - depth]
        m = 1.0 / tree.n_samples if depth == 0 and p is None else masses[depth]
        values, cond = group_level(values, m, masses[depth + 1], lev, tau, xp, True)
        conditional.append((lev, cond))
    # the weight of each sample within its outermost group: the product of its
    # conditional weights down the tree (as in hierarchical_weights, without the top)
    q = conditional[-1][1]
    for lev, cond in reversed(conditional[:-1]):
        q = _segments.expand(q, lev, xp) * cond
    top = tree.sample_layouts[-1]
    mass = masses[-1]
    _, weight = risk_weights_scalar(values, mass, ts[0], xp, weights=True)
    # ESS fraction of the in-group weights q against the in-group prior p_x / P_g:
    # 1 / sum_x q_x^2 (P_g / p_x), i.e. 1 / (|g| sum_x q_x^2) under the uniform prior
    if p is None:
        ratio = xp.asarray(top.counts, dtype=l.dtype, device=device(l))
        ratio = _segments.expand(ratio, top, xp)
    else:
        on = p > 0
        safe = xp.where(on, p, xp.ones_like(p))
        ratio = xp.where(on, _segments.expand(mass, top, xp) / safe, xp.zeros_like(p))
    ess = 1.0 / _segments.segment_sum(q * q * ratio, top, xp)
    ess = xp.minimum(ess, xp.ones_like(ess))  # 1 exactly where rounding overshoots
    size = xp.asarray(top.counts, dtype=xp.int64, device=device(l))
    return {
        "group": _outer_labels(groups),
        "risk": values,
        "mass": mass,
        "weight": weight,
        "ess": ess,
        "size": size,
    }


def format_group_report(report: dict, *, worst: int = 3, best: int = 3) -> str:
    """A plain-text table of the groups with the largest and the smallest risk.

    Parameters
    ----------
    report : dict
        A :func:`group_report` (any backend: the values are copied to the host).
    worst, best : int, optional
        How many groups of the largest and of the smallest risk to list (all groups,
        once each, when they add up to the number of groups or more).

    Returns
    -------
    str
        One line per group, the largest risks first: label, risk, mass, weight, ESS
        fraction and size, with a header; a line ``(k more)`` between the two blocks
        when ``k`` groups are left out. Groups of NaN risk (a running estimator's
        groups not seen yet) are left out.

    See Also
    --------
    group_report

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.diagnostics import format_group_report, group_report
    >>> l = np.array([0.1, 0.2, 0.3, 2.0, 2.5, 9.0, 1.0, 1.1])
    >>> rep = group_report(l, np.array([0, 0, 0, 1, 1, 1, 2, 2]), (1.0, -1.0))
    >>> print(format_group_report(rep, worst=1, best=1))
    group      risk      mass    weight       ess    size
        1     2.624     0.375    0.8155    0.6297       3
           (1 more)
        0    0.1967     0.375   0.07199    0.9934       3
    """
    for name, k in (("worst", worst), ("best", best)):
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"`{name}` must be a non-negative integer, got {k!r}")
    missing = [k for k in REPORT_KEYS if k not in report]
    if missing:
        raise ValueError(f"`report` lacks the entries {missing} (pass a group_report)")
    host = {k: np.asarray(report[k]) if k == "group" else to_numpy(report[k]) for k in REPORT_KEYS}
    # groups without a risk (NaN: not seen yet by a running estimator) are not ranked
    order = np.argsort(-host["risk"], kind="stable")
    order = order[~np.isnan(host["risk"][order])]
    n = order.size
    if worst + best >= n:
        rows, gap = list(order), None
    else:
        rows, gap = list(order[:worst]) + list(order[n - best :]), worst
    labels = [str(host["group"][i]) for i in rows]
    width = max([5] + [len(s) for s in labels])
    head = "".join(f"{h:>10}" for h in ("risk", "mass", "weight", "ess"))
    lines = [f"{'group':>{width}}{head}{'size':>8}"]
    for j, (i, label) in enumerate(zip(rows, labels, strict=True)):
        if gap is not None and j == gap:
            lines.append(f"{'':>{width}}  ({n - worst - best} more)")
        nums = "".join(f"{_fmt(host[k][i]):>10}" for k in ("risk", "mass", "weight", "ess"))
        lines.append(f"{label:>{width}}{nums}{int(host['size'][i]):>8}")
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return f"{float(v):.4g}" if math.isfinite(float(v)) else str(float(v))

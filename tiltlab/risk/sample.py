"""Sample-level tilted risks and weights: :func:`tilted_risk` and :func:`tilted_weights`.

Validation, the choice between the fast path and the vectorised kernels, and grids of
tilts (evaluated in bounded blocks).
"""

from __future__ import annotations

import math
from typing import Any

from .._compat import (
    device,
    namespace_of,
    normalize_axis,
)
from ..accumulator import NonFiniteLosses, host_extremes
from ._dispatch import TILTED_RISK, TILTED_WEIGHTS
from .fast_path import (
    _check_losses,
    _finite_nonzero,
    _host_tilt,
    _quiet,
    _risk_1d,
    _use_fast_path,
    _weights_1d,
)
from .inputs import narrow, prepare_losses, prepare_prior, prepare_tilt, widen_half
from .kernels import risk_kernel, weights_kernel

__all__ = ["tilted_risk", "tilted_weights"]


# ---------------------------------------------------------------------------
# public sample-level API

#: elements of (tilts x losses) evaluated at once by tilted_risk on a grid of tilts
_GRID_CHUNK = 1 << 23


def tilted_risk(
    losses: Any,
    t: Any,
    *,
    axis: int = -1,
    weights: Any = None,
    keepdims: bool = False,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Tilted risk :math:`R(t) = \frac{1}{t}\log\sum_i p_i e^{t\,\ell_i}`.

    Exact at every tilt: ``t = 0`` gives the (prior-weighted) mean, ``t = +inf`` the
    maximum and ``t = -inf`` the minimum over the samples with positive prior weight.
    Accurate to a few ulps of ``max |losses|`` at every tilt from ``-1e8`` to ``1e8``,
    including tilts as small as ``1e-300`` (see the module notes).

    Parameters
    ----------
    losses : array
        Per-sample losses; samples lie along ``axis``. Integer and boolean losses are
        promoted to the namespace's default floating dtype.
    t : float, 0-d or 1-d array
        The tilt, or a grid of tilts. With a 1-d grid of length T the result gains a
        leading axis of length T (vectorised, no Python loop). Tilts are parameters:
        Python or NumPy numbers and arrays of any supported library are converted to
        the namespace, dtype and device of ``losses`` (an array of that namespace is
        kept, so autograd through ``t`` works). Strings and booleans raise ``TypeError``.
    axis : int, optional
        The sample axis. Default: the last.
    weights : array, optional
        Non-negative prior weights, 1-d with one entry per sample or of the shape of
        ``losses`` (then their sample axis is ``axis`` too, as for the losses);
        normalised to sum to one along it. Default: uniform.
    keepdims : bool, optional
        Keep the reduced axis with length one.
    check_finite : bool, optional
        Raise ``ValueError`` for NaN or infinite losses (default). Pass ``False`` to skip
        the check: then a NaN loss with positive prior weight makes the result NaN (the
        risk, and every weight in :func:`tilted_weights`) at every tilt, on every
        backend; infinite losses give what IEEE arithmetic gives in the shifted formulas
        (``inf`` at ``t = 0`` for a ``+inf`` loss, NaN where two infinities meet).
    xp : namespace, optional
        The array namespace; inferred from the inputs by default.

    Returns
    -------
    array
        The tilted risk, in the namespace, dtype and device of ``losses``.

    Raises
    ------
    ValueError
        Empty or non-finite ``losses``, NaN ``t``, negative or all-zero ``weights``,
        mismatched shapes.
    TypeError
        Complex input, or arrays from two different libraries.

    Notes
    -----
    Supported backends: NumPy, CuPy, PyTorch, array-api-strict and Dask (through
    array-api-compat).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import tilted_risk
    >>> l = np.array([0.0, 1.0, 4.0])
    >>> float(tilted_risk(l, 0.0))
    1.6666666666666667
    >>> float(tilted_risk(l, np.inf)), float(tilted_risk(l, -np.inf))
    (4.0, 0.0)
    >>> tilted_risk(l, np.array([-1.0, 1.0])).shape
    (2,)
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    impl = TILTED_RISK.dispatch(xp)  # a library with its own evaluation (Dask: one graph)
    if impl is not None:
        out = impl(losses, t, axis=axis, weights=weights, keepdims=keepdims,
                   check_finite=check_finite)
        if out is not None:
            return out
    l, half = widen_half(prepare_losses(losses, xp, False), xp)
    ax = normalize_axis(axis, l.ndim)
    l = xp.moveaxis(l, ax, -1) if ax != l.ndim - 1 else l
    host_t = _host_tilt(t, l, xp)
    # a plain number: no device copy of the tilt, no synchronisation to validate it
    tt, grid = (None, False) if host_t is not None else prepare_tilt(t, xp, l)
    p = prepare_prior(weights, l, xp, ax)
    r = None
    if _use_fast_path(l, xp, check_finite) and not getattr(tt, "requires_grad", False):
        try:
            with _quiet(xp, not check_finite):
                r = _risk_1d(l, p, host_t if tt is None else tt, grid, xp, check_finite)
        except NonFiniteLosses:
            if check_finite:
                raise
    if r is None:
        if tt is None:  # validated on the host: nothing data-dependent for torch.compile
            tt = xp.asarray(float(host_t), dtype=l.dtype, device=device(l))
        if check_finite:
            _check_losses(l, xp)
        with _quiet(xp, not check_finite):
            r = _risk_grid(l, p, tt, grid, False, ax, xp)
    if not check_finite:
        r = r + _nan_of_nan(l, p, xp)
    if keepdims:
        r = xp.expand_dims(r, axis=ax + (1 if grid else 0))
    return narrow(r, half, xp)


def _nan_of_nan(l: Any, p: Any, xp: Any) -> Any:
    """NaN for every batch row with a NaN loss on the support, else 0 (one sum, no
    synchronisation)."""
    bad = xp.isnan(l)
    if p is not None:
        bad = bad & (p > 0)
    nan = xp.asarray(math.nan, dtype=l.dtype, device=device(l))
    return xp.sum(xp.where(bad, nan, xp.zeros_like(l)), axis=-1)


def _risk_grid(l: Any, p: Any, tt: Any, grid: bool, keepdims: bool, ax: int, xp: Any) -> Any:
    """The vectorised kernel over any batch shape and tilt grid (bounded temporaries)."""
    n_elem = 1
    for s in l.shape:
        n_elem *= int(s)
    if grid and tt.shape[0] * n_elem > _GRID_CHUNK:
        # bound the temporaries: blocks of tilts, each block vectorised
        step = max(1, _GRID_CHUNK // n_elem)
        parts = [risk_kernel(l, p, tt[i : i + step], xp) for i in range(0, tt.shape[0], step)]
        r = xp.concat(parts, axis=0)
    else:
        r = risk_kernel(l, p, tt, xp)
    if keepdims:
        r = xp.expand_dims(r, axis=ax + (1 if grid else 0))
    return r


def tilted_weights(
    losses: Any,
    t: Any,
    *,
    axis: int = -1,
    weights: Any = None,
    check_finite: bool = True,
    xp: Any = None,
) -> Any:
    r"""Tilted weights :math:`w_i = p_i e^{t\ell_i} / \sum_j p_j e^{t\ell_j}`.

    The weights sum to one along ``axis`` and give the tilted gradient
    :math:`\nabla R(t) = \sum_i w_i \nabla \ell_i`. ``t = 0`` returns the prior; ``t = +inf``
    (``-inf``) returns the prior restricted to the tied maximisers (minimisers) and
    renormalised, which is uniform over them for uniform priors and is the limit of the
    weights as ``t`` grows.

    Parameters
    ----------
    losses, t, axis, weights, check_finite, xp
        As for :func:`tilted_risk`.

    Returns
    -------
    array
        Weights of the shape of ``losses`` (with a leading tilt axis for a 1-d grid of
        tilts), in the namespace, dtype and device of ``losses``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import tilted_weights
    >>> w = tilted_weights(np.array([0.0, 1.0, 1.0]), np.inf)
    >>> w.tolist()
    [0.0, 0.5, 0.5]
    >>> float(tilted_weights(np.array([0.0, 1.0]), 1000.0)[1])
    1.0
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    impl = TILTED_WEIGHTS.dispatch(xp)
    if impl is not None:
        out = impl(losses, t, axis=axis, weights=weights, check_finite=check_finite)
        if out is not None:
            return out
    l, half = widen_half(prepare_losses(losses, xp, False), xp)
    ax = normalize_axis(axis, l.ndim)
    l = xp.moveaxis(l, ax, -1) if ax != l.ndim - 1 else l
    host_t = _host_tilt(t, l, xp)
    if host_t is not None:  # validated on the host: nothing for torch.compile to trace
        tt, grid = xp.asarray(float(host_t), dtype=l.dtype, device=device(l)), False
    else:
        tt, grid = prepare_tilt(t, xp, l)
    p = prepare_prior(weights, l, xp, ax)
    if (
        _use_fast_path(l, xp, check_finite)
        and not grid
        and not getattr(tt, "requires_grad", False)
        and _finite_nonzero(tt)
    ):
        if check_finite and p is not None:
            _check_losses(l, xp)
        hi, lo = host_extremes(l, p, xp)
        if math.isfinite(hi) and math.isfinite(lo):
            with _quiet(xp, not check_finite):
                return narrow(_weights_1d(l, p, float(tt), hi, lo, xp), half, xp)
    if check_finite:
        _check_losses(l, xp)
    with _quiet(xp, not check_finite):
        w = weights_kernel(l, p, tt, xp)
    if not check_finite:
        w = w + _nan_of_nan(l, p, xp)[..., None]
    if ax != l.ndim - 1:
        w = xp.moveaxis(w, -1, ax + (1 if grid else 0))
    return narrow(w, half, xp)

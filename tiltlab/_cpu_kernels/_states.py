"""The mergeable states of a fused pass, in a documented form (:class:`KernelStates`).

The kernels write one tilted state per row chunk (or, with :func:`run_groups`, per group
of a partition of the rows) as a row of a float64 table (:mod:`._rows`: shift, hi, lo,
mass, s, q, lsum, non-finite flag, av). :func:`states_of` turns that table and the
per-entry vector sums into a :class:`KernelStates`, which callers outside the package
merge by the rule of :mod:`tiltlab.accumulator` (a state per entry: each field is that of
:class:`tiltlab.accumulator.TiltState`). :meth:`KernelStates.merged` is that merge, the
one the fused evaluations finish with as well.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..accumulator import GroupState, TiltState

__all__ = ["KernelStates", "run_groups", "states_of"]


@dataclass(frozen=True)
class KernelStates:
    """Tilted states of the row blocks (or groups) of one fused pass, one entry each.

    Entry ``k`` summarises the rows of block (group) ``k`` with positive prior weight
    ``p_i`` and losses ``l_i``, relative to its ``shift`` (the largest loss for
    ``t > 0``, the smallest otherwise): the fields of
    :class:`tiltlab.accumulator.TiltState`, so that entries (and the states of other
    passes) merge exactly by its rule.

    Attributes
    ----------
    t : float
        The tilt.
    shift, hi, lo, mass, s, q, lsum : ndarray of shape (m,), float64
        The shift, the largest and smallest loss, ``sum p_i``, ``sum p_i exp(t (l_i -
        shift))``, ``sum p_i expm1(t (l_i - shift))`` (NaN where the entry's ``|t| (hi -
        lo)`` exceeds 1 and the kernel stopped tracking it) and ``sum p_i (l_i -
        shift)``. An entry without rows of positive weight has ``mass = 0``, ``hi =
        -inf``, ``lo = +inf`` and zeros elsewhere.
    sums : tuple of ndarray
        Weighted sums per entry (entry axis first), with ``pe_i = p_i exp(t (l_i -
        shift))``: ``()`` for a value; ``(g,)`` for a gradient, ``g[k] = sum pe_i l'_i
        x_i`` (shape ``(m, d)``, ``(m, d, K)`` for the multinomial loss); for a
        Hessian-vector product along ``v`` (``u_i = x_i . v``, ``a_i = l'_i u_i``)
        ``(h, g, av)`` with ``h[k] = sum pe_i (l''_i u_i + t l'_i a_i) x_i``, ``g`` as
        above and ``av[k] = sum pe_i a_i`` (the multinomial loss applies its per-sample
        Hessian in the predictor instead of ``l''``). The Hessian-vector product of the
        merged state is ``h / s - t (g / s)(av / s)``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab._cpu_kernels import FusedProblem
    >>> fp = FusedProblem("squared", np.eye(2), np.array([1.0, 3.0]), n_chunks=2)
    >>> st = fp.block_states(np.zeros(2), 0.0, gradient=True)
    >>> st.mass.tolist(), st.shift.tolist(), st.sums[0].tolist()
    ([1.0, 1.0], [1.0, 9.0], [[-2.0, 0.0], [0.0, -6.0]])
    """

    t: float
    shift: np.ndarray
    hi: np.ndarray
    lo: np.ndarray
    mass: np.ndarray
    s: np.ndarray
    q: np.ndarray
    lsum: np.ndarray
    sums: tuple

    @property
    def present(self) -> np.ndarray:
        """Which entries have rows of positive prior weight."""
        return self.mass > 0

    def group_state(self) -> GroupState:
        """The entries as a :class:`~tiltlab.accumulator.GroupState` (one group per
        entry; the small-tilt sum is absent at ``t = 0``, as in the accumulator's own
        states)."""
        t = float(self.t)
        return GroupState(
            t=t, hi=self.hi, lo=self.lo, mass=self.mass, s=self.s,
            q=None if t == 0.0 else self.q, lsum=self.lsum, sums=tuple(self.sums),
        )  # fmt: skip

    def merged(self) -> TiltState:
        """Every entry merged into one :class:`~tiltlab.accumulator.TiltState` by the
        accumulator's exact merge (:meth:`~tiltlab.accumulator.GroupState.collapse`,
        vectorised over the entries).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab._cpu_kernels import FusedProblem
        >>> fp = FusedProblem("squared", np.eye(2), np.array([1.0, 3.0]), n_chunks=2)
        >>> st = fp.block_states(np.zeros(2), 0.0, gradient=True).merged()
        >>> float(st.risk()), (st.sums[0] / st.s).tolist()
        (5.0, [-1.0, -3.0])
        """
        st = self.group_state().collapse()
        return replace(st, q=None) if st.t == 0.0 else st


def states_of(state: np.ndarray, t: float, sums: tuple) -> KernelStates | None:
    """The :class:`KernelStates` of a kernel's state table (None where a loss on the
    support is not finite)."""
    if np.any(state[:, 7] != 0):
        return None
    shift, hi, lo, mass, s, q, lsum = (np.array(state[:, j]) for j in range(7))
    used = mass > 0
    shift[~used] = 0.0
    hi[~used], lo[~used] = -np.inf, np.inf
    s[~used], q[~used], lsum[~used] = 0.0, 0.0, 0.0
    return KernelStates(float(t), shift, hi, lo, mass, s, q, lsum, tuple(sums))


def run_groups(pb: Any, codes: Any, n_groups: Any, gradient: bool, V: Any) -> KernelStates | None:
    """One pass of the grouped kernel over the bound problem ``pb``
    (:func:`._grouped.group_scalar`, or :func:`._grouped_multi.group_multi` for the
    multinomial loss): the states and sums of each group (see
    :meth:`FusedProblem.group_states`)."""
    from ._launch import _call, _kernels

    n, d = pb.X.shape
    if isinstance(n_groups, bool) or not isinstance(n_groups, (int, np.integer)) or n_groups < 1:
        raise ValueError(f"`n_groups` must be a positive integer, got {n_groups!r}")
    G = int(n_groups)
    codes = np.asarray(codes)
    if codes.shape != (n,) or not (
        np.issubdtype(codes.dtype, np.integer) or np.issubdtype(codes.dtype, np.bool_)
    ):
        raise ValueError(
            f"`codes` must be {n} integer group codes, got {codes.dtype} of shape {codes.shape}"
        )
    codes = np.ascontiguousarray(codes, dtype=np.int64)
    if n and (int(codes.min()) < 0 or int(codes.max()) >= G):
        raise ValueError(f"`codes` must lie in [0, {G})")
    hvp = V is not None
    _kernels()  # numba and the kernels' availability (raises as the other entry points)
    state = np.zeros((G, 9))
    vectors = gradient or hvp
    shape = (G,) + pb.theta.shape  # (G, d), or (G, d, K) for the multinomial loss
    none = (1,) * len(shape)
    A = np.zeros(shape if vectors else none)
    B = np.zeros(shape if hvp else none)
    v = V if hvp else np.zeros_like(pb.theta)
    grad_only = bool(gradient and not hvp)
    if pb.loss == "multinomial":
        from . import _grouped_multi

        _call(
            _grouped_multi.group_multi, pb.X, pb.y, pb.p, codes, pb.theta, v, pb.t,
            grad_only, hvp, state, A, B, chunks=1,
        )  # fmt: skip
    else:
        from . import _grouped

        _call(
            _grouped.group_scalar, pb.X, pb.y, pb.p, codes, pb.theta, v, pb.t, pb.code,
            pb.param, grad_only, hvp, state, A, B, chunks=1,
        )  # fmt: skip
    sums: tuple = ()
    if hvp:
        sums = (A, B, np.array(state[:, 8]))
    elif gradient:
        sums = (A,)
    return states_of(state, pb.t, sums)

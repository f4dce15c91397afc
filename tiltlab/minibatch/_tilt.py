"""`MinibatchTilt`: the stochastic estimate of a tilted risk, one minibatch at a time."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import device, is_array_api_obj, namespace_of, to_numpy
from ..accumulator import packed as P
from ..accumulator.packed import N_FIELDS, ess_fraction, fit_tilt, merge
from ..accumulator.packed import block as batch_stats
from ._sampling import MLMCBatchSampler, level_probabilities
from .checks import (
    check_estimator,
    check_groups,
    check_lam,
    check_losses,
    check_mlmc_data_size,
    check_positive_int,
    check_tilt_spec,
    resolve,
)
from .steps import (
    check_stats,
    group_mask,
    mlmc_step,
    report_from_state,
    running_from_stats,
    sample_weights,
    variational_from_stats,
)

__all__ = ["MinibatchTilt"]


def _detach(x: Any) -> Any:
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) else x


class MinibatchTilt:
    r"""Tilted risk of a whole data set, estimated from its minibatches.

    The tilted risk of N losses is :math:`R(t) = \frac1t \log \frac1N \sum_i e^{t \ell_i}`,
    with gradient :math:`\sum_i w_i \nabla \ell_i`, :math:`w_i = e^{t(\ell_i - R)}/N`. A
    minibatch does not know R. Each call of :meth:`weights` (or of the object itself) takes
    one batch of per-sample losses, updates the estimator's state and returns weights
    :math:`w_i` of the batch such that :math:`\sum_{i \in B} w_i \nabla \ell_i` estimates
    the full-data gradient. On the whole data set in one batch (the first call) every
    estimator returns exactly :func:`tiltlab.tilted_weights` (or
    :func:`tiltlab.hierarchical_weights`).

    The three estimators:

    ``"running"`` (default)
        The paper's stochastic TERM: a running tilted average of the batch risks,
        :math:`\tilde R \leftarrow \frac1t \log((1-\lambda) e^{t \tilde R} + \lambda
        e^{t R_B})`, kept in the log domain (no exponential of a raw loss is formed, so
        ``t * loss`` in the thousands cannot overflow), started at the first batch's value;
        weights :math:`e^{t(\ell_i - \tilde R)}/|B|`. Both signs of t. Its bias for a fixed
        model falls as :math:`\lambda` falls (a longer memory), at the price of lagging a
        moving model.
    ``"mlmc"``
        Multilevel Monte Carlo (Levy, Carmon, Duchi and Sidford, 2020): batches of random
        size ``base_batch_size * 2**J`` (draw them with :meth:`batch_sampler`); the plug-in
        weights of the first ``base_batch_size`` samples plus the level-J correction
        divided by ``P(J)``. Stateless; its expectation is the plug-in estimate at the
        largest batch, ``base_batch_size * 2**max_level``. Weights can be negative.
    ``"variational"``
        From :math:`\log z = \min_v (z e^v - v) - 1`: with :math:`v = -t\eta`, the risk is
        :math:`\min_\eta\, \eta + \frac1t(\frac1N\sum_i e^{t(\ell_i - \eta)} - 1)` for
        t > 0, a plain average over the data whose stochastic gradients are unbiased.
        :math:`\eta` starts at the first batch's tilted risk (its exact minimiser there)
        and then takes a stochastic step of size :math:`\lambda` in the scale
        :math:`s = e^{t\eta}`, preconditioned by the objective's curvature at its optimum:
        :math:`s \leftarrow (1-\lambda) s + \lambda e^{t R_B}` (the paper's tilted
        average, in the log domain, so no overflow). The difference from
        ``"running"``: a batch is weighted with the :math:`\eta` from *before* it, which
        makes its gradient unbiased for that :math:`\eta`. For t < 0 the same expression is
        a *maximum* over :math:`\eta`: the problem is a saddle point (min over the model,
        max over :math:`\eta`), and the same update is its ascent step.
        Its weights are not bounded (the running estimator's are, by :math:`1/\lambda`).

    Group-level tilting (the paper's Algorithm 2) takes ``tilts=(t_group, t_sample)``,
    ``n_groups`` and integer ``groups`` labels per batch: a running tilted risk per group
    at ``t_sample``, group masses from the running label counts, and group weights
    :math:`P_g e^{t_g \tilde R_g} / \sum_h P_h e^{t_g \tilde R_h}`; a sample of group g
    gets :math:`W_g e^{\tau(\ell - \tilde R_g)} / (|B| P_g)`. Running estimator only.

    ``t = 0`` gives exactly the plain mean (weights ``1/|B|``); ``t = +-inf`` the batch's
    max or min (weights uniform over its tied extremes). Half-precision losses are
    accumulated, and their weights returned, in float32. The state lives in the
    namespace and on the device of the losses.

    Parameters
    ----------
    t : float or callable, optional
        The tilt, or a schedule ``t(step)`` (see :func:`linear_schedule`); ``step`` counts
        the calls from 0. Give either ``t`` or ``tilts``.
    tilts : pair, optional
        ``(t_group, t_sample)``, each a number or a schedule: group-level tilting.
    estimator : {"running", "mlmc", "variational"}, default "running"
    lam : float in (0, 1], default 0.1
        Averaging rate of the running estimator, step of the variational one.
    n_groups : int, optional
        Number of groups (labels ``0..n_groups-1``); required with ``tilts``.
    base_batch_size, max_level : int, optional
        Level structure of ``"mlmc"`` (``max_level`` default 4).
    n_samples : int, optional
        Size of the data set, for ``"mlmc"``: a batch of that size is the whole data and
        gets the exact weights. It must exceed the largest batch,
        ``base_batch_size * 2**max_level`` (where that batch is the whole data set, leave
        it out: the estimator's mean is then exactly the full-data plug-in).
    check_finite : bool, default True
        Raise on NaN or infinite losses. With False, such a batch gets NaN weights and
        value and leaves the state as it was (at every tilt).

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab
    >>> from tiltlab.minibatch import MinibatchTilt
    >>> losses = np.array([0.2, 0.5, 0.1, 3.0])
    >>> tilt = MinibatchTilt(-2.0)
    >>> w = tilt.weights(losses)                     # the whole data in one batch: exact
    >>> bool(np.allclose(w, tiltlab.tilted_weights(losses, -2.0)))
    True
    >>> round(float(tilt(losses[:2])), 4)            # a later batch: the running estimate
    0.3772
    """

    def __init__(
        self,
        t: Any = None,
        *,
        tilts: Any = None,
        estimator: str = "running",
        lam: float = 0.1,
        n_groups: int | None = None,
        base_batch_size: int | None = None,
        max_level: int | None = None,
        n_samples: int | None = None,
        check_finite: bool = True,
    ):
        self.estimator = check_estimator(estimator)
        self.lam = check_lam(lam)
        if (t is None) == (tilts is None):
            raise ValueError("give exactly one of `t` (sample level) and `tilts` (group level)")
        if tilts is not None:
            if isinstance(tilts, (str, bytes)) or not hasattr(tilts, "__len__") or len(tilts) != 2:
                raise ValueError("`tilts` must be a pair (t_group, t_sample)")
            if self.estimator != "running":
                raise ValueError(
                    f"`tilts` (group-level tilting) needs estimator='running', got "
                    f"{self.estimator!r}"
                )
            if n_groups is None:
                raise ValueError("`n_groups` is required with `tilts`")
            self._tilts = (
                check_tilt_spec(tilts[0], "tilts[0]"),
                check_tilt_spec(tilts[1], "tilts[1]"),
            )
            self.n_groups = check_positive_int(n_groups, "n_groups")
            self.hierarchical = True
        else:
            self._tilts = (0.0, check_tilt_spec(t, "t"))
            self.n_groups = 1
            self.hierarchical = False
        if self.estimator == "variational" and not callable(self._tilts[1]):
            if math.isinf(self._tilts[1]):
                raise ValueError("`t` must be finite for estimator='variational'")
        self.base_batch_size = base_batch_size
        self.max_level = max_level
        self.n_samples = None if n_samples is None else check_positive_int(n_samples, "n_samples")
        if self.estimator == "mlmc":
            if base_batch_size is None:
                raise ValueError("`base_batch_size` is required for estimator='mlmc'")
            self.base_batch_size = check_positive_int(base_batch_size, "base_batch_size")
            self.max_level = check_positive_int(4 if max_level is None else max_level, "max_level")
            self._level_p = level_probabilities(self.max_level)
            if self.n_samples is not None:
                check_mlmc_data_size(self.n_samples, self.base_batch_size, self.max_level)
        self.check_finite = bool(check_finite)
        self.reset()

    # -- the tilt ------------------------------------------------------------------------

    @property
    def t(self) -> Any:
        """The sample-level tilt (a number or a schedule); settable."""
        return self._tilts[1]

    @t.setter
    def t(self, value: Any) -> None:
        self._tilts = (self._tilts[0], check_tilt_spec(value, "t"))

    @property
    def tilts(self) -> tuple:
        """``(t_group, t_sample)`` (``t_group`` is 0 at sample level); settable."""
        return self._tilts

    @tilts.setter
    def tilts(self, value: Any) -> None:
        if not self.hierarchical:
            raise ValueError("`tilts` can be set only on a group-level estimator")
        self._tilts = (check_tilt_spec(value[0], "tilts[0]"), check_tilt_spec(value[1], "tilts[1]"))

    def current_tilts(self) -> tuple[float, float]:
        """``(t_group, t_sample)`` as numbers at the current step."""
        return (
            resolve(self._tilts[0], self.step, "tilts[0]"),
            resolve(self._tilts[1], self.step, "tilts[1]" if self.hierarchical else "t"),
        )

    # -- state ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every batch seen (the step counter restarts at 0)."""
        self.step = 0
        self._state: dict[str, Any] | None = None
        self._last_ess: Any = None

    def group_report(self) -> dict:
        """The running state per group, with the keys of
        :func:`tiltlab.diagnostics.group_report`.

        ``"risk"``: the running tilted risk of each group at the inner tilt; ``"mass"``:
        its share of the samples seen; ``"weight"``: its weight in the outer tilt at the
        current step (sum 1); ``"ess"``: the effective sample size of the last batch's
        weights inside the group, as a fraction of the group's samples in that batch (the
        state keeps no per-sample weights; NaN for a group not in the last batch, which
        then keeps its earlier value); ``"size"``: the samples seen; ``"group"``: the
        labels ``0..n_groups-1``. A sample-level estimator reports one group. Arrays in
        the namespace and on the device of the losses; running estimator only.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.minibatch import MinibatchTilt
        >>> tilt = MinibatchTilt(tilts=(1.0, 0.0), n_groups=2)
        >>> _ = tilt.weights(np.array([0.1, 0.3, 2.0, 4.0]), groups=np.array([0, 0, 1, 1]))
        >>> rep = tilt.group_report()
        >>> rep["risk"].tolist(), rep["mass"].tolist(), rep["ess"].tolist()
        ([0.2, 3.0], [0.5, 0.5], [1.0, 1.0])
        >>> bool(np.isclose(rep["weight"][1], np.exp(3.0) / (np.exp(0.2) + np.exp(3.0))))
        True
        """
        if self.estimator != "running":
            raise ValueError("`group_report` is for the running estimator")
        if self._state is None:
            raise ValueError("`group_report`: no batch seen yet")
        risk, counts = self._state["risk"], self._state["counts"]
        xp = namespace_of(risk=risk)
        t_group = fit_tilt(self.current_tilts()[0], risk.dtype, xp)
        return report_from_state(risk, counts, self._last_ess, t_group, xp)

    def state_dict(self) -> dict[str, Any]:
        """The state as a dict (arrays in the namespace and on the device of the losses).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.minibatch import MinibatchTilt
        >>> a = MinibatchTilt(1.0)
        >>> _ = a.weights(np.array([0.1, 0.9]))
        >>> b = MinibatchTilt(1.0)
        >>> b.load_state_dict(a.state_dict())
        >>> bool(np.allclose(a.weights(np.array([2.0])), b.weights(np.array([2.0]))))
        True
        """
        out: dict[str, Any] = {"step": self.step, "estimator": self.estimator}
        if self._state is not None:
            out.update(self._state)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict`."""
        if not isinstance(state, dict) or "step" not in state:
            raise TypeError("`state` must be a dict written by `state_dict()`")
        if state.get("estimator") != self.estimator:
            raise ValueError(
                f"`state` belongs to estimator {state.get('estimator')!r}, not {self.estimator!r}"
            )
        arrays = {k: v for k, v in state.items() if k not in ("step", "estimator")}
        expected = {"running": {"risk", "seen", "counts"}, "mlmc": set(), "variational": {"eta"}}[
            self.estimator
        ]
        if arrays and set(arrays) != expected:
            raise ValueError(f"`state` must hold {sorted(expected)}, got {sorted(arrays)}")
        if self.estimator == "running" and arrays:
            shape = tuple(arrays["risk"].shape)
            if shape != (self.n_groups,):
                raise ValueError(f"`state` has {shape} group risks, expected ({self.n_groups},)")
        self.step = check_positive_int(state["step"], "state['step']", minimum=0)
        self._state = dict(arrays) if arrays else None

    def _state_like(self, like: Any, xp: Any) -> dict[str, Any]:
        """The state as arrays of ``xp`` in ``like``'s dtype and on its device."""
        g = self.n_groups
        if self._state is None:
            zeros = xp.zeros((g,), dtype=like.dtype, device=device(like))
            if self.estimator == "running":
                return {"risk": zeros, "seen": zeros, "counts": zeros}
            if self.estimator == "variational":
                return {"eta": zeros[0]}
            return {}
        out = {}
        for key, value in self._state.items():
            if not is_array_api_obj(value) or type(value) is not type(like):
                value = xp.asarray(to_numpy(value), device=device(like))
            if value.dtype != like.dtype:
                value = xp.astype(value, like.dtype)
            out[key] = value
        return out

    # -- estimation ----------------------------------------------------------------------

    def batch_sampler(self, n_samples: int, *, num_batches: int | None = None, seed: Any = None):
        """An :class:`MLMCBatchSampler` matching this multilevel estimator.

        Examples
        --------
        >>> from tiltlab.minibatch import MinibatchTilt
        >>> tilt = MinibatchTilt(1.0, estimator="mlmc", base_batch_size=2, max_level=2)
        >>> sorted({len(b) for b in tilt.batch_sampler(64, num_batches=50, seed=0)})
        [4, 8]
        """
        if self.estimator != "mlmc":
            raise ValueError("`batch_sampler` is for estimator='mlmc'")
        return MLMCBatchSampler(
            n_samples, self.base_batch_size, self.max_level, num_batches=num_batches, seed=seed
        )

    def _mlmc_level(self, n: int) -> int | None:
        """The level of a batch of ``n`` samples (None: the whole data set)."""
        if self.n_samples is not None and n == self.n_samples:
            return None
        base = self.base_batch_size
        ratio = n // base
        if n % base == 0 and ratio >= 2 and ratio & (ratio - 1) == 0:
            level = ratio.bit_length() - 1
            if level <= self.max_level:
                return level
        sizes = [base * 2**j for j in range(1, self.max_level + 1)]
        raise ValueError(
            f"`losses` has {n} samples; estimator='mlmc' needs a batch of one of the sizes "
            f"{sizes} (draw them with `batch_sampler`) or of `n_samples`"
        )

    def _prepare(self, losses: Any, groups: Any) -> tuple:
        """Validated ``(xp, losses, values, t_group, t_sample, codes, mask)`` of a batch."""
        xp, losses = check_losses(losses, self.check_finite)
        acc = P.accumulation_dtype(losses.dtype, xp)
        values = xp.astype(_detach(losses), acc)
        t_group, t_sample = self.current_tilts()
        if self.estimator == "variational" and math.isinf(t_sample):
            raise ValueError("`t` must be finite for estimator='variational'")
        t_group, t_sample = fit_tilt(t_group, acc, xp), fit_tilt(t_sample, acc, xp)
        codes = mask = None
        if self.hierarchical:
            codes = check_groups(groups, values.shape[0], self.n_groups, xp, values)
            mask = group_mask(codes, self.n_groups, acc, xp)
        elif groups is not None:
            raise ValueError("`groups` is for group-level tilting: pass `tilts=` and `n_groups=`")
        return xp, losses, values, t_group, t_sample, codes, mask

    def statistics(self, losses: Any, groups: Any = None) -> Any:
        """Mergeable statistics of this batch at the current tilt (does not change the state).

        For data-parallel training without :class:`tiltlab.torch.TiltedLoss`: each process
        computes the statistics of its batch, the processes exchange them (an all-gather
        of ``7 * n_groups`` numbers), :meth:`combine` merges them, and
        ``weights(losses, groups, combined=...)`` on each process gives the weights of one
        call on the union of the batches. Those weights are normalised over the union:
        *sum* the gradients across processes (or multiply by the number of processes
        where they are averaged). Running and variational estimators.

        Returns
        -------
        array, shape (7, n_groups)
            The packed tilted state of the batch (:mod:`tiltlab.accumulator.packed`): per
            group the largest and the smallest loss, the count, the shifted sums of
            ``exp`` and ``expm1`` of ``t (l - shift)``, the sum of ``l - shift`` and the
            shifted sum of ``exp(2 t (l - shift))``.

        Examples
        --------
        >>> import numpy as np
        >>> import tiltlab
        >>> from tiltlab.minibatch import MinibatchTilt
        >>> losses = np.array([0.2, 0.5, 0.1, 3.0])
        >>> tilts = [MinibatchTilt(-2.0), MinibatchTilt(-2.0)]    # one per process
        >>> parts = [losses[:2], losses[2:]]                        # their batches
        >>> stats = [a.statistics(b) for a, b in zip(tilts, parts)]  # all-gathered
        >>> w = [a.weights(b, combined=a.combine(stats)) for a, b in zip(tilts, parts)]
        >>> w = np.concatenate(w)
        >>> bool(np.allclose(w, tiltlab.tilted_weights(losses, -2.0)))
        True
        """
        if self.estimator == "mlmc":
            raise ValueError("`statistics` is for the running and variational estimators")
        xp, _, values, _, t_sample, _, mask = self._prepare(losses, groups)
        return batch_stats(values, mask, t_sample, xp)

    def combine(self, statistics: Any) -> Any:
        """Merge the :meth:`statistics` of disjoint batches (a sequence of arrays, or one
        array of shape ``(P, 7, n_groups)``) into the statistics of their union; exact, in
        the log domain."""
        if is_array_api_obj(statistics):
            stacked = statistics
            xp = namespace_of(statistics=stacked)
        else:
            parts = list(statistics)
            if not parts or not all(is_array_api_obj(p) for p in parts):
                raise TypeError("`statistics` must be a non-empty sequence of arrays")
            xp = namespace_of(statistics=parts[0])
            stacked = xp.stack(parts)
        if stacked.ndim != 3 or tuple(stacked.shape[1:]) != (N_FIELDS, self.n_groups):
            raise ValueError(
                f"`statistics` must hold arrays of shape ({N_FIELDS}, {self.n_groups}), got "
                f"{tuple(stacked.shape)}"
            )
        t_sample = fit_tilt(self.current_tilts()[1], stacked.dtype, xp)
        return merge(stacked, t_sample, xp)

    def _step(self, losses: Any, groups: Any, combined: Any = None) -> tuple[Any, Any, Any]:
        xp, losses, values, t_group, t_sample, codes, mask = self._prepare(losses, groups)
        n = values.shape[0]
        state = self._state_like(values, xp)
        if self.estimator == "mlmc":
            if combined is not None:
                raise ValueError("`combined` is for the running and variational estimators")
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                level = self._mlmc_level(n)
                prob = 1.0 if level is None else float(self._level_p[level - 1])
                t_s = P.const(t_sample, values, xp)
                weights, value = mlmc_step(
                    values, self.base_batch_size, level or 0, prob, level is None, t_s, xp
                )
            self.step += 1
            return losses, weights, value
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if combined is None:
                stats = batch_stats(values, mask, t_sample, xp)
            else:
                stats = check_stats(combined, self.n_groups, values, xp)
            # a batch with a NaN or infinite loss (check_finite=False) leaves the state as
            # it was and gets NaN weights, at every tilt
            ok = xp.all(xp.isfinite(values)) & xp.all(xp.isfinite(stats))
            nan = P.const(math.nan, values, xp)
            if self.estimator == "running":
                value, coef, risk, seen, counts = running_from_stats(
                    stats,
                    t_group,
                    t_sample,
                    state["risk"],
                    state["seen"],
                    state["counts"],
                    self.lam,
                    xp,
                )
                weights = sample_weights(values, risk, stats, codes, coef, t_sample, xp)
                new = {"risk": risk, "seen": seen, "counts": counts}
                new_state = {k: xp.where(ok, v, state[k]) for k, v in new.items()}
                # a group absent from this batch (or a skipped batch) keeps its last ESS
                ess = xp.where(ok, ess_fraction(stats, xp), nan)
                last = self._last_ess
                if last is not None and type(last) is type(ess) and last.dtype == ess.dtype:
                    ess = xp.where(xp.isnan(ess), last, ess)
                self._last_ess = ess
            else:
                ready = P.const(float(self._state is not None), values, xp) > 0
                value, eta, _, b_risk, coef = variational_from_stats(
                    stats, t_sample, state["eta"], ready, xp
                )
                weights = sample_weights(values, eta, stats, None, coef, t_sample, xp)
                if not bool(ok):
                    new_state = self._state
                else:
                    if not bool(xp.all(xp.isfinite(weights))):
                        raise ValueError(
                            "`losses`: the variational weights exp(t (loss - eta)) "
                            "overflowed; this batch is far from the current eta: lower `t` "
                            "or use estimator='running' (its weights are bounded by 1/lam)"
                        )
                    # a step of size lam in s = e^{t eta}, preconditioned by the curvature
                    # at the optimum: s <- (1 - lam) s + lam e^{t R_B}, in the log domain
                    new_state = {"eta": P.running_update(eta, b_risk, t_sample, self.lam, xp)}
            weights = xp.where(ok, weights, nan)
            value = xp.where(ok, value, nan)
        self._state = new_state
        self.step += 1
        return losses, weights, value

    def weights(self, losses: Any, groups: Any = None, *, combined: Any = None) -> Any:
        """Weights of this batch's samples in the estimated full-data gradient.

        Updates the state and advances the step.

        Parameters
        ----------
        losses : array, shape (B,)
            Per-sample losses of the batch (any array-API library; not differentiated).
        groups : array of int, shape (B,), optional
            Group labels in ``[0, n_groups)``; required with ``tilts``.
        combined : array, optional
            The :meth:`combine`-d statistics of this batch and the batches of the other
            processes at this step: the weights are then those of one call on the union
            (see :meth:`statistics`).

        Returns
        -------
        array, shape (B,)
            In the namespace and on the device of ``losses``; float32 for half-precision
            losses.

        Examples
        --------
        >>> import numpy as np
        >>> import tiltlab
        >>> from tiltlab.minibatch import MinibatchTilt
        >>> l, g = np.array([0.1, 0.4, 2.0, 3.0]), np.array([0, 0, 1, 1])
        >>> tilt = MinibatchTilt(tilts=(1.0, -2.0), n_groups=2)
        >>> w = tilt.weights(l, groups=g)
        >>> bool(np.allclose(w, tiltlab.hierarchical_weights(l, g, (1.0, -2.0))))
        True
        """
        return self._step(losses, groups, combined)[1]

    def __call__(self, losses: Any, groups: Any = None, *, combined: Any = None) -> Any:
        """A scalar whose gradient is the estimate and whose value is the risk estimate.

        For autograd backends (PyTorch) the result is ``value + sum_i w_i (l_i -
        l_i.detach())``: backpropagating it gives ``sum_i w_i grad l_i``. Elsewhere it is
        the 0-d value. Updates the state and advances the step.

        Examples
        --------
        >>> import torch
        >>> from tiltlab.minibatch import MinibatchTilt
        >>> losses = torch.tensor([0.5, 1.5], requires_grad=True)
        >>> MinibatchTilt(0.0)(losses).backward()
        >>> losses.grad.tolist()
        [0.5, 0.5]
        """
        losses, weights, value = self._step(losses, groups, combined)
        if not getattr(losses, "requires_grad", False):
            return value
        return value + (weights * (losses - losses.detach())).sum()

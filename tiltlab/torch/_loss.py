"""`TiltedLoss`: tilted losses as a PyTorch module, for training on minibatches."""

from __future__ import annotations

import math
from typing import Any

import torch

from tiltlab.accumulator import packed as P
from tiltlab.minibatch import level_probabilities
from tiltlab.minibatch.checks import (
    check_ess,
    check_estimator,
    check_lam,
    check_mlmc_data_size,
    check_positive_int,
    check_tilt_spec,
)
from tiltlab.minibatch.steps import group_mask

from . import _steps as steps
from ._accumulate import finish, micro_batch, observe_batch, planned_step
from ._checks import check_call
from ._grouped import lean_group_step, lean_tilts
from ._parallel import gather_stats, keep_state_dtypes, lean_running_step
from ._placement import misplaced, place_state, place_state_eagerly

__all__ = ["TiltedLoss"]


class TiltedLoss(torch.nn.Module):
    r"""A tilted loss for minibatch training (the ``torch.nn.Module`` form of
    :class:`tiltlab.minibatch.MinibatchTilt`).

    Wraps a per-sample criterion, ``TiltedLoss(nn.CrossEntropyLoss(reduction="none"),
    t=-2)`` called as ``loss_fn(logits, target)``, or, without a criterion, takes a vector
    of per-sample losses, ``TiltedLoss(t=-2)(losses)``. It returns a scalar whose gradient
    is the estimator's tilted gradient :math:`\sum_i w_i \nabla \ell_i` and whose value is
    the current estimate of the tilted risk of the whole data (at t = 0: exactly the mean
    of the batch, as ``reduction="mean"``). Estimators and their state are those of
    :class:`~tiltlab.minibatch.MinibatchTilt`; the state lives in registered buffers, so
    ``.to(device)``, ``state_dict()``/``load_state_dict()`` and checkpoints carry it, and
    it moves to the device of the losses on the first call (compiled or not).

    The tilt is a Python number (kept in float64; settable, ``loss_fn.t = -1.0``) or a
    schedule, a callable of the step (see :func:`~tiltlab.minibatch.linear_schedule`).
    For noisy labels the paper ramps t from 0 to its final value; see the user guide for
    what that changes.

    In evaluation mode (``loss_fn.eval()``) a call uses the state without changing it and
    does not advance the step.

    **Precision.** The running state is kept in float32 or wider, and in float64 for
    float64 losses: a module-wide cast (``.half()``, ``.bfloat16()``, a parent model's
    ``.to(dtype)``) never narrows it, and float16/bfloat16/autocast losses are accumulated
    in float32 (autocast is switched off inside).

    **No host synchronisation.** A call never reads a value from the device (except the
    tilt solved for ``ess``, read once eagerly to keep it in ``t``): a batch with
    a NaN or infinite loss (or a group label out of range) is detected on the device,
    returns NaN, leaves the state as it was and is counted; :meth:`check` reports it (one
    read). On the CPU, where reading costs nothing, a call with ``check_finite=True``
    raises at once instead. ``torch.compile(fullgraph=True)`` traces it without graph
    breaks once the state is on the losses' device (``loss_fn.to(device)`` before the
    first compiled call; without ``fullgraph`` a compiled first call moves it itself,
    with one graph break in that trace). A state narrower than the losses is read in
    their dtype and written back in its own inside the graph: ``loss_fn.double()`` before
    compiling keeps a float64 state for float64 losses. ``ess`` is solved inside the
    graph as eagerly.

    **Data-parallel and gradient accumulation.** ``distributed=True`` exchanges each
    batch's statistics (per group: extremes, shifted sums, counts: ``7 * n_groups``
    numbers) with one all-gather in the forward pass, so that every process holds the
    same state and the gradient averaged by ``DistributedDataParallel`` is the gradient of
    one process that saw the global batch (running and variational estimators, sample and
    group level; with ``ess`` the losses themselves are gathered, so that the tilt is
    solved on the global batch). A process's local batch may be empty.

    Gradient accumulation comes in two exact forms. ``accumulation_steps=k`` (running
    estimator, sample level, ``t`` a number or a schedule) makes k micro-batches and
    :meth:`finish_step` equal one call on their union: each backward accumulates the
    gradient relative to a provisional state, and :meth:`finish_step` multiplies what
    is in ``.grad`` by one factor. Call it before clipping (as
    ``GradScaler.unscale_``) and before the backward of any other loss term (an L2
    penalty, an auxiliary loss), which it would rescale too. It is exact while the
    weights of the later micro-batches relative to the first, ``exp(t (l - a)) / n_0``
    (huge where their losses lie far from the first micro-batch's in the direction of
    ``t``), stay below ``finfo.max * sqrt(eps)`` of the losses' dtype (about
    ``exp(80.75)`` in float32, ``exp(691.8)`` in float64; the rest of the range is left
    to the backward pass): a micro-batch beyond that cannot be held in ``.grad`` beside
    the first one's gradient and raises ``ValueError`` before its backward, leaving the
    state as it was (on the CPU with ``check_finite``; elsewhere, or compiled, it is
    skipped and counted as a non-finite batch, see :meth:`check`). :meth:`observe` is the
    two-pass form: every micro-batch's losses are taken first without gradients, then
    the training pass weighs each micro-batch with the state of the union, so the
    gradient is final as it accumulates (group level and ``ess`` included, other loss
    terms and clipping as without accumulation), for one more forward pass per
    micro-batch. Both combine with ``distributed=True``: k micro-batches on each of P
    processes (the same k everywhere; DDP's ``no_sync()`` for all but the last
    backward) give the gradient and state of one call on all P k micro-batches.
    Empty micro-batches are legal. Refused at construction: ``accumulation_steps`` > 1
    with ``tilts``, ``ess`` or estimators other than ``"running"`` (use
    :meth:`observe`), and ``distributed=True`` or ``ess`` with ``estimator="mlmc"``
    (its batch sizes are the estimator's random levels).

    Parameters
    ----------
    criterion : callable, optional
        Per-sample loss ``criterion(input, target) -> (B,)`` (``reduction="none"``).
    t : float or callable, optional
        Sample-level tilt or schedule (default 0 when ``tilts`` is not given).
    tilts : pair, optional
        ``(t_group, t_sample)`` for group-level tilting (class labels, annotators...),
        with ``n_groups`` and ``groups=`` at each call. Running estimator only.
    estimator : {"running", "mlmc", "variational"}, default "running"
        For ``"variational"`` the auxiliary variable ``eta`` (in loss units, ``v = -t
        eta``) is a parameter of this module: give ``loss_fn.parameters()`` to the
        optimiser too. Its gradient is reversed for t < 0 (the saddle point: descent in
        the model, ascent in ``eta``). It starts at the first batch's tilted risk.
    lam, n_groups, base_batch_size, max_level, n_samples
        As for :class:`~tiltlab.minibatch.MinibatchTilt`.
    check_finite : bool, default True
        Report batches with NaN or infinite losses (at once on the CPU, by :meth:`check`
        elsewhere), and micro-batches that ``accumulation_steps`` cannot accumulate
        exactly (see above). With False they are still skipped (NaN value, state
        unchanged).
    accumulation_steps : int, default 1
        Micro-batches per optimiser step; with k > 1 call :meth:`finish_step` before
        clipping and each optimiser step (or :meth:`attach` the optimiser, without
        clipping and other loss terms).
    distributed : bool, default False
        Combine each step's statistics over the processes of ``process_group``.
    process_group : optional
        The ``torch.distributed`` group (default: the default group).
    ess : float or callable, optional
        Instead of ``t``: the effective sample size of each batch's tilted weights as a
        fraction of the batch, in (0, 1] (or a schedule of the step, e.g.
        ``linear_schedule(1.0, 0.6, steps)``). At each call the tilt of sign
        ``ess_sign`` at which the weights of the batch (of the global batch with
        ``distributed=True``, of the step's micro-batches with :meth:`observe`) keep
        that fraction is solved on the device (as :func:`tiltlab.tilt_for_ess` does on
        the host, to about 1e-13 relative; inside ``torch.compile`` too) and used for
        the step; ``loss_fn.t`` and :attr:`tilts_in_use` read it. A fraction no finite
        tilt reaches (not above the share of losses tied at the favoured extreme: below
        ``1/B``, or any fraction below 1 for equal losses) raises ``ValueError``; in a
        compiled call the batch is skipped and counted instead (see :meth:`check`).
    ess_sign : {-1, +1}, default -1
        The sign of the tilt solved for with ``ess``.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.torch import TiltedLoss
    >>> torch.manual_seed(0)
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Linear(4, 3)
    >>> loss_fn = TiltedLoss(torch.nn.CrossEntropyLoss(reduction="none"), t=-1.0)
    >>> X, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    >>> loss = loss_fn(model(X), y)
    >>> loss.backward()
    >>> loss.ndim, model.weight.grad.shape
    (0, torch.Size([3, 4]))
    """

    def __init__(
        self,
        criterion: Any = None,
        *,
        t: Any = None,
        tilts: Any = None,
        estimator: str = "running",
        lam: float = 0.1,
        n_groups: int | None = None,
        base_batch_size: int | None = None,
        max_level: int | None = None,
        n_samples: int | None = None,
        check_finite: bool = True,
        accumulation_steps: int = 1,
        distributed: bool = False,
        process_group: Any = None,
        ess: Any = None,
        ess_sign: int = -1,
    ):
        super().__init__()
        if criterion is not None and not callable(criterion):
            raise TypeError("`criterion` must be callable (a per-sample loss)")
        self.criterion = criterion
        self.estimator = check_estimator(estimator)
        self.lam = check_lam(lam)
        if sum(x is not None for x in (t, tilts, ess)) > 1:
            raise ValueError(
                "give at most one of `t` (sample level), `tilts` (group level) and `ess`"
            )
        self._ess = None if ess is None else check_ess(ess)
        if ess_sign not in (-1, 1) or isinstance(ess_sign, bool):
            raise ValueError(f"`ess_sign` must be -1 or +1, got {ess_sign!r}")
        self.ess_sign = int(ess_sign)
        if self._ess is not None and estimator == "mlmc":
            raise ValueError("`ess` needs estimator='running' or 'variational'")
        if self._ess is not None and accumulation_steps != 1:
            raise ValueError(
                "`ess` with `accumulation_steps` > 1: the tilt of the union of the "
                "micro-batches is known only after the last one, and a gradient accumulated "
                "at another tilt cannot be rescaled to it; use the two-pass form instead "
                "(`observe` each micro-batch without gradients, then the training pass)"
            )
        self.hierarchical = tilts is not None
        if self.hierarchical:
            if isinstance(tilts, (str, bytes)) or not hasattr(tilts, "__len__") or len(tilts) != 2:
                raise ValueError("`tilts` must be a pair (t_group, t_sample)")
            if self.estimator != "running":
                raise ValueError("`tilts` (group-level tilting) needs estimator='running'")
            if n_groups is None:
                raise ValueError("`n_groups` is required with `tilts`")
            self.n_groups = check_positive_int(n_groups, "n_groups")
            specs = (check_tilt_spec(tilts[0], "tilts[0]"), check_tilt_spec(tilts[1], "tilts[1]"))
        else:
            self.n_groups = 1
            specs = (0.0, check_tilt_spec(0.0 if t is None else t, "t"))
        self.check_finite = bool(check_finite)
        self.accumulation_steps = check_positive_int(accumulation_steps, "accumulation_steps")
        if self.accumulation_steps > 1 and (self.estimator != "running" or self.hierarchical):
            raise ValueError(
                "`accumulation_steps` > 1 needs the running estimator at sample level: at "
                "group level the final gradient weighs each group's accumulated gradient "
                "by its own factor, which one gradient buffer per parameter cannot hold; "
                "for group-level accumulation use the two-pass form (`observe` each "
                "micro-batch without gradients, then the training pass)"
            )
        self.distributed = bool(distributed)
        self.process_group = process_group
        if self.distributed and self.estimator == "mlmc":
            raise ValueError("`distributed=True` needs estimator='running' or 'variational'")
        self._values: list[float] = [0.0, 0.0]
        self._schedules: list[Any] = [None, None]
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.register_buffer("nonfinite", torch.zeros((), dtype=torch.int64), persistent=False)
        nan2 = torch.full((2,), math.nan, dtype=torch.float32)
        self.register_buffer("used", nan2, persistent=False)  # the tilts of the last step
        self._reported = 0
        self._micro = 0
        self.__dict__["_step_cache"] = (self.step, self.step._version, 0)
        for i, spec in enumerate(specs):
            self._set_tilt(i, spec)
        g = self.n_groups
        if self.estimator == "running":
            for name in ("risk", "seen", "counts"):
                self.register_buffer(name, torch.zeros(g, dtype=torch.float32))
            nan = torch.full((g,), math.nan, dtype=torch.float32)
            self.register_buffer("ess", nan, persistent=False)
            if self.accumulation_steps > 1:
                zeros = torch.zeros(P.N_FIELDS, g, dtype=torch.float32)
                self.register_buffer("pending", zeros, persistent=False)
                self.register_buffer("anchor", torch.zeros(g), persistent=False)
                self.register_buffer("anchor_coef", torch.zeros(g), persistent=False)
        elif self.estimator == "variational":
            if specs[1] is not None and not callable(specs[1]) and math.isinf(specs[1]):
                raise ValueError("`t` must be finite for estimator='variational'")
            self.eta = torch.nn.Parameter(torch.zeros((), dtype=torch.float32))
            self.register_buffer("ready", torch.zeros((), dtype=torch.float32))
        else:
            if base_batch_size is None:
                raise ValueError("`base_batch_size` is required for estimator='mlmc'")
            self.base_batch_size = check_positive_int(base_batch_size, "base_batch_size")
            self.max_level = check_positive_int(4 if max_level is None else max_level, "max_level")
            self._level_p = level_probabilities(self.max_level).tolist()
        self.n_samples = None if n_samples is None else check_positive_int(n_samples, "n_samples")
        if self.estimator == "mlmc" and self.n_samples is not None:
            check_mlmc_data_size(self.n_samples, self.base_batch_size, self.max_level)
        # the common case (one process, sample level, running) has a path of few operations
        self._lean = (
            self.estimator == "running"
            and not self.hierarchical
            and not self.distributed
            and self.accumulation_steps == 1
        )
        self._lean_group = (
            self.estimator == "running" and self.hierarchical and not self.distributed
        )

    # -- the tilt ------------------------------------------------------------------------

    def _set_tilt(self, index: int, spec: Any) -> None:
        if callable(spec):
            self._schedules[index] = spec
        else:
            self._schedules[index] = None
            self._values[index] = float(spec)

    @property
    def t(self) -> Any:
        """The sample-level tilt: a number, or the schedule; settable."""
        return self._schedules[1] if self._schedules[1] is not None else self._values[1]

    @t.setter
    def t(self, value: Any) -> None:
        spec = check_tilt_spec(value, "t")
        if self.estimator == "variational" and not callable(spec) and math.isinf(spec):
            raise ValueError("`t` must be finite for estimator='variational'")
        self._set_tilt(1, spec)

    @property
    def tilts(self) -> tuple:
        """``(t_group, t_sample)`` (numbers or schedules); settable on a group-level loss."""
        return tuple(s if s is not None else self._values[i] for i, s in enumerate(self._schedules))

    @tilts.setter
    def tilts(self, value: Any) -> None:
        if not self.hierarchical:
            raise ValueError("`tilts` can be set only on a group-level loss")
        self._set_tilt(0, check_tilt_spec(value[0], "tilts[0]"))
        self._set_tilt(1, check_tilt_spec(value[1], "tilts[1]"))

    def _host_step(self) -> int:
        """The step as a Python int, read from the device only after the buffer was
        written elsewhere (a load, a compiled call): its version counter tells."""
        step, cache = self.step, self.__dict__.get("_step_cache")
        if cache is None or cache[0] is not step or cache[1] != step._version:
            cache = (step, step._version, int(step))
            self.__dict__["_step_cache"] = cache
        return cache[2]

    def _advance(self, compiling: bool) -> None:
        host = None if compiling else self._host_step()
        self.step.add_(1)  # an integer buffer: never part of a graph
        if host is not None:
            self.__dict__["_step_cache"] = (self.step, self.step._version, host + 1)

    def _tilts_now(self, like: torch.Tensor, compiling: bool) -> list[Any]:
        return steps.tilts_now(self, like, compiling)

    def _solve_ess(self, values: torch.Tensor, compiling: bool) -> Any:
        return steps.solve_ess(self, values, compiling)

    def _record_tilts(self, t_group: Any, t_sample: Any, like: Any, compiling: bool) -> None:
        steps.record_tilts(self, t_group, t_sample, like, compiling)

    @property
    def tilts_in_use(self) -> tuple[float, float]:
        """``(t_group, t_sample)``: the tilts of the last training call, as Python floats,
        whatever set them (a number, a schedule at that step, or the tilt solved for
        ``ess``); NaN before the first call. For logging: one read from the device after
        a compiled call, none after an eager one (``t_group`` is 0 at sample level).

        Examples
        --------
        >>> import torch
        >>> from tiltlab.minibatch import linear_schedule
        >>> from tiltlab.torch import TiltedLoss
        >>> loss_fn = TiltedLoss(t=linear_schedule(0.0, -2.0, 4))
        >>> for _ in range(3):
        ...     _ = loss_fn(torch.tensor([0.1, 0.3, 2.0]))
        >>> loss_fn.tilts_in_use
        (0.0, -1.0)
        """
        return steps.used_tilts(self)

    def group_report(self) -> dict:
        """The running state per group, with the keys of
        :func:`tiltlab.diagnostics.group_report` (see
        :meth:`tiltlab.minibatch.MinibatchTilt.group_report`): ``"risk"``, ``"mass"``,
        ``"weight"`` (outer tilt at the current step), ``"ess"`` (of the last training
        batch, per group), ``"size"``, ``"group"``. Tensors on the state's device (nothing
        is read here); running estimator only.

        Examples
        --------
        >>> import torch
        >>> from tiltlab.torch import TiltedLoss
        >>> loss_fn = TiltedLoss(tilts=(1.0, 0.0), n_groups=2)
        >>> _ = loss_fn(torch.tensor([0.1, 0.3, 2.0, 4.0]), groups=torch.tensor([0, 0, 1, 1]))
        >>> rep = loss_fn.group_report()
        >>> [round(v, 4) for v in rep["risk"].tolist()], rep["mass"].tolist()
        ([0.2, 3.0], [0.5, 0.5])
        """
        return steps.report(self)

    # -- state ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every batch seen (the step counter restarts at 0)."""
        with torch.no_grad():
            self.step.zero_()
            for name in ("risk", "seen", "counts", "eta", "ready", "nonfinite", "anchor_coef"):
                if hasattr(self, name):
                    getattr(self, name).zero_()
        self.__dict__["_step_cache"] = (self.step, self.step._version, 0)
        self._reported = 0
        self._micro = 0
        for name in ("_plan", "_observed"):
            self.__dict__.pop(name, None)
        self.__dict__["_plan_open"] = False

    def check(self) -> None:
        """Raise if a batch since the last check had a NaN or infinite loss (or a group label
        out of range); such batches were skipped. One read from the device."""
        count = int(self.nonfinite)
        new, self._reported = count - self._reported, count
        if new > 0 and self.check_finite:
            raise ValueError(
                f"`losses`: {new} batch(es) contained NaN or infinite losses (or group labels "
                f"outside [0, n_groups), or, compiled, an `ess` fraction no tilt reaches, "
                f"or, with `accumulation_steps`, weights relative to the step's first "
                f"micro-batch beyond the range of the losses' dtype); they were skipped "
                f"(NaN value, state unchanged)"
            )

    def get_extra_state(self) -> dict:
        return {
            "tilts": [
                v if s is None else None for v, s in zip(self._values, self._schedules, strict=True)
            ]
        }

    def set_extra_state(self, state: Any) -> None:
        for i, value in enumerate(state.get("tilts", [])):
            if value is not None:
                self._set_tilt(i, check_tilt_spec(value, "state['tilts']"))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints of earlier versions keep the tilt in a buffer named "tilt"
        legacy = state_dict.pop(prefix + "tilt", None)
        if legacy is not None and prefix + "_extra_state" not in state_dict:
            state_dict[prefix + "_extra_state"] = {"tilts": [float(v) for v in legacy]}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.__dict__["_widened_for"] = None  # a load with assign=True may replace buffers

    def _apply(self, fn, recurse=True):
        # a module-wide cast (.half(), a parent's .to(dtype)) must not narrow the state;
        # a move keeps the host copy of the step (no read from the new device)
        cache, step = self.__dict__.get("_step_cache"), self._buffers.get("step")
        known = cache is not None and cache[0] is step and cache[1] == step._version
        out = keep_state_dtypes(self, lambda: super(TiltedLoss, self)._apply(fn, recurse))
        self.__dict__["_widened_for"] = None
        if known:
            self.__dict__["_step_cache"] = (self.step, self.step._version, cache[2])
        return out

    def extra_repr(self) -> str:
        return f"estimator={self.estimator!r}, tilts={self.tilts}, lam={self.lam}"

    # -- forward -------------------------------------------------------------------------

    def forward(self, input: Any, target: Any = None, groups: Any = None):
        """The tilted loss of this batch (see the class documentation); updates the state.

        ``loss_fn(input, target, groups=None)`` with a criterion, ``loss_fn(losses,
        groups=None)`` without.
        """
        losses = steps.per_sample(self, input, target)
        compiling = torch.compiler.is_compiling()
        if not compiling:
            check_call(self, losses, groups)
            place_state(self, losses)
        elif misplaced(self, losses):  # eagerly: a graph break in the first trace only
            place_state_eagerly(self, losses)
        kind = losses.device.type
        if compiling and kind in ("cpu", "cuda"):
            # the state's arithmetic in its own precision; the query of the autocast state
            # below is not traced by every torch release (a graph break at every step)
            with torch.autocast(device_type=kind, enabled=False):
                return self._tilted(losses, groups, compiling)
        if not torch.amp.is_autocast_available(kind) or not torch.is_autocast_enabled(kind):
            return self._tilted(losses, groups, compiling)
        with torch.autocast(device_type=kind, enabled=False):
            return self._tilted(losses, groups, compiling)

    def _tilted(self, losses: torch.Tensor, groups: Any, compiling: bool) -> torch.Tensor:
        xp = steps.xp_torch
        acc = P.accumulation_dtype(losses.dtype, torch)
        values = losses.detach().to(acc)
        if self.training and self.__dict__.get("_plan_open"):
            return planned_step(self, losses, values, groups, xp)
        if self._ess is not None:
            solved = self._solve_ess(values, compiling)
        t_group, t_sample = self._tilts_now(values, compiling)
        if self._ess is not None and compiling:
            t_sample = solved
        if self.training:
            self._record_tilts(t_group, t_sample, values, compiling)
        update = self.training  # eval mode: evaluate with the state, leave it as it is
        if (
            self._lean
            and P.is_number(t_sample)
            and (t_sample == 0 or 0.05 <= abs(t_sample) < math.inf)
        ):
            return lean_running_step(self, losses, values, t_sample, update, compiling)
        if self._lean_group and lean_tilts(t_group, t_sample):
            return lean_group_step(
                self, losses, values, groups, t_group, t_sample, update, compiling
            )
        if self.estimator == "mlmc":
            return steps.mlmc(self, losses, values, t_sample, update, compiling)
        codes = mask = None
        valid = None
        if self.hierarchical:
            codes = groups.to(torch.int64)
            valid = ((codes >= 0) & (codes < self.n_groups)).all()
            codes = codes.clamp(0, self.n_groups - 1)
            mask = group_mask(codes, self.n_groups, acc, xp)
        stats = P.block(values, mask, t_sample, xp)
        world = 1
        if self.distributed:
            stats, world = gather_stats(stats, t_sample, self.process_group, xp)
        ok = torch.isfinite(stats).all()
        for tilt in (t_group, t_sample):
            if not P.is_number(tilt):
                ok = ok & ~torch.isnan(tilt)
        ok = ok if valid is None else ok & valid
        if not compiling and losses.device.type == "cpu" and self.check_finite and not bool(ok):
            # on the CPU reading costs nothing: a bad batch raises at once
            raise ValueError(
                "`losses` contains NaN or infinite values (or `groups` labels outside "
                "[0, n_groups)); every loss must be finite"
            )
        if self.estimator == "running":
            if self.accumulation_steps > 1 and update:
                value, weights = self._accumulate(
                    values, stats, t_group, t_sample, ok, compiling, losses.dtype
                )
            else:
                value, weights = steps.running(
                    self, values, stats, codes, t_group, t_sample, ok, update
                )
            extra = None
        else:
            value, weights, extra = steps.variational(self, values, stats, t_sample, ok, update)
        if update:
            with torch.no_grad():
                self.nonfinite.add_((~ok).to(torch.int64))
            if self.accumulation_steps == 1:
                self._advance(compiling)
        value = torch.where(ok, value, torch.full_like(value, math.nan)).detach()
        if world > 1:
            weights = weights * world  # DistributedDataParallel averages the gradients
        if not losses.requires_grad and extra is None:
            return value
        out = value + torch.dot(weights.detach(), losses.to(acc) - values)
        return out if extra is None else out + extra

    def _accumulate(self, values, stats, t_group, t_sample, ok, compiling, grad_dtype=None):
        return micro_batch(
            self, values, stats, t_group, t_sample, ok, compiling, steps.xp_torch, grad_dtype
        )

    def finish_step(self, parameters: Any) -> None:
        """End an accumulation step: rescale the gradients accumulated over the
        micro-batches to the final normaliser and commit the state.

        Call it after the last micro-batch's ``backward()`` and before clipping and
        ``optimizer.step()``, as ``GradScaler.unscale_``. It multiplies everything in the
        ``.grad`` of ``parameters`` by one factor: backward other loss terms (an L2
        penalty, an auxiliary loss) after it, not with the micro-batches, or use the
        two-pass :meth:`observe`, which needs no rescaling. Each micro-batch's
        backward accumulated ``c_0 sum_i exp(t (l_i - a)) grad l_i``, relative to the
        provisional state ``a`` (and coefficient ``c_0``) after the first micro-batch; the
        statistics of every micro-batch were merged exactly, so the final state ``R`` and
        coefficient ``c`` are those of one call on their union, and multiplying the
        gradients by ``(c / c_0) exp(t (a - R))`` (at most 1) gives that call's gradient.
        A micro-batch whose weights ``c_0 exp(t (l_i - a))`` would leave the range of the
        losses' dtype (see the class) raised, or was skipped and counted, in its own call.
        Without pending micro-batches it does nothing.
        """
        finish(self, parameters, steps.xp_torch)

    def observe(self, input: Any, target: Any = None, groups: Any = None) -> None:
        """The first pass of a two-pass step: take a micro-batch's losses (computed
        without gradients) into the statistics of the step, changing nothing else.

        Observe every micro-batch of the step (on every process), then run the training
        pass over the same micro-batches, in the same order: each call then weighs its
        samples with the state of one call on the union of all of them (the tilt solved
        for ``ess`` on that union, the group level included), so the gradient is final
        as each backward accumulates it. No :meth:`finish_step`, no rescaling: clip and
        add other loss terms as without accumulation. The step ends after as many
        training calls as observed micro-batches. Costs one more forward pass per
        micro-batch (without gradients) and the micro-batches' losses kept on the device
        until the training pass (exchanged once between processes with ``ess``). The
        losses of the two passes should agree (a model in the same mode, the same
        dropout masks): the statistics are those of the observed ones. Running
        estimator, ``accumulation_steps=1``, eager (the model may be compiled).

        Examples
        --------
        >>> import torch
        >>> from tiltlab.torch import TiltedLoss
        >>> loss_fn = TiltedLoss(tilts=(1.0, -1.0), n_groups=2)
        >>> parts = [(torch.tensor([0.2, 3.0]), torch.tensor([0, 1])),
        ...          (torch.tensor([0.5, 1.0]), torch.tensor([1, 1]))]
        >>> for l, g in parts:  # the first pass (with the model: under torch.no_grad())
        ...     loss_fn.observe(l, groups=g)
        >>> for l, g in parts:  # the training pass: backward() after each call
        ...     _ = loss_fn(l, groups=g)
        >>> union = TiltedLoss(tilts=(1.0, -1.0), n_groups=2)
        >>> _ = union(torch.cat([l for l, _ in parts]), groups=torch.tensor([0, 1, 1, 1]))
        >>> torch.allclose(loss_fn.risk, union.risk)
        True
        """
        losses = steps.per_sample(self, input, target)
        self.__dict__["_plan_open"] = True
        check_call(self, losses, groups)
        observe_batch(self, losses, groups)

    def attach(self, optimizer: torch.optim.Optimizer) -> Any:
        """Call :meth:`finish_step` on the optimiser's parameters before each of its steps;
        returns the hook's handle (``handle.remove()`` detaches it).

        The hook runs inside ``optimizer.step()``, after any clipping and after the
        backward of every other loss term, which it would rescale: with gradient clipping
        or other terms call :meth:`finish_step` yourself before them (the hook then has
        nothing left to do)."""

        def hook(opt, args, kwargs):
            self.finish_step(p for group in opt.param_groups for p in group["params"])

        return optimizer.register_step_pre_hook(hook)

"""`TiltedLoss`: tilted losses as a PyTorch module, for training on minibatches.

This module imports PyTorch; ``import tiltlab`` does not import it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tiltlab._compat import library_namespace
from tiltlab.minibatch import _kernels as K
from tiltlab.minibatch._sampling import level_probabilities
from tiltlab.minibatch._validation import (
    check_estimator,
    check_lam,
    check_positive_int,
    check_tilt_spec,
)

__all__ = ["TiltedLoss"]

#: the array-API namespace of PyTorch tensors (the minibatch kernels are written for it)
xp_torch = library_namespace(torch.empty(0))


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
    ``.to(device)``, ``state_dict()``/``load_state_dict()`` and checkpoints carry it
    (with DDP, each process keeps the state of its own batches).

    The tilt is settable (``loss_fn.t = -1.0``) or a schedule, a callable of the step
    (a 0-d integer tensor counting the calls). On the handwritten-digits data with 80%
    of the labels replaced at random (an MLP trained with Adam), a constant ``t = -2``
    from the first step collapsed training to a single class (test accuracy 0.10), while
    the paper's linear ramp from 0 to -2, ``t=linear_schedule(0.0, -2.0, steps)``, reached
    0.89 (ERM: 0.67).

    In evaluation mode (``loss_fn.eval()``) a call uses the state without changing it and
    does not advance the step, so validation batches do not enter the running normaliser
    or move the schedule; ``loss_fn.train()`` resumes the updates.

    Half-precision and autocast losses are accumulated in float32 (autocast is switched
    off inside). ``torch.compile(fullgraph=True)`` traces it without graph breaks (the
    NaN check, a host read, is skipped there: a NaN batch returns NaN and leaves the state
    unchanged).

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
    lam, n_groups, base_batch_size, max_level, n_samples, check_finite
        As for :class:`~tiltlab.minibatch.MinibatchTilt`.

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
    ):
        super().__init__()
        if criterion is not None and not callable(criterion):
            raise TypeError("`criterion` must be callable (a per-sample loss)")
        self.criterion = criterion
        self.estimator = check_estimator(estimator)
        self.lam = check_lam(lam)
        if t is not None and tilts is not None:
            raise ValueError("give at most one of `t` (sample level) and `tilts` (group level)")
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
        self.register_buffer("tilt", torch.zeros(2, dtype=torch.float32))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self._schedules: list[Any] = [None, None]
        for i, spec in enumerate(specs):
            self._set_tilt(i, spec)
        if self.estimator == "running":
            g = self.n_groups
            self.register_buffer("risk", torch.zeros(g, dtype=torch.float32))
            self.register_buffer("seen", torch.zeros(g, dtype=torch.float32))
            self.register_buffer("counts", torch.zeros(g, dtype=torch.float32))
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

    # -- the tilt ------------------------------------------------------------------------

    def _set_tilt(self, index: int, spec: Any) -> None:
        if callable(spec):
            self._schedules[index] = spec
        else:
            self._schedules[index] = None
            with torch.no_grad():
                self.tilt[index] = spec

    @property
    def t(self) -> Any:
        """The sample-level tilt: a number, or the schedule; settable."""
        return self._schedules[1] if self._schedules[1] is not None else float(self.tilt[1])

    @t.setter
    def t(self, value: Any) -> None:
        spec = check_tilt_spec(value, "t")
        if self.estimator == "variational" and not callable(spec) and math.isinf(spec):
            raise ValueError("`t` must be finite for estimator='variational'")
        self._set_tilt(1, spec)

    @property
    def tilts(self) -> tuple:
        """``(t_group, t_sample)`` (numbers or schedules); settable on a group-level loss."""
        return tuple(
            s if s is not None else float(self.tilt[i]) for i, s in enumerate(self._schedules)
        )

    @tilts.setter
    def tilts(self, value: Any) -> None:
        if not self.hierarchical:
            raise ValueError("`tilts` can be set only on a group-level loss")
        self._set_tilt(0, check_tilt_spec(value[0], "tilts[0]"))
        self._set_tilt(1, check_tilt_spec(value[1], "tilts[1]"))

    def _current(self, index: int, like: torch.Tensor) -> torch.Tensor:
        schedule = self._schedules[index]
        value = self.tilt[index] if schedule is None else schedule(self.step)
        return torch.as_tensor(value, device=like.device).to(like.dtype)

    def reset(self) -> None:
        """Forget every batch seen (the step counter restarts at 0)."""
        with torch.no_grad():
            self.step.zero_()
            for name in ("risk", "seen", "counts", "eta", "ready"):
                if hasattr(self, name):
                    getattr(self, name).zero_()

    def extra_repr(self) -> str:
        return f"estimator={self.estimator!r}, tilts={self.tilts}, lam={self.lam}"

    # -- forward -------------------------------------------------------------------------

    def _check(self, losses: torch.Tensor, groups: Any) -> None:
        if losses.ndim != 1:
            raise ValueError(
                f"`losses` must be one-dimensional (one loss per sample), got shape "
                f"{tuple(losses.shape)}; use reduction='none' in the criterion"
            )
        if losses.shape[0] == 0:
            raise ValueError("`losses` is empty")
        if not losses.is_floating_point():
            raise TypeError(f"`losses` must hold real floating values, got {losses.dtype}")
        if self.check_finite and not bool(torch.isfinite(losses).all()):
            what = "NaN" if bool(torch.isnan(losses).any()) else "infinite"
            raise ValueError(f"`losses` contains {what} values; every loss must be finite")
        if self.hierarchical:
            if groups is None:
                raise ValueError("`groups` is required with `tilts` (one label per loss)")
            if not isinstance(groups, torch.Tensor):
                raise TypeError("`groups` must be a tensor of integer labels")
            if groups.shape != losses.shape:
                raise ValueError(
                    f"`groups` must have one label per loss (shape {tuple(losses.shape)}), "
                    f"got shape {tuple(groups.shape)}"
                )
            if groups.is_floating_point() or groups.dtype == torch.bool:
                raise TypeError(f"`groups` must hold integer labels, got {groups.dtype}")
            if not bool(((groups >= 0) & (groups < self.n_groups)).all()):
                raise ValueError(
                    f"`groups` labels must lie in [0, n_groups) = [0, {self.n_groups})"
                )
        elif groups is not None:
            raise ValueError("`groups` is for group-level tilting: pass `tilts=` and `n_groups=`")

    def _mlmc_level(self, n: int) -> int | None:
        if self.n_samples is not None and n == self.n_samples:
            return None
        ratio = n // self.base_batch_size
        if n % self.base_batch_size == 0 and ratio >= 2 and ratio & (ratio - 1) == 0:
            level = ratio.bit_length() - 1
            if level <= self.max_level:
                return level
        sizes = [self.base_batch_size * 2**j for j in range(1, self.max_level + 1)]
        raise ValueError(
            f"`losses` has {n} samples; estimator='mlmc' needs a batch of one of the sizes "
            f"{sizes} or of `n_samples`"
        )

    def forward(self, input: torch.Tensor, target: Any = None, groups: Any = None):
        """The tilted loss of this batch (see the class documentation); updates the state.

        ``loss_fn(input, target, groups=None)`` with a criterion, ``loss_fn(losses,
        groups=None)`` without.
        """
        if self.criterion is not None:
            if target is None:
                raise ValueError("`target` is required: this loss wraps a criterion")
            losses = self.criterion(input, target)
        else:
            if target is not None:
                raise ValueError(
                    "`target` given but no criterion: pass per-sample losses, or build the "
                    "loss as TiltedLoss(criterion, ...)"
                )
            losses = input
        if not torch.compiler.is_compiling():
            self._check(losses, groups)
        with torch.autocast(device_type=losses.device.type, enabled=False):
            return self._tilted(losses, groups)

    def _tilted(self, losses: torch.Tensor, groups: Any) -> torch.Tensor:
        xp = xp_torch
        acc = torch.promote_types(K.accumulation_dtype(losses.dtype, torch), self.tilt.dtype)
        values = losses.detach().to(acc)
        t_group, t_sample = self._current(0, values), self._current(1, values)
        finite = torch.isfinite(values).all()
        n = values.shape[0]
        update = self.training  # eval mode: evaluate with the state, leave it as it is
        if update:
            with torch.no_grad():
                self.step.add_(1)
        if self.estimator == "running":
            if self.hierarchical:
                mask = K.group_mask(groups, self.n_groups, acc, xp)
            else:
                mask = torch.ones((n, 1), dtype=acc, device=values.device)
            weights, value, risk, seen, counts = K.hierarchical_step(
                values,
                mask,
                t_group,
                t_sample,
                self.risk.to(acc),
                self.seen.to(acc),
                self.counts.to(acc),
                self.lam,
                xp,
            )
            if update:
                with torch.no_grad():
                    for buf, new in ((self.risk, risk), (self.seen, seen), (self.counts, counts)):
                        buf.copy_(torch.where(finite, new, buf.to(acc)))
            extra = 0.0
        elif self.estimator == "mlmc":
            level = self._mlmc_level(n)
            prob = 1.0 if level is None else self._level_p[level - 1]
            weights, value = K.mlmc_step(
                values, self.base_batch_size, level or 0, prob, level is None, t_sample, xp
            )
            extra = 0.0
        else:
            eta_now = self.eta.detach().to(acc)
            weights, value, eta_used, eta_grad, _ = K.variational_step(
                values, t_sample, eta_now, self.ready > 0, xp
            )
            if not torch.compiler.is_compiling() and not bool(torch.isfinite(weights).all()):
                raise ValueError(
                    "`losses`: the variational weights exp(t (loss - eta)) overflowed; this "
                    "batch is far from the current eta: lower `t` or use estimator='running' "
                    "(its weights are bounded by 1/lam)"
                )
            if update:
                with torch.no_grad():
                    self.eta.copy_(torch.where(finite, eta_used, eta_now))
                    self.ready.copy_(torch.where(finite, torch.ones_like(self.ready), self.ready))
            extra = eta_grad.detach() * (self.eta - self.eta.detach())
        value = value.detach()
        if not losses.requires_grad and not isinstance(extra, torch.Tensor):
            return value
        return value + (weights.detach() * (losses.to(acc) - values)).sum() + extra

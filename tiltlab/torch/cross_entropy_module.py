"""`TiltedCrossEntropy`: the tilted cross-entropy head as a module, over the running state,
gradient accumulation and data-parallel exchange of :class:`TiltedLoss`."""

from __future__ import annotations

from typing import Any

import torch

from ._loss import TiltedLoss
from .cross_entropy import LEVELS, NORMALIZE, tilted_cross_entropy, token_cross_entropy

__all__ = ["TiltedCrossEntropy"]


class TiltedCrossEntropy(torch.nn.Module):
    r"""The tilted cross-entropy of a language model's output layer, for training.

    ``loss_fn(hidden, weight, targets, bias=None, groups=None)`` forms the per-token
    cross-entropy of ``hidden @ weight.T + bias`` without the logits
    (:func:`token_cross_entropy`: chunks of tokens, recomputed in the backward pass),
    reduces them to the items of ``level`` (tokens, or each sequence's mean token loss),
    and hands the items to a :class:`TiltedLoss`, whose running state, gradient
    accumulation (``accumulation_steps``, :meth:`finish_step`) and data-parallel exchange
    (``distributed=True``) it uses as they are: the value is that module's running
    estimate of the tilted risk, and its gradient the tilted gradient (exactly the batch's
    tilted risk and its gradient at the first step). The state is the submodule
    ``loss_fn.tilted`` (its buffers are this module's: ``state_dict()`` and ``.to()``
    carry them).

    With ``normalize="count"`` there is no normaliser to carry: each call is
    :func:`tilted_cross_entropy` with ``normalize="count"`` (Dynamic Fine-Tuning at
    ``t = -1``), and ``accumulation_steps`` and ``distributed`` are refused.

    Parameters
    ----------
    t : float or callable, optional
        The tilt at token and sequence level (default 0), or a schedule of the step.
    tilts : pair, optional
        ``(t_outer, t_inner)`` with ``level="group"`` (and ``n_groups``).
    level : {"token", "sequence", "group"}
    ignore_index : int, default -100
    normalize : {"weights", "count"}
    chunk_size : int, optional
        Tokens per chunk of logits.
    accumulation_steps, distributed, process_group, lam
        As for :class:`TiltedLoss`.
    n_groups : int, optional
        The number of groups, for ``level="group"``; ``groups`` hold labels in
        ``[0, n_groups)``, per token or per sequence.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.torch import TiltedCrossEntropy
    >>> torch.manual_seed(0)
    <torch._C.Generator object at ...>
    >>> head = torch.nn.Linear(8, 50, bias=False)
    >>> loss_fn = TiltedCrossEntropy(t=-1.0, level="sequence")
    >>> hidden, targets = torch.randn(4, 6, 8), torch.randint(0, 50, (4, 6))
    >>> loss = loss_fn(hidden, head.weight, targets)
    >>> loss.backward()
    >>> head.weight.grad.shape
    torch.Size([50, 8])
    """

    def __init__(
        self,
        t: Any = None,
        *,
        tilts: Any = None,
        level: str = "token",
        ignore_index: int = -100,
        normalize: str = "weights",
        chunk_size: int | None = None,
        accumulation_steps: int = 1,
        distributed: bool = False,
        process_group: Any = None,
        n_groups: int | None = None,
        lam: float = 0.1,
    ):
        super().__init__()
        if level not in LEVELS:
            raise ValueError(f"`level` must be one of {LEVELS}, got {level!r}")
        if normalize not in NORMALIZE:
            raise ValueError(f"`normalize` must be one of {NORMALIZE}, got {normalize!r}")
        if (level == "group") != (tilts is not None):
            raise ValueError("`tilts=(t_outer, t_inner)` goes with level='group', and only")
        if level == "group" and t is not None:
            raise ValueError("level='group' takes `tilts`, not `t`")
        self.level = level
        self.ignore_index = ignore_index
        self.normalize = normalize
        self.chunk_size = chunk_size
        self.t_count = t
        if normalize == "count":
            if level == "group":
                raise ValueError("normalize='count' is defined for level='token' or 'sequence'")
            if accumulation_steps != 1 or distributed:
                raise ValueError(
                    "normalize='count' has no state to accumulate or exchange: use "
                    "`accumulation_steps=1` and `distributed=False` (scale the loss of "
                    "each micro-batch as for a mean)"
                )
            self.tilted = None
            return
        self.tilted = TiltedLoss(
            t=t, tilts=tilts, n_groups=n_groups, lam=lam,
            accumulation_steps=accumulation_steps, distributed=distributed,
            process_group=process_group,
        )

    def forward(self, hidden: Any, weight: Any, targets: Any, bias: Any = None,
                groups: Any = None) -> Any:
        """The tilted loss of this batch (see the class); updates the state."""
        if self.tilted is None:
            return tilted_cross_entropy(
                hidden, weight, targets, self.t_count, bias=bias, level=self.level,
                ignore_index=self.ignore_index, normalize="count", chunk_size=self.chunk_size,
            )
        if (groups is None) == (self.level == "group"):
            raise ValueError("`groups` goes with level='group', and only")
        tok = token_cross_entropy(hidden, weight, targets, bias=bias,
                                  ignore_index=self.ignore_index, chunk_size=self.chunk_size)
        ok = targets != self.ignore_index
        g = None if groups is None else torch.as_tensor(groups, device=tok.device)
        per_seq = self.level == "sequence" or (
            g is not None and tok.ndim == 2 and g.shape == tok.shape[:1]
        )
        if per_seq:
            if tok.ndim != 2:
                raise ValueError("sequence items need `hidden` of shape (B, T, H)")
            n = ok.sum(-1)
            keep = n > 0
            items = (tok * ok).sum(-1)[keep] / n[keep].to(tok.dtype)
            g = None if g is None else g[keep]
        else:
            if g is not None and g.shape != targets.shape:
                raise ValueError(
                    "`groups` must hold a label per token (the shape of `targets`) or per "
                    "sequence (shape (B,))"
                )
            items = tok[ok]
            g = None if g is None else g[ok]
        return self.tilted(items, groups=g)

    def finish_step(self, parameters: Any) -> None:
        """End an accumulation step (see :meth:`TiltedLoss.finish_step`)."""
        if self.tilted is not None:
            self.tilted.finish_step(parameters)

    def attach(self, optimizer: Any) -> Any:
        """Call :meth:`finish_step` before each step of ``optimizer`` (see
        :meth:`TiltedLoss.attach`)."""
        if self.tilted is None:
            raise ValueError("normalize='count' has no accumulation step to finish")
        return self.tilted.attach(optimizer)

    def group_report(self) -> dict:
        """The running state per group (see :meth:`TiltedLoss.group_report`)."""
        if self.tilted is None:
            raise ValueError("normalize='count' keeps no state")
        return self.tilted.group_report()

    def extra_repr(self) -> str:
        return f"level={self.level!r}, normalize={self.normalize!r}"

"""Checks of a `TiltedLoss` call (on the host, reading no tensor value)."""

from __future__ import annotations

from typing import Any

import torch

__all__: list[str] = []


def check_call(loss, losses: Any, groups: Any) -> None:
    """Types, shapes and devices of the losses and group labels of one call."""
    if not isinstance(losses, torch.Tensor):
        what = "the criterion's result" if loss.criterion is not None else "`losses`"
        raise TypeError(
            f"{what} must be a torch.Tensor of per-sample losses, got {type(losses).__name__}"
        )
    if losses.ndim != 1:
        raise ValueError(
            f"`losses` must be one-dimensional (one loss per sample), got shape "
            f"{tuple(losses.shape)}; use reduction='none' in the criterion"
        )
    if losses.shape[0] == 0 and not (
        loss.distributed or loss.accumulation_steps > 1 or loss.__dict__.get("_plan_open")
    ):
        raise ValueError(
            "`losses` is empty (an empty batch is legal with `distributed=True`, "
            "`accumulation_steps` > 1 or after `observe`: other batches of the step have "
            "samples)"
        )
    if not losses.is_floating_point():
        raise TypeError(f"`losses` must hold real floating values, got {losses.dtype}")
    if loss.hierarchical:
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
        if groups.device != losses.device:
            raise ValueError("`groups` and `losses` live on different devices")
    elif groups is not None:
        raise ValueError("`groups` is for group-level tilting: pass `tilts=` and `n_groups=`")


def mlmc_level(loss, n: int) -> int | None:
    """The level of a batch of ``n`` samples (None: the whole data set)."""
    if loss.n_samples is not None and n == loss.n_samples:
        return None
    ratio = n // loss.base_batch_size
    if n % loss.base_batch_size == 0 and ratio >= 2 and ratio & (ratio - 1) == 0:
        level = ratio.bit_length() - 1
        if level <= loss.max_level:
            return level
    sizes = [loss.base_batch_size * 2**j for j in range(1, loss.max_level + 1)]
    raise ValueError(
        f"`losses` has {n} samples; estimator='mlmc' needs a batch of one of the sizes "
        f"{sizes} or of `n_samples`"
    )

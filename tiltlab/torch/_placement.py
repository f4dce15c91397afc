"""Where the state of a `TiltedLoss` lives: on the losses' device and at least as wide
as their accumulation dtype, placed before a step, eagerly or outside a compiled graph."""

from __future__ import annotations

from typing import Any

import torch

from tiltlab.accumulator.packed import accumulation_dtype

from ._parallel import widen_state

__all__: list[str] = []


def place_state(loss: Any, losses: torch.Tensor) -> None:
    """The state on the losses' device, at least as wide as their accumulation dtype."""
    acc = accumulation_dtype(losses.dtype, torch)
    if loss.step.device != losses.device:
        loss.to(losses.device)
    if loss.__dict__.get("_widened_for") is not acc:
        widen_state(loss, acc)
        loss.__dict__["_widened_for"] = acc


def misplaced(loss: Any, losses: torch.Tensor) -> bool:
    """Whether the state is on another device than the losses (decided when tracing:
    devices are static there). A state narrower than the losses is not misplaced inside a
    graph: every step reads it in the losses' dtype and writes it back rounded to its
    own, so a compiled step never breaks the graph for it (``loss_fn.double()`` before
    compiling keeps a float64 state for float64 losses)."""
    return loss.step.device != losses.device


@torch.compiler.disable
def place_state_eagerly(loss: Any, losses: torch.Tensor) -> None:
    """:func:`place_state` outside a compiled graph: a module's buffers cannot be replaced
    inside one. The tensors' devices and dtypes are known when tracing, so the trace that
    finds the state in place has no break (``fullgraph=True`` needs the state in place
    before the first call: ``loss_fn.to(device)``, or one eager call)."""
    place_state(loss, losses)

"""State-sync answers checked before anything is adopted (pure; protocols/node/sync.py calls it).

A joiner (or a restarted peer) copies a neighbour's parameters and jumps to
its round (``join_at``). The answer comes from a roster member, so it is
checked like any other message: the parameters must be a floating tensor of
our size with finite values, and the round and step counts must be integers
some honest member can be at (``0 <= round <= last_round + 1``, a finished
member's round; ``0 <= steps_done <= min(round * local_steps, total_steps)``,
the schedule position of that round). Anything else is a ``BadParts`` with a
short reason for the driver to count; this function never raises for what a
peer sends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from protocols.compress import BadParts
from protocols.events import Machine
from protocols.finite import all_finite
from protocols.messages import Scalar, StateSyncResponse


@dataclass(frozen=True)
class SyncOffer:
    """A checked answer: parameters in our dtype and shape (a fresh CPU tensor) and where to join."""

    round: int
    steps_done: int
    params: torch.Tensor


def _count(value: Scalar | None) -> int | None:
    """A non-negative int (never a bool or a float), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def check_sync_response(message: StateSyncResponse, machine: Machine) -> SyncOffer | BadParts:
    """The offer ``message`` makes to ``machine``, or why it must be ignored (returned, not raised)."""
    params = message.tensors.get("params")
    if params is None:
        return BadParts("missing_params", "no 'params' tensor")
    if not params.is_floating_point():
        return BadParts("wrong_dtype", str(params.dtype))
    numel = machine.params.numel()
    if params.numel() != numel:
        return BadParts("wrong_length", f"{params.numel()} elements, expected {numel}")
    config = machine.config
    round_index = _count(message.meta.get("round", message.round))
    if round_index is None or round_index > machine.last_round + 1:
        return BadParts("bad_round", repr(message.meta.get("round", message.round))[:40])
    steps_done = _count(message.meta.get("steps_done", 0))
    if steps_done is None or steps_done > min(round_index * config.local_steps, config.total_steps):
        return BadParts("bad_steps", repr(message.meta.get("steps_done"))[:40])
    adopted = params.detach().reshape(-1).to(device="cpu", dtype=machine.params.dtype, copy=True)
    if not all_finite(adopted):
        return BadParts("nonfinite", "NaN or Inf in the offered parameters")
    return SyncOffer(round=round_index, steps_done=steps_done, params=adopted)

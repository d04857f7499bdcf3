"""The mixing maths as small pure functions over flat tensors.

Neighbours are always summed in sorted name order (callers pass them sorted),
never in arrival order, so two drivers produce the same floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gossip_correction(x: torch.Tensor, sent: torch.Tensor,
                      received: Sequence[tuple[float, torch.Tensor]]) -> None:
    """D-PSGD in place: ``x += sum_j W_ij (x_j - sent)``, neighbours in the order given.

    ``x`` holds the peer's parameters after its local steps and ``sent`` the
    vector it sent at the start of the round, so with every neighbour present
    this is ``x <- W x_sent - lr * g``. A neighbour left out keeps its weight
    on ``sent``: the missing weight is renormalised into the self weight.
    """
    total = 0.0
    for weight, x_j in received:
        x.add_(x_j, alpha=weight)
        total += weight
    if total:
        x.add_(sent, alpha=-total)


def nesterov_outer_step(params: torch.Tensor, anchor: torch.Tensor, momentum_buffer: torch.Tensor, *,
                        lr: float, momentum: float) -> None:
    """DiLoCo's outer step, in place, as ``torch.optim.SGD(nesterov=True)`` does it.

    pseudo-gradient ``d = anchor - params``; ``m <- momentum * m + d``;
    ``anchor <- anchor - lr * (d + momentum * m)``; ``params <- anchor``.
    """
    delta = anchor - params
    momentum_buffer.mul_(momentum).add_(delta)
    anchor.sub_(delta.add_(momentum_buffer, alpha=momentum), alpha=lr)
    params.copy_(anchor)


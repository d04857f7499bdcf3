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


def clip_radius(distances: Sequence[float], clipped: int) -> float:
    """ClippedGossip's radius for one round: the distance of the (``clipped`` + 1)-th farthest
    neighbour, so that the ``clipped`` farthest (where a Byzantine minority's messages must be to
    pull us far) move us no farther than it. With no more candidates than ``clipped``, the nearest
    one's distance: each is then bounded by the closest of them."""
    if not distances:
        return 0.0
    ordered = sorted(distances, reverse=True)
    return ordered[clipped] if clipped < len(ordered) else ordered[-1]


def clipped_gossip(sent: torch.Tensor, received: Sequence[tuple[float, torch.Tensor]],
                   clipped: int) -> tuple[list[tuple[float, torch.Tensor]], int]:
    """ClippedGossip (He, Karimireddy & Jaggi 2022) for :func:`gossip_correction`: each ``x_j``
    replaced by ``sent + min(1, tau / ||x_j - sent||) (x_j - sent)``, with ``tau`` from
    :func:`clip_radius`. Returns the new list (same order and weights) and how many were clipped."""
    differences = [x_j - sent for _, x_j in received]
    norms = [float(torch.linalg.vector_norm(d)) for d in differences]
    tau = clip_radius(norms, clipped)
    out: list[tuple[float, torch.Tensor]] = []
    count = 0
    for (weight, x_j), difference, norm in zip(received, differences, norms, strict=True):
        if norm > tau:
            count += 1
            x_j = sent + difference * (tau / norm)
        out.append((weight, x_j))
    return out, count


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


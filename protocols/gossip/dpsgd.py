"""D-PSGD (Lian et al. 2017) and local SGD: gossip the parameters every H local steps.

Round ``t`` sends ``x_t`` (through the configured operator: ``identity``,
``fp16``, ``bf16``...), runs H local steps, then sets
``x <- x_local + sum_j W_ij (x_j - x_sent)`` -- with H = 1 and every neighbour
present, exactly ``x_{t+1} = W x_t - lr g(x_t)``. ``x_sent`` is the decoded
form of what was sent, so a lossy cast perturbs but never shifts the average.

With ``clip_neighbours = B`` each ``x_j - x_sent`` is first clipped to the distance of the
(B+1)-th farthest neighbour (ClippedGossip, mixing.py ``clipped_gossip``), bounding what B
Byzantine in-neighbours can do to one round.

With ``mixing = "after"`` (rounds.py) the message is built after the H
steps, so ``x_sent`` is the post-step value and the same correction is
``x <- sum_j W_ij x_j``: local SGD, and with H = 1 on a complete graph with
uniform weights, data-parallel SGD.
"""

from __future__ import annotations

from typing import Any

import torch

from protocols.events import Send
from protocols.gossip.mixing import clipped_gossip, gossip_correction
from protocols.gossip.rounds import Candidate, RoundMachine
from protocols.messages import ParamPush


class DPSGD(RoundMachine):
    """Synchronous gossip of the whole parameter vector on an undirected (doubly stochastic) graph."""

    SENDS_OWN_PARAMS = True  # round t's message is x_t (through the operator)
    CLIPS_FAR = True  # a far half the filter's reports vouch for pulls at the filter's bound (robust.py)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.topology.directed:
            raise ValueError(f"algorithm {self.config.algorithm!r} needs an undirected (doubly stochastic) "
                             "graph; use algorithm 'pushsum' on a directed one")
        self.sent: torch.Tensor | None = None

    def _round_messages(self, t: int) -> list[Send]:
        if not self._sendable(self.params):
            self.sent = self.params.clone()     # the mix keeps its reference; nothing goes out
            return []
        tensors, meta, self.sent = self.payload.encode(self.params, t)
        recipients = tuple(sorted(self.topology.out_neighbours(self.name, t)))
        return [Send(recipients, ParamPush(round=t, tensors=tensors, meta=meta))] if recipients else []

    def _decode(self, sender: str, message: ParamPush) -> tuple[Any, float]:
        assert self.sent is not None
        x_j = self.payload.decode(message.tensors, message.meta)
        return x_j, self._distance(x_j, self.sent)

    def _own_norm(self) -> float:
        assert self.sent is not None
        return self._distance(self.params, self.sent)

    def _clipped(self, payload: Any, factor: float) -> Any:
        assert self.sent is not None
        return self.sent + (payload - self.sent) * factor

    def _mix(self, t: int, accepted: list[Candidate]) -> None:
        assert self.sent is not None
        weights = self.topology.in_neighbours(self.name, t)
        received = [(weights[j], x_j) for j, _, x_j in accepted]
        if self.config.clip_neighbours:
            received, clipped = clipped_gossip(self.sent, received, self.config.clip_neighbours)
            self._count("clipped_updates", clipped)
        gossip_correction(self.params, self.sent, received)
        self.sent = None

    def _joined(self) -> None:
        self.sent = None

    def _export_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        if self.sent is not None:
            tensors["dpsgd/sent"] = self.sent.clone()

    def _restore_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.sent = self._own_copy(tensors.get("dpsgd/sent"))

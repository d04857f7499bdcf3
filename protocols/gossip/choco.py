"""CHOCO-SGD (Koloskova et al. 2019): compressed gossip through public copies.

Every peer keeps ``x_hat_i``, the public copy of itself that its neighbours
also hold, and ``s_i = sum_j W_ij x_hat_j`` (itself included), so memory is two
vectors whatever the degree. Round ``t``:

  q_i = C(x_i - x_hat_i)           sent to the neighbours; x_hat_i += q_i; s_i += W_ii q_i
  H local steps                    x_i <- x_i - lr g
  s_i += sum_j W_ij q_j            for every received q_j (sorted by sender)
  x_i += gamma (s_i - x_hat_i)     the consensus step

The compression error is not lost: it stays in ``x_i - x_hat_i`` and is sent
in later rounds (error feedback by construction). With ``choco_full_start``
round 0 goes uncompressed, so the public copies start exact instead of at 0
(top-1% alone would need about 100 rounds to fill them). A ``q_j`` that arrives after
its round closed is still added at the next mix, so the neighbours' views of
``x_hat_j`` never drift apart. The ``s_i`` form needs a static graph.

A ``q_j`` lost on the way (a lossy link, a partition) leaves ``i``'s view of
``x_hat_j`` wrong for good, and every later consensus step then pushes the
average by that error. So CHOCO does not catch up after a partition
(rounds.py, "Catching up"): re-mixing the two sides through views that miss
every ``q`` lost while they were apart drove the simulator's run from 0.75 to
0.05 accuracy, against a slow decline to 0.69 with the sides left apart.
Healing CHOCO needs the public copies re-synchronised (not done yet).
"""

from __future__ import annotations

from typing import Any

import torch

from protocols.events import Send
from protocols.gossip.rounds import Candidate, RoundMachine
from protocols.messages import ParamPush


class Choco(RoundMachine):
    KEEPS_LATE = True
    JOINABLE = False  # a joiner's public copy and its neighbours' views of it would disagree
    CATCHES_UP = False  # views of x_hat_j missing q's lost in a partition must not be re-mixed: see below

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.topology.directed or self.topology.period != 1:
            raise ValueError("algorithm 'choco' needs a static undirected graph (symmetric W, period 1)")
        self.x_hat = torch.zeros_like(self.params)
        self.neighbour_sum = torch.zeros_like(self.params)  # s_i = sum_j W_ij x_hat_j, self included
        self.own_q_norm = 0.0

    def _raw(self, t: int) -> bool:
        return t == 0 and self.config.choco_full_start

    def _round_messages(self, t: int) -> list[Send]:
        tensors, meta, q = self.payload.encode(self.params - self.x_hat, t, raw=self._raw(t))
        self.x_hat.add_(q)
        self.neighbour_sum.add_(q, alpha=self.topology.self_weight(self.name, t))
        self.own_q_norm = self._distance(q)
        recipients = tuple(sorted(self.topology.out_neighbours(self.name, t)))
        return [Send(recipients, ParamPush(round=t, tensors=tensors, meta=meta))] if recipients else []

    def _decode(self, sender: str, message: ParamPush) -> tuple[Any, float]:
        q_j = self.payload.decode(message.tensors, message.meta, raw=self._raw(message.round))
        return q_j, self._distance(q_j)

    def _own_norm(self) -> float:
        return self.own_q_norm

    def _mix(self, t: int, accepted: list[Candidate]) -> None:
        for sender, r, q_j in accepted:
            self.neighbour_sum.add_(q_j, alpha=self.topology.in_neighbours(self.name, r)[sender])
        self.params.add_(self.neighbour_sum - self.x_hat, alpha=self.config.consensus_step)

    def _export_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        tensors["choco/x_hat"] = self.x_hat.clone()
        tensors["choco/neighbour_sum"] = self.neighbour_sum.clone()
        meta["choco_own_q_norm"] = self.own_q_norm

    def _restore_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.x_hat.copy_(tensors["choco/x_hat"])
        self.neighbour_sum.copy_(tensors["choco/neighbour_sum"])
        self.own_q_norm = float(meta["choco_own_q_norm"])

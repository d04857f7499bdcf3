"""An edge client's Node holds its :class:`FedAvgClient` as its machine, through :class:`EdgeMachine`.

The Node routes a member's own events (the trainer's ``WorkDone``) and the
messages of its machine's kinds to its machine, so an edge client needs no
second routing path: ``EdgeMachine`` gives the client the machine's interface.
The edge's one neighbour is its gateway: the Node's heartbeats to it are what
keeps the client registered there (the gateway's Node tells its server role
``NeighbourUp`` when it hears a client, ``NeighbourDown`` when the client falls
silent). An edge has no gossip schedule: it cannot join by state sync
(``joinable`` False; its driver never asks) and ignores its neighbour's up and
down (the server re-asks it in a later round).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from protocols.errors import HivemeshError
from protocols.events import Action, Event, ProtocolState
from protocols.federation.client import FedAvgClient
from protocols.gossip import GossipConfig
from protocols.messages import Message


class EdgeMachine:
    """The Machine interface around a FedAvg client (its events and messages pass straight through)."""

    def __init__(self, client: FedAvgClient) -> None:
        self.client = client
        self.params: torch.Tensor = client.params
        # no gossip: the steps cap is the federation's work, never reached by the Node's checks
        self.config = GossipConfig(total_steps=max(1, client.config.rounds))

    @property
    def accepts(self) -> frozenset[type[Message]]:
        return self.client.accepts

    def handle(self, event: Event, now: float) -> list[Action]:
        return self.client.handle(event, now)

    @property
    def position(self) -> tuple[int, int]:
        return max(self.client.round, 0), 0

    @property
    def joinable(self) -> bool:
        return False

    @property
    def last_round(self) -> int:
        return self.client.config.rounds

    def join_at(self, round_index: int, steps_done: int) -> None:
        raise HivemeshError("an edge client takes its model from its gateway's RoundStart, not by state sync")

    def set_graph(self, topology: Any) -> None:
        """An edge has no gossip graph: a roster change only changes who its Node verifies."""

    def sender_params(self, message: Message) -> torch.Tensor | None:
        return None

    @property
    def counters(self) -> Mapping[str, int]:
        return self.client.counters

    def gauges(self) -> dict[str, float]:
        return {}

    def export_state(self) -> ProtocolState:
        return self.client.export_state()

    def restore_state(self, state: ProtocolState) -> None:
        self.client.restore_state(state)

    def notes(self) -> list[str]:
        return []

    def warnings(self) -> list[str]:
        return []

"""Stand-ins for a gateway's Node tests, in-process: a gossip machine at a settable round and a FedAvg
server that records who comes, who goes and whose update reached it (the Node's routing is what those
tests check: tests/test_gateway_roster_clients.py, test_gateway_edge_assignment.py,
test_gateway_revoked_client.py)."""

from __future__ import annotations

from typing import Any

from protocols.events import Event, NeighbourDown, NeighbourUp, Received
from protocols.messages import ClientUpdate, Message


class Machine:
    """A gossip machine stand-in at a settable round."""

    accepts: frozenset[type[Message]] = frozenset()

    def __init__(self) -> None:
        self.position = (0, 0)

    def handle(self, event: Event, now: float) -> list[Any]:
        return []

    def set_graph(self, topology: Any) -> None:
        pass


class Server:
    """A FedAvg server stand-in: ``events`` holds ("NeighbourUp" | "NeighbourDown", client) and
    ("ClientUpdate", sender), in order."""

    accepts = frozenset({ClientUpdate})

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def handle(self, event: Event, now: float) -> list[Any]:
        match event:
            case NeighbourUp(name=name) | NeighbourDown(name=name):
                self.events.append((type(event).__name__, name))
            case Received(sender=sender, message=ClientUpdate()):
                self.events.append(("ClientUpdate", sender))
        return []

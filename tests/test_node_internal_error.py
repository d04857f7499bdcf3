"""A message whose handling raises is dropped and counted against its sender, never the member's end
(issue 32, item 1; protocols/node/node.py ``Node.receive``): the one place every host (the daemon's
gateways and peers, edge clients, the simulator) hands a member's accepted input in."""

from __future__ import annotations

from typing import Any

import torch
from _gateway_support import Machine, Server

from peer.cli.status import render_edge
from protocols.events import Event, Received
from protocols.messages import ClientUpdate, Heartbeat, ParamPush
from protocols.node import Neighbour, Node, NodeConfig, Note


class BrittleServer(Server):
    """The server stand-in, with a bug that an update from ``e1`` meets."""

    def handle(self, event: Event, now: float) -> list[Any]:
        if isinstance(event, Received) and event.sender == "e1":
            raise OverflowError("cannot convert float infinity to integer")
        return super().handle(event, now)


def update(round_index: int) -> ClientUpdate:
    return ClientUpdate(round=round_index, num_samples=2**63 - 1, tensors={"x": torch.zeros(2)})


def test_an_exception_from_a_members_input_is_counted_against_it_and_the_member_goes_on() -> None:
    # Prepare: a gateway's Node, both clients heard
    server = BrittleServer()
    node: Node[Neighbour] = Node("gw0", Machine(), neighbours={}, config=NodeConfig(),  # type: ignore[arg-type]
                                 early_per_neighbour=2, answer_source=lambda: (torch.zeros(2), 0),
                                 roles={"fedavg": server}, clients=("e0", "e1"))
    node.start(0.0)
    for name in ("e0", "e1"):
        node.receive(name, Heartbeat(step=0, loss=0.0), 0.5)
    # Execute: e1's update raises in the server, twice; e0's comes after
    first = node.receive("e1", update(0), 1.0)
    second = node.receive("e1", update(1), 1.5)
    after = node.receive("e0", update(0), 2.0)
    # Assert: dropped, counted by reason and by sender, said once naming the sender and the error
    assert len(first) == 1 and isinstance(first[0], Note) and first[0].warning
    assert "client_update from e1 dropped: internal_error: OverflowError" in first[0].text
    assert "test_node_internal_error.py" in first[0].text      # where it was raised
    assert second == [] and after == []
    assert node.all_rejections() == {"internal_error": 2}
    assert node.internal_errors == {"e1": 2}
    # and the member goes on: e0's update reached the server, and e1 is still heard
    assert ("ClientUpdate", "e0") in server.events
    node.receive("e1", Heartbeat(step=0, loss=0.0), 3.0)
    assert node.clients.members["e1"].up


def test_hivemesh_status_names_the_senders_of_messages_an_exception_dropped() -> None:
    shown = render_edge({"name": "e1", "rejections": {"internal_error": 2}, "internal_errors": {"gw0": 2}})
    assert "internal errors (messages dropped, a bug to report): gw0 2" in shown
    assert "internal errors" not in render_edge({"name": "e1"})


class BrittleMachine(Machine):
    """The gossip machine stand-in, with a bug that a push from ``p1`` meets."""

    accepts = frozenset({ParamPush})

    def __init__(self) -> None:
        super().__init__()
        self.pushes: list[str] = []

    def handle(self, event: Event, now: float) -> list[Any]:
        if isinstance(event, Received):
            if event.sender == "p1":
                raise OverflowError("cannot convert float infinity to integer")
            self.pushes.append(event.sender)
        return []


def test_a_message_held_before_start_that_raises_when_fed_is_dropped_not_the_start() -> None:
    # Prepare: a peer's Node not started yet; p1's push (which the machine cannot handle) and p2's
    # arrive before Start and are held (protocols/node/early.py)
    machine = BrittleMachine()
    node: Node[Neighbour] = Node("p0", machine, neighbours={"p1": Neighbour(), "p2": Neighbour()},  # type: ignore[arg-type]
                                 config=NodeConfig(), early_per_neighbour=2,
                                 answer_source=lambda: (torch.zeros(2), 0))
    node.receive("p1", ParamPush(round=0), 0.5)
    node.receive("p2", ParamPush(round=0), 0.6)
    # Execute: Start feeds what was held
    actions = node.start(1.0)
    # Assert: p1's dropped and counted against it as if it had come after Start; p2's delivered
    notes = [a.text for a in actions if isinstance(a, Note)]
    assert any("param_push from p1 dropped: internal_error" in text for text in notes)
    assert node.all_rejections() == {"internal_error": 1} and node.internal_errors == {"p1": 1}
    assert machine.pushes == ["p2"]

"""A member holds several roles (protocols/node/node.py): each message kind reaches the role that
takes it, a role's timers and metrics are its own, and two roles cannot claim one kind. The
roles beside the machine here are small recording ones (the federation's FedAvg server is next)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from protocols.events import (
    Action,
    CancelTimer,
    Event,
    Metric,
    Received,
    Send,
    SetTimer,
    Start,
    TimerFired,
)
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import ClientUpdate, Message, ParamPush, RoundResult, RoundStart
from protocols.node import Neighbour, Node, NodeConfig
from topology import build


class Recording:
    """A role that takes ``kinds``, records its events, sets a timer at Start and answers each message."""

    def __init__(self, *kinds: type[Message]) -> None:
        self.kinds = frozenset(kinds)
        self.events: list[Event] = []

    @property
    def accepts(self) -> frozenset[type[Message]]:
        return self.kinds

    def handle(self, event: Event, now: float) -> list[Action]:
        self.events.append(event)
        match event:
            case Start():
                return [SetTimer("round", now + 1.0), Metric("started", 1.0)]
            case Received(sender=sender):
                return [Send((sender,), RoundResult(round=0)), CancelTimer("round")]
            case TimerFired(key="round"):
                return [Metric("rounds", 1.0)]
        return []


def member(**roles: Any) -> Node[Neighbour]:
    machine = make_machine(GossipConfig(total_steps=10), name="p00", topology=build("ring:4"),
                           params=torch.zeros(3))
    return Node("p00", machine, neighbours={"p01": Neighbour(), "p03": Neighbour()}, config=NodeConfig(),
                early_per_neighbour=2, answer_source=lambda: (torch.zeros(3), 0), roles=roles)


def test_each_kind_reaches_the_role_that_takes_it_and_a_role_sees_start() -> None:
    server = Recording(ClientUpdate)
    node = member(fedavg=server)
    assert node.owners[ClientUpdate] == "fedavg" and node.owners[ParamPush] == ""
    started = node.start(0.0)
    assert SetTimer("fedavg/round", 1.0) in started and Metric("fedavg.started", 1.0) in started
    assert server.events == [Start()]
    update = ClientUpdate(round=0, num_samples=5)
    actions = node.receive("e07", update, 0.5)            # an edge client: not a gossip neighbour
    assert server.events[-1] == Received("e07", update)
    assert Send(("e07",), RoundResult(round=0)) in actions and CancelTimer("fedavg/round") in actions
    assert node.all_rejections() == {}


def test_a_roles_timer_goes_back_to_it_and_the_machines_timers_stay_its_own() -> None:
    server = Recording(ClientUpdate)
    node = member(fedavg=server)
    node.start(0.0)
    assert node.handle(TimerFired("fedavg/round"), 1.0) == [Metric("fedavg.rounds", 1.0)]
    assert server.events[-1] == TimerFired("round")
    before = len(server.events)
    node.handle(TimerFired("deadline"), 2.0)              # the machine's key, unprefixed
    assert len(server.events) == before


def test_a_roles_messages_before_start_are_held_then_given_to_it() -> None:
    server = Recording(RoundStart)
    node = member(client=server)
    node.receive("p01", RoundStart(round=3), 0.0)
    assert server.events == []
    node.start(1.0)
    assert server.events == [Start(), Received("p01", RoundStart(round=3))]


def test_a_kind_no_role_takes_is_counted_and_two_roles_cannot_take_one_kind() -> None:
    node = member(fedavg=Recording(ClientUpdate))
    node.start(0.0)
    node.receive("p01", RoundStart(round=0), 0.1)
    assert node.all_rejections() == {"no_role_for_round_start": 1}
    with pytest.raises(ValueError, match="roles a and b both take client_update"):
        member(a=Recording(ClientUpdate), b=Recording(ClientUpdate))
    with pytest.raises(ValueError, match="the machine and x both take param_push"):
        member(x=Recording(ParamPush))
    with pytest.raises(ValueError, match="without '/'"):
        member(**{"a/b": Recording(ClientUpdate)})

"""The Node's heartbeat timer and its wait for the neighbours before the first round, one decision
for both drivers (protocols/node/liveness.py ``start_wait``, protocols/node/node.py ``tick``)."""

from __future__ import annotations

import itertools

import pytest
import torch

from protocols.events import Send
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import Heartbeat
from protocols.node import Neighbour, Node, NodeConfig, Presence, Wait, start_wait
from topology import build

UP, NEVER, DOWN, DONE = Presence.UP, Presence.NEVER_HEARD, Presence.DOWN, Presence.FINISHED


def node(**config: float) -> Node[Neighbour]:
    machine = make_machine(GossipConfig(total_steps=10), name="p00", topology=build("ring:4"),
                           params=torch.zeros(2))
    return Node("p00", machine, neighbours={"p01": Neighbour(), "p03": Neighbour()},
                config=NodeConfig(**config), early_per_neighbour=2,
                answer_source=lambda: (torch.zeros(2), 0))


def test_the_heartbeat_goes_to_every_neighbour_once_per_interval_and_says_finished() -> None:
    member = node(heartbeat_interval_s=1.0)
    first = member.tick(0.0, step=3, loss=0.5, stamp_s=123.0)
    assert first == [Send(("p01", "p03"), Heartbeat(step=3, loss=0.5, sent_at_s=123.0, finished=False,
                                                     roster_version=1))]
    assert member.tick(0.99, step=4, loss=0.4) == []          # not due yet
    assert member.next_beat_s == 1.0
    member.finished = True
    again = member.tick(1.0, step=5, loss=0.3)
    assert len(again) == 1 and isinstance(again[0], Send)
    assert again[0].message == Heartbeat(step=5, loss=0.3, sent_at_s=0.0, finished=True, roster_version=1)


def test_a_member_without_neighbours_sends_no_heartbeat_but_its_timer_advances() -> None:
    machine = make_machine(GossipConfig(total_steps=10), name="p00", topology=build("ring:4"),
                           params=torch.zeros(2))
    alone: Node[Neighbour] = Node("p00", machine, neighbours={}, config=NodeConfig(), early_per_neighbour=2,
                                  answer_source=lambda: (torch.zeros(2), 0))
    assert alone.tick(0.0, step=0, loss=0.0) == [] and alone.next_beat_s == 1.0


def test_a_restart_heartbeats_again_at_once() -> None:
    member = node()
    member.tick(0.0, step=0, loss=0.0)
    member.restart(member.machine, {"p01": Neighbour(), "p03": Neighbour()})
    assert len(member.tick(0.1, step=0, loss=0.0)) == 1


def wait(presence: dict[str, Presence], steps: dict[str, int] | None = None, *, waited_s: float = 0.0,
         resumed: bool = False, all_reachable: bool = True) -> Wait:
    return start_wait(presence, steps or {n: -1 for n in presence}, waited_s=waited_s, resumed=resumed,
                      ahead_steps=10, all_reachable=all_reachable, neighbour_timeout_s=5.0,
                      start_timeout_s=60.0)


def test_every_row_of_the_start_wait_table() -> None:
    assert wait({"a": UP, "b": UP}) is Wait.START
    assert wait({}) is Wait.START                                            # a lone member
    assert wait({"a": UP, "b": UP}, all_reachable=False) is Wait.WAIT         # heard, not reached yet
    assert wait({"a": UP, "b": NEVER}, {"a": 11, "b": -1}) is Wait.JOIN       # the network runs on
    assert wait({"a": UP, "b": UP}, {"a": 11, "b": 0}) is Wait.JOIN           # first row wins
    assert wait({"a": UP, "b": NEVER}, {"a": 10, "b": -1}) is Wait.WAIT       # within what it buffers
    assert wait({"a": NEVER, "b": NEVER}, resumed=True, waited_s=5.0) is Wait.ALONE
    assert wait({"a": NEVER, "b": NEVER}, resumed=True, waited_s=4.9) is Wait.WAIT
    assert wait({"a": NEVER, "b": NEVER}, resumed=False, waited_s=30.0) is Wait.WAIT  # a fresh start waits
    assert wait({"a": DOWN, "b": NEVER}, resumed=True, waited_s=30.0) is Wait.WAIT    # someone was there
    assert wait({"a": UP, "b": NEVER}, waited_s=60.0) is Wait.TIMED_OUT
    assert wait({"a": NEVER, "b": NEVER}, resumed=True, waited_s=60.0) is Wait.ALONE  # first row wins
    assert start_wait({"a": UP, "b": NEVER}, {"a": 0, "b": -1}, waited_s=0.0, resumed=False, ahead_steps=10,
                      all_reachable=True, neighbour_timeout_s=5.0, start_timeout_s=60.0,
                      later=frozenset({"b"})) is Wait.START                   # b starts later: not waited for


@pytest.mark.parametrize("states", list(itertools.product([UP, NEVER, DOWN, DONE], repeat=2)))
@pytest.mark.parametrize("resumed", [False, True])
def test_the_wait_ends_by_the_start_timeout_whatever_the_neighbours(states: tuple[Presence, ...],
                                                                    resumed: bool) -> None:
    presence = dict(zip(("a", "b"), states, strict=True))
    assert wait(presence, waited_s=60.0, resumed=resumed) is not Wait.WAIT
    if UP not in states or len(set(states)) > 1:
        assert wait(presence, waited_s=59.0, resumed=False) is Wait.WAIT   # nobody far ahead


def test_the_node_reads_the_steps_its_heartbeats_brought() -> None:
    member = node()
    member.receive("p01", Heartbeat(step=2), 0.0)
    assert member.start_wait(waited_s=0.0, resumed=False, ahead_steps=10) is Wait.WAIT
    member.receive("p03", Heartbeat(step=50), 0.1)                          # far on: join by sync
    assert member.start_wait(waited_s=0.1, resumed=False, ahead_steps=10) is Wait.JOIN

"""A member cut off from every neighbour keeps its place in the schedule (issue 11, item 6d): every
machine that closes rounds, and AD-PSGD, by hand, no sockets."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from protocols.events import (
    Action,
    Finished,
    NeighbourDown,
    NeighbourUp,
    Received,
    Send,
    SetTimer,
    Start,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.gossip import GossipConfig, make_machine
from topology import build

DEADLINE_S = 1.0
ROUND_MACHINES = [
    {"algorithm": "dpsgd"},
    {"algorithm": "local", "local_steps": 2},
    {"algorithm": "local", "local_steps": 2, "mixing": "after"},
    {"algorithm": "choco", "consensus_step": 0.5},
    {"algorithm": "pushsum"},
    {"algorithm": "dpsgd", "outer": "diloco", "outer_every": 2},
]


def _timer(actions: list[Action]) -> SetTimer:
    timers = [a for a in actions if isinstance(a, SetTimer)]
    assert len(timers) == 1, actions
    return timers[0]


def _works(actions: list[Action]) -> bool:
    return any(isinstance(a, StartWork) for a in actions)


@pytest.mark.parametrize("options", ROUND_MACHINES, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_a_round_machine_cut_off_from_every_neighbour_waits_its_deadline_each_round(
        options: dict[str, Any]) -> None:
    # Prepare: p00 of a ring of 4, 6 steps to go; both its neighbours go down during round 0.
    config = GossipConfig(total_steps=6, deadline_s=DEADLINE_S, norm_multiple=0, **options)
    steps = config.local_steps
    machine = make_machine(config, name="p00", topology=build("ring:4"), params=torch.zeros(4))
    assert _works(machine.handle(Start(), 0.0))
    machine.handle(NeighbourDown("p01"), 0.1)
    machine.handle(NeighbourDown("p03"), 0.1)
    # Execute: the work is done; nobody is left to wait for.
    actions = machine.handle(WorkDone(steps, 0.0), 0.2)
    # Assert: the round does not close at once (``all([])``): it waits its deadline, and only then
    # starts the next round, counting one round alone. Before the fix it raced on at once.
    assert not _works(actions) and not any(isinstance(a, Finished) for a in actions), actions
    assert _timer(actions).at == pytest.approx(0.2 + DEADLINE_S)
    assert machine.position == (0, 0)
    actions = machine.handle(TimerFired(_timer(actions).key), 0.2 + DEADLINE_S)
    assert _works(actions) and machine.position == (1, steps)
    assert machine.counters["rounds_alone"] == 1
    # Then every later round alone takes a deadline too: the schedule ends no sooner than that.
    now, rounds = 0.2 + DEADLINE_S, 1
    while True:
        waiting = machine.handle(WorkDone(steps, 0.0), now + 0.01)
        if any(isinstance(a, Finished) for a in waiting):
            break
        assert not _works(waiting), waiting
        now = _timer(waiting).at
        done = machine.handle(TimerFired(_timer(waiting).key), now)
        rounds += 1
        if any(isinstance(a, Finished) for a in done):
            break
    assert rounds == config.total_steps // steps
    assert machine.counters["rounds_alone"] == rounds
    assert now >= rounds * DEADLINE_S


@pytest.mark.parametrize("options", ROUND_MACHINES[:1] + ROUND_MACHINES[4:5], ids=["dpsgd", "pushsum"])
def test_a_member_alone_closes_its_round_at_the_first_arrival_and_mixes_again(
        options: dict[str, Any]) -> None:
    # Prepare: p00 alone (both neighbours down), waiting in round 0.
    config = GossipConfig(total_steps=6, deadline_s=DEADLINE_S, norm_multiple=0, **options)
    params = torch.zeros(4)
    machine = make_machine(config, name="p00", topology=build("ring:4"), params=params)
    machine.handle(Start(), 0.0)
    machine.handle(NeighbourDown("p01"), 0.1)
    machine.handle(NeighbourDown("p03"), 0.1)
    _timer(machine.handle(WorkDone(1, 0.0), 0.2))
    # Execute: p01's round-0 message arrives before the deadline (before its NeighbourUp, too).
    p01 = make_machine(config, name="p01", topology=build("ring:4"), params=torch.ones(4))
    sends = [a for a in p01.handle(Start(), 0.0) if isinstance(a, Send) and "p00" in a.recipients]
    actions = machine.handle(Received("p01", sends[0].message), 0.4)
    # Assert: the round closed on that first arrival and mixed it (no round alone, nothing waited out)
    assert _works(actions) and machine.position == (1, 1)
    assert machine.counters["rounds_alone"] == 0
    assert float(params.sum()) > 0  # p01's ones were mixed in


def test_a_member_with_no_in_neighbour_in_the_topology_closes_its_rounds_at_once() -> None:
    # The negative control: nothing to wait for by design (a lone member) is no reason to wait.
    config = GossipConfig(total_steps=3, deadline_s=DEADLINE_S)
    machine = make_machine(config, name="p00", topology=build("ring:1"), params=torch.zeros(2))
    machine.handle(Start(), 0.0)
    actions = machine.handle(WorkDone(1, 0.0), 0.1)
    assert _works(actions) and not any(isinstance(a, SetTimer) for a in actions)
    assert machine.counters["rounds_alone"] == 0


def test_adpsgd_alone_waits_for_a_neighbour_instead_of_racing_through_its_iterations() -> None:
    # Prepare: p00 of a ring of 4 asks its partner, then both neighbours go down while it works.
    config = GossipConfig(algorithm="adpsgd", total_steps=6, deadline_s=DEADLINE_S, norm_multiple=0)
    machine = make_machine(config, name="p00", topology=build("ring:4"), params=torch.zeros(4))
    first = machine.handle(Start(), 0.0)
    partner = next(a.recipients[0] for a in first if isinstance(a, Send))
    machine.handle(NeighbourDown("p01"), 0.1)
    machine.handle(NeighbourDown("p03"), 0.1)
    # Execute: iteration 0 ends (its partner is gone); iteration 1 has nobody to ask.
    second = machine.handle(WorkDone(1, 0.0), 0.2)
    assert _works(second) and not any(isinstance(a, Send) for a in second)
    waiting = machine.handle(WorkDone(1, 0.0), 0.3)
    # Assert: iteration 1 waits for a neighbour (or its deadline) instead of starting iteration 2.
    assert not _works(waiting) and _timer(waiting).at == pytest.approx(0.3 + DEADLINE_S)
    assert machine.counters["rounds_alone"] == 1
    # A neighbour back: the wait ends, and the next iteration asks it.
    back = machine.handle(NeighbourUp(partner), 0.5)
    assert _works(back) and [a.recipients for a in back if isinstance(a, Send)] == [(partner,)]
    assert machine.position == (2, 2)
    # The deadline also ends a wait alone; it is not a missed reply.
    machine.handle(NeighbourDown(partner), 0.6)  # gives up iteration 2's request: one missed
    machine.handle(WorkDone(1, 0.0), 0.7)  # iteration 3: alone again
    missed = machine.counters["missed_deadline"]
    timer = _timer(machine.handle(WorkDone(1, 0.0), 0.8))
    assert _works(machine.handle(TimerFired(timer.key), timer.at))
    # (iteration 4, begun on it, is alone too: counted when it begins)
    assert machine.counters["missed_deadline"] == missed and machine.counters["rounds_alone"] == 3


def test_adpsgd_restarted_while_waiting_alone_waits_again() -> None:
    config = GossipConfig(algorithm="adpsgd", total_steps=6, deadline_s=DEADLINE_S, norm_multiple=0)
    machine = make_machine(config, name="p00", topology=build("ring:4"), params=torch.zeros(4))
    machine.handle(Start(), 0.0)
    machine.handle(NeighbourDown("p01"), 0.1)
    machine.handle(NeighbourDown("p03"), 0.1)
    machine.handle(WorkDone(1, 0.0), 0.2)
    _timer(machine.handle(WorkDone(1, 0.0), 0.3))
    restored = make_machine(config, name="p00", topology=build("ring:4"), params=torch.zeros(4))
    restored.restore_state(machine.export_state())
    # the old driver's timer died with it: a new one, or the member would wait forever
    assert _timer(restored.handle(Start(), 5.0)).at == pytest.approx(5.0 + DEADLINE_S)

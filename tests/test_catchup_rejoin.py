"""A member restarted from a checkpoint and handed its neighbours' round by a state sync catches up
with a ring that runs on without it (pure: one machine fed by hand, no processes).

What the multi-host kill test (tests/test_hosts_kills.py) can run into: a killed peer's neighbours
take it for a laggard (it missed their deadline) and stop waiting for it. Restarted, it adopts the
round they were in when they answered its sync, but at 50 rounds a second they are past its buffer
window by the time it starts: every message it hears is a claim to catch up to. With no round of
its own timed in its new life it had no step rate, so it refused each one (``catch_up_refused``;
restarted peers there ended with such counts and ``rounds_alone``), waited out a deadline (10 s)
in its first round for messages that had gone to its dead life, and only then, at its compute
rate, jumped back. Its two in-neighbours' claims now confirm each other (f + 1 = 2); its pace, a
duration its checkpoint keeps, only prices the waits of its new life (protocols/gossip/catchup.py).
"""

from __future__ import annotations

from typing import Any

import torch

from protocols.events import Received, SetTimer, Start, TimerFired, WorkDone
from protocols.gossip import GossipConfig, RoundMachine, make_machine
from protocols.gossip.base import Phase
from protocols.messages import ParamPush
from topology import build

CONFIG = GossipConfig(total_steps=10_000, max_rounds_ahead=4, deadline_s=10.0)
ROUND_S, WORK_S = 0.02, 0.005   # the ring's pace (50 rounds/s) and our compute per step
NEIGHBOURS = ("p01", "p03")


class Fed:
    """p00 on a ring of 4, fed by hand: its work takes ``WORK_S``, its deadlines fire when due."""

    def __init__(self, machine: RoundMachine) -> None:
        self.machine = machine
        self.timers: dict[str, float] = {}
        self.fired: list[str] = []  # the deadlines that closed a round

    def feed(self, event: Any, now: float) -> None:
        for action in self.machine.handle(event, now):
            if isinstance(action, SetTimer):
                self.timers[action.key] = action.at

    def run(self, start_s: float, until_s: float, theirs: Any) -> None:
        """From ``start_s`` to ``until_s``: each ``ROUND_S`` both neighbours send their round
        ``theirs(now)``; our work is done ``WORK_S`` after it is asked; deadlines fire when due."""
        now = start_s
        while now < until_s:
            if self.machine.phase is Phase.WORKING:
                self.feed(WorkDone(1, 0.0), now + WORK_S)
            now += ROUND_S
            for key, at in sorted(self.timers.items()):
                if at <= now:
                    del self.timers[key]
                    self.fired.append(key)
                    self.feed(TimerFired(key), at)
            for j in NEIGHBOURS:
                self.feed(Received(j, ParamPush(round=theirs(now), tensors={"x": torch.zeros(2)})), now)


def _checkpoint_of_a_trained_life() -> Any:
    """p00's state after 30 rounds in step with its neighbours (its pace measured), as a checkpoint
    holds it."""
    machine = make_machine(CONFIG, name="p00", topology=build("ring:4"), params=torch.zeros(2))
    assert isinstance(machine, RoundMachine)
    fed = Fed(machine)
    fed.feed(Start(), 0.0)
    fed.run(0.0, 30 * ROUND_S, lambda now: machine.round)
    assert machine.round >= 25 and machine.reach.step_s is not None
    return machine.export_state()


def _restarted_and_synced(state: Any, joined: int) -> RoundMachine:
    """A new process: the checkpoint restored, then a state sync adopted at round ``joined``."""
    machine = make_machine(CONFIG, name="p00", topology=build("ring:4"), params=torch.zeros(2))
    assert isinstance(machine, RoundMachine)
    machine.restore_state(state)
    machine.join_at(joined, joined)
    return machine


def test_a_member_restarted_and_synced_catches_up_with_neighbours_that_ran_on() -> None:
    # Prepare: its checkpoint, then a sync that handed it round 100; by its Start (its new life's
    # clock at 1000 s) its neighbours are 30 rounds further on, and go on at 50 rounds/s.
    machine = _restarted_and_synced(_checkpoint_of_a_trained_life(), 100)
    fed = Fed(machine)

    def theirs(now: float) -> int:
        return 130 + int((now - 1000.0) / ROUND_S)

    # Execute: one second of its new life.
    fed.feed(Start(), 1000.0)
    fed.run(1000.0, 1001.0, theirs)
    # Assert: it jumped to them within the second (both neighbours claim the round they are in), no
    # deadline fired, and its rounds close in step with them again.
    # (Before, every claim was refused, about 100 a second, and it stayed in round 100 until its
    # deadline fired 10 s on.)
    assert machine.counters["rounds_skipped"] > 0 and fed.fired == []
    assert abs(machine.round - theirs(1001.0)) <= CONFIG.max_rounds_ahead + 1, machine.round
    refused = machine.counters["catch_up_refused"]
    fed.run(1001.0, 1002.0, theirs)
    assert abs(machine.round - theirs(1002.0)) <= CONFIG.max_rounds_ahead + 1, machine.round
    assert machine.counters["catch_up_refused"] == refused and fed.fired == []


def test_the_pace_is_what_a_restart_keeps_not_the_references() -> None:
    # A liar's claim at its first message of the new life moves it no further than its own pace since
    # its Start (nothing trained, nothing waited: nowhere; a reference of the old life is not kept).
    state = _checkpoint_of_a_trained_life()
    machine = _restarted_and_synced(state, 100)
    _, meta = state
    assert meta["pace"]["timed"] and machine.reach.step_s is not None
    machine.handle(Start(), 1000.0)
    machine.handle(Received("p01", ParamPush(round=machine.last_round, tensors={"x": torch.zeros(2)})),
                   1000.0 + 10 * machine.reach.step_s)
    assert machine.catch_up == 0 and machine.counters["catch_up_unconfirmed"] == 1
    # a checkpoint from before the pace was kept: measured anew, as before
    old_tensors, old_meta = state
    older = _restarted_and_synced((old_tensors, {k: v for k, v in old_meta.items() if k != "pace"}), 100)
    assert older.reach.step_s is None

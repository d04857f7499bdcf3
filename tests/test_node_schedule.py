"""The round-keyed fault schedule (protocols/node/schedule.py) both drivers honour, and its file side
in the daemon (peer.runtime.testhooks.ScheduleFiles): pure, no processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from peer.runtime.testhooks import (
    SCHEDULE_VARIABLE,
    ScheduleFiles,
    read_round,
    schedule_from_environment,
    schedule_json,
)
from protocols.errors import HivemeshError
from protocols.messages import ParamPush, StateSyncRequest
from protocols.node.schedule import (
    Cut,
    Flood,
    Hold,
    Join,
    MemberFaults,
    Reached,
    Schedule,
    Stop,
    from_plain,
    met,
    to_plain,
)

SCHEDULE = Schedule((
    Hold(member="p00", at_round=3, until=(Reached("p04", 3),)),
    Join(member="p04", when=(Reached("p00", 3),)),
    Flood(member="p00", at_round=3, to="p01", requests=2),
    Stop(member="p02", at_round=5, restart_when=(Reached("p01", 6),)),
    Cut(side_a=frozenset({"p00", "p01"}), side_b=frozenset({"p02", "p03", "p04"}), from_round=8,
        heal_when=(Reached("p00", 10), Reached("p02", 12))),
    Hold(member="p02", at_round=12, until=(Reached("p00", 10),)),
))


def faults_of(name: str, reached: dict[str, int], fired: set[int] | None = None) -> MemberFaults:
    return MemberFaults(SCHEDULE, name, reached=lambda m: reached.get(m, -1), fired=fired or set())


def test_faults_fire_once_in_schedule_order_and_a_hold_keeps_the_later_ones_back() -> None:
    reached: dict[str, int] = {}
    p00 = faults_of("p00", reached)
    assert p00.work_point(2) == []                      # not due yet
    assert p00.work_point(3) == [SCHEDULE.faults[0]]     # the hold; the flood after it waits
    assert p00.holding() and p00.work_point(3) == []
    reached["p04"] = 3
    assert not p00.holding()
    assert p00.work_point(3) == [SCHEDULE.faults[2]]     # released: the flood fires now, once
    assert p00.work_point(4) == [] and p00.work_point(8) == [SCHEDULE.faults[4]]  # the cut, from its round


def test_a_fault_passed_by_a_jump_fires_at_the_next_work_point_and_nothing_after_a_stop() -> None:
    p02 = faults_of("p02", {})
    assert p02.work_point(9) == [SCHEDULE.faults[3]]    # the stop (round 5, jumped past); the cut waits
    restarted = faults_of("p02", {}, fired=set(p02.fired))   # its next life: the stop has fired
    assert restarted.work_point(9) == [SCHEDULE.faults[4]]


def test_a_cut_drops_what_crosses_it_from_its_round_until_it_heals_here() -> None:
    reached: dict[str, int] = {}
    p01 = faults_of("p01", reached)
    push = ParamPush(round=8, tensors={"x": torch.zeros(1)})
    assert p01.drops("p02", push) and not p01.drops("p02", ParamPush(round=7, tensors={}))
    assert not p01.drops("p00", push)                        # same side
    assert not p01.drops("p02", StateSyncRequest())          # no round: goes through
    assert p01.work_point(8) == [SCHEDULE.faults[4]] and p01.heals() == []
    reached.update(p00=10, p02=12)
    assert p01.heals() == ["p02", "p03", "p04"] and p01.heals() == []   # once
    assert not p01.drops("p02", push)


def test_conditions_are_all_of_their_reached_rounds() -> None:
    assert met((), lambda m: -1)
    assert not met((Reached("a", 2), Reached("b", 1)), lambda m: {"a": 2}.get(m, -1))
    assert met((Reached("a", 2), Reached("b", 1)), lambda m: {"a": 3, "b": 1}[m])


def test_the_schedule_goes_through_plain_data_unchanged() -> None:
    assert from_plain(json.loads(json.dumps(to_plain(SCHEDULE)))) == SCHEDULE
    assert SCHEDULE.joins_later() == {"p04"} and [s.member for s in SCHEDULE.stops()] == ["p02"]
    with pytest.raises(KeyError):
        from_plain([{"kind": "explode", "member": "p00"}])


def test_the_daemon_side_shares_rounds_and_fired_faults_through_files(tmp_path: Path) -> None:
    files = ScheduleFiles(SCHEDULE, "p02", tmp_path)
    assert read_round(tmp_path, "p02") == -1
    files.reached(5)
    assert read_round(tmp_path, "p02") == 5
    assert files.work_point(5) == [SCHEDULE.faults[3]]
    files.reached(4)                                          # never backwards
    assert read_round(tmp_path, "p02") == 5
    again = ScheduleFiles(SCHEDULE, "p02", tmp_path)          # a restarted life: the stop has fired
    assert again.work_point(5) == []
    os.environ[SCHEDULE_VARIABLE] = schedule_json(SCHEDULE, tmp_path)
    try:
        loaded = schedule_from_environment("p00")
        assert loaded is not None and loaded.faults.schedule == SCHEDULE
        os.environ[SCHEDULE_VARIABLE] = "{not json"
        with pytest.raises(HivemeshError, match=SCHEDULE_VARIABLE):
            schedule_from_environment("p00")
    finally:
        del os.environ[SCHEDULE_VARIABLE]
    assert schedule_from_environment("p00") is None

"""The round machines' acceptance rule is one table (protocols/gossip/admission.py): every cell
enumerated, the boolean rule it replaced reproduced on a grid, and real machines acting on it."""

from __future__ import annotations

import itertools

import pytest
import torch
from _hostile import CONFIGS, HONEST, ME, ROUND_CONFIGS, D, honest_push

from protocols.events import Received, Start
from protocols.gossip import make_machine
from protocols.gossip.admission import TABLE, Admission, Distance, Lateness, admission, distance_of
from protocols.gossip.rounds import RoundMachine
from topology import build


def _old_rule(r: int, *, round_now: int, mra: int, catch_up: int, may_jump: bool,
              lateness: Lateness) -> Admission:
    """The flag algebra rounds.py had before the table, kept here as the specification it replaced."""
    keeps_late = lateness is not Lateness.NEVER
    any_age = lateness is Lateness.ANY_AGE
    horizon = round_now + mra
    far = r > horizon
    jump = may_jump and far and r > catch_up
    buffered = not far or jump or (r == catch_up > round_now)
    if not buffered and not any_age:
        return Admission.DROP_FUTURE
    oldest = round_now - (mra if keeps_late else 0)
    if r < oldest and not any_age:
        return Admission.STALE
    if jump:
        return Admission.JUMP
    if r < round_now or not buffered:
        return Admission.LATE
    return Admission.BUFFER


def test_the_table_has_one_cell_for_every_distance_stage_and_lateness() -> None:
    assert set(TABLE) == set(itertools.product(Distance, (True, False)))
    for row in TABLE.values():
        assert len(row) == len(Lateness)


@pytest.mark.parametrize("lateness", list(Lateness))
@pytest.mark.parametrize("may_jump", [True, False])
def test_the_table_reproduces_the_flag_rule_it_replaced(lateness: Lateness, may_jump: bool) -> None:
    cells_seen: set[Distance] = set()
    for round_now, mra in itertools.product(range(0, 7), range(1, 4)):
        for catch_up in [0, *range(round_now + 1, round_now + 2 * mra + 4)]:
            for r in range(0, round_now + 2 * mra + 5):
                distance = distance_of(r, round_now=round_now, max_rounds_ahead=mra, catch_up=catch_up)
                cells_seen.add(distance)
                expected = _old_rule(r, round_now=round_now, mra=mra, catch_up=catch_up,
                                     may_jump=may_jump, lateness=lateness)
                assert admission(distance, may_jump=may_jump, lateness=lateness) is expected, (
                    r, round_now, mra, catch_up)
    assert cells_seen == set(Distance)  # the grid reached every row


def test_what_the_table_promises_in_words() -> None:
    for (distance, may_jump), row in TABLE.items():
        for lateness, verdict in zip(Lateness, row, strict=True):
            # only a round beyond the jump target starts a jump, and only while jumping is allowed
            assert (verdict is Admission.JUMP) == (distance is Distance.BEYOND_TARGET and may_jump)
            # a kind that never keeps late messages never keeps one
            assert not (lateness is Lateness.NEVER and verdict is Admission.LATE)
            # the current round and the rounds within the window are always buffered
            if distance in (Distance.CURRENT, Distance.AHEAD, Distance.AT_TARGET):
                assert verdict is Admission.BUFFER
            # push-sum's mass is never dropped for its round: every message is kept somehow
            if lateness is Lateness.ANY_AGE:
                assert verdict in (Admission.BUFFER, Admission.JUMP, Admission.LATE)


_COUNTER = {Admission.LATE: "late_message", Admission.STALE: "stale_message",
            Admission.DROP_FUTURE: "dropped_future"}


@pytest.mark.parametrize("config_name", ROUND_CONFIGS)
@pytest.mark.parametrize("distance", list(Distance))
@pytest.mark.parametrize("training_over", [False, True])
def test_a_machine_does_what_its_cell_says(config_name: str, distance: Distance, training_over: bool) -> None:
    config = CONFIGS[config_name]
    machine = make_machine(config, name=ME, topology=build("ring:4"), params=torch.zeros(D))
    assert isinstance(machine, RoundMachine)
    machine.handle(Start(), 0.0)
    mra = config.max_rounds_ahead
    # place the machine in round R, about to jump to round `target` (white-box: only the position)
    round_now = mra + 1
    target = round_now + mra + 2  # far: the round just short of it is beyond the window too
    machine.round, machine.catch_up, machine.training_over = round_now, target, training_over
    machine.reach.worked(1, 1e-3)  # a fast step timed and a long wait: any round here is within
    machine.reach.advanced(0, 1.0)  # one sender's reach (catchup.py)
    r = {Distance.BEHIND_FAR: 0, Distance.BEHIND: round_now - 1, Distance.CURRENT: round_now,
         Distance.AHEAD: round_now + 1, Distance.SHORT_OF_TARGET: target - 1,
         Distance.AT_TARGET: target, Distance.BEYOND_TARGET: target + 1}[distance]
    assert distance_of(r, round_now=round_now, max_rounds_ahead=mra, catch_up=target) is distance
    assert r <= machine.last_round  # a round some member can be in
    may_jump = machine.CATCHES_UP and not training_over
    verdict = admission(distance, may_jump=may_jump, lateness=machine.LATENESS)
    before = dict(machine.counters)
    machine.handle(Received(HONEST, honest_push(machine, HONEST, r)), 0.5)
    changed = {k for k in machine.counters if machine.counters[k] != before.get(k, 0)}
    if verdict in _COUNTER:
        assert _COUNTER[verdict] in changed
    kept_late = any(m.round == r for _, m in machine.late)
    assert kept_late == (verdict is Admission.LATE)
    if verdict is Admission.JUMP:
        assert machine.catch_up == r
    else:
        assert machine.catch_up == target
    if verdict is Admission.BUFFER and distance is not Distance.CURRENT:
        assert HONEST in machine.inbox.get(r, {})

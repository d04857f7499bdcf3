"""The Node (protocols/node/node.py): each row of its routing table, on a real machine whose events
are recorded (pure, fast). p00 on ring:4: neighbours p01 and p03; p02 is not one. D-PSGD."""

from __future__ import annotations

from typing import Any

import torch

from protocols.events import (
    Event,
    Finished,
    NeighbourDown,
    NeighbourUp,
    Received,
    Send,
    SetTrainerStep,
    Start,
    StartWork,
    WorkDone,
)
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import (
    ErrorReply,
    Heartbeat,
    ParamPull,
    ParamPush,
    RoundStart,
    StateSyncRequest,
    StateSyncResponse,
)
from protocols.node import Adoption, Neighbour, Node, NodeConfig, Note
from topology import build

RING = build("ring:4")


class Recorded(Node[Neighbour]):
    """A Node whose machine's events are recorded, in order."""

    def __init__(self, *, total_steps: int = 20, **config: Any) -> None:
        params = torch.zeros(3)
        machine = make_machine(GossipConfig(total_steps=total_steps), name="p00", topology=RING,
                               params=params)
        self.events: list[Event] = []
        handle = machine.handle

        def recording(event: Event, now: float) -> Any:
            self.events.append(event)
            return handle(event, now)

        machine.handle = recording  # type: ignore[method-assign]
        super().__init__("p00", machine, neighbours={"p01": Neighbour(), "p03": Neighbour()},
                         config=NodeConfig(**config), early_per_neighbour=2,
                         answer_source=lambda: (params.clone(), 7))

    def fed(self) -> list[Any]:
        """The events since last asked; a Received as (sender, round), tensors compare badly."""
        events, self.events = self.events, []
        return [(e.sender, e.message.round) if isinstance(e, Received) and isinstance(e.message, ParamPush)
                else e for e in events]


def push(r: int, value: float = 1.0) -> ParamPush:
    return ParamPush(round=r, tensors={"x": torch.full((3,), value)})


def beat(step: int = 0, *, finished: bool = False) -> Heartbeat:
    return Heartbeat(step=step, loss=0.0, sent_at_s=0.0, finished=finished)


def answer(r: int, value: float) -> StateSyncResponse:
    return StateSyncResponse(round=r, tensors={"params": torch.full((3,), value)},
                             meta={"round": r, "steps_done": r, "trainer_step": r})


def test_at_start_the_machine_is_told_who_is_down_then_given_what_was_held() -> None:
    n = Recorded()
    n.receive("p01", beat(4), 0.0)
    n.receive("p01", push(0), 0.1)
    assert n.fed() == []                                    # nothing reaches the machine before Start
    assert n.neighbourhood["p01"].up and n.neighbourhood["p01"].step == 4
    n.start(1.0)
    assert n.fed() == [Start(), NeighbourDown("p03"), ("p01", 0)]  # p03 never heard


def test_a_neighbour_heard_after_start_comes_up_for_the_machine_once() -> None:
    n = Recorded()
    n.start(0.0)
    n.fed()
    n.receive("p03", beat(0, finished=True), 1.0)
    n.receive("p03", beat(1), 1.5)
    assert n.fed() == [NeighbourUp("p03")]
    assert n.neighbourhood["p03"].step == 1 and not n.neighbourhood["p03"].finished
    unreachable = Recorded()
    unreachable.start(0.0)
    unreachable.fed()
    unreachable.receive("p03", beat(), 1.0, reachable=False)   # heard, but we cannot answer yet
    assert unreachable.fed() == [] and not unreachable.neighbourhood["p03"].up


def test_messages_before_start_are_capped_per_neighbour_and_non_neighbours_refused() -> None:
    n = Recorded()
    for r in (0, 1, 2):
        n.receive("p01", push(r), 0.1 * r)
    n.receive("p02", push(0), 0.5)
    assert [m.round for m in n.early.held("p01")] == [1, 2]   # type: ignore[attr-defined]
    assert n.all_rejections() == {"early_overflow": 1, "early_not_neighbour": 1}
    n.start(1.0)
    assert [e for e in n.fed() if isinstance(e, tuple)] == [("p01", 1), ("p01", 2)]


def test_a_state_sync_request_is_answered_once_started_and_rate_limited() -> None:
    n = Recorded(sync_answer_interval_s=5.0)
    refused = [Send(("p01",), ErrorReply(code="sync_refused"))]
    assert n.receive("p01", StateSyncRequest(), 0.0) == refused     # not started: nothing to offer
    n.start(0.0)
    sent = [a for a in n.receive("p01", StateSyncRequest(), 1.0) if isinstance(a, Send)]
    assert [s.recipients for s in sent] == [("p01",), ("p01",)]    # the round resent, then the answer
    assert isinstance(sent[1].message, StateSyncResponse) and sent[1].message.meta["trainer_step"] == 7
    assert n.receive("p01", StateSyncRequest(), 2.0) == refused     # too soon: told so
    assert n.all_rejections() == {"sync_request_not_started": 1, "sync_request_too_often": 1}
    # p01 was heard (its first request) before Start; up since, its answered request tells it restarted
    assert n.fed() == [Start(), NeighbourDown("p03"), NeighbourUp("p01")]


def test_a_sync_waits_for_every_asked_neighbour_up_then_adopts_the_best_and_counts_a_late_one() -> None:
    n = Recorded()
    n.receive("p03", beat(), 0.0)
    n.receive("p01", beat(), 0.0)
    asked = n.begin_sync(resumed=False)
    assert n.syncing and [a.recipients for a in asked if isinstance(a, Send)] == [("p01", "p03")]
    unusable = n.receive("p01", answer(6, float("nan")), 0.5)
    assert n.syncing and any(isinstance(a, Note) and a.warning for a in unusable)
    assert n.receive("p01", answer(5, 3.0), 0.55) == []     # a second answer of one neighbour: late
    adopted = n.receive("p03", answer(4, 2.0), 0.6)         # the last one up: the best is taken
    assert not n.syncing and n.adoption is Adoption.ADOPTED
    assert SetTrainerStep(4) in adopted and any(isinstance(a, Note) for a in adopted)
    assert torch.equal(n.machine.params, torch.full((3,), 2.0)) and n.machine.position == (4, 4)
    n.receive("p01", answer(5, 3.0), 0.7)                   # after the sync: counted, not taken
    assert torch.equal(n.machine.params, torch.full((3,), 2.0))
    assert n.rejected == {"sync_answer_late": 2}
    assert n.fed() == []                                    # the machine is not started by a sync


def test_a_sync_takes_the_highest_round_then_the_lowest_name_whatever_the_order() -> None:
    for order in (("p01", "p03"), ("p03", "p01")):
        for rounds, winner in (({"p01": 4, "p03": 6}, 6.0), ({"p01": 5, "p03": 5}, 1.0)):
            n = Recorded()
            for name in order:
                n.receive(name, beat(), 0.0)
            n.begin_sync(resumed=False)
            for name in order:
                n.receive(name, answer(rounds[name], 1.0 if name == "p01" else 6.0), 0.5)
            assert not n.syncing and torch.equal(n.machine.params, torch.full((3,), winner)), (order, rounds)


def test_a_refusal_counts_as_an_answer_so_the_best_is_taken_without_waiting() -> None:
    n = Recorded()
    n.receive("p03", beat(), 0.0)
    n.receive("p01", beat(), 0.0)
    n.begin_sync(resumed=False)
    n.receive("p03", answer(4, 2.0), 0.5)
    assert n.syncing
    n.receive("p01", ErrorReply(code="sync_refused"), 0.6)   # p01 has not started: it says so
    assert not n.syncing and n.adoption is Adoption.ADOPTED and n.machine.position == (4, 4)
    n.receive("p01", ErrorReply(code="sync_refused"), 0.7)   # nobody waits for it any more
    assert n.rejected == {"sync_answer_late": 1}


def test_an_answer_nobody_asked_for_is_counted_and_not_taken() -> None:
    n = Recorded()
    n.receive("p01", beat(), 0.0)
    n.begin_sync(resumed=False)                             # asks its neighbours p01 and p03
    assert n.receive("p02", answer(9, 7.0), 0.5) == []      # p02 offers a later round, unasked
    assert n.syncing and n.rejected == {"sync_answer_unasked": 1}
    n.receive("p01", answer(4, 2.0), 0.6)                   # p03 is not up: not waited for
    assert not n.syncing and torch.equal(n.machine.params, torch.full((3,), 2.0))


def test_a_sync_stops_waiting_for_an_asked_neighbour_that_falls_silent() -> None:
    n = Recorded(neighbour_timeout_s=2.0)
    n.receive("p01", beat(), 0.0)
    n.receive("p03", beat(), 0.0)
    n.begin_sync(resumed=False)
    n.receive("p03", answer(4, 2.0), 1.5)
    assert n.syncing                                        # p01 is up: waited for
    silent, actions = n.expire(2.5)                         # p01 silent past the timeout: down
    assert silent == ["p01"] and SetTrainerStep(4) in actions
    assert not n.syncing and n.adoption is Adoption.ADOPTED


def test_a_sync_waits_only_for_neighbours_up_and_takes_what_it_has_at_the_timeout() -> None:
    n = Recorded()
    n.receive("p03", beat(), 0.0)
    n.receive("p01", beat(), 0.0)
    n.begin_sync(resumed=False)
    n.receive("p03", answer(4, 2.0), 0.5)
    assert n.syncing                                         # p01 is up: its answer is waited for
    assert SetTrainerStep(4) in n.sync_timed_out()           # the attempt's time is up: p03's is taken
    assert not n.syncing and n.sync.attempts_made == 1 and n.adoption is Adoption.ADOPTED
    m = Recorded()
    m.receive("p03", beat(), 0.0)                            # p01 never heard: not waited for
    m.begin_sync(resumed=False)
    m.receive("p03", answer(4, 2.0), 0.5)
    assert not m.syncing and m.adoption is Adoption.ADOPTED


def test_a_neighbour_up_all_along_that_asks_is_resent_the_round_once_per_answer() -> None:
    n = Recorded(sync_answer_interval_s=5.0)
    n.receive("p01", beat(), 0.0)
    n.receive("p03", beat(), 0.0)
    n.start(0.0)
    n.fed()
    first = n.receive("p01", StateSyncRequest(), 1.0)      # it restarted: the round is resent, then answered
    assert [type(a.message) for a in first if isinstance(a, Send)] == [ParamPush, StateSyncResponse]
    assert n.fed() == [NeighbourUp("p01")]
    assert n.receive("p01", StateSyncRequest(), 2.0) == [Send(("p01",), ErrorReply(code="sync_refused"))]
    # one that comes up by being heard is resent the round by that; its request is only answered
    n.goodbye("p03", 3.0)
    n.receive("p03", beat(), 3.0)
    n.fed()
    answered = n.receive("p03", StateSyncRequest(), 3.0)
    assert [type(a.message) for a in answered if isinstance(a, Send)] == [StateSyncResponse]
    assert n.fed() == []


def test_a_sync_nobody_answers_asks_its_attempts_then_says_so() -> None:
    n = Recorded(sync_attempts=2)
    assert len(n.begin_sync(resumed=False)) == 1
    assert [type(a) for a in n.sync_timed_out()] == [Send]  # the second attempt
    gave_up = n.sync_timed_out()
    assert not n.syncing and [type(a) for a in gave_up] == [Note]
    assert n.sync.outcomes == {"no_answer": 1} and n.adoption is None
    assert n.sync_timed_out() == []                          # over: a stray timeout does nothing


def test_a_restarted_member_that_heard_nobody_asks_once() -> None:
    n = Recorded(sync_attempts=5)
    n.begin_sync(resumed=True)
    assert [type(a) for a in n.sync_timed_out()] == [Note] and not n.syncing


def test_a_silent_neighbour_goes_down_for_the_machine_and_a_goodbye_at_once() -> None:
    n = Recorded(neighbour_timeout_s=2.0)
    n.receive("p01", beat(), 0.0)
    n.receive("p03", beat(), 0.0)
    n.start(0.0)
    n.fed()
    n.receive("p03", beat(), 1.5)
    silent, _ = n.expire(2.5)
    assert silent == ["p01"] and n.fed() == [NeighbourDown("p01")]
    assert n.expire(3.0)[0] == []                            # down once
    n.goodbye("p03", 3.0)
    assert n.fed() == [NeighbourDown("p03", left=True)] and not n.neighbourhood["p03"].up
    n.goodbye("p03", 3.5)
    assert n.fed() == []


def test_after_finishing_messages_still_reach_the_machine_which_counts_them() -> None:
    n = Recorded(total_steps=2)
    n.receive("p01", beat(), 0.0)
    n.receive("p03", beat(), 0.0)
    actions = n.start(0.0)
    finished = False
    for _ in range(50):  # each round: our work done, then both neighbours' messages
        r = n.machine.position[0]
        if StartWork(1) in actions:
            actions = n.handle(WorkDone(1, 0.0), 1.0)
        actions += n.receive("p01", push(r), 1.0) + n.receive("p03", push(r), 1.0)
        finished = finished or any(isinstance(a, Finished) for a in actions)
        if n.finished:
            break
    assert finished and n.finished
    before = n.machine.counters["after_finish"]
    n.receive("p01", push(n.machine.position[0]), 2.0)
    assert n.machine.counters["after_finish"] == before + 1


def test_a_kind_no_role_takes_is_counted_and_never_reaches_the_machine() -> None:
    n = Recorded()
    n.start(0.0)
    n.fed()
    for message in (ParamPull(round=0), ErrorReply(code="update_refused", detail="0"), RoundStart(round=1)):
        n.receive("p01", message, 1.0)
    n.receive("p02", ParamPull(round=0), 1.0)   # from a non-neighbour too: counted by kind first
    assert n.fed() == [NeighbourUp("p01")]
    assert n.rejected == {"no_role_for_param_pull": 2, "no_role_for_error": 1, "no_role_for_round_start": 1}


def test_the_node_says_which_messages_may_write_the_parameters() -> None:
    n = Recorded()
    assert not n.may_write_params(push(0))                 # not started: held, not mixed
    assert not n.may_write_params(answer(3, 1.0))          # no sync asked
    n.begin_sync(resumed=False)
    assert n.may_write_params(answer(3, 1.0))              # adopted in place
    n.start(0.0)
    assert n.may_write_params(push(0)) and n.may_write_params(ParamPull(round=0)) is False
    assert not n.may_write_params(beat()) and not n.may_write_params(StateSyncRequest())
    assert not n.may_write_params(RoundStart(round=0))    # no role here takes it


def test_a_heartbeat_from_a_member_that_is_not_a_neighbour_is_counted() -> None:
    n = Recorded()
    n.receive("p02", beat(9), 0.0)
    assert n.all_rejections() == {"heartbeat_not_neighbour": 1} and "p02" not in n.neighbourhood

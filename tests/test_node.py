"""protocols/node: the decisions both drivers make, and the Machine interface they use (pure, fast)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from protocols.errors import HivemeshError
from protocols.events import Machine, Received, Send, SetTrainerStep, Start, StartWork, WorkDone
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import ParamPush, StateSyncResponse
from protocols.node import Adoption, EarlyMessages, NodeConfig, StateSync, SyncOffer
from protocols.node.sync import best_offer
from topology import build

RING = build("ring:4")  # p00's neighbours: p01, p03
NEIGHBOURS = frozenset({"p01", "p03"})


def machine(algorithm: str = "dpsgd", *, numel: int = 3, **options: Any) -> Machine:
    spec = "directed-exponential:4" if algorithm == "pushsum" else "ring:4"
    built: Machine = make_machine(GossipConfig(algorithm=algorithm, total_steps=20, **options), name="p00",
                                  topology=build(spec), params=torch.zeros(numel))
    return built


def offer(round_index: int, steps_done: int, value: float = 2.0, numel: int = 3) -> SyncOffer:
    return SyncOffer(round=round_index, steps_done=steps_done, params=torch.full((numel,), value))


# ------------------------------------------------------------ asking

@pytest.mark.parametrize(("resumed", "heard_anyone", "attempts"),
                         [(False, False, 4), (False, True, 4), (True, True, 4), (True, False, 1)])
def test_a_sync_asks_its_attempts_then_counts_no_answer(resumed: bool, heard_anyone: bool,
                                                        attempts: int) -> None:
    sync = StateSync(NodeConfig(sync_attempts=4), NEIGHBOURS)
    sync.begin_asking(resumed=resumed, heard_anyone=heard_anyone)
    asked = 0
    while sync.ask():
        asked += 1
        assert asked <= 10
    assert asked == attempts and sync.attempts_made == attempts
    assert sync.outcomes["no_answer"] == 1
    sync.begin_asking(resumed=False, heard_anyone=True)  # a later sync starts afresh
    assert sync.ask() and sync.attempts_made == 1


# ------------------------------------------------------------ answering a state-sync request


def test_each_requester_is_answered_at_most_once_per_interval() -> None:
    sync = StateSync(NodeConfig(sync_answer_interval_s=5.0), NEIGHBOURS)
    answered = [sync.may_answer("p01", now, started=True) for now in (0.0, 1.0, 4.99)]
    assert answered == [True, False, False]
    assert sync.may_answer("p03", 1.0, started=True)  # another requester has its own allowance
    assert sync.may_answer("p01", 5.0, started=True)  # the interval has passed
    assert sync.answers_sent == 3
    assert sync.rejected == {"sync_request_too_often": 2}


def test_only_neighbours_are_answered_and_only_once_started() -> None:
    sync = StateSync(NodeConfig(), NEIGHBOURS)
    assert not sync.may_answer("p02", 0.0, started=True)
    assert not sync.may_answer("p01", 0.0, started=False)  # nothing better than the initial model yet
    assert sync.may_answer("p01", 0.0, started=True)  # a refusal before Start used no allowance
    assert sync.rejected == {"sync_request_not_neighbour": 1, "sync_request_not_started": 1}


def test_the_answer_says_where_the_machine_is() -> None:
    m = machine()
    m.join_at(4, 4)
    answer = StateSync.answer(m, torch.ones(3), trainer_step=5)
    assert (answer.round, answer.meta["round"], answer.meta["steps_done"], answer.meta["trainer_step"]) == \
        (4, 4, 4, 5)
    assert torch.equal(answer.tensors["params"], torch.ones(3))


def test_a_negative_answer_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="sync_answer_interval_s"):
        NodeConfig(sync_answer_interval_s=-1.0)


# ------------------------------------------------------------ choosing among answers


@pytest.mark.parametrize(("offers", "chosen"), [
    ({"p01": (4, 4)}, "p01"),
    ({"p01": (4, 4), "p03": (6, 6)}, "p03"),                 # the highest round
    ({"p03": (6, 6), "p01": (6, 6)}, "p01"),                 # a tie: the lowest name, whatever the order
    ({"p01": (6, 5), "p03": (6, 6)}, "p03"),                 # same round: the most steps done
    ({"p09": (7, 7), "p01": (6, 6), "p02": (7, 7)}, "p02"),
])
def test_a_sync_takes_the_highest_round_then_the_most_steps_then_the_lowest_name(
        offers: dict[str, tuple[int, int]], chosen: str) -> None:
    assert best_offer({name: offer(r, s) for name, (r, s) in offers.items()}) == chosen


def test_there_is_no_best_of_no_offer() -> None:
    with pytest.raises(ValueError):
        best_offer({})


# ------------------------------------------------------------ checking and adopting an answer


def test_an_answer_from_a_non_neighbour_or_unusable_is_counted_never_adopted() -> None:
    sync, m = StateSync(NodeConfig(), NEIGHBOURS), machine()
    good = StateSyncResponse(round=2, tensors={"params": torch.ones(3)}, meta={"round": 2, "steps_done": 2})
    assert not isinstance(sync.check("p02", good, m), SyncOffer)
    assert not isinstance(sync.check("p01", StateSyncResponse(round=2, tensors={"params": torch.ones(4)}), m),
                          SyncOffer)
    assert isinstance(sync.check("p01", good, m), SyncOffer)
    assert sync.rejected == {"sync_answer_not_neighbour": 1, "sync_answer_wrong_length": 1}


def test_adopting_copies_the_parameters_then_joins_then_sets_the_trainer_step() -> None:
    sync, m = StateSync(NodeConfig(), NEIGHBOURS), machine()
    outcome, actions = sync.adopt(offer(6, 6), m)
    assert outcome is Adoption.ADOPTED and actions == [SetTrainerStep(6)]
    assert torch.equal(m.params, torch.full((3,), 2.0)) and m.position == (6, 6)
    sends = [a for a in m.handle(Start(), 0.0) if isinstance(a, Send)]
    assert sends[0].message.round == 6  # it goes on from the adopted round, with the adopted values
    assert sync.outcomes == {"adopted": 1}


def test_an_answer_behind_us_is_kept_out() -> None:
    sync, m = StateSync(NodeConfig(), NEIGHBOURS), machine()
    m.join_at(8, 8)
    m.params.fill_(1.0)
    outcome, actions = sync.adopt(offer(7, 7), m)
    assert (outcome, actions) == (Adoption.KEPT, [])
    assert m.position == (8, 8) and torch.equal(m.params, torch.ones(3))


def test_an_algorithm_that_cannot_join_keeps_its_own_state() -> None:
    sync, m = StateSync(NodeConfig(), NEIGHBOURS), machine("choco")
    outcome, actions = sync.adopt(offer(6, 6), m)
    assert (outcome, actions) == (Adoption.REFUSED, [])
    assert m.position == (0, 0) and torch.equal(m.params, torch.zeros(3))  # not even the parameters
    assert sync.outcomes == {"refused": 1}


def test_the_outer_optimiser_restarts_from_the_adopted_parameters() -> None:
    # join_at after the copy: DiLoCo's anchor is the adopted model, not the one it replaced
    m = machine("local", local_steps=2, outer="diloco", outer_every=2)
    StateSync(NodeConfig(), NEIGHBOURS).adopt(offer(3, 6, value=5.0), m)
    anchor = m.export_state()[0]["outer/anchor"]
    assert torch.equal(anchor, torch.full((3,), 5.0))


# ------------------------------------------------------------ messages before Start


def test_early_messages_keep_the_newest_per_neighbour_and_count_the_rest() -> None:
    early = EarlyMessages(NEIGHBOURS, per_neighbour=3)
    for r in range(10):
        early.hold("p01", ParamPush(round=r))
    early.hold("p03", ParamPush(round=0))
    early.hold("p02", ParamPush(round=0))
    assert [m.round for m in early.held("p01")] == [7, 8, 9]  # type: ignore[attr-defined]
    assert len(early.held("p03")) == 1  # one neighbour's flood does not crowd out another
    assert early.held("p02") == []
    assert early.rejected == {"early_overflow": 7, "early_not_neighbour": 1}


def test_early_messages_are_released_once_in_arrival_order() -> None:
    early = EarlyMessages(NEIGHBOURS, per_neighbour=2)
    for sender, r in [("p01", 0), ("p03", 0), ("p01", 1), ("p01", 2), ("p03", 1)]:
        early.hold(sender, ParamPush(round=r))
    released = [(s, m.round) for s, m in early.release()]  # type: ignore[attr-defined]
    assert released == [("p03", 0), ("p01", 1), ("p01", 2), ("p03", 1)]
    assert early.release() == []


# ------------------------------------------------------------ the Machine interface


def test_a_catch_up_emits_the_trainer_step_before_the_next_rounds_work() -> None:
    params = torch.zeros(2)
    m = make_machine(GossipConfig(total_steps=10, max_rounds_ahead=2), name="p00", topology=RING,
                     params=params)
    m.handle(Start(), 0.0)
    for j in ("p01", "p03"):
        m.handle(Received(j, ParamPush(round=0, tensors={"x": torch.ones(2)})), 0.5)
    m.handle(WorkDone(1, 0.0), 1.0)  # round 0
    for j in ("p01", "p03"):  # both in-neighbours claim round 6: confirmed (catchup.py)
        m.handle(Received(j, ParamPush(round=6, tensors={"x": torch.ones(2)})), 4.0)
    actions = m.handle(WorkDone(1, 0.0), 5.0)
    steps = [a for a in actions if isinstance(a, SetTrainerStep | StartWork)]
    assert steps == [SetTrainerStep(6), StartWork(1)]  # round 1 done, rounds 2-5 skipped
    assert m.position == (6, 6)


def test_an_ordinary_round_sets_no_trainer_step() -> None:
    m = machine()
    actions = m.handle(Start(), 0.0) + m.handle(WorkDone(1, 0.0), 1.0)
    assert not any(isinstance(a, SetTrainerStep) for a in actions)


@pytest.mark.parametrize("algorithm", ["dpsgd", "local", "choco", "pushsum", "adpsgd"])
def test_position_is_what_the_exported_state_says(algorithm: str) -> None:
    m = machine(algorithm)
    m.handle(Start(), 0.0)
    m.handle(WorkDone(1, 0.0), 1.0)
    _, meta = m.export_state()
    assert m.position == (meta["round"], meta["steps_done"])


@pytest.mark.parametrize(("algorithm", "joinable"), [("dpsgd", True), ("local", True), ("choco", False),
                                                      ("pushsum", True), ("adpsgd", True)])
def test_every_machine_has_join_at_and_says_whether_it_can_join(algorithm: str, joinable: bool) -> None:
    m = machine(algorithm)
    assert m.joinable is joinable
    if joinable:
        m.join_at(3, 3)
        assert m.position == (3, 3)
    else:
        with pytest.raises(HivemeshError, match="cannot join"):
            m.join_at(3, 3)


@pytest.mark.parametrize(("algorithm", "compression", "carries"), [
    ("dpsgd", "identity", True), ("local", "identity", True), ("adpsgd", "identity", True),
    ("dpsgd", "fp16", False), ("pushsum", "identity", False), ("choco", "identity", False),
])
def test_the_machine_says_whether_its_messages_carry_the_senders_parameters(
        algorithm: str, compression: str, carries: bool) -> None:
    sender = machine(algorithm, compression=compression)
    sender.params.copy_(torch.tensor([1.0, 2.0, 3.0]))
    sends = [a for a in sender.handle(Start(), 0.0) if isinstance(a, Send)]
    assert sends, "the machine sent nothing to look at"
    found = machine(algorithm, compression=compression).sender_params(sends[0].message)
    if carries:
        assert found is not None and torch.equal(found, torch.tensor([1.0, 2.0, 3.0]))
    else:
        assert found is None

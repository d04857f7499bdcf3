"""The synchronous FedAvg server's round life cycle, driven by hand (no sockets, no clock).

Sampling by seed, over-selection, the deadline, every refusal counted by reason, failures as
data in the round's report, the pause between rounds, and a restore."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peer.cli.status import _federation_lines
from peer.runtime.gateway import failed_round_line
from protocols.events import (
    Action,
    CancelTimer,
    Finished,
    Metric,
    Received,
    Send,
    SetTimer,
    Start,
    TimerFired,
)
from protocols.federation import FedAvgServer, FederationConfig, ServerOptConfig, ServerPhase
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import ClientUpdate, RoundResult, RoundStart
from protocols.node import Neighbour, Node, NodeConfig
from topology import build

CLIENTS = tuple(f"c{i:02d}" for i in range(10))


def config(**overrides: object) -> FederationConfig:
    # exact FedAvg arithmetic below: the influence bounds off (tests/test_federation_influence.py)
    settings: dict[str, object] = {"fraction": 0.5, "min_clients": 2, "rounds": 3, "round_timeout_s": 10.0,
                                   "uplink": "identity", "samples_multiple": 0, "norm_multiple": 0}
    settings.update(overrides)
    return FederationConfig(**settings)  # type: ignore[arg-type]


def server(cfg: FederationConfig | None = None, clients: Sequence[str] = CLIENTS,
           pause_between_rounds: bool = False) -> FedAvgServer:
    return FedAvgServer(cfg or config(), name="gw", params=torch.zeros(4, dtype=torch.float64),
                        clients=clients, pause_between_rounds=pause_between_rounds)


def update(round_index: int, delta: Sequence[float], num_samples: int = 10) -> ClientUpdate:
    return ClientUpdate(round=round_index, num_samples=num_samples,
                        tensors={"x": torch.tensor(delta, dtype=torch.float64)})


def sends(actions: list[Action]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def round_start(actions: list[Action]) -> Send:
    (send,) = [s for s in sends(actions) if isinstance(s.message, RoundStart)]
    return send


def start_message(actions: list[Action]) -> RoundStart:
    message = round_start(actions).message
    assert isinstance(message, RoundStart)
    return message


# ---------------------------------------------------------------- sampling


def test_start_asks_a_seeded_sample_with_the_model_and_the_work() -> None:
    s = server()
    actions = s.handle(Start(), 0.0)
    send = round_start(actions)
    assert len(send.recipients) == 5 and set(send.recipients) <= set(CLIENTS)
    assert list(send.recipients) == sorted(send.recipients)
    assert isinstance(send.message, RoundStart)
    assert send.message.round == 0 and send.message.deadline_s == 10.0
    assert send.message.meta["local_epochs"] == 1 and send.message.meta["local_steps"] == 0
    assert torch.equal(send.message.tensors["x"], torch.zeros(4, dtype=torch.float64))
    assert SetTimer("deadline/0", 10.0) in actions
    assert s.phase is ServerPhase.OPEN


def test_sampling_depends_on_seed_and_round_not_on_registration_order() -> None:
    first = round_start(server(clients=CLIENTS).handle(Start(), 0.0)).recipients
    again = round_start(server(clients=tuple(reversed(CLIENTS))).handle(Start(), 5.0)).recipients
    assert first == again
    others = {round_start(server(config(seed=seed)).handle(Start(), 0.0)).recipients for seed in range(1, 6)}
    assert len(others | {first}) > 1  # another seed asks others


def test_rounds_draw_afresh() -> None:
    s = server(config(rounds=8))
    asked = [round_start(s.handle(Start(), 0.0)).recipients]
    for r in range(7):
        actions: list[Action] = []
        for client in asked[-1]:
            actions = s.handle(Received(client, update(r, [0, 0, 0, 0])), 1.0)
        asked.append(round_start(actions).recipients)
    assert len(set(asked)) > 1
    assert all(len(a) == 5 for a in asked)


# ---------------------------------------------------------------- a round's close


def test_quota_closes_the_round_and_fedavg_weighs_by_samples() -> None:
    s = server(config(fraction=0.2))  # m = 2
    asked = round_start(s.handle(Start(), 0.0)).recipients
    a, b = asked
    assert s.handle(Received(a, update(0, [1, 0, 0, 0], num_samples=1)), 1.0) == [
        Metric("updates_taken", 1.0)]
    actions = s.handle(Received(b, update(0, [0, 4, 0, 0], num_samples=3)), 2.0)
    assert CancelTimer("deadline/0") in actions
    assert torch.allclose(s.params, torch.tensor([0.25, 3.0, 0, 0], dtype=torch.float64))
    report = s.reports[0]
    assert report.closed_by == "quota" and report.taken == (a, b) and report.missing == ()
    assert report.aggregated and start_message(actions).round == 1


def test_over_selection_takes_the_first_m_and_counts_the_rest_surplus() -> None:
    # Prepare: m = 3 of 10, asked n = ceil(3 * 1.5) = 5
    s = server(config(fraction=0.3, over_selection=0.5))
    asked = round_start(s.handle(Start(), 0.0)).recipients
    assert len(asked) == 5
    # Execute: all five answer; the round closes at the third
    for i, client in enumerate(asked):
        s.handle(Received(client, update(0, [1, 1, 1, 1])), 1.0 + i)
    # Assert
    report = s.reports[0]
    assert report.taken == tuple(sorted(asked[:3])) and report.closed_by == "quota"
    assert report.missing == asked[3:] and report.late == asked[3:]
    assert s.counters["refused_surplus"] == 2 and s.counters["updates_taken"] == 3
    assert s.counters["refused_late"] == 0


def test_deadline_closes_with_what_came_and_late_answers_are_data() -> None:
    s = server()
    asked = round_start(s.handle(Start(), 0.0)).recipients
    for client in asked[:2]:
        s.handle(Received(client, update(0, [2, 0, 0, 0])), 1.0)
    actions = s.handle(TimerFired("deadline/0"), 10.0)
    report = s.reports[0]
    assert report.closed_by == "deadline" and report.taken == asked[:2] and report.missing == asked[2:]
    assert torch.allclose(s.params, torch.tensor([2.0, 0, 0, 0], dtype=torch.float64))
    assert start_message(actions).round == 1
    # a straggler of round 0 answers during round 1: refused late, and the report says so
    s.handle(Received(asked[2], update(0, [9, 9, 9, 9])), 11.0)
    assert s.reports[0].late == (asked[2],)
    assert s.counters["refused_late"] == 1
    assert s.status()["last_contact_s"][asked[2]] == 11.0 and s.status()["round"] == 1
    assert torch.allclose(s.params, torch.tensor([2.0, 0, 0, 0], dtype=torch.float64))


def test_a_stale_deadline_timer_is_ignored() -> None:
    s = server(config(fraction=0.2))
    asked = round_start(s.handle(Start(), 0.0)).recipients
    for client in asked:
        s.handle(Received(client, update(0, [1, 1, 1, 1])), 1.0)
    assert s.handle(TimerFired("deadline/0"), 10.0) == []
    assert s.round == 1 and 1 not in s.reports


def test_too_few_updates_leave_the_model_alone() -> None:
    s = server(config(min_updates=2))
    asked = round_start(s.handle(Start(), 0.0)).recipients
    s.handle(Received(asked[0], update(0, [5, 5, 5, 5])), 1.0)
    s.handle(TimerFired("deadline/0"), 10.0)
    assert not s.reports[0].aggregated and s.counters["rounds_failed"] == 1
    assert torch.equal(s.params, torch.zeros(4, dtype=torch.float64))


# ---------------------------------------------------------------- refusals


def test_every_refusal_is_counted_by_reason_and_none_is_taken() -> None:
    # Prepare
    s = server()
    asked = round_start(s.handle(Start(), 0.0)).recipients
    outsider = next(c for c in CLIENTS if c not in asked)
    hostile = [
        (outsider, update(0, [1, 1, 1, 1])),  # registered, not sampled
        ("stranger", update(0, [1, 1, 1, 1])),  # not even registered
        (asked[0], update(1, [1, 1, 1, 1])),  # a future round
        (asked[0], update(-1, [1, 1, 1, 1])),  # a past round it was never in
        (asked[0], update(0, [1, 1, 1])),  # wrong length
        (asked[0], update(0, [1, float("nan"), 1, 1])),  # not finite
        (asked[0], update(0, [1, 1, 1, 1], num_samples=0)),
        (asked[0], ClientUpdate(round=0, num_samples=5, tensors={})),  # nothing in it
    ]
    # Execute
    for sender, message in hostile:
        s.handle(Received(sender, message), 1.0)
    # Assert
    assert s.counters["updates_taken"] == 0
    assert s.counters["refused_update"] == len(hostile)
    assert s.counters["refused_not_sampled"] == 2
    assert s.counters["refused_wrong_round"] == 2
    assert s.counters["refused_bad_update"] == 3
    assert s.counters["refused_bad_update_wrong_length"] == 1
    assert s.counters["refused_bad_update_nonfinite"] == 1
    assert s.counters["refused_bad_update_missing_part"] == 1
    assert s.counters["refused_bad_num_samples"] == 1
    # a valid update, then the same client again
    s.handle(Received(asked[0], update(0, [1, 1, 1, 1])), 2.0)
    s.handle(Received(asked[0], update(0, [1, 1, 1, 1])), 2.0)
    assert s.counters["updates_taken"] == 1 and s.counters["refused_duplicate"] == 1
    s.handle(TimerFired("deadline/0"), 10.0)
    # the open round's refusals are in its report (wrong-round ones belong to no round)
    assert dict(s.reports[0].refused) == {"bad_num_samples": 1, "bad_update": 3, "duplicate": 1,
                                          "not_sampled": 2}


def test_finish_sends_the_final_model_and_refuses_what_follows() -> None:
    s = server(config(rounds=1, fraction=0.2))
    asked = round_start(s.handle(Start(), 0.0)).recipients
    s.handle(Received(asked[0], update(0, [1, 0, 0, 0])), 1.0)
    actions = s.handle(Received(asked[1], update(0, [3, 0, 0, 0])), 1.0)
    assert Finished() in actions
    (result,) = [a for a in sends(actions) if isinstance(a.message, RoundResult)]
    assert result.recipients == CLIENTS
    assert isinstance(result.message, RoundResult)
    assert torch.allclose(result.message.tensors["x"], torch.tensor([2.0, 0, 0, 0], dtype=torch.float64))
    s.handle(Received(asked[0], update(1, [1, 1, 1, 1])), 2.0)
    assert s.phase is ServerPhase.FINISHED and s.counters["refused_after_finish"] == 1


# ---------------------------------------------------------------- registration, pause, restore


def test_no_round_before_enough_clients_register() -> None:
    s = server(config(min_registered=3), clients=("a", "b"))
    assert s.handle(Start(), 0.0) == [] and s.phase is ServerPhase.WAITING
    # the status says what the wait is for, in words (hivemesh status)
    (head, *_) = _federation_lines({**s.status(), "rounds": 3})
    assert head.endswith("(waiting); a round opens with 3 registered clients (min_clients, min_registered), "
                         "2 now: a, b"), head
    actions = s.register("c", 1.0)
    assert round_start(actions).recipients and s.phase is ServerPhase.OPEN


def test_pause_between_rounds_waits_for_resume_and_sends_what_params_hold() -> None:
    s = server(config(fraction=0.2), pause_between_rounds=True)
    asked = round_start(s.handle(Start(), 0.0)).recipients
    for client in asked:
        actions = s.handle(Received(client, update(0, [1, 1, 1, 1])), 1.0)
    assert not [a for a in sends(actions)] and s.phase is ServerPhase.PAUSED
    s.params.fill_(7.0)  # what gossip between rounds would do
    start = round_start(s.resume(2.0)).message
    assert isinstance(start, RoundStart) and start.round == 1
    assert torch.equal(start.tensors["x"], torch.full((4,), 7.0, dtype=torch.float64))


def test_restore_reopens_the_same_round_with_the_same_draw() -> None:
    momentum = ServerOptConfig(name="fedavgm")
    s = server(config(fraction=0.2, server_opt=momentum))
    asked = round_start(s.handle(Start(), 0.0)).recipients
    actions: list[Action] = []
    for client in asked:
        actions = s.handle(Received(client, update(0, [1, 2, 3, 4])), 1.0)
    opened = round_start(actions).recipients  # round 1, open when the state is taken
    fresh = server(config(fraction=0.2, server_opt=momentum))
    fresh.restore_state(s.export_state())
    again = round_start(fresh.handle(Start(), 5.0))
    assert again.recipients == opened and isinstance(again.message, RoundStart) and again.message.round == 1
    assert torch.equal(fresh.params, s.params) and torch.equal(fresh.opt_state["m"], s.opt_state["m"])


# ---------------------------------------------------------------- hosted on a gateway's Node


def test_a_gateway_node_hosts_the_server_beside_its_gossip_machine() -> None:
    # Prepare: a gossip member p00 of a ring, with the FedAvg server as its "fedavg" role
    machine = make_machine(GossipConfig(total_steps=10), name="p00", topology=build("ring:4"),
                           params=torch.zeros(3))
    fed = server(config(fraction=0.2))
    node = Node("p00", machine, neighbours={"p01": Neighbour(), "p03": Neighbour()}, config=NodeConfig(),
                early_per_neighbour=2, answer_source=lambda: (torch.zeros(3), 0), roles={"fedavg": fed})
    # Execute / Assert: Start opens round 0, its timer and metrics prefixed with the role's name
    started = node.start(0.0)
    assert SetTimer("fedavg/deadline/0", 10.0) in started and Metric("fedavg.round", 0.0) in started
    asked = fed.asked
    node.receive(asked[0], update(0, [1, 1, 1, 1]), 1.0)
    node.receive("c99", update(0, [1, 1, 1, 1]), 1.0)  # routed to the server, which refuses it
    assert fed.counters["updates_taken"] == 1 and fed.counters["refused_not_sampled"] == 1
    closed = node.handle(TimerFired("fedavg/deadline/0"), 10.0)
    assert fed.reports[0].closed_by == "deadline" and fed.reports[0].taken == (asked[0],)
    assert SetTimer("fedavg/deadline/1", 20.0) in closed


def test_a_failed_round_is_one_line_naming_why_and_who_was_missing() -> None:
    # the gateway's console says it as the round closes (peer/runtime/gateway.py), not only its status
    s = server(config(min_clients=2, fraction=0.2, min_updates=2))
    asked = round_start(s.handle(Start(), 0.0)).recipients
    s.handle(Received(asked[0], update(0, [1, 1, 1, 1])), 1.0)
    s.handle(TimerFired(key="deadline/0"), 11.0)
    (report,) = s.reports.values()
    assert not report.aggregated
    assert failed_round_line(report) == (f"round 0 failed (deadline): 1 of 2 asked taken, missing "
                                         f"{asked[1]}; the model did not change")
    assert all(failed_round_line(r) == "" for r in s.reports.values() if r.aggregated)

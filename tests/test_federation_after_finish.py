"""A finished federation server answers a client that comes late (protocols/federation/server_base.py):
one that registers or sends an update after the end gets the final ``RoundResult``, at most once per
client per ``round_timeout_s``, counted; both servers (synchronous FedAvg and FedBuff), restored
ones too, and through a gateway's Node whose gossip machine has finished."""

from __future__ import annotations

import pytest
import torch

from protocols.events import Action, Finished, NeighbourUp, Received, Send, Start
from protocols.federation import FedAvgClient, FedAvgServer, FedBuffServer, FederationConfig, make_server
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import ClientUpdate, Heartbeat, RoundResult, RoundStart
from protocols.node import Neighbour, Node, NodeConfig
from topology import build

CLIENTS = ("a", "b")
TIMEOUT_S = 10.0
MODES = {"sync": {"fraction": 1.0, "min_clients": 2},
         "fedbuff": {"mode": "fedbuff", "concurrency": 2, "buffer_size": 2}}


def config(mode: str) -> FederationConfig:
    # exact FedAvg arithmetic below: the influence bounds off (tests/test_federation_influence.py)
    return FederationConfig(rounds=1, round_timeout_s=TIMEOUT_S, uplink="identity",  # type: ignore[arg-type]
                            samples_multiple=0, norm_multiple=0, **MODES[mode])


def finished_server(mode: str) -> tuple[FedAvgServer | FedBuffServer, RoundResult]:
    """A server of ``mode`` that ran its one round with a and b (finished at t = 1), and the end it sent."""
    server = make_server(config(mode), name="gw", params=torch.zeros(3, dtype=torch.float64), clients=CLIENTS)
    server.handle(Start(), 0.0)
    actions: list[Action] = []
    for client, delta in zip(CLIENTS, ([1.0, 0, 0], [3.0, 0, 0]), strict=True):
        actions = server.handle(Received(client, update(delta)), 1.0)
    assert Finished() in actions and server.finished
    (end,) = results(actions)
    assert end.recipients == CLIENTS and isinstance(end.message, RoundResult)
    return server, end.message


def update(delta: list[float], round_index: int = 0) -> ClientUpdate:
    tensors = {"x": torch.tensor(delta, dtype=torch.float64)}
    return ClientUpdate(round=round_index, num_samples=10, tensors=tensors)


def results(actions: list[Action]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send) and isinstance(a.message, RoundResult)]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_client_that_registers_after_the_end_gets_the_final_model(mode: str) -> None:
    # Prepare
    server, end = finished_server(mode)
    client = FedAvgClient(config(mode), name="late", server="gw", num_samples=10, steps_per_epoch=1,
                          params=torch.full((3,), 9.0, dtype=torch.float64))
    # Execute
    (answer,) = results(server.handle(NeighbourUp("late"), 50.0))
    # Assert: the end as the others got it; the late client takes it and finishes
    assert answer.recipients == ("late",) and answer.message is end
    assert server.counters["final_answers"] == 1 and "late" in server.registered
    assert client.handle(Received("gw", answer.message), 50.1) == [Finished()]
    assert torch.equal(client.params, server.params)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_update_after_the_end_is_refused_and_answered_once_per_round_timeout(mode: str) -> None:
    server, _ = finished_server(mode)
    # a was sent the end at t = 1: within round_timeout_s it is not sent again
    assert results(server.handle(Received("a", update([1.0, 1, 1])), 5.0)) == []
    assert server.counters["final_answer_limited"] == 1 and server.counters["final_answers"] == 0
    # its copy may have been lost: after round_timeout_s it is answered again
    (answer,) = results(server.handle(Received("a", update([1.0, 1, 1])), 1.0 + TIMEOUT_S))
    assert answer.recipients == ("a",)
    assert server.counters["refused_after_finish"] == 2 and server.counters["final_answers"] == 1
    assert server.counters["updates_taken"] == 2    # the two of the round only


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_flood_after_the_end_gets_one_model_per_round_timeout(mode: str) -> None:
    # Prepare
    server, _ = finished_server(mode)
    # Execute: 250 updates and 250 registrations from one client, one each 0.1 s for 25 s
    answers = 0
    for k in range(250):
        now = 100.0 + 0.1 * k
        answers += len(results(server.handle(Received("late", update([1.0, 0, 0])), now)))
        answers += len(results(server.handle(NeighbourUp("late"), now + 0.05)))
    # Assert: at t = 100, 110 and 120 only; every other request counted
    assert answers == 3 == server.counters["final_answers"]
    assert server.counters["final_answer_limited"] == 500 - 3
    assert server.counters["refused_after_finish"] == 250


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_server_restored_finished_answers_with_its_model(mode: str) -> None:
    server, end = finished_server(mode)
    fresh = make_server(config(mode), name="gw", params=torch.zeros(3, dtype=torch.float64))
    fresh.restore_state(server.export_state())
    (answer,) = results(fresh.handle(NeighbourUp("b"), 2.0))   # a restart forgot what it sent
    assert isinstance(answer.message, RoundResult) and answer.message.round == end.round == 1
    assert torch.equal(answer.message.tensors["x"], end.tensors["x"])
    assert torch.equal(end.tensors["x"], torch.tensor([2.0, 0, 0], dtype=torch.float64))


def test_a_gateway_node_whose_gossip_finished_answers_a_late_client() -> None:
    """The gateway's machine finished with the federation (a daemon lingers ``finish_grace_s``
    then): a client heard for the first time is still ``NeighbourUp`` to the server, which answers;
    a client's heartbeats while it is up are liveness only (no answer each)."""
    # Prepare: a gossip member of a ring, the finished server as its "fedavg" role
    server, end = finished_server("sync")
    machine = make_machine(GossipConfig(total_steps=10), name="p00", topology=build("ring:4"),
                           params=torch.zeros(3))
    node = Node("p00", machine, neighbours={"p01": Neighbour(), "p03": Neighbour()}, config=NodeConfig(),
                early_per_neighbour=2,
                answer_source=lambda: (torch.zeros(3), 0), roles={"fedavg": server},
                clients=(*CLIENTS, "late"))
    node.start(2.0)
    node.finished = True    # what its machine's last round does
    beat = Heartbeat(step=0, finished=False)
    # Execute
    first = node.receive("late", beat, 3.0)
    again = node.receive("late", beat, 3.5)
    # Assert
    (answer,) = results(first)
    assert answer.recipients == ("late",) and answer.message is end
    assert results(again) == [] and server.counters["final_answers"] == 1


def test_round_start_is_not_the_answer() -> None:
    """The answer is the end, never a new round: a late client is not asked to train."""
    server, _ = finished_server("fedbuff")
    actions = server.handle(NeighbourUp("late"), 30.0)
    assert not [a for a in actions if isinstance(a, Send) and isinstance(a.message, RoundStart)]
    assert len(results(actions)) == 1

"""A federation on the per-member Node (protocols/node/node.py): a gateway is a Node with its gossip
machine and the FedAvg server as a role, an edge client a Node whose machine is its FedAvg client
(protocols/federation/edge_machine.py). Clients register by being heard (the Node's ``clients`` failure
detector tells the roles ``NeighbourUp``) and leave by falling silent (``NeighbourDown``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from protocols.events import NeighbourUp, Send, StartWork, WorkDone
from protocols.federation import FedAvgClient, FedAvgServer, FederationConfig, make_server
from protocols.federation.edge_machine import EdgeMachine
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import ClientUpdate, Heartbeat, RoundStart
from protocols.node import Neighbour, Node, NodeConfig
from topology import build

# exact FedAvg arithmetic below: the influence bounds off (tests/test_federation_influence.py)
CONFIG = FederationConfig(rounds=2, fraction=1.0, min_clients=2, local_epochs=0, local_steps=1,
                          uplink="identity", samples_multiple=0, norm_multiple=0)
NODE = NodeConfig(neighbour_timeout_s=5.0)


def gateway(clients: tuple[str, ...]) -> tuple[Node[Neighbour], FedAvgServer]:
    params = torch.zeros(4)
    machine = make_machine(GossipConfig(total_steps=10), name="p00", topology=build("ring:3"), params=params)
    server = make_server(CONFIG, name="p00", params=params)
    assert isinstance(server, FedAvgServer)
    node = Node("p00", machine, neighbours={"p01": Neighbour(), "p02": Neighbour()}, config=NODE,
                early_per_neighbour=2, answer_source=lambda: (params.clone(), 0),
                roles={"fedavg": server}, clients=clients)
    return node, server


def edge(name: str) -> tuple[Node[Neighbour], FedAvgClient]:
    client = FedAvgClient(CONFIG, name=name, server="p00", params=torch.zeros(4), num_samples=3,
                          steps_per_epoch=1)
    node = Node(name, EdgeMachine(client), neighbours={"p00": Neighbour()}, config=NODE,
                early_per_neighbour=2, answer_source=lambda: (client.params.clone(), 0))
    return node, client


def sends(actions: Sequence[object]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def test_clients_heard_register_with_the_server_and_the_round_runs_through_both_nodes() -> None:
    # Prepare: one client heard before the gateway starts, one after
    node, server = gateway(("e0", "e1"))
    e0, e1 = edge("e0")[0], edge("e1")[0]
    edges = {"e0": e0, "e1": e1}
    beat = sends(e0.tick(0.0, step=0, loss=0.0))
    assert beat and beat[0].recipients == ("p00",) and isinstance(beat[0].message, Heartbeat)
    node.receive("e0", beat[0].message, 0.1)
    assert server.registered == set()              # roles hear of clients from Start on
    # Execute: Start registers e0 (heard before); e1's heartbeat registers it and opens round 0
    started = sends(node.start(0.2))
    assert not any(isinstance(s.message, RoundStart) for s in started) and server.registered == {"e0"}
    opened = node.receive("e1", Heartbeat(step=0, loss=0.0), 0.3)
    # Assert: the round asks both; each edge trains on its Node and uploads through it
    starts = [s for s in sends(opened) if isinstance(s.message, RoundStart)]
    assert len(starts) == 1 and starts[0].recipients == ("e0", "e1")
    assert node.all_rejections() == {}             # a client's heartbeat is no stray one
    for name, member in edges.items():
        member.start(0.3)
        work = member.receive("p00", starts[0].message, 0.4)
        assert StartWork(1) in work
        member.machine.params.add_(1.0 if name == "e0" else 3.0)   # the "training"
        update = sends(member.handle(WorkDone(steps=1, loss=0.0), 0.5))
        assert update[0].recipients == ("p00",) and isinstance(update[0].message, ClientUpdate)
        node.receive(name, update[0].message, 0.6)
    assert server.round == 1 and torch.allclose(server.params, torch.full((4,), 2.0))


def test_a_silent_client_is_unregistered_and_registered_again_when_heard() -> None:
    node, server = gateway(("e0", "e1", "e2"))
    node.start(0.0)
    for name in ("e0", "e1", "e2"):
        node.receive(name, Heartbeat(step=0, loss=0.0), 1.0)
    assert server.registered == {"e0", "e1", "e2"}
    for name in ("e0", "e1"):
        node.receive(name, Heartbeat(step=0, loss=0.0), 5.0)
    # Execute: e2 silent past the timeout, then heard again
    silent, _ = node.expire(7.0)
    assert silent == [] and server.registered == {"e0", "e1"}
    node.receive("e2", Heartbeat(step=0, loss=0.0), 8.0)
    assert server.registered == {"e0", "e1", "e2"}
    node.goodbye("e1", 9.0)
    assert server.registered == {"e0", "e2"}


def test_a_gateway_beats_to_the_clients_it_hears_so_one_not_asked_knows_it_is_registered() -> None:
    # Prepare: three clients known, e0 and e1 heard, e2 never
    node, _ = gateway(("e0", "e1", "e2"))
    e0 = edge("e0")[0]
    node.start(0.0)
    for name in ("e0", "e1"):
        node.receive(name, Heartbeat(step=0, loss=0.0), 0.5)
    # Execute: the gateway's next heartbeat, and e0 hearing it
    beats = [s for s in sends(node.tick(1.0, step=0, loss=0.0)) if isinstance(s.message, Heartbeat)]
    e0.start(1.0)
    e0.receive("p00", beats[0].message, 1.1)
    # Assert: the gossip neighbours and the clients heard get it, not one never heard; the client
    # counts its gateway up (what its wait's words read: registered, not asked yet)
    assert len(beats) == 1 and beats[0].recipients == ("p01", "p02", "e0", "e1")
    assert e0.neighbourhood["p00"].up and e0.all_rejections() == {}


def test_a_client_that_says_it_leaves_is_waited_for_no_more_and_shown_as_left() -> None:
    """An edge stopping sends its farewell (a heartbeat saying finished): the gateway's open round
    closes once the others answered ("answered"), not at its deadline; heard again, it registers."""
    # Prepare: a round open for e0 and e1; e0's update taken
    node, server = gateway(("e0", "e1"))
    (e0, _), (e1, _) = edge("e0"), edge("e1")
    node.start(0.0)
    node.receive("e0", Heartbeat(step=0, loss=0.0), 0.1)
    start = next(s for s in sends(node.receive("e1", Heartbeat(step=0, loss=0.0), 0.2))
                 if isinstance(s.message, RoundStart))
    e0.start(0.2)
    e0.receive("p00", start.message, 0.3)
    e0.machine.params.add_(1.0)
    node.receive("e0", sends(e0.handle(WorkDone(steps=1, loss=0.0), 0.4))[0].message, 0.5)
    # Execute: e1, asked, says it leaves (it has heard its gateway, so it has a neighbour to tell)
    e1.start(0.2)
    e1.receive("p00", Heartbeat(step=0, loss=0.0), 0.3)
    farewell = sends(e1.farewell(step=0, loss=0.0))
    node.receive("e1", farewell[0].message, 0.6)
    left = (server.round, server.reports[0].closed_by, server.reports[0].missing, set(server.registered))
    node.receive("e1", Heartbeat(step=0, loss=0.0), 0.7)
    # Assert: round 0 closed at 0.6 s (its deadline: 60 s) with e0's update; e1 back on its next beat
    assert farewell[0].recipients == ("p00",) and farewell[0].message.finished
    assert left == (1, "answered", ("e1",), {"e0"})
    assert server.reports[0].closed_at_s == 0.6 and torch.allclose(server.params, torch.ones(4))
    assert server.registered == {"e0", "e1"} and not node.clients["e1"].finished


def test_the_gossip_machine_never_hears_of_clients_and_an_unknown_sender_is_counted() -> None:
    node, server = gateway(("e0",))
    node.start(0.0)
    actions = node.receive("e0", Heartbeat(step=0, loss=0.0), 1.0)
    assert NeighbourUp("e0") not in actions                 # no machine event leaks as an action
    node.receive("x9", Heartbeat(step=0, loss=0.0), 1.0)    # neither neighbour nor client
    assert node.all_rejections() == {"heartbeat_not_neighbour": 1}
    assert "e0" not in node.neighbourhood and server.registered == {"e0"}


def test_fedavg_rounds_fall_on_every_gth_gossip_round() -> None:
    from protocols.federation.interleave import fedavg_round_due, gossip_total_rounds

    assert [fedavg_round_due(k, 3) for k in range(7)] == [True, False, False, True, False, False, True]
    assert all(fedavg_round_due(k, g) for k in range(5) for g in (0, 1))   # no gossip: every round
    assert gossip_total_rounds(30, 2) == 60 and gossip_total_rounds(30, 0) == 30
    with pytest.raises(ValueError):
        fedavg_round_due(-1, 2)


@pytest.mark.parametrize(("gossip_rounds", "mode", "ready_at"),
                         [(2, "sync", {4: [], 5: [], 6: [2]}), (0, "sync", {4: [], 5: [2]}),
                          (0, "fedbuff", {4: [2]})])
def test_a_closed_round_is_recorded_once_the_gossip_after_it_is_over(
        gossip_rounds: int, mode: str, ready_at: dict[int, list[int]]) -> None:
    from protocols.federation.interleave import GossipedRounds

    # Prepare: FedAvg round 2 closes during gossip round 4 (its work)
    gossiped = GossipedRounds(gossip_rounds=gossip_rounds, mode=mode)
    gossiped.closed(2, gossip_round=4)
    # Execute, Assert: given once, after its exchanges (two; one without gossip; none under FedBuff)
    assert {g: gossiped.ready(g) for g in ready_at} == ready_at
    assert gossiped.ready(9) == []
    gossiped.closed(3, gossip_round=9)
    assert gossiped.ready(9, flush=True) == [3]      # a stop: whatever waits
    gossiped.closed(4, gossip_round=9, last=True)    # the last: the machine's final gossip may follow
    assert gossiped.ready(100) == [] and gossiped.ready(100, flush=True) == [4]


def test_a_direct_call_on_a_role_comes_back_prefixed() -> None:
    from protocols.events import SetTimer

    node, _ = gateway(("e0", "e1"))
    node.start(0.0)
    assert node.role_actions("fedavg", [SetTimer("deadline/0", 1.0)]) == [SetTimer("fedavg/deadline/0", 1.0)]

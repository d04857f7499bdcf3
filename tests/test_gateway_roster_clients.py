"""A gateway's edge clients follow the roster while it runs (issue 16, item 3): one whose config
names no clients serves every ``edge`` member of each roster version from that version's round on
(protocols/node/node.py, ``Serving`` in protocols/node/membership.py), so an edge client
added by ``hivemesh roster add --role edge`` is registered by its next heartbeat without a
restart, and one removed is no longer asked. A gateway that names its clients keeps them (one
added with its entry naming the gateway: tests/test_gateway_edge_assignment.py). And a
gateway's checkpoints count its rounds (it trains nothing, so its trainer's step never moves).
The same in real processes across hosts: tests/test_hosts_federation.py.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _gateway_support import Machine, Server

from peer.cli.init import default_network
from peer.runtime.netinit import GATEWAY_CHECKPOINT_ROUNDS, create_federation
from peer.runtime.peerconfig import load_peer_config
from protocols.identity import Identity
from protocols.messages import Heartbeat
from protocols.node import Neighbour, Node, NodeConfig, Note
from protocols.node.membership import Serving
from protocols.roster import Member, Roster
from topology import build

GATEWAYS = ("gw0", "gw1")
EFFECTIVE_ROUND = 5
KEYS: dict[str, Identity] = {}


def roster_of(edges: tuple[str, ...], **version: int) -> Roster:
    gateways = tuple(Member(name=name, public_id=KEYS.setdefault(name, Identity.generate()).public_id,
                            role="gateway", address=f"tcp://127.0.0.1:{9000 + i}")
                     for i, name in enumerate(GATEWAYS))
    clients = tuple(Member(name=name, public_id=KEYS.setdefault(name, Identity.generate()).public_id,
                           role="edge", address="") for name in edges)
    return Roster(gateways + clients, **version)






def gateway(*, clients: tuple[str, ...],
            configured: tuple[str, ...]) -> tuple[Node[Neighbour], Machine, Server]:
    machine, server = Machine(), Server()
    node: Node[Neighbour] = Node("gw0", machine, neighbours={"gw1": Neighbour()},  # type: ignore[arg-type]
                                 config=NodeConfig(), early_per_neighbour=2,
                                 answer_source=lambda: (torch.zeros(2), 0), roles={"fedavg": server},
                                 clients=clients, serving=Serving("gw0", configured))
    node.set_membership(roster_of(("e00", "e01")), build("ring", GATEWAYS))
    node.start(0.0)
    return node, machine, server


def registered(server: Server) -> list[tuple[str, str]]:
    return [(kind, name) for kind, name in server.events if kind in ("NeighbourUp", "NeighbourDown")]


def test_served_clients_are_the_rosters_edge_members() -> None:
    assert Serving("gw0").clients(roster_of(("e01", "e00", "e07"))) == ("e00", "e01", "e07")
    assert Serving("gw0").clients(roster_of(())) == ()


def test_an_edge_added_to_the_roster_is_served_from_its_round_and_a_removed_one_is_let_go() -> None:
    # Prepare: gw0 serves e00 and e01 (the roster's); version 2 adds e02 and removes e00 from round 5
    node, machine, server = gateway(clients=("e00", "e01"), configured=())
    node.receive("e00", Heartbeat(step=0, loss=0.0), 0.5)
    v2 = roster_of(("e01", "e02"), version=2, effective_round=EFFECTIVE_ROUND)
    node.change_membership(v2, build("ring", GATEWAYS), 1.0, make_neighbour=Neighbour)
    # Execute: before round 5, e02's heartbeat registers nothing
    early = node.receive("e02", Heartbeat(step=0, loss=0.0), 1.5)
    # Assert
    assert early == [] and node.clients.names() == ("e00", "e01")
    assert node.all_rejections()["client_not_served_yet"] == 1
    # Execute: the machine reaches round 5 (any event it handles), then e02 beats
    machine.position = (EFFECTIVE_ROUND, 0)
    settled = node.handle(object(), 2.0)  # type: ignore[arg-type]
    node.receive("e02", Heartbeat(step=0, loss=0.0), 2.5)
    # Assert: e02 known and registered by its heartbeat; e00 gone for the server
    assert Note("edge clients from roster version 2: added e02, removed e00") in settled
    assert node.clients.names() == ("e01", "e02")
    assert registered(server) == [("NeighbourUp", "e00"), ("NeighbourDown", "e00"), ("NeighbourUp", "e02")]


def test_a_gateway_that_names_its_clients_keeps_them_through_a_roster_change() -> None:
    # Prepare: gw0's config names e00 alone
    node, machine, server = gateway(clients=("e00",), configured=("e00",))
    v2 = roster_of(("e00", "e01", "e02"), version=2, effective_round=EFFECTIVE_ROUND)
    # Execute
    node.change_membership(v2, build("ring", GATEWAYS), 1.0, make_neighbour=Neighbour)
    machine.position = (EFFECTIVE_ROUND, 0)
    settled = node.handle(object(), 2.0)  # type: ignore[arg-type]
    node.receive("e02", Heartbeat(step=0, loss=0.0), 2.5)
    # Assert
    assert node.clients.names() == ("e00",)
    assert not any(isinstance(a, Note) and a.text.startswith("edge clients") for a in settled)
    assert registered(server) == []


def test_init_a_lone_gateway_serves_the_rosters_edges_and_checkpoints_each_round(tmp_path: Path) -> None:
    network = default_network(topology="ring", task="digits-mlp", algorithm="dpsgd", compression="identity",
                              steps=10, seed=0, partition="iid", alpha=0.5)
    lone = create_federation(tmp_path / "one", gateways=1, edges=3, network=network, federation={"rounds": 2})
    two = create_federation(tmp_path / "two", gateways=2, edges=4, network=network, federation={"rounds": 2})
    assert load_peer_config(lone.network.configs["gw0"]).peer.clients == ()
    assert load_peer_config(two.network.configs["gw0"]).peer.clients == ("e000", "e001")
    # a gateway's checkpoint interval is in rounds: one a round
    every = load_peer_config(lone.network.configs["gw0"]).checkpoint.every_steps
    assert every == GATEWAY_CHECKPOINT_ROUNDS == 1


def test_a_member_without_roles_serves_no_edge_client_from_the_roster() -> None:
    # Prepare: a plain gossip peer (no FedAvg role) whose config names no clients, as the daemon builds
    # every peer without [peer] clients; the roster gains an edge client
    machine = Machine()
    node: Node[Neighbour] = Node("gw0", machine, neighbours={"gw1": Neighbour()},  # type: ignore[arg-type]
                                 config=NodeConfig(), early_per_neighbour=2,
                                 answer_source=lambda: (torch.zeros(2), 0), serving=Serving("gw0"))
    node.set_membership(roster_of(("e00",)), build("ring", GATEWAYS))
    node.start(0.0)
    v2 = roster_of(("e00", "e01"), version=2, effective_round=EFFECTIVE_ROUND)
    node.change_membership(v2, build("ring", GATEWAYS), 1.0, make_neighbour=Neighbour)
    machine.position = (EFFECTIVE_ROUND, 0)
    # Execute
    settled = node.handle(object(), 2.0)  # type: ignore[arg-type]
    node.receive("e01", Heartbeat(step=0, loss=0.0), 2.5)
    # Assert: nothing to serve them with, so no edge client is taken in, and its heartbeat is refused
    assert node.clients.names() == ()
    assert not any(isinstance(a, Note) and a.text.startswith("edge clients") for a in settled)
    assert node.all_rejections()["heartbeat_not_neighbour"] == 1


def test_a_fedbuff_gateway_counts_its_model_versions_for_its_checkpoints(tmp_path: Path) -> None:
    # Prepare: a FedBuff gateway's pieces (its gossip machine has one round, the whole buffered run, so
    # its machine's steps stay 0 until the end); its server has applied 3 buffers
    from peer.runtime.daemon import PeerDaemon
    from tests._federation_support import make_federation
    from tests.test_daemon_limits import RecordingTransport

    files = make_federation(tmp_path / "fed", edges=3, mode="fedbuff", rounds=10, min_clients=1,
                            buffer_size=2)
    gateway = PeerDaemon(load_peer_config(files.network.configs["gw0"]))
    gateway.transport = RecordingTransport()  # type: ignore[assignment]
    try:
        assert gateway.gateway_work is not None
        now = gateway.now()
        assert gateway.gateway is not None and not gateway.gateway.due(gateway._work_done(), now)
        gateway.gateway_work.server.version = 3     # type: ignore[union-attr]
        # Execute, Assert: its checkpoints follow the versions (one a version, as init sets), and are
        # named by them
        assert gateway.gateway.due(gateway._work_done(), now)
        assert gateway._checkpoint(final=False) and gateway.store.step == 3
    finally:
        gateway.parts.lock.release()


def test_a_checkpoint_table_given_to_init_keeps_the_gateways_interval_in_rounds(tmp_path: Path) -> None:
    # a [checkpoint] table that names only keep: the interval stays one a round, not the default 100
    network = default_network(topology="ring", task="digits-mlp", algorithm="dpsgd", compression="identity",
                              steps=10, seed=0, partition="iid", alpha=0.5)
    files = create_federation(tmp_path / "fed", gateways=1, edges=2, network=network,
                              federation={"rounds": 2}, sections={"checkpoint": {"keep": 3}})
    checkpoint = load_peer_config(files.network.configs["gw0"]).checkpoint
    assert (checkpoint.every_steps, checkpoint.keep) == (GATEWAY_CHECKPOINT_ROUNDS, 3)

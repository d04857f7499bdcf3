"""A revoked edge client leaves its gateway's clients at once (protocols/node/node.py), not at its
neighbour timeout or the version's round: the FedAvg server is told it is down (not asked again) and
its updates are refused at the Node, counted ``sender_revoked``. In-process: the Node with a
stand-in machine and server, no sockets."""

from __future__ import annotations

import torch
from _gateway_support import Machine, Server

from protocols.identity import Identity
from protocols.messages import ClientUpdate, Heartbeat
from protocols.node import Neighbour, Node, NodeConfig, Note
from protocols.node.membership import Connect, Serving
from protocols.roster import Member, Roster
from topology import build

GATEWAYS = ("gw0", "gw1")
EDGES = ("e00", "e01")
EFFECTIVE_ROUND = 5
TIMEOUT_S = 30.0     # the neighbour timeout: nothing in this test comes near it


def roster() -> Roster:
    members = []
    for index, name in enumerate((*GATEWAYS, *EDGES)):
        identity = Identity.generate()
        gateway = name in GATEWAYS
        members.append(Member(name=name, public_id=identity.public_id, role="gateway" if gateway else "edge",
                              address=f"tcp://127.0.0.1:{9000 + index}" if gateway else "",
                              curve_key=identity.curve_public_key))
    return Roster(tuple(members))






def test_a_revoked_edge_client_leaves_the_gateways_clients_at_once_and_its_updates_are_refused() -> None:
    # Prepare: gw0 serves e00 and e01, both heard (registered with the server)
    v1 = roster()
    machine, server = Machine(), Server()
    node: Node[Neighbour] = Node("gw0", machine, neighbours={"gw1": Neighbour()},  # type: ignore[arg-type]
                                 config=NodeConfig(neighbour_timeout_s=TIMEOUT_S), early_per_neighbour=2,
                                 answer_source=lambda: (torch.zeros(2), 0), roles={"fedavg": server},
                                 clients=EDGES, serving=Serving("gw0"))
    node.set_membership(v1, build("ring", GATEWAYS))
    node.start(0.0)
    for name in EDGES:
        node.receive(name, Heartbeat(step=0, loss=0.0), 0.5)
    node.receive("e01", ClientUpdate(round=0, num_samples=4), 0.6)
    # Execute: version 2 revokes e01 from round 5; the gateway is still at round 0
    v2 = v1.revoke("e01").revised(EFFECTIVE_ROUND)
    actions = node.change_membership(v2, build("ring", GATEWAYS), 1.0, make_neighbour=Neighbour)
    late = node.receive("e01", ClientUpdate(round=0, num_samples=4), 1.5)
    beat = node.receive("e01", Heartbeat(step=1, loss=0.0), 1.6)
    # Assert: e01 is gone for the server at once, long before its round or its timeout ...
    assert node.clients.names() == ("e00",)
    assert Note("edge clients revoked at roster version 2: e01 let go at once") in actions
    [connect] = [a for a in actions if isinstance(a, Connect)]
    assert "e01" not in connect.roster and "e00" in connect.roster     # (its key leaves the allowlist)
    # ... and what is handed over from it afterwards never reaches the server, counted
    assert late == [] and beat == []
    assert node.all_rejections()["sender_revoked"] == 2
    assert server.events == [("NeighbourUp", "e00"), ("NeighbourUp", "e01"), ("ClientUpdate", "e01"),
                             ("NeighbourDown", "e01")]
    # e00, not revoked, is still served; at the version's round nothing more happens to e01
    node.receive("e00", ClientUpdate(round=0, num_samples=4), 2.0)
    machine.position = (EFFECTIVE_ROUND, 0)
    node.handle(object(), 3.0)  # type: ignore[arg-type]
    assert server.events[4:] == [("ClientUpdate", "e00")]
    assert node.clients.names() == ("e00",)

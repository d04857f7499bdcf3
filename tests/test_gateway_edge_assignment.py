"""A new edge client joins a running federation of several gateways (issue 16, item 3).

Each gateway's config lists its clients (``hivemesh init`` writes them in blocks), so a client
added later is assigned by its roster entry: ``hivemesh roster add e010 --role edge --gateway gw1``
(``Member.gateway``). The one rule, ``Serving`` in protocols/node/membership.py, is what a gateway
applies at start-up (peer/runtime/assemble.py) and at each roster version's round (the Node). And a
joiner's transport key is admitted as soon as the version is learnt, so it may connect before its
round; it is served (asked into rounds) only from that round on, and a revoked one is shut out at
once. In-process: the Node with a stand-in machine and server, no sockets.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _gateway_support import Machine, Server

from peer.cli.main import main
from peer.files import roster_file
from peer.runtime.assemble import gateway_serving
from peer.runtime.edge import EdgeClient
from peer.runtime.edgeconfig import load_edge_config
from peer.runtime.netinit import load_roster
from peer.runtime.peerconfig import load_peer_config
from protocols.errors import HivemeshError
from protocols.identity import Identity
from protocols.messages import Heartbeat
from protocols.node import Neighbour, Node, NodeConfig, Note
from protocols.node.membership import Connect, Serving
from protocols.roster import Member, Roster
from topology import build

GATEWAYS = ("gw0", "gw1")
EFFECTIVE_ROUND = 5
KEYS: dict[str, Identity] = {}


def member(name: str, role: str, gateway: str = "") -> Member:
    identity = KEYS.setdefault(name, Identity.generate())
    address = f"tcp://127.0.0.1:{9000 + GATEWAYS.index(name)}" if role == "gateway" else ""
    return Member(name=name, public_id=identity.public_id, role=role, address=address,
                  curve_key=identity.curve_public_key, gateway=gateway)


def roster_of(edges: dict[str, str], *, version: int = 1, effective_round: int = 0) -> Roster:
    """The two gateways and ``edges`` (name -> the gateway its entry names, "" for none)."""
    return Roster((*(member(name, "gateway") for name in GATEWAYS),
                   *(member(name, "edge", gateway) for name, gateway in edges.items())),
                  version=version, effective_round=effective_round)






def gateway(name: str, roster: Roster,
            configured: tuple[str, ...]) -> tuple[Node[Neighbour], Machine, Server]:
    machine, server = Machine(), Server()
    serving = Serving(name, configured)
    other = next(g for g in GATEWAYS if g != name)
    node: Node[Neighbour] = Node(name, machine, neighbours={other: Neighbour()},  # type: ignore[arg-type]
                                 config=NodeConfig(), early_per_neighbour=2,
                                 answer_source=lambda: (torch.zeros(2), 0), roles={"fedavg": server},
                                 clients=serving.clients(roster), serving=serving)
    node.set_membership(roster, build("ring", GATEWAYS))
    node.start(0.0)
    return node, machine, server


def beat(node: Node[Neighbour], sender: str, now: float) -> None:
    node.receive(sender, Heartbeat(step=0, loss=0.0), now)


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(("named", "configured", "served"), [
    ("gw0", ("e00",), True),     # the entry names this gateway: whatever its config lists
    ("gw0", (), True),
    ("gw1", ("e01",), False),    # ... or another: never here, even if this config lists it
    ("gw1", (), False),
    ("", (), True),              # none named: a gateway that lists none serves every edge member
    ("", ("e01",), True),        # ... one that lists it
    ("", ("e00",), False),       # ... not one that lists others
])
def test_which_gateway_serves_an_edge_client(named: str, configured: tuple[str, ...], served: bool) -> None:
    roster = roster_of({"e00": "", "e01": named})
    assert ("e01" in Serving("gw0", configured).clients(roster)) is served


def test_every_edge_client_has_exactly_one_gateway_when_the_configs_split_them() -> None:
    # init's blocks: gw0 lists e00, e01; gw1 lists e02, e03; e04 and e05 joined later by entries
    roster = roster_of({"e00": "", "e01": "", "e02": "", "e03": "", "e04": "gw1", "e05": "gw0"})
    lists = {"gw0": ("e00", "e01"), "gw1": ("e02", "e03")}
    served = {name: Serving(name, lists[name]).clients(roster) for name in GATEWAYS}
    assert served == {"gw0": ("e00", "e01", "e05"), "gw1": ("e02", "e03", "e04")}


def test_the_roster_refuses_a_gateway_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="not a gateway on the roster"):
        roster_of({"e00": "gw9"})
    with pytest.raises(ValueError, match="only an edge client names its gateway"):
        Member(name="p0", public_id=Identity.generate().public_id, role="peer",
               address="tcp://127.0.0.1:9", gateway="gw0")
    roster = roster_of({"e00": "gw1"})
    assert Roster.from_dict(roster.to_dict()).member("e00").gateway == "gw1"


# ------------------------------------------------------------------ the Node


def test_a_gateway_that_lists_its_clients_takes_a_joiner_whose_entry_names_it_from_its_round() -> None:
    # Prepare: gw0 lists e00; version 2 adds e02 (its entry names gw0) and e03 (names gw1)
    v1 = roster_of({"e00": "", "e01": ""})
    node, machine, server = gateway("gw0", v1, ("e00",))
    beat(node, "e00", 0.5)
    v2 = roster_of({"e00": "", "e01": "", "e02": "gw0", "e03": "gw1"}, version=2,
                   effective_round=EFFECTIVE_ROUND)
    # Execute: the version is learnt at round 0
    actions = node.change_membership(v2, build("ring", GATEWAYS), 1.0, make_neighbour=Neighbour)
    # Assert: both joiners' transport keys are admitted at once (they may connect and heartbeat) ...
    [connect] = [a for a in actions if isinstance(a, Connect)]
    assert {KEYS["e02"].curve_public_key, KEYS["e03"].curve_public_key} <= connect.roster.curve_allowlist()
    # ... but neither is served before round 5: e02's heartbeat is counted, not registered
    beat(node, "e02", 1.5)
    assert node.clients.names() == ("e00",)
    assert node.all_rejections()["client_not_served_yet"] == 1
    # Execute: round 5 begins (any event the Node handles), the joiners beat
    machine.position = (EFFECTIVE_ROUND, 0)
    settled = node.handle(object(), 2.0)  # type: ignore[arg-type]
    beat(node, "e02", 2.5)
    beat(node, "e03", 2.5)
    # Assert: e02 served and registered here, e03 is gw1's (its heartbeat here is a stranger's)
    assert Note("edge clients from roster version 2: added e02, removed none") in settled
    assert node.clients.names() == ("e00", "e02")
    assert server.events == [("NeighbourUp", "e00"), ("NeighbourUp", "e02")]
    assert node.all_rejections()["heartbeat_not_neighbour"] == 1


def test_the_other_gateway_takes_the_joiner_named_for_it() -> None:
    v1 = roster_of({"e00": "", "e01": ""})
    node, machine, server = gateway("gw1", v1, ("e01",))
    v2 = roster_of({"e00": "", "e01": "", "e03": "gw1"}, version=2, effective_round=EFFECTIVE_ROUND)
    node.change_membership(v2, build("ring", GATEWAYS), 1.0, make_neighbour=Neighbour)
    machine.position = (EFFECTIVE_ROUND, 0)
    node.handle(object(), 2.0)  # type: ignore[arg-type]
    beat(node, "e03", 2.5)
    assert node.clients.names() == ("e01", "e03")
    assert server.events == [("NeighbourUp", "e03")]


def test_a_revoked_edge_client_is_shut_out_and_let_go_at_once() -> None:
    # Prepare: gw0 serves e00 and e02 (e02's entry names it)
    v1 = roster_of({"e00": "", "e02": "gw0"})
    node, machine, server = gateway("gw0", v1, ("e00",))
    beat(node, "e02", 0.5)
    # Execute: version 2 revokes e02 from round 5
    v2 = v1.revoke("e02").revised(EFFECTIVE_ROUND)
    actions = node.change_membership(v2, build("ring", GATEWAYS), 1.0, make_neighbour=Neighbour)
    # Assert: its key leaves the transport's allowlist at once (no new handshake gets through), and
    # the server lets it go at once too (not at the version's round: a sampled update is refused)
    [connect] = [a for a in actions if isinstance(a, Connect)]
    assert "e02" not in connect.roster
    assert KEYS["e02"].curve_public_key not in connect.roster.curve_allowlist()
    assert node.clients.names() == ("e00",)
    assert server.events == [("NeighbourUp", "e02"), ("NeighbourDown", "e02")]
    # ... and stays gone once its round has come
    machine.position = (EFFECTIVE_ROUND, 0)
    node.handle(object(), 2.0)  # type: ignore[arg-type]
    assert node.clients.names() == ("e00",)
    assert server.events == [("NeighbourUp", "e02"), ("NeighbourDown", "e02")]


def test_roster_add_names_an_edge_clients_gateway(tmp_path: Path) -> None:
    path = tmp_path / "roster.toml"
    roster_file.write(path, roster_of({"e00": ""}))
    key = tmp_path / "e010.key"
    assert main(["keygen", "--out", str(key)]) == 0
    assert main(["roster", "add", "e010", "--roster", str(path), "--key", str(key), "--role", "edge",
                 "--gateway", "gw1", "--effective-round", "4"]) == 0
    written = roster_file.read(path)
    assert (written.version, written.effective_round, written.member("e010").gateway) == (2, 4, "gw1")
    assert Serving("gw0", ("e00",)).clients(written) == ("e00",)     # gw1's, not gw0's


def test_a_joiner_named_for_gw1_is_gw1s_at_start_up_and_its_config_must_agree(tmp_path: Path) -> None:
    # Prepare: init's two gateways list e000-e001 and e002-e003; e010 is added for gw1
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "2", "--edges", "4", "--rounds", "3", "--out", str(out)]) == 0
    key = out / "keys" / "e010.key"
    assert main(["keygen", "--out", str(key)]) == 0
    assert main(["roster", "add", "e010", "--roster", str(out / "roster.toml"), "--key", str(key),
                 "--role", "edge", "--gateway", "gw1", "--effective-round", "2"]) == 0
    roster = load_roster(out / "roster.toml")
    # Execute / Assert: a gateway (re)started now serves by the same rule
    served = {name: gateway_serving(load_peer_config(out / f"{name}.toml"), name).clients(roster)
              for name in GATEWAYS}
    assert served == {"gw0": ("e000", "e001"), "gw1": ("e002", "e003", "e010")}
    # an edge config copied from gw0's client, its gateway left as gw0: refused at start, named
    config = (out / "e000.toml").read_text().replace("e000", "e010")
    (out / "e010.toml").write_text(config)
    with pytest.raises(HivemeshError, match="gives e010 to gateway 'gw1'"):
        EdgeClient(load_edge_config(out / "e010.toml"))

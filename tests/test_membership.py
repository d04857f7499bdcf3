"""Membership that changes while the network runs (issue 11, item 5; acceptance e).

A roster carries a version and the round from which it holds; every member applies a change at
that round, with no restart and no new run id, and refuses a member whose roster version differs
for the round in question, naming both versions. Pure tests first, then a simulated ring that
gains one member and loses another mid-run.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from peer.cli.main import main
from peer.files import roster_file
from protocols.events import Send
from protocols.identity import Identity
from protocols.messages import Heartbeat, ParamPush, StateSyncResponse
from protocols.node import Neighbour, Node, NodeConfig, Note
from protocols.node.membership import Connect, Membership
from protocols.roster import Member, Roster, RosterError
from sim.gossip_driver import GossipRun, SimPeer
from sim.scenario import scenario_from_dict
from sim.world import build_world
from topology import build
from topology.membership import ChangingGraph

torch.set_num_threads(1)

OLD = ("p00", "p01", "p02", "p03", "p04")           # version 1
NEW = ("p00", "p01", "p03", "p04", "p05")           # version 2: adds p05, removes p02
EFFECTIVE_ROUND = 40
NETWORK = {"topology": "ring", "task": "logreg", "task_options": {"n_samples": 100, "n_features": 4},
           "gossip": {"algorithm": "dpsgd", "total_steps": 5}}


KEYS: dict[str, Identity] = {}   # one key per name: a key changes only by a signed rotation


def roster_of(names: tuple[str, ...], **version: int) -> Roster:
    members = tuple(Member(name=name, public_id=KEYS.setdefault(name, Identity.generate()).public_id,
                           address=f"tcp://127.0.0.1:{9000 + i}") for i, name in enumerate(names))
    return Roster(members, **version)


# ------------------------------------------------------------ the roster


def test_a_roster_carries_its_version_and_effective_round_through_its_file(tmp_path: Path) -> None:
    roster = roster_of(OLD).revised(EFFECTIVE_ROUND)
    path = tmp_path / "roster.toml"
    roster_file.write(path, roster)
    text = path.read_text()
    assert "version = 2" in text and f"effective_round = {EFFECTIVE_ROUND}" in text
    assert text.index("version") < text.index("[[member]]")
    again = roster_file.read(path)
    assert (again.version, again.effective_round, again.names) == (2, EFFECTIVE_ROUND, OLD)
    # a roster without them (every roster before versions) is version 1 from round 0
    old_style = {"member": [m.to_dict() for m in roster]}
    assert (Roster.from_dict(old_style).version, Roster.from_dict(old_style).effective_round) == (1, 0)
    for bad in ({"version": 0}, {"version": True}, {"effective_round": -1}, {"effective_round": "7"}):
        with pytest.raises(RosterError, match=r"version|effective_round"):
            Roster.from_dict({**old_style, **bad})


def test_roster_cli_edits_bump_the_version_and_take_the_effective_round(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "roster.toml")
    ids = [Identity.generate().public_id for _ in range(3)]
    assert main(["roster", "add", "--roster", path, "p00", "--public-id", ids[0], "--address", "h:1"]) == 0
    assert roster_file.read(path).version == 1     # a new roster starts at version 1
    assert main(["roster", "add", "--roster", path, "p01", "--public-id", ids[1], "--address", "h:2",
                 "--effective-round", "120"]) == 0
    assert "version 2, effective from round 120" in capsys.readouterr().out
    assert main(["roster", "remove", "--roster", path, "p00", "--effective-round", "300"]) == 0
    roster = roster_file.read(path)
    assert (roster.version, roster.effective_round, roster.names) == (3, 300, ("p01",))
    assert main(["roster", "show", "--roster", path]) == 0
    assert "version 3, effective from round 300" in capsys.readouterr().out


def test_the_run_id_does_not_change_when_a_member_is_added(tmp_path: Path) -> None:
    from peer.runtime.assemble import assemble
    from peer.runtime.netinit import create_network
    from peer.runtime.peerconfig import load_peer_config

    # Prepare: a network of three; its run id as p00 computes it
    files = create_network(tmp_path / "net", peers=3, network=NETWORK)
    config = load_peer_config(files.configs["p00"])
    parts = assemble(config)
    before = parts.run_id
    parts.lock.release()
    # Execute: a fourth member joins the roster
    roster = roster_file.read(config.roster_path)
    joiner = Member(name="p03", public_id=Identity.generate().public_id, address="tcp://127.0.0.1:1")
    roster_file.write(config.roster_path, roster.add(joiner).revised(10))
    parts = assemble(load_peer_config(files.configs["p00"]))
    parts.lock.release()
    # Assert: the same run id, and the new member is in the graph
    assert parts.run_id == before
    assert "p03" in parts.topology.names


def test_gateways_are_members_of_the_topology(tmp_path: Path) -> None:
    from peer.runtime.assemble import peer_topology
    from peer.runtime.netinit import create_network
    from peer.runtime.peerconfig import load_peer_config

    files = create_network(tmp_path / "net", peers=3, network=NETWORK)
    config = load_peer_config(files.configs["p00"])
    roster = roster_file.read(config.roster_path)
    gateway = Member(name="g0", public_id=Identity.generate().public_id, role="gateway", address="tcp://h:1")
    edge = Member(name="phone", public_id=Identity.generate().public_id, role="edge")
    assert peer_topology(config, roster.add(gateway).add(edge)).names == ("g0", "p00", "p01", "p02")


# ------------------------------------------------------------ the graph and the version rule


def test_a_changing_graph_answers_with_the_old_graph_before_its_round_and_the_new_one_from_it() -> None:
    old, new = build("ring", OLD), build("ring", NEW)
    graph = ChangingGraph(old, new, EFFECTIVE_ROUND)
    assert graph.names == ("p00", "p01", "p02", "p03", "p04", "p05")
    r = EFFECTIVE_ROUND
    assert set(graph.in_neighbours("p01", r - 1)) == {"p00", "p02"}
    assert set(graph.in_neighbours("p01", r)) == {"p00", "p03"}
    assert graph.in_neighbours("p05", r - 1) == {} and graph.self_weight("p05", r - 1) == 1.0
    assert graph.out_neighbours("p02", r) == {} and graph.self_weight("p02", r) == 1.0
    assert graph.neighbours("p01") == ("p00", "p02", "p03")       # stay connected to both until r
    assert graph.neighbours_from("p01") == ("p00", "p03") and graph.neighbours_from("p02") == ()


def test_the_version_in_force_follows_the_round() -> None:
    v1 = roster_of(OLD)
    v2 = dataclasses.replace(v1, version=2, effective_round=EFFECTIVE_ROUND)
    membership = Membership(v1).changed_to(v2)
    assert [membership.version_at(r) for r in (0, EFFECTIVE_ROUND - 1, EFFECTIVE_ROUND)] == [1, 1, 2]
    assert membership.stamp(ParamPush(round=EFFECTIVE_ROUND)).roster_version == 2      # type: ignore[union-attr]
    assert membership.mismatch(ParamPush(round=EFFECTIVE_ROUND - 1, roster_version=1)) is None
    assert membership.mismatch(ParamPush(round=EFFECTIVE_ROUND, roster_version=1)) == (EFFECTIVE_ROUND, 1, 2)
    assert membership.mismatch(Heartbeat(step=3)) is None
    with pytest.raises(ValueError, match="not newer"):
        membership.changed_to(v1)


class Recording:
    """A machine stand-in that records what it is fed (the Node's routing is what is tested)."""

    accepts = frozenset({ParamPush})
    position = (EFFECTIVE_ROUND, 0)

    def __init__(self) -> None:
        self.fed: list[Any] = []
        self.graph: Any = None

    def handle(self, event: Any, now: float) -> list[Any]:
        self.fed.append(event)
        return []

    def set_graph(self, topology: Any) -> None:
        self.graph = topology


def node_at_round(round_index: int) -> tuple[Node[Neighbour], Recording]:
    machine = Recording()
    machine.position = (round_index, 0)
    node: Node[Neighbour] = Node("p01", machine, neighbours={"p00": Neighbour(), "p02": Neighbour()},  # type: ignore[arg-type]
                                 config=NodeConfig(), early_per_neighbour=4,
                                 answer_source=lambda: (torch.zeros(2), 0))
    node.set_membership(roster_of(OLD), build("ring", OLD))
    node.start(0.0)
    return node, machine


def test_a_member_with_another_roster_version_is_refused_naming_both_versions() -> None:
    # Prepare: p01 has learnt version 2 (from round 40) and is at round 39
    node, machine = node_at_round(EFFECTIVE_ROUND - 1)
    v2 = roster_of(NEW, version=2, effective_round=EFFECTIVE_ROUND)
    node.change_membership(v2, build("ring", NEW), 0.0, make_neighbour=Neighbour)
    # Execute: p00 still on version 1 sends for round 39 (fine) and 40 (not), twice
    fed_before = len(machine.fed)
    ok = node.receive("p00", ParamPush(round=EFFECTIVE_ROUND - 1, roster_version=1), 1.0)
    refused = node.receive("p00", ParamPush(round=EFFECTIVE_ROUND, roster_version=1), 1.0)
    again = node.receive("p00", ParamPush(round=EFFECTIVE_ROUND + 1, roster_version=1), 1.0)
    # Assert: the round-39 message reaches the machine; the others are counted, said once, naming both
    assert [type(e).__name__ for e in machine.fed[fed_before:]] == ["NeighbourUp", "Received"]
    assert ok == [] and again == []
    assert refused == [Note(f"p01 refused p00's param_push for round {EFFECTIVE_ROUND}: roster version 1 "
                            "(theirs) != 2 (ours)", warning=True)]
    assert node.all_rejections()["roster_version_mismatch"] == 2


def test_a_node_switches_neighbours_at_the_effective_round_and_stamps_its_version() -> None:
    # Prepare: p01 at round 38 learns version 2
    node, machine = node_at_round(EFFECTIVE_ROUND - 2)
    v2 = roster_of(NEW, version=2, effective_round=EFFECTIVE_ROUND)
    # Execute
    actions = node.change_membership(v2, build("ring", NEW), 0.0, make_neighbour=Neighbour)
    # Assert: the new neighbour is known at once (down until heard), the old one kept until round 40
    assert Note("roster version 2 (adds p05; removes p02) takes effect at round 40") in actions
    connect = next(a for a in actions if isinstance(a, Connect))
    assert connect.neighbours == ("p00", "p02", "p03") and "p02" in connect.roster and "p05" in connect.roster
    assert node.neighbourhood.names() == ("p00", "p02", "p03")
    assert [type(e).__name__ for e in machine.fed[-1:]] == ["NeighbourDown"]
    assert isinstance(machine.graph, ChangingGraph)
    # Execute: the machine reaches round 40 (any event it handles)
    machine.position = (EFFECTIVE_ROUND, 0)
    actions = node.handle(object(), 1.0)  # type: ignore[arg-type]
    # Assert: p02 forgotten, the endpoint told to verify against version 2 alone
    connect = next(a for a in actions if isinstance(a, Connect))
    assert connect.neighbours == ("p00", "p03") and "p02" not in connect.roster
    assert node.neighbourhood.names() == ("p00", "p03")
    # Assert: what the Node sends for a round carries its version for that round
    answer = node._answer("p00", 5.0)
    assert isinstance(answer[0], Send) and isinstance(answer[0].message, StateSyncResponse)
    assert answer[0].message.roster_version == 2


# ------------------------------------------------------------ acceptance (e), simulated


class ChangingRing(GossipRun):
    """A simulated ring of OLD; NEW's joiner p05 knows only version 2 (it starts with the new roster)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.graphs = {"old": build("ring", OLD), "new": build("ring", NEW)}
        self.sent: dict[str, list[tuple[int, tuple[str, ...]]]] = defaultdict(list)
        super().__init__(*args, **kwargs)

    def _graph(self, name: str) -> Any:
        return self.graphs["new" if name == "p05" else "old"]

    def _machine(self, name: str) -> Any:
        machine = super()._machine(name)
        machine.set_graph(self._graph(name))
        return machine

    def _node(self, peer: SimPeer) -> Any:
        graph = self._graph(peer.name)
        peer.neighbour_names = graph.neighbours(peer.name)
        node = super()._node(peer)
        names = NEW if peer.name == "p05" else OLD
        roster = Roster(tuple(self.roster.member(n) for n in names))
        if peer.name == "p05":
            roster = dataclasses.replace(roster, version=2, effective_round=EFFECTIVE_ROUND)
        node.set_membership(roster, graph)
        return node

    def _send(self, peer: SimPeer, send: Send) -> None:
        if isinstance(send.message, ParamPush):
            self.sent[peer.name].append((send.message.round, tuple(sorted(send.recipients))))
        super()._send(peer, send)


def changing_ring(algorithm: str = "dpsgd") -> ChangingRing:
    """Six simulated members; p00-p04 run a ring (version 1); p05 starts at 0.8 s with version 2."""
    scenario = scenario_from_dict({
        "seed": 3, "duration_s": 60.0, "eval_every_s": 100.0, "graph": {"spec": "ring:6"},
        "links": {"latency_ms": 1.0, "bandwidth_mbps": 1000.0},
        "nodes": {"step_time_ms": 10.0, "neighbour_timeout_s": 0.2},
        "algorithm": {"algorithm": algorithm, "local_steps": 2 if algorithm == "local" else 1,
                      "deadline_s": 0.05, "total_steps": 100, "max_rounds_ahead": 4,
                      "final_gossip_rounds": 30},
        "task": {"name": "logreg", "options": {"n_samples": 400, "n_features": 10}},
        "trainer": {"lr": 0.1},
        "faults": {"churn": [{"node": "p05", "kind": "join", "at_s": 0.8}]},
    })
    run = ChangingRing(build_world(scenario))
    run.begin()
    return run


def version_two(run: ChangingRing) -> Roster:
    return dataclasses.replace(Roster(tuple(run.roster.member(n) for n in NEW)), version=2,
                               effective_round=EFFECTIVE_ROUND)


@pytest.mark.parametrize("algorithm", ["dpsgd", "local", "pushsum"])
def test_a_ring_gains_a_member_and_loses_another_while_it_runs(algorithm: str) -> None:
    # Prepare
    run = changing_ring(algorithm)
    # Execute: at 0.1 s (round ~9) every running member learns version 2 (from round 40) and runs on
    run.engine.at(0.1, lambda: run.change_roster(version_two(run), run.graphs["new"]))
    run.engine.run(until_s=run.scenario.duration_s)
    result = run.end()
    # Assert: each member sent to the old ring's neighbours before round 40 and the new ring's from it
    old, new = run.graphs["old"], run.graphs["new"]
    for name in ("p00", "p01", "p03", "p04"):
        rounds = [r for r, _ in run.sent[name]]
        assert min(rounds) == 0 and max(rounds) > EFFECTIVE_ROUND + 20, name
        reached: dict[bool, set[str]] = {False: set(), True: set()}   # before the round, from it on
        for r, recipients in run.sent[name]:
            graph = old if r < EFFECTIVE_ROUND else new
            # (one send may go to a subset: a neighbour down is skipped, a laggard answered alone)
            assert set(recipients) <= set(graph.out_neighbours(name, r)), (name, r, recipients)
            reached[r >= EFFECTIVE_ROUND].update(recipients)
        assert reached == {False: set(old.out_neighbours(name)), True: set(new.out_neighbours(name))}, name
    assert max(r for r, _ in run.sent["p02"]) == EFFECTIVE_ROUND - 1       # the leaver stopped at 40
    assert run.peers["p02"].node.left
    joined = [r for r, _ in run.sent["p05"]]
    assert joined and min(joined) >= EFFECTIVE_ROUND                         # the joiner synced, then mixed
    assert set().union(*(set(recipients) for _, recipients in run.sent["p05"])) == {"p00", "p04"}
    # Assert: no restart, one run id, no version refusals, the new members finished together
    for name, peer in sorted(run.peers.items()):
        assert peer.restarts == 0 and peer.endpoint.run_id == run.run_id
        assert peer.all_rejections()["roster_version_mismatch"] == 0, name
        assert peer.node.machine.counters["not_neighbour"] == 0, name
    assert all(result.peers[name]["finished"] for name in NEW)
    finals = torch.stack([run.world.trainers[name].flat_params for name in NEW])
    spread = float((finals - finals.mean(0)).norm(dim=1).max() / finals.mean(0).norm())
    assert spread < 1e-3, spread


def test_a_member_that_missed_the_change_is_refused_from_the_effective_round_on() -> None:
    # Prepare: p04 never learns version 2 (its roster file was not updated)
    run = changing_ring()
    # Execute
    run.engine.at(0.1, lambda: run.change_roster(version_two(run), run.graphs["new"], skip=("p04",)))
    run.engine.run(until_s=run.scenario.duration_s)
    # Assert: from round 40 p04 still mixes with its version-1 ring (p00, p03); they refuse its
    # rounds, and p04 refuses p03's (p03 sends to it in version 2's ring too), counted by reason.
    # Members p04 does not exchange with under either version refuse nothing.
    refused = {name: peer.all_rejections()["roster_version_mismatch"] for name, peer in run.peers.items()}
    assert refused["p00"] > 0 and refused["p03"] > 0 and refused["p04"] > 0, refused
    assert refused["p01"] == refused["p05"] == 0, refused
    assert max(r for r, _ in run.sent["p04"]) >= EFFECTIVE_ROUND
    assert set().union(*(set(recipients) for _, recipients in run.sent["p04"])) == {"p00", "p03"}


def test_a_member_that_starts_with_a_roster_not_yet_in_force_speaks_the_version_before_it() -> None:
    # A joiner (or a restart) reads version 2 from round 40 and knows nothing of version 1's members
    membership = Membership(roster_of(NEW, version=2, effective_round=EFFECTIVE_ROUND))
    assert membership.version_at(EFFECTIVE_ROUND - 1) == 1 and membership.version_at(EFFECTIVE_ROUND) == 2
    assert membership.mismatch(ParamPush(round=EFFECTIVE_ROUND - 1, roster_version=1)) is None


def test_the_daemon_sees_a_new_roster_version_in_its_file_and_says_what_it_cannot_use(tmp_path: Path) -> None:
    from peer.runtime.rosterwatch import NewVersion, RosterWatch, Unusable

    path = tmp_path / "roster.toml"
    v1 = roster_of(OLD)
    roster_file.write(path, v1)
    watch = RosterWatch(path, v1, every_s=1.0)
    assert watch.poll(0.0) is None                                    # unchanged
    # the same version with other members: said, not applied
    roster_file.write(path, v1.remove("p02"))
    os.utime(path, ns=(1, 1))
    found = watch.poll(1.0)
    assert isinstance(found, Unusable) and "not later than ours (1)" in found.reason
    # the next version: handed over once (looked at no more often than every_s)
    roster_file.write(path, v1.remove("p02").revised(EFFECTIVE_ROUND))
    os.utime(path, ns=(2, 2))
    assert watch.poll(1.5) is None
    found = watch.poll(2.0)
    assert isinstance(found, NewVersion) and found.roster.version == 2
    assert watch.poll(3.0) is None
    path.write_text("not toml [")
    os.utime(path, ns=(3, 3))
    found = watch.poll(4.0)
    assert isinstance(found, Unusable) and "running on with version 2" in found.reason


def test_a_member_restarted_after_a_roster_change_resumes_on_its_new_shard() -> None:
    from peer.train.partition import partition
    from peer.train.tasks import get_task
    from peer.train.trainer import Trainer, TrainerConfig

    # Prepare: p01's trainer on its shard among OLD, a few steps into its first epoch
    task = get_task("logreg", n_samples=200, n_features=4)
    config = TrainerConfig(device="cpu", batch_size=4)
    before = Trainer(task, config, partition(task.labels, OLD, seed=1)["p01"], seed=1, member_index=1)
    before.run_steps(3)
    state = before.state_dict()
    # Execute: it restarts with NEW's roster: p05 took some of its samples, p02's came to some
    after = Trainer(task, config, partition(task.labels, NEW, seed=1)["p01"], seed=1, member_index=1)
    assert len(after.shard) != len(before.shard)
    after.load_state_dict(state)
    # Assert: its model and step carry over; its place in the data starts a new epoch of the new shard
    assert torch.equal(after.flat_params, before.flat_params) and after.step == 3
    assert (after.epoch, after.offset) == (before.epoch + 1, 0)


def test_a_version_learnt_after_its_round_is_applied_at_once_and_said() -> None:
    # Prepare: p01 is at round 45 when version 2 (from round 40) reaches it
    node, _ = node_at_round(EFFECTIVE_ROUND + 5)
    v2 = roster_of(NEW, version=2, effective_round=EFFECTIVE_ROUND)
    # Execute
    actions = node.change_membership(v2, build("ring", NEW), 0.0, make_neighbour=Neighbour)
    # Assert: it says which rounds went by the old version, and switches at once
    assert Note("roster version 2 arrived at round 45, after its effective round 40: rounds 40-44 went by "
                "version 1 here (members already on version 2 refused them)", warning=True) in actions
    assert node.neighbourhood.names() == ("p00", "p03") and node.membership.previous is None
    assert node.all_rejections()["roster_not_newer"] == 0
    assert node.change_membership(v2, build("ring", NEW), 0.0, make_neighbour=Neighbour) == [
        Note("roster version 2 is not newer than 2: ignored", warning=True)]
    assert node.all_rejections()["roster_not_newer"] == 1

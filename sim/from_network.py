"""A scenario from a real network's files: simulate what you are about to deploy.

``scenario_from_peer_file(peer.toml)`` takes the ``[network]`` table every
member agrees on (topology, seed, task, partition, gossip, trainer) and the
roster's gossip members (peers and gateways), so the simulated members are the same members with the
same shards, seeds and algorithm as the daemons (and the file's ``[checkpoint]`` interval, which a
crashed member restarts from); relative paths in it are taken
from its folder, as the daemon takes them. The link and node model
(which a peer file does not describe) comes from ``overrides``. Only TOML is
read here: the daemon's own modules (and ZeroMQ) are never imported.

``scenario_from_federation_files(gateway.toml, edge configs)`` does the same for a
federation: the gateways' ``[network]`` and ``[federation]`` tables (which every edge
config repeats word for word: they are the run id) become the scenario's task,
partition, trainer, gateway gossip and ``[federation.server]``; the roster's edge
clients are the simulated clients, with the same names, so each trains on the shard,
data order and initial model of its real twin (peer.train.build, keyed by name). What
the simulator cannot model is refused with the key that says it: an edge client on its
own data (``edge.data``), a client served by another gateway than the rule both sides
follow gives it (peer/files/federation_layout.py: ``hivemesh init`` writes it that way),
gateways whose ``[network] topology`` mixes otherwise than the simulator's ``complete:G``
(a ring is that up to three gateways).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from peer.files.config import ConfigError, load
from peer.files.include import MemberText, read_member
from peer.files.paths import from_folder
from peer.files.roster_file import read as read_roster
from peer.files.schema import NetworkSection, resolve_network_paths
from protocols.node.config import NodeConfig
from protocols.roster import GOSSIP_ROLES, Roster
from protocols.settings_diff import first_difference, flatten
from sim.scenario import ScenarioConfig, ScenarioFederationSection, scenario_from_dict
from topology import build


def scenario_from_peer_file(path: str | Path, **overrides: Any) -> ScenarioConfig:
    """The scenario of the network ``path`` (a peer config file) belongs to; ``overrides`` add the rest."""
    path = Path(path)
    text = read_member(path)
    data = text.data
    peer = data.get("peer")
    if not isinstance(peer, dict) or not isinstance(peer.get("roster"), str):
        raise ConfigError(f"{path}: missing key 'peer.roster'")
    base = path.resolve().parent   # the peer file's relative paths are relative to its folder
    roster = read_roster(from_folder(base, peer["roster"]))
    names = tuple(member.name for member in roster.with_role(*GOSSIP_ROLES))  # gateways gossip too
    return _with_overrides(_network_scenario(text, names), path, overrides)


def _network_scenario(text: MemberText, names: tuple[str, ...]) -> dict[str, Any]:
    """The scenario tables of a peer file's ``[network]`` and ``[peer]`` (the gossip members ``names``)."""
    path, data = text.source, text.data
    peer = data["peer"]
    # the peer file's own schema, defaults and checks (peer.files.schema), then its paths as the daemon
    # takes them
    network = resolve_network_paths(load(NetworkSection, data.get("network", {}),
                                         source=str(text.file_of("network")), prefix="network"),
                                    text.folder_of("network"))
    return {
        "name": path.stem,
        "seed": network.seed,
        "graph": {"spec": network.topology, "weights": network.weights, "members": list(names)},
        "task": {"name": network.task, "options": network.task_options},
        "partition": dataclasses.asdict(network.partition),
        "algorithm": dict(network.gossip),
        "trainer": dict(network.trainer),
        # [peer]'s liveness and state-sync keys are [nodes]' (both protocols.node.NodeConfig)
        "nodes": {f.name: peer[f.name] for f in dataclasses.fields(NodeConfig) if f.name in peer},
        # the member's own interval: what a crashed member restarts from (a command line's
        # --set checkpoint.every_steps is not in the file: give it as an override)
        "checkpoint": dict(data.get("checkpoint", {})),
    }


def _with_overrides(scenario: dict[str, Any], path: Path, overrides: dict[str, Any]) -> ScenarioConfig:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(scenario.get(key), dict):
            scenario[key] = {**scenario[key], **value}
        else:
            scenario[key] = value
    return scenario_from_dict(scenario, source=str(path))


def scenario_from_federation_files(gateway: str | Path, edges: Sequence[str | Path],
                                   **overrides: Any) -> ScenarioConfig:
    """The scenario of the federation whose gateway config is ``gateway`` and whose edge client
    configs are ``edges`` (every client of every gateway); ``overrides`` add the link and node model."""
    path = Path(gateway)
    text = read_member(path)
    data = text.data
    peer = data.get("peer")
    if not isinstance(peer, dict) or not isinstance(peer.get("roster"), str):
        raise ConfigError(f"{path}: missing key 'peer.roster'")
    federation = data.get("federation")
    if not isinstance(federation, dict):
        raise ConfigError(f"{path}: missing table [federation] (not a gateway's config)", key="federation")
    roster = read_roster(from_folder(path.resolve().parent, peer["roster"]))
    gateways = tuple(m.name for m in roster.with_role("gateway"))
    clients = tuple(m.name for m in roster.with_role("edge"))
    if not gateways or not clients or len(clients) % len(gateways):
        raise ConfigError(f"{path}: the roster has {len(gateways)} gateways and {len(clients)} edge "
                          "clients; the simulator serves the same number of clients from each gateway")
    per_gateway = len(clients) // len(gateways)
    section = ScenarioFederationSection(gateways=len(gateways), clients=per_gateway)
    simulated = (*section.gateway_names(), *section.client_names())
    if simulated != (*sorted(gateways), *sorted(clients)):
        raise ConfigError(f"{path}: the roster's members {', '.join(sorted(gateways + clients))} are not "
                          f"the simulator's names {', '.join(simulated)}")
    _check_edges(path, data, roster, section, [Path(e) for e in edges])
    server = {k: v for k, v in federation.items() if k != "gossip_rounds"}
    scenario = _network_scenario(text, gateways)
    _check_gateway_graph(path, scenario, tuple(sorted(gateways)))
    scenario["federation"] = {"gateways": len(gateways), "clients": per_gateway,
                              "gossip_rounds": federation.get("gossip_rounds", 0), "server": server}
    return _with_overrides(scenario, path, overrides)


def _check_gateway_graph(path: Path, scenario: dict[str, Any], gateways: tuple[str, ...]) -> None:
    """The simulator's gateways gossip over ``complete:G`` (sim/federation.py); the daemons over
    ``[network] topology``: the two must give the same mixing, or the gossip rounds would differ."""
    if len(gateways) < 2:
        return
    graph, seed = scenario["graph"], scenario["seed"]
    deployed = build(graph["spec"], gateways, seed=seed, weights=graph["weights"])
    simulated = build(f"complete:{len(gateways)}", gateways, seed=seed)
    same = deployed.period == simulated.period and deployed.directed == simulated.directed and all(
        np.array_equal(deployed.mixing(t), simulated.mixing(t)) for t in range(deployed.period))
    if not same:
        raise ConfigError(f"{path}: key 'network.topology': the gateways gossip over {graph['spec']!r} "
                          f"with {graph['weights']!r} weights; the simulator's gateways over "
                          f"complete:{len(gateways)} (a different mixing)", key="network.topology")


def _check_edges(path: Path, data: dict[str, Any], roster: Roster, section: ScenarioFederationSection,
                 edges: list[Path]) -> None:
    """Every edge client on the roster has a config here, trains on its task shard, is served by the
    gateway the simulator gives it, and agrees with the gateway's ``[network]`` and ``[federation]``."""
    found: dict[str, Path] = {}
    for edge in edges:
        table = read_member(edge).data
        own = table.get("edge", {})
        name = own.get("name", "")
        found[name] = edge
        if own.get("data"):
            raise ConfigError(f"{edge}: key 'edge.data': the simulator trains clients on the task's shards, "
                              "not on their own files", key="edge.data")
        difference = first_difference(flatten({key: table.get(key, {}) for key in ("network", "federation")}),
                                      flatten({key: data.get(key, {}) for key in ("network", "federation")}))
        if difference is not None:
            raise ConfigError(f"{edge}: {difference.describe(them=f'in {path.name}', us='here')} "
                              "(the run id would refuse it)", key=f"{difference.table}.{difference.key}")
        if name not in section.client_names():
            raise ConfigError(f"{edge}: key 'edge.name': {name!r} is not an edge client on the roster "
                              f"(members: {', '.join(roster.names)})", key="edge.name")
        simulated = section.gateway_of(section.client_names().index(name))
        if own.get("gateway") != simulated:
            raise ConfigError(f"{edge}: key 'edge.gateway': {name!r} is served by {own.get('gateway')!r}, "
                              f"the simulator's {name!r} by {simulated!r} (client i of E goes to "
                              "gateway i * G // E, as hivemesh init writes it)", key="edge.gateway")
    missing = sorted(set(section.client_names()) - set(found))
    if missing:
        raise ConfigError(f"{path}: no edge config for {', '.join(missing)} "
                          f"(roster members: {', '.join(roster.names)})")

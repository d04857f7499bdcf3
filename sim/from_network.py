"""A scenario from a real network's peer config: simulate what you are about to deploy.

``scenario_from_peer_file(peer.toml)`` takes the ``[network]`` table every
member agrees on (topology, seed, task, partition, gossip, trainer) and the
roster's gossip members (peers and gateways), so the simulated members are the same members with the
same shards, seeds and algorithm as the daemons; relative paths in it are taken
from its folder, as the daemon takes them. The link and node model
(which a peer file does not describe) comes from ``overrides``. Only TOML is
read here: the daemon's own modules (and ZeroMQ) are never imported.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from peer.files.config import ConfigError, load, read_toml
from peer.files.paths import from_folder
from peer.files.roster_file import read as read_roster
from peer.files.schema import NetworkSection, resolve_network_paths
from protocols.node.config import NodeConfig
from protocols.roster import GOSSIP_ROLES
from sim.scenario import ScenarioConfig, scenario_from_dict


def scenario_from_peer_file(path: str | Path, **overrides: Any) -> ScenarioConfig:
    """The scenario of the network ``path`` (a peer config file) belongs to; ``overrides`` add the rest."""
    path = Path(path)
    data = read_toml(path)
    peer = data.get("peer")
    if not isinstance(peer, dict) or not isinstance(peer.get("roster"), str):
        raise ConfigError(f"{path}: missing key 'peer.roster'")
    base = path.resolve().parent   # the peer file's relative paths are relative to its folder
    roster = read_roster(from_folder(base, peer["roster"]))
    names = tuple(member.name for member in roster.with_role(*GOSSIP_ROLES))  # gateways gossip too
    # the peer file's own schema, defaults and checks (peer.files.schema), then its paths as the daemon
    # takes them
    network = resolve_network_paths(load(NetworkSection, data.get("network", {}), source=str(path),
                                         prefix="network"), base)
    scenario: dict[str, Any] = {
        "name": path.stem,
        "seed": network.seed,
        "graph": {"spec": network.topology, "weights": network.weights, "members": list(names)},
        "task": {"name": network.task, "options": network.task_options},
        "partition": dataclasses.asdict(network.partition),
        "algorithm": dict(network.gossip),
        "trainer": dict(network.trainer),
        # [peer]'s liveness and state-sync keys are [nodes]' (both protocols.node.NodeConfig)
        "nodes": {f.name: peer[f.name] for f in dataclasses.fields(NodeConfig) if f.name in peer},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(scenario.get(key), dict):
            scenario[key] = {**scenario[key], **value}
        else:
            scenario[key] = value
    return scenario_from_dict(scenario, source=str(path))

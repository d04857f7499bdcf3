"""A scenario from a real network's peer config: simulate what you are about to deploy.

``scenario_from_peer_file(peer.toml)`` takes the ``[network]`` table every
member agrees on (topology, seed, task, partition, gossip, trainer) and the
roster's peer names, so the simulated members are the same members with the
same shards, seeds and algorithm as the daemons; relative paths in it are taken
from its folder, as the daemon takes them. The link and node model
(which a peer file does not describe) comes from ``overrides``. Only TOML is
read here: the daemon's own modules (and ZeroMQ) are never imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peer.config import ConfigError, read_toml
from peer.paths import from_folder, topology_spec
from peer.roster_file import read as read_roster
from peer.tasks import resolve_task_paths
from sim.scenario import ScenarioConfig, scenario_from_dict


def scenario_from_peer_file(path: str | Path, **overrides: Any) -> ScenarioConfig:
    """The scenario of the network ``path`` (a peer config file) belongs to; ``overrides`` add the rest."""
    path = Path(path)
    data = read_toml(path)
    peer = data.get("peer")
    if not isinstance(peer, dict) or not isinstance(peer.get("roster"), str):
        raise ConfigError(f"{path}: missing key 'peer.roster'")
    base = path.resolve().parent   # the peer file's relative paths are relative to its folder
    names = tuple(member.name for member in read_roster(from_folder(base, peer["roster"])).with_role("peer"))
    network = data.get("network", {})
    partition = dict(network.get("partition", {}))
    partition.setdefault("scheme", "dirichlet")  # the daemon's default (peer.peerconfig.PartitionSection)
    task, task_options, topology = (network.get("task", "digits-mlp"), network.get("task_options", {}),
                                    network.get("topology", "ring"))
    if isinstance(partition.get("path"), str) and partition["path"]:
        partition["path"] = from_folder(base, partition["path"])
    if isinstance(task, str) and isinstance(task_options, dict):   # else the scenario's checks name the key
        task, task_options = resolve_task_paths(task, task_options, base)
    if isinstance(topology, str):
        topology = topology_spec(base, topology)
    scenario: dict[str, Any] = {
        "name": path.stem,
        "seed": network.get("seed", 0),
        "graph": {"spec": topology, "weights": network.get("weights", "metropolis"), "members": list(names)},
        "task": {"name": task, "options": task_options},
        "partition": partition,
        "algorithm": dict(network.get("gossip", {})),
        "trainer": dict(network.get("trainer", {})),
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(scenario.get(key), dict):
            scenario[key] = {**scenario[key], **value}
        else:
            scenario[key] = value
    return scenario_from_dict(scenario, source=str(path))

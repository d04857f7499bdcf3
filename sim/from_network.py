"""A scenario from a real network's peer config: simulate what you are about to deploy.

``scenario_from_peer_file(peer.toml)`` takes the ``[network]`` table every
member agrees on (topology, seed, task, partition, gossip, trainer) and the
roster's peer names, so the simulated members are the same members with the
same shards, seeds and algorithm as the daemons. The link and node model
(which a peer file does not describe) comes from ``overrides``. Only TOML is
read here: the daemon's own modules (and ZeroMQ) are never imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peer.config import ConfigError, read_toml
from peer.roster_file import read as read_roster
from sim.scenario import ScenarioConfig, scenario_from_dict


def scenario_from_peer_file(path: str | Path, **overrides: Any) -> ScenarioConfig:
    """The scenario of the network ``path`` (a peer config file) belongs to; ``overrides`` add the rest."""
    path = Path(path)
    data = read_toml(path)
    peer = data.get("peer")
    if not isinstance(peer, dict) or not isinstance(peer.get("roster"), str):
        raise ConfigError(f"{path}: missing key 'peer.roster'")
    roster_path = Path(peer["roster"]).expanduser()
    if not roster_path.is_absolute():
        roster_path = path.resolve().parent / roster_path
    names = tuple(member.name for member in read_roster(roster_path).with_role("peer"))
    network = data.get("network", {})
    partition = dict(network.get("partition", {}))
    partition.setdefault("scheme", "dirichlet")  # the daemon's default (peer.peerconfig.PartitionSection)
    scenario: dict[str, Any] = {
        "name": path.stem,
        "seed": network.get("seed", 0),
        "graph": {"spec": network.get("topology", "ring"), "weights": network.get("weights", "metropolis"),
                  "members": list(names)},
        "task": {"name": network.get("task", "digits-mlp"), "options": network.get("task_options", {})},
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

"""A peer's configuration file (``hivemesh peer --config peer.toml``), validated once.

Layout::

    [peer]        who this peer is and where its files live (per peer)
    [transport]   socket limits and timings (per peer, peer.transport.TransportConfig)
    [checkpoint]  interval and retention (per peer, peer.checkpoint.CheckpointConfig)
    [network]     what every member must agree on: topology, seed, task, partition,
      [network.gossip]   protocols.gossip.GossipConfig
      [network.trainer]  peer.trainer.TrainerConfig

Everything under ``[network]`` plus the roster goes into the run id, so a peer
configured differently is refused by its neighbours (``config_mismatch``).
Relative paths (key, roster, data folder, a graph file as topology, a task
file, a partition file) are relative to the config file's folder; the run id
digests them as written, so members whose files sit in different folders
agree (``PeerConfig.network`` resolved for use, ``network_as_written`` for the
digest). The gossip and
trainer tables are checked against their owners' config classes at load time,
so a wrong key anywhere is reported here, naming the file and key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from peer.checkpoint import CheckpointConfig
from peer.config import ConfigError, load, read_toml
from peer.paths import from_folder, topology_spec
from peer.transport import TransportConfig
from protocols.node.config import SYNC_ANSWER_INTERVAL_S


def _empty() -> dict[str, Any]:
    return {}


@dataclass(frozen=True, kw_only=True)
class PeerSection:
    """This member: name, files, timings of the daemon loop."""

    name: str
    key: str                      # identity key file (hivemesh keygen / init)
    roster: str                   # roster TOML: the one source of membership
    data_dir: str                 # checkpoints, epoch, metrics, status
    listen: str = ""              # empty: the roster's address for this member
    # a late joiner (or a replacement) pulls parameters from a neighbour before it trains
    late_join: bool = False
    curve: bool = False           # CurveZMQ encryption with the roster's curve keys as allowlist
    # signed liveness messages; also what `hivemesh status` shows as last-seen and latency
    heartbeat_interval_s: float = 1.0
    # a neighbour silent this long is reported down (the machine's deadlines still decide rounds)
    neighbour_timeout_s: float = 5.0
    # wait this long for every neighbour before the first round (slow starts, many processes)
    start_timeout_s: float = 60.0
    # after finishing, keep answering neighbours this long (their last round may need us)
    finish_grace_s: float = 3.0
    # answer a neighbour's state-sync request (a full model) at most this often: a joiner asks every 10 s
    sync_answer_interval_s: float = SYNC_ANSWER_INTERVAL_S
    status_interval_s: float = 1.0   # status.json refresh (what `hivemesh status` reads)
    eval_every_steps: int = 50       # test-set evaluation for metrics and status; 0 = only at the end
    progress: bool = True            # one progress line per status refresh on the console

    def __post_init__(self) -> None:
        for name in ("name", "key", "roster", "data_dir"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        for name in ("heartbeat_interval_s", "neighbour_timeout_s", "start_timeout_s", "status_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.finish_grace_s < 0:
            raise ValueError("finish_grace_s must be >= 0")
        if not self.sync_answer_interval_s >= 0:
            raise ValueError(f"sync_answer_interval_s must be >= 0, got {self.sync_answer_interval_s}")
        if self.eval_every_steps < 0:
            raise ValueError("eval_every_steps must be >= 0")


@dataclass(frozen=True, kw_only=True)
class PartitionSection:
    """How the task's training set is split over the members (peer.partition)."""

    scheme: Literal["iid", "dirichlet", "shards", "file"] = "dirichlet"
    alpha: float = 0.5            # Dirichlet label skew; 0.5 is the usual "strongly non-iid" setting
    shards_per_member: int = 2
    path: str = ""

    def __post_init__(self) -> None:
        if self.alpha <= 0:
            raise ValueError("alpha must be positive")
        if self.shards_per_member < 1:
            raise ValueError("shards_per_member must be at least 1")
        if self.scheme == "file" and not self.path:
            raise ValueError("scheme 'file' needs a path")


@dataclass(frozen=True, kw_only=True)
class NetworkSection:
    """What all members agree on (digested into the run id)."""

    topology: str = "ring"            # a topology spec or graph file, over the roster's peer names
    weights: str = "metropolis"       # mixing weights for undirected graphs
    seed: int = 0
    task: str = "digits-mlp"
    task_options: dict[str, Any] = field(default_factory=_empty)
    partition: PartitionSection = field(default_factory=PartitionSection)
    gossip: dict[str, Any] = field(default_factory=_empty)   # protocols.gossip.GossipConfig
    trainer: dict[str, Any] = field(default_factory=_empty)  # peer.trainer.TrainerConfig

    def __post_init__(self) -> None:
        if not self.topology:
            raise ValueError("topology must not be empty")


@dataclass(frozen=True, kw_only=True)
class PeerFile:
    """The file as written (tables as plain data where their owner validates them)."""

    peer: PeerSection
    network: NetworkSection = field(default_factory=NetworkSection)
    transport: TransportConfig = field(default_factory=TransportConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    """A loaded, validated peer config with paths resolved and owners' configs built."""

    source: Path
    peer: PeerSection
    network: NetworkSection              # paths resolved against the file's folder: what to use
    network_as_written: NetworkSection   # the file's text: what the run id digests
    transport: TransportConfig
    checkpoint: CheckpointConfig
    gossip: Any                     # protocols.gossip.GossipConfig
    trainer: Any                    # peer.trainer.TrainerConfig
    key_path: Path
    roster_path: Path
    data_dir: Path

    def shared(self) -> dict[str, Any]:
        """The network-wide settings that go into the run id (with the roster)."""
        return {"network": dataclasses.asdict(self.network_as_written)}


def load_peer_config(path: str | Path) -> PeerConfig:
    """Read and validate ``path``; ConfigError naming the file and key on any problem."""
    path = Path(path)
    raw = read_toml(path)
    parsed = load(PeerFile, raw, source=str(path))
    network = parsed.network
    gossip = _owned_config("protocols.gossip.config", "GossipConfig", network.gossip, path, "network.gossip")
    trainer = _owned_config("peer.trainer", "TrainerConfig", network.trainer, path, "network.trainer")
    base = path.resolve().parent
    return PeerConfig(
        source=path, peer=parsed.peer, network=resolve_network_paths(parsed.network, base),
        network_as_written=parsed.network, transport=parsed.transport,
        checkpoint=parsed.checkpoint, gossip=gossip, trainer=trainer,
        key_path=_resolve(base, parsed.peer.key), roster_path=_resolve(base, parsed.peer.roster),
        data_dir=_resolve(base, parsed.peer.data_dir))


def _resolve(base: Path, value: str) -> Path:
    return Path(from_folder(base, value))


def resolve_network_paths(network: NetworkSection, base: Path) -> NetworkSection:
    """``network`` with its graph file, task file and partition file taken against ``base``."""
    from peer.tasks import resolve_task_paths

    task, task_options = resolve_task_paths(network.task, network.task_options, base)
    partition = network.partition
    if partition.path:
        partition = dataclasses.replace(partition, path=from_folder(base, partition.path))
    return dataclasses.replace(network, topology=topology_spec(base, network.topology), task=task,
                               task_options=task_options, partition=partition)


def _owned_config(module: str, name: str, data: dict[str, Any], path: Path, prefix: str) -> Any:
    import importlib

    cls = getattr(importlib.import_module(module), name)
    return load(cls, data, source=str(path), prefix=prefix)


__all__ = ["ConfigError", "NetworkSection", "PartitionSection", "PeerConfig",
           "PeerFile", "PeerSection", "load_peer_config"]

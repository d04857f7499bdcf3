"""A peer's configuration file (``hivemesh peer --config peer.toml``), validated once.

Layout::

    [peer]        who this peer is and where its files live (per peer)
    [transport]   socket limits and timings (per peer, peer.net.transport_config.TransportConfig)
    [checkpoint]  interval and retention (per peer, protocols.node.checkpoints.CheckpointConfig)
    [federation]  (a gateway only) FedAvg rounds for the roster's edge clients (PeerFederationSection)
    [network]     what every member must agree on: topology, seed, task (peer.files.schema.NetworkSection),
      [network.partition] peer.files.schema.PartitionConfig
      [network.gossip]   protocols.gossip.GossipConfig (peer.files.schema.gossip_config)
      [network.trainer]  peer.train.trainer.TrainerConfig (peer.files.schema.trainer_config)

``[network]`` and ``[peer]``'s liveness and state-sync keys are the schema a
scenario shares (peer.files.schema, protocols.node.NodeConfig): the same table gives
the same settings, defaults and errors in ``hivemesh sim``.

Everything under ``[network]`` and ``[federation]`` goes into the run id, so a peer
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peer.files.config import ConfigError, apply_override, load
from peer.files.include import check_shared, read_member
from peer.files.paths import from_folder
from peer.files.schema import (
    NetworkSection,
    PartitionConfig,
    gossip_config,
    resolve_network_paths,
    trainer_config,
)
from peer.net.transport_config import TransportConfig
from protocols.federation import FederationConfig
from protocols.federation.interleave import gossip_total_rounds
from protocols.node.checkpoints import CheckpointConfig
from protocols.node.config import NodeConfig


@dataclass(frozen=True, kw_only=True)
class PeerFederationSection(FederationConfig):
    """``[federation]``: protocols.federation.FederationConfig's keys, and how the gateways' gossip
    interleaves with the FedAvg rounds (protocols/federation/interleave.py). The same table, word
    for word, is in every gateway's and every edge client's config: it is part of the run id."""

    # gossip exchanges between the gateways after each FedAvg round (0: none, each gateway alone)
    gossip_rounds: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.gossip_rounds, bool) or not isinstance(self.gossip_rounds, int) \
                or self.gossip_rounds < 0:
            raise ValueError(f"gossip_rounds must be an integer >= 0, not {self.gossip_rounds!r}")
        if self.gossip_rounds and not self.has_rounds:
            raise ValueError("gossip_rounds: FedBuff has no rounds to gossip between (use 0)")

    def gateway_gossip(self, gossip: Any) -> Any:
        """A gateway's gossip config: ``gossip`` on the interleaving's schedule (one step a round,
        the work being a FedAvg round or nothing, mixing after it)."""
        rounds = gossip_total_rounds(self.rounds, self.gossip_rounds, mode=self.mode)
        return dataclasses.replace(gossip, mixing="after", local_steps=1, duration_s=0.0, total_steps=rounds)


@dataclass(frozen=True, kw_only=True)
class PeerSection(NodeConfig):
    """This member: name, files, timings of the daemon loop.

    The liveness, start and state-sync keys (``heartbeat_interval_s``, ``neighbour_timeout_s``,
    ``start_timeout_s``, ``sync_answer_interval_s``, ``sync_timeout_s``, ``sync_attempts``) are
    protocols.node.NodeConfig's, shared with a
    scenario's ``[nodes]``: one name, default and check for both.
    """

    name: str                     # this member's name on the roster
    key: str                      # identity key file (hivemesh keygen / init)
    roster: str                   # roster TOML: the one source of membership
    data_dir: str                 # checkpoints, epoch, metrics, status
    listen: str = ""              # empty: the roster's address for this member
    # a late joiner (or a replacement) pulls parameters from a neighbour before it trains
    late_join: bool = False
    # CurveZMQ encryption, and only the roster's curve keys get a connection (ZAP): without it anyone
    # who reaches the port reaches the message decoder; off only on a network you trust (status warns)
    curve: bool = True
    # after finishing, keep answering neighbours this long (their last round may need us)
    finish_grace_s: float = 3.0
    status_interval_s: float = 1.0   # status.json refresh (what `hivemesh status` reads)
    eval_every_steps: int = 50       # test-set evaluation for metrics and status; 0 = only at the end
    progress: bool = True            # one progress line per status refresh on the console
    # a Prometheus endpoint (peer.runtime.prometheus) on this port; 0: none (opt-in: a port is a choice)
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"  # loopback: exposing metrics beyond the host is the operator's choice
    # each evaluation's numbers as TensorBoard scalars in data_dir/tensorboard (an extra package)
    tensorboard: bool = False
    # a gateway's edge clients (roster names); empty: every edge client on the roster
    clients: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("name", "key", "roster", "data_dir"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if self.status_interval_s <= 0:
            raise ValueError(f"status_interval_s must be positive, got {self.status_interval_s}")
        if self.finish_grace_s < 0:
            raise ValueError("finish_grace_s must be >= 0")
        if self.eval_every_steps < 0:
            raise ValueError("eval_every_steps must be >= 0")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a TCP port (1 to 65535) or 0 for none, "
                             f"got {self.metrics_port}")


@dataclass(frozen=True, kw_only=True)
class PeerFile:
    """The file as written (tables as plain data where their owner validates them)."""

    peer: PeerSection
    network: NetworkSection = field(default_factory=NetworkSection)
    transport: TransportConfig = field(default_factory=TransportConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    federation: PeerFederationSection | None = None    # present: this peer is a gateway


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
    trainer: Any                    # peer.train.trainer.TrainerConfig
    key_path: Path
    roster_path: Path
    data_dir: Path
    federation: PeerFederationSection | None = None    # a gateway's FedAvg rounds (None: a plain peer)

    def shared(self) -> dict[str, Any]:
        """The network-wide settings that go into the run id (never the member list: membership
        changes by roster version while the run goes on)."""
        return shared_settings(self.network_as_written, self.federation)


def shared_settings(network: NetworkSection, federation: PeerFederationSection | None) -> dict[str, Any]:
    """What the run id digests: ``[network]`` as written and, in a federation, ``[federation]``
    (a gateway's and its edge clients' configs give the same)."""
    shared: dict[str, Any] = {"network": dataclasses.asdict(network)}
    if federation is not None:
        shared["federation"] = dataclasses.asdict(federation)
    return shared


def load_peer_config(path: str | Path, overrides: Sequence[str] = ()) -> PeerConfig:
    """Read and validate ``path``; ConfigError naming the file and key on any problem.

    ``overrides`` are ``KEY=VALUE`` assignments (``hivemesh peer --set``) applied on top of the
    file before it is checked (peer.files.config.apply_override). One under ``network`` changes
    the run id: every member must be given the same.
    """
    path = Path(path)
    text = read_member(path)
    check_shared(PeerFile, text)
    raw = text.data
    for assignment in overrides:
        apply_override(raw, assignment, source=str(path))
    parsed = load(PeerFile, raw, source=str(path))
    written = str(text.file_of("network"))
    gossip = gossip_config(parsed.network, source=written, prefix="network.gossip")
    if parsed.federation is not None:
        gossip = parsed.federation.gateway_gossip(gossip)
    trainer = trainer_config(parsed.network, source=written, prefix="network.trainer",
                             federated=parsed.federation is not None)
    base = path.resolve().parent
    network = resolve_network_paths(parsed.network, text.folder_of("network"))
    return PeerConfig(
        source=path, peer=parsed.peer, network=network,
        network_as_written=parsed.network, transport=parsed.transport,
        checkpoint=parsed.checkpoint, gossip=gossip, trainer=trainer,
        key_path=_resolve(base, parsed.peer.key), roster_path=_resolve(base, parsed.peer.roster),
        data_dir=_resolve(base, parsed.peer.data_dir), federation=parsed.federation)


def _resolve(base: Path, value: str) -> Path:
    return Path(from_folder(base, value))


__all__ = [
    "ConfigError",
    "NetworkSection",
    "PartitionConfig",
    "PeerConfig",
    "PeerFederationSection",
    "PeerFile",
    "PeerSection",
    "load_peer_config",
]

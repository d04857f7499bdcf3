"""An edge client's configuration file (``hivemesh edge --config edge.toml``), validated once.

Layout::

    [edge]        who this client is, its gateway, its data (EdgeSection)
    [network]     the federation's task, partition and trainer: the gateway's table, word for word
    [federation]  the gateway's table, word for word (protocols.federation.FederationConfig's keys)

``[network]`` and ``[federation]`` go into the run id as a gateway's do
(peer.runtime.peerconfig.shared_settings), so a client set up differently is
refused before it sends anything. The gateway's address and public key are
its roster entry's (the roster is also what the client verifies the gateway's
messages against); ``gateway_address`` overrides the address (a NAT'd gateway
reached through a forwarded port). Relative paths are relative to the file's folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peer.files import roster_file
from peer.files.config import load
from peer.files.include import check_shared, read_member
from peer.files.keyfile import load_identity
from peer.files.paths import from_folder
from peer.files.schema import NetworkSection, resolve_network_paths, trainer_config
from peer.net.transport_config import TransportConfig
from peer.runtime.peerconfig import PeerFederationSection, shared_settings
from peer.train.tasks import resolve_task_paths
from protocols.errors import HivemeshError
from protocols.identity import Identity
from protocols.node.config import NodeConfig
from protocols.roster import Member as RosterMember
from protocols.roster import Roster


@dataclass(frozen=True, kw_only=True)
class EdgeSection(NodeConfig):
    """This client. The liveness keys are protocols.node.NodeConfig's: its heartbeats every
    ``heartbeat_interval_s`` keep it registered with its gateway."""

    name: str                     # this client's name on the roster (role "edge")
    key: str                      # its identity key file
    roster: str                   # the roster: the gateway's address and key, and ours
    data_dir: str                 # checkpoints (error feedback, trainer), epoch, status
    gateway: str                  # the gateway's name on the roster
    gateway_address: str = ""     # empty: the gateway's roster address
    # own data: a .npz / .safetensors (x, y), a .csv, or module:function; empty: the task's shard
    # for this client among the roster's edge clients (demos and tests)
    data: str = ""
    label_column: str = "label"   # a .csv's label column
    # the user's training: "module:function" or "file.py:function", fit(model, round_config) ->
    # (num_samples, metrics), run on the task's model in each round this client is asked into
    # (docs/federation.md, "Your own fit"); empty: the built-in trainer's steps
    fit: str = ""
    # CurveZMQ encryption to the gateway (its roster curve_key): set as the gateway's [peer] curve
    curve: bool = True
    status_interval_s: float = 1.0
    progress: bool = True
    # give up (exit 3, counters said) after this long with neither a connection to the gateway nor a
    # message from it: a gateway that finished and exited, or never came up. Two minutes outlast a
    # gateway's restart; 0 = wait forever
    gateway_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("name", "key", "roster", "data_dir", "gateway"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if self.status_interval_s <= 0:
            raise ValueError(f"status_interval_s must be positive, got {self.status_interval_s}")
        if not (self.gateway_timeout_s >= 0 and math.isfinite(self.gateway_timeout_s)):
            raise ValueError(f"gateway_timeout_s must be >= 0 (0 = wait forever), "
                             f"got {self.gateway_timeout_s}")


@dataclass(frozen=True, kw_only=True)
class EdgeFile:
    edge: EdgeSection
    federation: PeerFederationSection
    network: NetworkSection = field(default_factory=NetworkSection)
    transport: TransportConfig = field(default_factory=TransportConfig)


@dataclass(frozen=True, kw_only=True)
class EdgeConfig:
    source: Path
    edge: EdgeSection
    federation: PeerFederationSection
    network: NetworkSection            # paths resolved
    network_as_written: NetworkSection  # for the run id
    transport: TransportConfig
    trainer: Any                       # peer.train.trainer.TrainerConfig
    key_path: Path
    roster_path: Path
    data_dir: Path
    data: str                          # resolved path, or module:function, or ""
    fit: str = ""                      # [edge] fit, a file.py's path resolved; "": the built-in steps

    def shared(self) -> dict[str, Any]:
        return shared_settings(self.network_as_written, self.federation)


def load_edge_config(path: str | Path) -> EdgeConfig:
    path = Path(path)
    text = read_member(path)
    check_shared(EdgeFile, text)
    parsed = load(EdgeFile, text.data, source=str(path))
    base = path.resolve().parent
    data = parsed.edge.data
    if data and Path(data).suffix.lower() in (".npz", ".safetensors", ".csv"):
        data = from_folder(base, data)
    trainer = trainer_config(parsed.network, source=str(text.file_of("network")), prefix="network.trainer",
                             federated=True)
    network = resolve_network_paths(parsed.network, text.folder_of("network"))
    return EdgeConfig(source=path, edge=parsed.edge, federation=parsed.federation,
                      network=network, network_as_written=parsed.network,
                      transport=parsed.transport, trainer=trainer,
                      key_path=Path(from_folder(base, parsed.edge.key)),
                      roster_path=Path(from_folder(base, parsed.edge.roster)),
                      data_dir=Path(from_folder(base, parsed.edge.data_dir)), data=data,
                      fit=resolve_task_paths(parsed.edge.fit, {}, base)[0] if parsed.edge.fit else "")


def edge_identity_and_roster(config: EdgeConfig) -> tuple[Identity, Roster, RosterMember]:
    """This client's key, the roster and its gateway's entry, checked against each other: it is an
    edge client on the roster with this key, its gateway a gateway, and the roster gives it to that
    gateway (else it would never be asked into a round). Errors name the file and the key."""
    identity = load_identity(config.key_path)
    roster = roster_file.read(config.roster_path)
    edge = config.edge
    member, gateway = roster.get(edge.name), roster.get(edge.gateway)
    if member is None or member.role != "edge" or member.public_id != identity.public_id:
        raise HivemeshError(f"{config.source}: key 'edge.name': {edge.name!r} is not an edge client on "
                            f"the roster {config.roster_path} with the key {config.key_path}")
    if gateway is None or gateway.role != "gateway":
        raise HivemeshError(f"{config.source}: key 'edge.gateway': {edge.gateway!r} is not a gateway on "
                            f"the roster {config.roster_path}")
    if member.gateway and member.gateway != edge.gateway:
        raise HivemeshError(f"{config.source}: key 'edge.gateway': {edge.gateway!r}, but the roster "
                            f"{config.roster_path} gives {edge.name} to gateway {member.gateway!r}")
    return identity, roster, gateway

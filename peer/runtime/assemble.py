"""Build one peer's parts from its config: identity, roster, topology, endpoint, trainer, machine.

Everything a user can get wrong (missing key file, a key that is not the
roster's, a name not on the roster, a bad topology, a task or partition that
cannot be made) fails here with a one-line HivemeshError, before any socket
is opened or any step trained.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peer.files.config import ConfigError
from peer.files.keydir import find_identity
from peer.files.keyfile import load_identity
from peer.runtime.datalock import DataDirLock
from peer.runtime.netinit import load_roster
from peer.runtime.peerconfig import PeerConfig
from protocols.errors import HivemeshError
from protocols.events import Machine
from protocols.identity import Identity
from protocols.node.membership import Serving
from protocols.roster import GOSSIP_ROLES, Roster, run_id
from protocols.wire import Endpoint
from topology import Topology, build


@dataclass
class Parts:
    config: PeerConfig
    identity: Identity
    roster: Roster
    topology: Topology
    name: str
    index: int                    # position among the sorted member names (data order; the shard is by name)
    neighbours: dict[str, str]    # name -> address: everyone this peer sends to or hears from
    run_id: bytes
    epoch: int
    endpoint: Endpoint
    trainer: Any                  # peer.train.trainer.Trainer
    machine: Machine
    lock: DataDirLock             # held while the peer runs (released by the daemon, or at exit)
    # a gateway ([federation]): its FedAvg (or FedBuff) server on the machine's vector, its edge clients
    server: Any = None            # protocols.federation.FedAvgServer | FedBuffServer
    clients: tuple[str, ...] = ()


def tcp_address(address: str) -> str:
    """A roster or listen address as ZeroMQ wants it ("host:port" gets "tcp://")."""
    return address if address.startswith("tcp://") else f"tcp://{address}"


def not_owned_hint(address: str) -> str:
    """A hint for a listen address whose host is not one of this machine's addresses (EADDRNOTAVAIL),
    else "": what an operator sees who gave a peer another host's address."""
    host = tcp_address(address).removeprefix("tcp://").rpartition(":")[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except OSError as error:
        if error.errno == errno.EADDRNOTAVAIL:
            return (f" ({host} is not an address of this machine: run the peer on that host, or give it "
                    "its own with `hivemesh roster set-address` or [peer] listen)")
    return ""


def next_epoch(data_dir: Path) -> int:
    """Read, increment and durably store this member's boot counter (0 on the first start)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "epoch"
    previous = -1
    if path.exists():
        try:
            previous = int(path.read_text().strip())
        except ValueError:
            raise HivemeshError(f"{path}: corrupt epoch file (expected one integer)") from None
    epoch = previous + 1
    temporary = path.with_suffix(".tmp")
    try:
        with temporary.open("w") as handle:
            handle.write(f"{epoch}\n")
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if previous < 0:
            raise HivemeshError(f"{path}: cannot store the epoch: {error.strerror}") from None
        # a full disk: the file we have keeps its block, so the number is written over in place (a
        # few bytes in one sector), and the peer starts from its checkpoint rather than not at all
        try:
            with path.open("r+") as handle:
                handle.write(f"{epoch}\n")
                handle.truncate()
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as again:
            raise HivemeshError(f"{path}: cannot store the epoch: {again.strerror}") from None
    return epoch


def _named(config: PeerConfig, key: str, error: HivemeshError) -> ConfigError:
    """``error`` as one line that names the config file and the key whose value led to it."""
    return ConfigError(f"{config.source}: key '{key}': {error}", key=key)


def identity_and_roster(config: PeerConfig) -> tuple[Identity, Roster, str]:
    """This peer's key and the roster, checked against each other (errors name the file and key)."""
    try:
        identity = load_identity(config.key_path)
    except HivemeshError as error:
        raise _named(config, "peer.key", error) from None
    try:
        roster = load_roster(config.roster_path)
    except HivemeshError as error:
        raise _named(config, "peer.roster", error) from None
    name = config.peer.name
    member = roster.get(name)
    if member is None:
        raise ConfigError(f"{config.source}: key 'peer.name': {name!r} is not on the roster "
                          f"{config.roster_path}", key="peer.name")
    if member.public_id != identity.public_id:
        # rotated away (revoked, and the member's entry says it was rotated): the new key file is
        # beside it (files/keydir.py); any other key is a configuration error, not looked past
        rotated = None
        if member.rotated_from and roster.is_revoked(identity.public_key):
            rotated = find_identity(config.key_path, member.public_id)
        if rotated is None:
            raise ConfigError(f"{config.source}: key 'peer.key': {config.key_path} (public id "
                              f"{identity.public_id}) is not the key of {name!r} on the roster "
                              f"{config.roster_path}, nor is any key file beside it", key="peer.key")
        identity = rotated
    if member.role not in GOSSIP_ROLES:
        raise ConfigError(f"{config.source}: key 'peer.name': {name!r} has role {member.role!r} on the "
                          "roster; `hivemesh peer` runs peers and gateways", key="peer.name")
    return identity, roster, name


def peer_topology(config: PeerConfig, roster: Roster) -> Topology:
    """The network's graph over the roster's gossip members, peers and gateways (a gateway is a
    gossip peer as well as a FedAvg server); errors name the file and ``network.topology``."""
    network = config.network
    peer_names = tuple(m.name for m in roster.with_role(*GOSSIP_ROLES))
    try:
        return build(network.topology, peer_names, seed=network.seed, weights=network.weights)
    except HivemeshError as error:
        raise ConfigError(f"{config.source}: key 'network.topology' (roster {config.roster_path}): {error}",
                          key="network.topology") from None


def make_trainer(config: PeerConfig, *, members: Sequence[str] | None = None) -> Any:
    """This peer's trainer: the task, its shard (keyed by its name) among ``members`` (default: the
    topology's members on the roster), its data order."""
    from peer.train.build import build_trainers

    name = config.peer.name
    if members is None:
        members = peer_topology(config, load_roster(config.roster_path)).names
    return build_trainers(config.network, config.trainer, members=members, wanted=(name,))[1][name]


def assemble(config: PeerConfig, *, make: Callable[[Topology], Any] | None = None) -> Parts:
    """All parts of the peer described by ``config`` (see the module docstring for errors);
    ``make``: makes its trainer for the topology instead of the config's task (a member in the
    user's own loop: peer/library.py)."""
    from protocols.gossip import make_machine

    identity, roster, name = identity_and_roster(config)
    network = config.network
    topology = peer_topology(config, roster)
    index = topology.names.index(name)
    neighbours = {}
    for other in topology.neighbours(name):
        address = roster.member(other).address
        if not address:
            raise HivemeshError(f"roster {config.roster_path}: neighbour {other!r} has no address")
        neighbours[other] = tcp_address(address)
    digest = run_id(config.shared())  # not the members: a roster edit must not split the network
    lock = DataDirLock(config.data_dir)     # before the epoch: a second peer here must change nothing
    try:
        epoch = next_epoch(config.data_dir)
        endpoint = Endpoint(identity, roster, digest, epoch)
        trainer = make_trainer(config, members=topology.names) if make is None else make(topology)
        graph: Any = topology    # satisfies the machine's GraphView (read-only attributes)
        # trainer.mixed: the parameters, and the floating buffers when trainer.buffers = "average"
        machine: Machine = make_machine(config.gossip, name=name, topology=graph, params=trainer.mixed,
                                        seed=network.seed, shapes=trainer.mixed_shapes,
                                        trained_numel=trainer.flat_params.numel())
        server, clients = gateway_server(config, roster, name, trainer, endpoint=endpoint)
    except BaseException:
        lock.release()
        raise
    return Parts(config=config, identity=identity, roster=roster, topology=topology, name=name, index=index,
                 neighbours=neighbours, run_id=digest, epoch=epoch, endpoint=endpoint, trainer=trainer,
                 machine=machine, lock=lock, server=server, clients=clients)


def gateway_serving(config: PeerConfig, name: str) -> Serving:
    """Which edge clients gateway ``name`` serves in each roster version (protocols/node/membership.py)."""
    return Serving(gateway=name, configured=tuple(config.peer.clients))


def served_clients(config: PeerConfig, roster: Roster, name: str) -> tuple[str, ...]:
    """The edge clients gateway ``name`` serves now: those ``[peer] clients`` lists (none listed:
    every edge member) but one whose roster entry names another gateway, and one whose entry names
    this gateway (the rule the Node applies to each roster version); a listed name that is no edge
    client, or a ``[federation]`` whose rounds can never run for that many clients
    (FederationConfig.check_cohorts), is a ConfigError naming the key."""
    edges = {member.name for member in roster.with_role("edge")}
    unknown = [name for name in config.peer.clients if name not in edges]
    if unknown:
        raise ConfigError(f"{config.source}: key 'peer.clients': {', '.join(unknown)} not edge clients "
                          f"on the roster {config.roster_path}", key="peer.clients")
    clients = gateway_serving(config, name).clients(roster)
    if config.federation is not None:
        try:
            config.federation.check_cohorts(len(clients))
        except ValueError as error:
            raise ConfigError(f"{config.source}: key 'federation' ({len(clients)} edge clients served): "
                              f"{error}", key="federation") from None
    return clients


def gateway_server(config: PeerConfig, roster: Roster, name: str,
                   trainer: Any, *, endpoint: Endpoint | None = None) -> tuple[Any, tuple[str, ...]]:
    """A gateway's FedAvg (or FedBuff) server on the vector its gossip machine mixes, and the edge
    clients it serves (``Serving``: ``[peer] clients``, else every ``edge`` member of the roster; an
    entry that names its gateway goes to that one); (None, ())
    for a plain peer. ``endpoint``: its run id and current roster bind and check secure
    aggregation's keys (needed with ``[federation.secure_aggregation]``)."""
    federation = config.federation
    if federation is None:
        return None, ()
    from protocols.federation import make_server

    if trainer.mixed.numel() != trainer.flat_params.numel():   # (a model with floating buffers)
        raise ConfigError(f"{config.source}: key 'network.trainer.buffers': a gateway's global model is "
                          "the parameters its clients train: use \"local\"", key="network.trainer.buffers")
    clients = served_clients(config, roster, name)
    # the root of the DP draws (who is asked, the noise): this gateway's alone, fresh at every start
    secret_seed = secrets.randbits(63)
    secure = None
    if federation.secure_aggregation is not None:   # SecAgg+ (protocols/federation/secure.py)
        from protocols.federation import SecureServer
        from protocols.federation.secure import roster_verify

        if endpoint is None:
            raise HivemeshError("secure aggregation needs the gateway's endpoint (its run id and roster)")
        wire = endpoint
        secure = SecureServer(federation.secure_aggregation, run_id=wire.run_id.hex(),
                              verify=roster_verify(lambda: wire.roster), like=trainer.mixed)
    server = make_server(federation, name=name, params=trainer.mixed, secret_seed=secret_seed,
                         pause_between_rounds=federation.has_rounds, shapes=trainer.mixed_shapes,
                         secure=secure)
    return server, clients

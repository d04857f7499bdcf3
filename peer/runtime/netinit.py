"""Create a new network's files: one identity key per member, the roster, one config per peer.

What ``hivemesh init``, ``hivemesh demo`` and the process tests start from.
The layout of ``out``::

    roster.toml          members: name, public id, role, address, curve key
    keys/NAME.key        each member's secret key (mode 0600)
    NAME.toml            each peer's config ([peer], [network], [transport], [checkpoint])
    data/NAME/           each peer's data folder (created by the daemon)

A federation (``create_federation``; ``hivemesh init --gateways G --edges E``)
adds edge clients: role ``edge`` on the roster, no address (they dial out),
one ``NAME.toml`` each for ``hivemesh edge``; ``federation.toml`` holds the
``[network]`` and ``[federation]`` tables, once, and every gateway's and edge
client's config includes it (``include = "federation.toml"``) and keeps only
its own tables.

Only the key of a member ever needs to move to that member's machine; the
roster and the [network] table (a federation's ``federation.toml``) are the
same everywhere.

Addresses: one ``host`` for every member (ports consecutive from ``base_port``,
or free ports of that host chosen now), or ``hosts``, one entry per member in
roster order (``hivemesh init --hosts a,b,c``): ``HOST:PORT``, or ``HOST``
with the port ``base_port + i``. A free port can only be chosen on a host this
machine owns; for any other the operator gives the port.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Any

from peer.files import roster_file, tomlout
from peer.files.federation_layout import federation_names
from peer.files.federation_layout import gateway_of as layout_gateway_of
from peer.files.include import INCLUDE_KEY
from peer.files.keyfile import save_identity
from peer.net.transport import free_tcp_addresses, listener_address, reserve_listeners
from protocols.errors import HivemeshError
from protocols.identity import Identity
from protocols.roster import Member, Roster
from topology import default_names


@dataclass(frozen=True)
class NetworkFiles:
    out: Path
    roster: Path
    configs: dict[str, Path]   # member name -> its config file
    keys: dict[str, Path]
    # member name -> a socket bound to its address, when the ports were reserved (``reserve=True``):
    # hand them to peer.runtime.launch.PeerProcesses, which passes each to its peer
    listeners: dict[str, socket.socket] = field(default_factory=dict)


def create_network(out: str | Path, *, peers: int, network: Mapping[str, Any],
                   names: Sequence[str] | None = None, host: str = "127.0.0.1", base_port: int = 0,
                   peer_options: Mapping[str, Any] | None = None,
                   sections: Mapping[str, Mapping[str, Any]] | None = None,
                   reserve: bool = False,
                   own_options: Mapping[str, Mapping[str, Any]] | None = None,
                   hosts: Sequence[str] | None = None, include: str = "") -> NetworkFiles:
    """Write keys, roster and configs for ``peers`` members into ``out`` (which must be empty).

    ``network`` is the [network] table (topology, seed, task, partition, gossip, trainer).
    ``base_port`` 0 asks the operating system for free ports on ``host``; with ``reserve`` the ports
    stay bound (``NetworkFiles.listeners``) for peers started here at once (demo, tests), otherwise
    they are only written down (``hivemesh init``: the peers start later, elsewhere).
    ``peer_options`` are extra [peer] keys for every peer, ``own_options`` for one (by name: a
    gateway's ``clients``); ``sections`` extra tables (e.g. {"checkpoint": {"every_steps": 20}}).
    ``hosts``: one address per member instead of ``host`` (see :func:`host_addresses`).
    ``include``: a shared file (in ``out``) that holds ``network`` and that each config includes
    instead of a copy of its own (peer/files/include.py; the caller writes it).
    """
    if peers < 1:
        raise HivemeshError("--peers must be at least 1")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise HivemeshError(f"{out}: not empty; choose a new folder for a new network")
    member_names = tuple(names) if names is not None else default_names(peers)
    if len(member_names) != peers:
        raise HivemeshError(f"{peers} peers but {len(member_names)} names")
    listeners: list[socket.socket] = []
    if hosts is not None:
        if reserve:
            raise HivemeshError("hosts: addresses of other machines cannot be reserved here")
        if len(hosts) != peers:
            raise HivemeshError(f"--hosts: {len(hosts)} addresses for {peers} members "
                                f"({', '.join(member_names)}): give one per member, in that order")
        addresses = host_addresses(hosts, base_port)
    elif base_port:
        if not 1 <= base_port <= 65535 - peers:
            raise HivemeshError(f"--base-port {base_port} leaves no room for {peers} ports")
        addresses = [f"tcp://{host}:{base_port + i}" for i in range(peers)]
    elif reserve:
        listeners = reserve_listeners(peers, host)
        addresses = [listener_address(listener) for listener in listeners]
    else:
        addresses = _free_addresses(peers, host, option="--host")
    (out / "keys").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(exist_ok=True)
    members, keys = [], {}
    for name, address in zip(member_names, addresses, strict=True):
        identity = Identity.generate()
        keys[name] = out / "keys" / f"{name}.key"
        save_identity(identity, keys[name])
        members.append(Member(name=name, public_id=identity.public_id, role="peer", address=address,
                              curve_key=identity.curve_public_key))
    roster = Roster(tuple(members))
    roster_path = out / "roster.toml"
    roster_file.write(roster_path, roster)
    configs = {}
    for name in roster.names:
        table: dict[str, Any] = {INCLUDE_KEY: include} if include else {}
        table["peer"] = {"name": name, "key": f"keys/{name}.key", "roster": "roster.toml",
                         "data_dir": f"data/{name}", **dict(peer_options or {}),
                         **dict((own_options or {}).get(name, {}))}
        if not include:
            table["network"] = dict(network)
        for section, values in (sections or {}).items():
            table[section] = dict(values)
        configs[name] = out / f"{name}.toml"
        configs[name].write_text(f"# hivemesh peer config for {name}: hivemesh peer --config {name}.toml\n"
                                 + tomlout.dumps(table))
    return NetworkFiles(out=out, roster=roster_path, configs=configs, keys=keys,
                        listeners=dict(zip(member_names, listeners, strict=False)))


def host_addresses(hosts: Sequence[str], base_port: int = 0) -> list[str]:
    """One ``tcp://HOST:PORT`` per entry of ``hosts`` (``HOST:PORT``, ``[IPv6]:PORT`` or ``HOST``).

    An entry without a port gets ``base_port + i`` (i its index), or with ``base_port`` 0 a port
    of that host that is free now: which only this machine's own addresses can tell.
    """
    parsed: list[tuple[str, int]] = []
    for index, entry in enumerate(hosts):
        entry = entry.strip().removeprefix("tcp://")
        host, port = _split_host(entry)
        if not host:
            raise HivemeshError(f"--hosts: entry {index + 1} is empty (one HOST or HOST:PORT per member)")
        if port is None and base_port:
            port = base_port + index
        if port is not None and not 1 <= port <= 65535:
            raise HivemeshError(f"--hosts: {entry!r}: port {port} is not in 1-65535")
        parsed.append((host, port or 0))
    free: dict[str, list[str]] = {}     # per host, free ports for its entries without one, in order
    for host in {host for host, port in parsed if not port}:
        free[host] = _free_addresses(sum(1 for h, p in parsed if h == host and not p), host, option="--hosts")
    addresses = [f"tcp://{_bracketed(host)}:{port}" if port else free[host].pop(0) for host, port in parsed]
    taken = [address for address in addresses if addresses.count(address) > 1]
    if taken:
        raise HivemeshError(f"--hosts: {taken[0]} is given to two members")
    return addresses


def _split_host(entry: str) -> tuple[str, int | None]:
    """``HOST:PORT`` -> (HOST, PORT); ``HOST``, a bare IPv6 address -> (HOST, None)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, _port(entry, rest.removeprefix(":")) if rest else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None


def _port(entry: str, text: str) -> int:
    if not text.isdigit():
        raise HivemeshError(f"--hosts: {entry!r} is not HOST or HOST:PORT")
    return int(text)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _free_addresses(count: int, host: str, *, option: str) -> list[str]:
    """``free_tcp_addresses``, with the error of a host this machine doesn't own made one line."""
    try:
        return free_tcp_addresses(count, host)
    except OSError as error:
        if error.errno == errno.EADDRNOTAVAIL:
            hint = "--base-port" if option == "--host" else "HOST:PORT, or --base-port"
            raise HivemeshError(f"{option}: {host} is not an address of this machine, so no free port can "
                                f"be chosen for it here: give {hint}") from None
        raise HivemeshError(f"{option}: cannot choose a free port on {host}: {error.strerror}") from None


def load_roster(path: str | Path) -> Roster:
    """Read a roster TOML file; a HivemeshError names the file on any problem."""
    return roster_file.read(path)


@dataclass(frozen=True)
class FederationFiles:
    """A federation's files: the gateways' as a network's, plus each edge client's key and config."""

    network: NetworkFiles           # gateways: roster, keys, configs (with [federation]), listeners
    edge_configs: dict[str, Path]   # edge client name -> its config (edge.toml)
    gateway_of: dict[str, str]      # edge client name -> its gateway
    shared: Path                    # SHARED_FILE: [network] and [federation], included by every member


# the file of a federation's [network] and [federation] tables, in the federation's folder
SHARED_FILE = "federation.toml"


# a gateway's checkpoint interval, in rounds (its steps): a round is the clients' training, long
# beside saving one model, so a checkpoint per round is cheap and a kill -9 loses at most one
GATEWAY_CHECKPOINT_ROUNDS = 1


def create_federation(out: str | Path, *, gateways: int, edges: int, network: Mapping[str, Any],
                      federation: Mapping[str, Any], host: str = "127.0.0.1", base_port: int = 0,
                      reserve: bool = False, peer_options: Mapping[str, Any] | None = None,
                      edge_options: Mapping[str, Any] | None = None,
                      sections: Mapping[str, Mapping[str, Any]] | None = None,
                      hosts: Sequence[str] | None = None) -> FederationFiles:
    """Write the keys, roster and configs of ``gateways`` gateways and ``edges`` edge clients.

    Gateways are members with role ``gateway`` and an address (``[federation]`` in their config
    makes ``hivemesh peer`` a gateway); edge clients have role ``edge``, no address, and an
    ``edge.toml``-style config naming their gateway (peer/files/federation_layout.py: contiguous
    blocks, client i of E belongs to gateway i * G // E, as in a simulated federation; each
    gateway's ``[peer] clients`` lists its block, except a lone gateway's, which serves every
    edge member of the roster, later ones included). The ``[network]`` and ``[federation]``
    tables (the run id) are written once, in :data:`SHARED_FILE`, which every member's config
    includes (peer/files/include.py): an edit there changes every member.
    ``hosts``: one address per gateway instead of ``host`` (edge clients have none). A gateway
    checkpoints every :data:`GATEWAY_CHECKPOINT_ROUNDS` rounds unless ``sections``' ``checkpoint``
    table sets ``every_steps``.
    """
    if gateways < 1 or edges < 1:
        raise HivemeshError("a federation needs at least one gateway and one edge client")
    gateway_names, edge_names = federation_names(gateways, edges)
    gateway_of = {name: layout_gateway_of(index, gateways=gateways, edges=edges)
                  for index, name in enumerate(edge_names)}
    # one gateway names no clients: it serves every edge member of the roster, in every version, so
    # an edge client added while it runs (`hivemesh roster add --role edge`) is served without a restart
    own = {gateway: {"clients": [edge for edge, theirs in gateway_of.items() if theirs == gateway]}
           for gateway in gateway_names} if gateways > 1 else {}
    # [checkpoint] merged key by key: a table naming only ``keep`` leaves the interval in rounds
    checkpoint = {"every_steps": GATEWAY_CHECKPOINT_ROUNDS, **dict((sections or {}).get("checkpoint", {}))}
    files = create_network(out, peers=gateways, network=network, names=gateway_names, host=host,
                           base_port=base_port, peer_options=peer_options, reserve=reserve,
                           sections={**dict(sections or {}), "checkpoint": checkpoint}, own_options=own,
                           hosts=hosts, include=SHARED_FILE)
    shared = files.out / SHARED_FILE
    shared.write_text(f"# what every gateway and edge client of this federation agrees on (the run id): "
                      f"each member's config includes it\n# (include = \"{SHARED_FILE}\"); change a key "
                      f"here, never in one member's file\n"
                      + tomlout.dumps({"network": dict(network), "federation": dict(federation)}))
    roster = roster_file.read(files.roster)
    members = [dataclass_replace(m, role="gateway") for m in roster.members]
    keys = dict(files.keys)
    for name in edge_names:
        identity = Identity.generate()
        keys[name] = files.out / "keys" / f"{name}.key"
        save_identity(identity, keys[name])
        members.append(Member(name=name, public_id=identity.public_id, role="edge", address="",
                              curve_key=identity.curve_public_key))
    roster_file.write(files.roster, Roster(tuple(members)))
    edge_configs = {}
    for name in edge_names:
        table: dict[str, Any] = {
            INCLUDE_KEY: SHARED_FILE,
            "edge": {"name": name, "key": f"keys/{name}.key", "roster": "roster.toml",
                     "data_dir": f"data/{name}", "gateway": gateway_of[name], **dict(edge_options or {})}}
        edge_configs[name] = files.out / f"{name}.toml"
        edge_configs[name].write_text(f"# hivemesh edge client config for {name}: "
                                      f"hivemesh edge --config {name}.toml\n" + tomlout.dumps(table))
    network_files = NetworkFiles(out=files.out, roster=files.roster, configs=files.configs, keys=keys,
                                 listeners=files.listeners)
    return FederationFiles(network=network_files, edge_configs=edge_configs, gateway_of=gateway_of,
                           shared=shared)

"""Whom the daemon's transport dials and admits: its CurveZMQ keys, and each roster the Node puts in force.

``Connect`` (protocols/node/membership.py) names a roster and a neighbour set:
the endpoint verifies against that roster, the transport dials who is new or
moved and drops who left, admits the roster's curve keys only, and takes a
neighbour's (or our own) rotated key once the roster lists it. A rotation of
our own signing key is picked up from a key file beside the configured one
(peer/files/keydir.py) as soon as the roster names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from peer.files.keydir import find_identity
from peer.net.transport import Transport
from peer.runtime.assemble import tcp_address
from peer.runtime.peerconfig import PeerConfig
from protocols.node.membership import Connect
from protocols.roster import Roster
from protocols.wire import Endpoint
from topology.errors import HivemeshError


def curve_keys(config: PeerConfig, identity: Any, roster: Roster, neighbours: dict[str, str]) -> Any:
    """The transport's CurveZMQ keys (None when ``[peer] curve`` is off)."""
    if not config.peer.curve:
        return None
    from peer.net.transport import CurveKeys

    missing = [n for n in neighbours if not roster.member(n).curve_key]
    if missing:
        raise HivemeshError(f"peer.curve is on but roster members {missing} have no curve_key")
    return CurveKeys(
        public_key=identity.curve_public_key.encode(), secret_key=identity.curve_secret_key.encode(),
        server_keys={n: roster.member(n).curve_key.encode() for n in neighbours},
        allowed_client_keys=frozenset(k.encode() for k in roster.curve_allowlist()))


def connect(connect: Connect, *, name: str, config: PeerConfig, transport: Transport, endpoint: Endpoint,
            dialled: dict[str, str], say: Callable[[str], None], warn: Callable[[str], None]) -> None:
    """The Node's new roster and neighbour set: verify against it, dial who is new or moved, drop who
    left. ``dialled``: each neighbour's address as dialled (kept up to date)."""
    roster = connect.roster
    hold_own_key(roster, name=name, config=config, endpoint=endpoint, say=say, warn=warn)
    endpoint.set_roster(roster)
    curve = config.peer.curve
    for neighbour in connect.neighbours:
        member = roster.member(neighbour)
        address = tcp_address(member.address)
        if neighbour in transport.neighbours and dialled.get(neighbour, address) != address:
            # moved (`hivemesh roster set-address`): dial it where it listens now
            transport.drop_neighbour(neighbour)
            say(f"{name}: dials {neighbour} at its new address {address}")
        if neighbour not in transport.neighbours:
            server_key = member.curve_key.encode() if curve and member.curve_key else None
            transport.add_neighbour(neighbour, address, server_key=server_key)
            dialled[neighbour] = address
    for neighbour in transport.neighbours:
        if neighbour not in connect.neighbours:
            transport.drop_neighbour(neighbour)
    if curve:
        transport.allow(frozenset(k.encode() for k in roster.curve_allowlist()))
        for neighbour in connect.neighbours:     # a neighbour's rotated key, once the roster lists it
            transport.set_server_key(neighbour, roster.member(neighbour).curve_key.encode())
        own = endpoint.identity   # a rotation of ours, once in force: serve and dial with it
        if own.curve_public_key.encode() != transport.curve_public_key:
            transport.rekey(own.curve_public_key.encode(), own.curve_secret_key.encode())
            say(f"{name}: serves and dials with its rotated CurveZMQ key")


def hold_own_key(roster: Roster, *, name: str, config: PeerConfig, endpoint: Endpoint,
                 say: Callable[[str], None], warn: Callable[[str], None]) -> None:
    """A rotation of our own key: the endpoint gets the new key file as soon as the roster names it;
    it signs with it once that roster is in force. Not found: said at each roster change; the peer
    fails when the rotation's round comes."""
    for entry in (*roster.members, *roster.also):
        if entry.name != name or entry.public_key in endpoint.identities:
            continue
        identity = find_identity(config.key_path, entry.public_id)
        if identity is not None:
            endpoint.add_identity(identity)
            say(f"{name}: holds its rotated key {entry.public_id[:12]}...")
        else:
            warn(f"the roster gives {name} the key {entry.public_id}, but no key file beside "
                 f"{config.key_path} holds it: put it there before the rotation's round")

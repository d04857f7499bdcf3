"""Members' connections at a CURVE inbox on 127.0.0.1 (issue 32 items 6 and 7): a member that
connected and has said nothing yet is past its handshake and never shed for strangers'
half-sent handshakes; a member holds at most ``max_connections_per_member`` connections; a closed
connection is reported at once, so what it was assembling is released then, not when idle."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from peer.net.contexts import new_context
from peer.net.transport import CurveKeys, Transport, TransportConfig, listener_address, reserve_listeners

pytestmark = pytest.mark.processes

MEMBERS = 20
HALF_SENT = 10
CAP = 3
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\0" + bytes(31)

Keys = tuple[bytes, bytes]


def _wait_for(condition: Callable[[], bool], failure: Callable[[], str], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, failure()
        time.sleep(0.01)


@pytest.fixture
def inbox() -> Iterator[tuple[Transport, Keys, list[Keys]]]:
    own = zmq.curve_keypair()
    members = [zmq.curve_keypair() for _ in range(MEMBERS)]
    (listener,) = reserve_listeners(1)
    transport = Transport(listen=listener_address(listener), neighbours={}, listen_fd=listener.detach(),
                          config=TransportConfig(max_handshaking_connections=CAP),
                          curve=CurveKeys(public_key=own[0], secret_key=own[1], server_keys={},
                                          allowed_client_keys=frozenset({own[0], *(k for k, _ in members)})))
    try:
        yield transport, own, members
    finally:
        transport.close()


def _member(context: zmq.Context, transport: Transport, server_key: bytes, keys: Keys) -> zmq.Socket:
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.setsockopt(zmq.RECONNECT_IVL, 600_000)     # a shed connection would not come back in time
    dealer.curve_publickey, dealer.curve_secretkey = keys
    dealer.curve_serverkey = server_key
    dealer.connect(transport.listen)
    return dealer


def _port(transport: Transport) -> int:
    return int(transport.listen.rsplit(":", 1)[1])


def _received(transport: Transport, count: int) -> list[bytes]:
    """``count`` frames off the inbox, each taken as the daemon takes it (its connection's key)."""
    connections: list[bytes] = []
    _wait_for(lambda: _take(transport, connections) >= count, lambda: f"only {len(connections)} arrived")
    return connections


def _take(transport: Transport, connections: list[bytes]) -> int:
    for arrival in transport.poll(0.05):
        assert transport.connection_key(arrival.frame) is not None
        connections.append(arrival.connection)
    return len(connections)


def test_silent_members_are_never_shed_for_half_sent_handshakes(
        inbox: tuple[Transport, Keys, list[Keys]]) -> None:
    transport, own, members = inbox
    context = new_context()
    stalled: list[socket.socket] = []
    try:
        # Prepare: every member connects and says nothing; two at a time, so their handshakes overlap
        # (then a success names no connection: each once counted mid-handshake until it spoke) and
        # stay within the cap (a burst past it is itself shed, and redials)
        dealers: list[zmq.Socket] = []
        for wave in (members[i:i + 2] for i in range(0, MEMBERS, 2)):
            dealers += [_member(context, transport, own[0], keys) for keys in wave]
            connected = len(dealers)
            _wait_for(lambda n=connected: transport.connections["handshake_succeeded"] == n,
                      lambda: f"{transport.connections}")
        # Execute: strangers greet and half-send a large handshake command, all at once
        for _ in range(HALF_SENT):
            raw = socket.create_connection(("127.0.0.1", _port(transport)))
            raw.sendall(GREETING + b"\x06" + (1 << 20).to_bytes(8, "big") + bytes(4096))
            stalled.append(raw)
        _wait_for(lambda: transport.connections["accepted"] == MEMBERS + HALF_SENT,
                  lambda: f"{transport.connections}")
        # Assert: exactly the strangers beyond the cap were shed, no member; every member still speaks
        assert transport.connections["shed_mid_handshake"] == HALF_SENT - CAP, transport.connections
        for dealer in dealers:
            dealer.send(b"hello")
        assert len(set(_received(transport, MEMBERS))) == MEMBERS
        assert transport.connections["closed_after_handshake"] == 0, transport.connections
    finally:
        for raw in stalled:
            raw.close()
        context.destroy(linger=0)


def test_a_members_oldest_connections_beyond_the_limit_are_shut_down(
        inbox: tuple[Transport, Keys, list[Keys]]) -> None:
    transport, own, members = inbox
    limit = transport.config.max_connections_per_member
    context = new_context()
    try:
        dealers = []
        for _ in range(limit + 2):   # one after another: each first frame is taken before the next
            dealers.append(_member(context, transport, own[0], members[0]))
            dealers[-1].send(b"hello")
            _received(transport, 1)
        _wait_for(lambda: transport.connections["closed_after_handshake"] == 2,
                  lambda: f"{transport.connections}")
        assert transport.connections["closed_surplus_connection"] == 2
        # the newest ones are kept
        for dealer in dealers[-limit:]:
            dealer.send(b"still here")
        _received(transport, limit)
    finally:
        context.destroy(linger=0)


def test_a_closed_connection_is_reported_at_once(inbox: tuple[Transport, Keys, list[Keys]]) -> None:
    transport, own, members = inbox
    context = new_context()
    try:
        staying, leaving = (_member(context, transport, own[0], keys) for keys in members[:2])
        staying.send(b"hello")
        (stays,) = _received(transport, 1)
        leaving.send(b"hello")
        (leaves,) = _received(transport, 1)
        leaving.close(linger=0)
        gone: list[bytes] = []
        _wait_for(lambda: bool(gone.extend(transport.closed_connections()) or gone), lambda: "no close seen")
        assert gone == [leaves] and stays != leaves
        assert transport.closed_connections() == []
    finally:
        context.destroy(linger=0)

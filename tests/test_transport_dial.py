"""An edge client's dial-out transport and the gateway's replies on the client's own connection."""

from __future__ import annotations

import os
import time

import pytest
import zmq

from peer.net.dial import GATEWAY, DialTransport
from peer.net.handshakes import refusal_backoff_ms
from peer.net.transport import (
    Arrival,
    CurveKeys,
    Transport,
    TransportConfig,
    listener_address,
    reserve_listeners,
)

pytestmark = pytest.mark.processes


def _gateway() -> Transport:
    [listener] = reserve_listeners(1)
    return Transport(listen=listener_address(listener), neighbours={}, listen_fd=listener.detach())


def _until(poll: object, count: int, timeout_s: float = 5.0) -> list[Arrival]:
    got: list[Arrival] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += poll(0.05)  # type: ignore[operator]
    return got


def _send_until_connected(client: DialTransport, frames: list[bytes]) -> None:
    deadline = time.monotonic() + 5.0
    while not client.send(frames):
        assert time.monotonic() < deadline, "never connected"
        client.poll(0.02)   # (an unconnected DEALER with IMMEDIATE refuses: retry until it is up)


def test_the_gateway_replies_on_the_connection_the_client_opened() -> None:
    with _gateway() as gateway, DialTransport(gateway.listen) as client:
        _send_until_connected(client, [b"header", b"payload"])
        arrivals = _until(gateway.poll, 2)
        assert [bytes(a.frame.bytes) for a in arrivals] == [b"header", b"payload"]
        assert arrivals[0].connection == arrivals[1].connection
        assert gateway.reply(arrivals[0].connection, [b"answer", memoryview(b"tensor")])
        back = _until(client.poll, 2)
        assert [bytes(a.frame.bytes) for a in back] == [b"answer", b"tensor"]
        assert {a.connection for a in back} == {GATEWAY}
        gateway.wait_sent()
        assert gateway.pending_sends() == 0
        assert gateway.bytes_replied == len(b"answertensor")
        assert client.listening() == ()


def test_a_reply_to_a_gone_connection_is_counted_not_raised() -> None:
    with _gateway() as gateway:
        assert not gateway.reply(b"\x00no-such-id", [b"answer"])
        assert gateway.replies_dropped == {"gone": 1}


def test_the_client_reconnects_to_a_restarted_gateway_on_a_new_connection() -> None:
    # the listening socket outlives the gateway process, as peer.runtime.launch keeps it for restarts
    [listener] = reserve_listeners(1)
    address = listener_address(listener)
    gateway = Transport(listen=address, neighbours={}, listen_fd=os.dup(listener.fileno()))
    with DialTransport(address) as client:
        _send_until_connected(client, [b"one"])
        [first] = _until(gateway.poll, 1)
        gateway.close()
        gateway = Transport(listen=address, neighbours={}, listen_fd=os.dup(listener.fileno()))
        try:
            arrivals: list[Arrival] = []
            deadline = time.monotonic() + 10.0
            while not arrivals and time.monotonic() < deadline:
                client.send([b"two"])
                arrivals = gateway.poll(0.1)
            assert arrivals and bytes(arrivals[0].frame.bytes) == b"two"
            assert not gateway.reply(first.connection, [b"to the old connection"])
            assert gateway.reply(arrivals[0].connection, [b"welcome back"])
            assert [bytes(a.frame.bytes) for a in _until(client.poll, 1)] == [b"welcome back"]
        finally:
            gateway.close()
            listener.close()


def test_a_multipart_reply_is_hostile_and_dropped() -> None:
    with _gateway() as gateway, DialTransport(gateway.listen) as client:
        _send_until_connected(client, [b"hello"])
        [arrival] = _until(gateway.poll, 1)
        raw: zmq.Socket[bytes] = zmq.Socket.shadow(gateway._inbox.underlying)
        raw.send_multipart([arrival.connection, b"a", b"b"])
        raw.send_multipart([arrival.connection, b"fine"])
        got = _until(client.poll, 1)
        assert [bytes(a.frame.bytes) for a in got] == [b"fine"]
        assert client.hostile == {"multipart": 1}


def _curve_gateway(allowed: frozenset[bytes]) -> tuple[Transport, bytes]:
    [listener] = reserve_listeners(1)
    public, secret = zmq.curve_keypair()
    gateway = Transport(listen=listener_address(listener), neighbours={}, listen_fd=listener.detach(),
                        curve=CurveKeys(public_key=public, secret_key=secret, server_keys={},
                                        allowed_client_keys=allowed))
    return gateway, public


def _poll_until(client: DialTransport, condition: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        client.poll(0.05)


def test_a_client_refused_before_its_key_is_admitted_redials_on_its_own_and_gets_in() -> None:
    """libzmq never retries a refused CurveZMQ handshake: the client sees the refusal on its socket's
    monitor, counts it, and dials again after its backoff, without waiting for a send to fail (an
    edge client added to the roster that dials before its gateway read that roster)."""
    public, secret = zmq.curve_keypair()
    config = TransportConfig(reconnect_ms=50, reconnect_max_ms=400)
    gateway, server_key = _curve_gateway(frozenset())
    with gateway, DialTransport(gateway.listen, config=config, curve=(public, secret, server_key)) as client:
        _poll_until(client, lambda: client.handshake_refused["auth"] >= 2, "never refused twice")
        assert client.handshakes == 0 and not client.send([b"too early"])
        gateway.allow(frozenset({public}))      # the gateway read the roster that adds it
        _poll_until(client, lambda: client.handshakes == 1, "never got in after its key was admitted")
        refused = client.handshake_refused["auth"]
        assert client.redialed >= refused           # one fresh dial per refusal (none waited for a send)
        assert gateway.refused["not_on_roster"] >= refused >= 2     # each refusal counted on both sides
        client.send([b"admitted"])
        assert [bytes(a.frame.bytes) for a in _until(gateway.poll, 1)] == [b"admitted"]


def test_a_removed_client_is_shut_out_at_once_and_refused_at_each_redial() -> None:
    public, secret = zmq.curve_keypair()
    config = TransportConfig(reconnect_ms=20, reconnect_max_ms=200)
    gateway, server_key = _curve_gateway(frozenset({public}))
    with gateway, DialTransport(gateway.listen, config=config, curve=(public, secret, server_key)) as client:
        _send_until_connected(client, [b"member"])
        [arrival] = _until(gateway.poll, 1)
        assert gateway.connection_key(arrival.frame) == public     # (the gate learns who holds it)
        gateway.allow(frozenset())      # removed (revoked): its open connection is shut at once
        _poll_until(client, lambda: client.handshake_refused["auth"] >= 6, "never refused again")
        assert gateway.connections["closed_removed_from_roster"] == 1
        assert not client.send([b"removed"]) and client.handshakes == 1
        assert gateway.refused["not_on_roster"] >= 6 and gateway.poll(0.1) == []


def test_the_backoff_after_refusals_doubles_up_to_the_ceiling() -> None:
    config = TransportConfig(reconnect_ms=100, reconnect_max_ms=5000)
    assert [refusal_backoff_ms(config, n) for n in range(8)] == [100, 200, 400, 800, 1600, 3200, 5000, 5000]
    assert refusal_backoff_ms(config, 10**6) == 5000

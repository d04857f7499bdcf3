"""An edge client's dial-out transport and the gateway's replies on the client's own connection."""

from __future__ import annotations

import os
import time

import pytest
import zmq

from peer.net.dial import GATEWAY, DialTransport
from peer.net.transport import Arrival, Transport, listener_address, reserve_listeners

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

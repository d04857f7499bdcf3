"""The ZeroMQ transport on 127.0.0.1: delivery, zero-copy tracking, memory bounds, CURVE allowlist."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
import zmq

from peer.transport import CurveKeys, Transport, TransportConfig, TransportError, free_tcp_addresses

pytestmark = pytest.mark.processes


def _send_until_connected(transport: Transport, name: str, frames: list[bytes | memoryview]) -> None:
    for _ in range(100):
        if transport.send(name, frames):
            return
        time.sleep(0.02)
    raise AssertionError("never connected")


def _receive(transport: Transport, count: int, timeout_s: float = 5.0) -> list[list[zmq.Frame]]:
    got: list[list[zmq.Frame]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += transport.poll(0.1)
    return got


@pytest.fixture
def pair() -> Iterator[tuple[Transport, Transport]]:
    a_addr, b_addr = free_tcp_addresses(2)
    a = Transport(listen=a_addr, neighbours={"b": b_addr})
    b = Transport(listen=b_addr, neighbours={"a": a_addr})
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_zero_copy_frames_arrive_intact_and_tracking_releases_them(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    x = torch.arange(3_000_000, dtype=torch.float32)
    view = memoryview(x.numpy()).cast("B")
    # a small last frame, like a signature: its tracker alone says nothing about the big ones
    frames: list[bytes | memoryview] = [b"header", view[: 4 << 20], view[4 << 20:], b"signature"]
    for _ in range(20):
        _send_until_connected(a, "b", frames)
        a.wait_sent(timeout_s=10)
        assert a.pending_sends() == 0
        x.add_(1.0)   # safe only now: ZeroMQ no longer holds the buffer
    messages = _receive(b, 20)
    assert len(messages) == 20
    for sent_index, message in enumerate(messages):
        assert bytes(message[0]) == b"header" and bytes(message[-1]) == b"signature"
        received = torch.cat([torch.frombuffer(f.buffer, dtype=torch.float32) for f in message[1:-1]])
        assert torch.equal(received, torch.arange(3_000_000, dtype=torch.float32) + sent_index)
    assert a.bytes_sent == b.bytes_received == 20 * (6 + 12_000_000 + 9)


def test_an_oversized_frame_disconnects_its_sender_before_it_is_buffered() -> None:
    a_addr, b_addr = free_tcp_addresses(2)
    small = TransportConfig(max_frame_bytes=1 << 20)
    a = Transport(listen=a_addr, neighbours={"b": b_addr})
    b = Transport(listen=b_addr, neighbours={"a": a_addr}, config=small)
    try:
        _send_until_connected(a, "b", [b"ok"])
        assert len(_receive(b, 1)) == 1
        a.send("b", [bytes(2 << 20)])
        got = _receive(b, 1, timeout_s=1.0)
        assert all(len(frame) < 1 << 20 for message in got for frame in message)   # never delivered
    finally:
        a.close()
        b.close()


def test_a_neighbour_that_is_not_listening_is_counted_unreachable() -> None:
    (own, dead) = free_tcp_addresses(2)
    with Transport(listen=own, neighbours={"dead": dead}) as transport:
        assert not transport.send("dead", [b"hello"])
        assert transport.dropped["dead"] == 1
        assert transport.pending_sends() == 0


def test_listening_on_a_taken_port_is_a_clear_error(pair: tuple[Transport, Transport]) -> None:
    a, _ = pair
    with pytest.raises(TransportError, match=f"cannot listen on {a.listen}"):
        Transport(listen=a.listen, neighbours={})


def test_curve_admits_roster_keys_only() -> None:
    a_addr, b_addr, c_addr = free_tcp_addresses(3)
    (pa, sa), (pb, sb), (pc, sc) = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    roster = frozenset({pa, pb})
    a = Transport(listen=a_addr, neighbours={"b": b_addr},
                  curve=CurveKeys(public_key=pa, secret_key=sa, server_keys={"b": pb},
                                  allowed_client_keys=roster))
    b = Transport(listen=b_addr, neighbours={"a": a_addr},
                  curve=CurveKeys(public_key=pb, secret_key=sb, server_keys={"a": pa},
                                  allowed_client_keys=roster))
    outsider = Transport(listen=c_addr, neighbours={"b": b_addr},
                         curve=CurveKeys(public_key=pc, secret_key=sc, server_keys={"b": pb}))
    try:
        _send_until_connected(a, "b", [b"from a"])
        for _ in range(20):
            outsider.send("b", [b"from outsider"])
            time.sleep(0.02)
        got = _receive(b, 2, timeout_s=1.0)
        assert [bytes(m[0]) for m in got] == [b"from a"]
        assert outsider.messages_sent["b"] == 0      # its handshake never completed
    finally:
        a.close()
        b.close()
        outsider.close()

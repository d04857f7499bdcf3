"""A neighbour that stops reading holds a peer at most its round deadline (issue 16: a split ring
stood still for ``send_timeout_s``, 30 s, with D-PSGD), on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from peer.net.transport import Transport, TransportConfig, listener_address, reserve_listeners
from peer.runtime.links import transport_config

pytestmark = pytest.mark.processes


def test_the_stall_timeout_is_the_round_deadline_when_that_is_shorter() -> None:
    default = TransportConfig()
    assert transport_config(default, deadline_s=0.5).stall_timeout_s == 0.5
    assert transport_config(default, deadline_s=120.0).stall_timeout_s == default.stall_timeout_s
    # a slow link that still moves bytes keeps the whole send timeout
    assert transport_config(default, deadline_s=0.5).send_timeout_s == default.send_timeout_s
    assert transport_config(default, deadline_s=0.5).high_water_mark == default.high_water_mark


def test_sends_to_a_neighbour_that_stopped_reading_are_abandoned_after_the_deadline() -> None:
    """``b`` never reads: ``a``'s queue and the sockets' buffers fill, ``a``'s frames stay in
    flight and the kernel acknowledges nothing more (a zero window, as across a cut); ``wait_sent``
    gives them up after the deadline (counted), not after 30 s."""
    la, lb = reserve_listeners(2)
    a_addr, b_addr = listener_address(la), listener_address(lb)
    config = transport_config(TransportConfig(high_water_mark=4), deadline_s=0.5)
    a = Transport(listen=a_addr, neighbours={"b": b_addr}, listen_fd=la.detach(), config=config)
    b = Transport(listen=b_addr, neighbours={"a": a_addr}, listen_fd=lb.detach())
    try:
        frame = bytes(1 << 20)
        connected, refused = False, 0
        for _ in range(1000):       # until connected, then until the buffers are full: 5 drops in a row
            sent = a.send("b", [frame])
            connected = connected or sent
            refused = 0 if sent else refused + connected
            if refused == 5:
                break
            if not sent:
                time.sleep(0.05)
        assert connected and a.dropped["b"] > 0 and a.pending_sends() > 0
        began = time.monotonic()
        a.wait_sent()
        waited_s = time.monotonic() - began
        assert a.abandoned["b"] > 0 and a.pending_sends() == 0
        assert waited_s < TransportConfig().send_timeout_s / 2   # the deadline (+ 1 s to release), not 30 s
    finally:
        a.close()
        b.close()


def test_a_message_cut_short_with_nothing_in_flight_abandons_nothing() -> None:
    """Frames small enough for ZeroMQ to copy are never in flight as ours: a message cut short by a
    queue that stays full is dropped (counted in ``dropped``), and the redial that discards its
    queued part abandons no send of ours, so ``abandoned`` gets no entry (it used to get ``b: 0``)."""
    la, lb = reserve_listeners(2)
    a_addr, b_addr = listener_address(la), listener_address(lb)
    a = Transport(listen=a_addr, neighbours={"b": b_addr}, listen_fd=la.detach(),
                  config=TransportConfig(high_water_mark=4, send_timeout_s=0.2))
    b = Transport(listen=b_addr, neighbours={"a": a_addr}, listen_fd=lb.detach())   # never reads
    try:
        for _ in range(200):        # until connected (a send with no connection is dropped at once)
            if a.send("b", [b"hello"]):
                break
            time.sleep(0.02)
        dropped = a.dropped["b"]
        small = bytes(32 << 10)     # below pyzmq's copy threshold (64 KiB): copied, never tracked
        assert not a.send("b", [small] * 2048)   # 64 MiB: more than the queue and the kernel's buffers
        assert a.dropped["b"] == dropped + 1 and a.pending_sends() == 0
        assert "b" not in a.abandoned, a.abandoned
    finally:
        a.close()
        b.close()

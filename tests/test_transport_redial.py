"""A peer's outbox redials a refused CurveZMQ handshake on its own (peer/net/handshakes.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import zmq

from peer.net.transport import CurveKeys, Transport, TransportConfig, listener_address, reserve_listeners

pytestmark = pytest.mark.processes


def _poll_until(transports: list[Transport], condition: Callable[[], bool], what: str,
                timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        for transport in transports:
            transport.poll(0.02)


def test_an_outbox_refused_before_its_key_is_admitted_redials_after_one_backoff_step() -> None:
    """b has not admitted a's key yet (a joiner dialed a neighbour that had not applied the roster
    version adding it): a's outbox sees the refusal on its monitor, counts it, and dials again after
    the refusal backoff; once b admits a, a is connected without having sent anything. The stale
    fallback (no connection for reconnect_max_ms, at a failed send) cannot be what let it in: its
    ceiling is a minute away and a never sends."""
    la, lb = reserve_listeners(2)
    (pa, sa), (pb, sb) = zmq.curve_keypair(), zmq.curve_keypair()
    config = TransportConfig(reconnect_ms=50, reconnect_max_ms=60_000)
    b = Transport(listen=listener_address(lb), neighbours={}, config=config, listen_fd=lb.detach(),
                  curve=CurveKeys(public_key=pb, secret_key=sb, server_keys={},
                                  allowed_client_keys=frozenset({pb})))     # a not admitted yet
    a = Transport(listen=listener_address(la), neighbours={"b": b.listen}, config=config,
                  listen_fd=la.detach(),
                  curve=CurveKeys(public_key=pa, secret_key=sa, server_keys={"b": pb}))
    with a, b:
        _poll_until([a], lambda: a.handshake_refused["auth"] >= 2, "a's outbox was never refused twice")
        assert a.redialed["b"] >= 1 and a.handshakes["b"] == 0      # redialed after a refusal, no send
        b.allow(frozenset({pa, pb}))        # b applied the roster version that adds a
        _poll_until([a], lambda: a.handshakes["b"] == 1, "a never got in after b admitted its key")
        refused = a.handshake_refused["auth"]
        assert a.redialed["b"] == refused       # one fresh dial per refusal: none was the stale fallback
        assert b.refused["not_on_roster"] >= refused   # each refusal counted on both sides
        assert not a.messages_sent and not a.dropped     # connected without sending anything
        assert a.send("b", [b"welcome at last"])          # the connection is up: the first send goes
        _poll_until([b], lambda: b.messages_received == 1, "b never got a's message")
        a.poll(0.2)     # a connected outbox is not redialed again
        assert a.redialed["b"] == refused and a.handshake_refused["auth"] == refused


def test_a_full_queue_behind_a_slow_receiver_is_not_redialed_and_loses_nothing() -> None:
    """b reads nothing for longer than the back-off's ceiling (a peer starved of CPU on a loaded
    machine) while a sends small messages (copied by libzmq: no tracker shows them queued) until its
    queue is full, then once more. The connection is up, so a full queue is a slow receiver, not a
    stale dial: a keeps its socket, and every message a's send took reaches b once b reads again.
    Before, the failed send redialed (no pending tracker, dialed over reconnect_max_ms ago) and the
    fresh socket dropped every message queued on the old one, uncounted."""
    la, lb = reserve_listeners(2)
    config = TransportConfig(reconnect_ms=50, reconnect_max_ms=200, high_water_mark=8,
                             receive_high_water_mark=8)
    b = Transport(listen=listener_address(lb), neighbours={}, config=config, listen_fd=lb.detach())
    a = Transport(listen=listener_address(la), neighbours={"b": b.listen}, config=config,
                  listen_fd=la.detach())
    frame = bytes(32 * 1024)        # under pyzmq's copy threshold: copied, never tracked
    with a, b:
        _poll_until([a], lambda: a.send("b", [frame]), "a never connected to b")   # sent once connected
        _poll_until([b], lambda: b.messages_received == 1, "b never got a's first message")

        def fill() -> int:
            """Send until a send fails: b reads nothing, so the kernel's buffers, then a's queue fill."""
            sent = 0
            while a.send("b", [frame]):
                sent += 1
                assert sent < 100_000, "a's queue never filled"
            return sent

        taken = 1 + fill()
        time.sleep(config.reconnect_max_ms / 1000 * 2)   # past the ceiling since a dialed b
        taken += fill()     # what room libzmq's I/O thread made meanwhile; then a failed send
        assert a.redialed["b"] == 0, "a full queue on a live connection was taken for a stale dial"
        _poll_until([a, b], lambda: b.messages_received >= taken, f"b got {b.messages_received} of {taken}")
        assert b.messages_received == taken


def test_an_outbox_says_why_it_has_no_connection_and_stops_once_it_has_one() -> None:
    """``Transport.dial_down``: a neighbour's port that nothing listens on is ``refused`` (and how
    long for); a key the neighbour does not admit is a refused handshake; once admitted, the
    neighbour is no longer listed."""
    la, lb, lc = reserve_listeners(3)
    (pa, sa), (pb, sb) = zmq.curve_keypair(), zmq.curve_keypair()
    config = TransportConfig(reconnect_ms=50, reconnect_max_ms=200)
    nobody = listener_address(lc)
    lc.close()      # its port is free: a connect there is refused
    b = Transport(listen=listener_address(lb), neighbours={}, config=config, listen_fd=lb.detach(),
                  curve=CurveKeys(public_key=pb, secret_key=sb, server_keys={},
                                  allowed_client_keys=frozenset({pb})))     # a not admitted yet
    a = Transport(listen=listener_address(la), neighbours={"b": b.listen, "c": nobody}, config=config,
                  listen_fd=la.detach(),
                  curve=CurveKeys(public_key=pa, secret_key=sa, server_keys={"b": pb, "c": pb}))
    with a, b:
        _poll_until([a], lambda: a.dial_down().get("c", (0.0, ""))[1] == "refused", "c was never refused")
        _poll_until([a], lambda: a.dial_down()["b"][1].startswith("handshake refused"),
                    f"b's refusal was not said: {a.dial_down()}")
        b.allow(frozenset({pa, pb}))
        _poll_until([a, b], lambda: "b" not in a.dial_down(), f"b still listed: {a.dial_down()}")
        down_for_s, reason = a.dial_down()["c"]
        assert reason == "refused" and down_for_s > 0.0

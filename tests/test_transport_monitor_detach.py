"""A dialing socket's handshake monitor is taken down without wedging its context (peer/net/handshakes.py).

The bug (CI, main at a0e5ae2: tests/test_federation_ddp_daemon.py hung): a gateway shed an edge
client's first connection mid-handshake; the client saw the refusal and redialed it, closing its
end of the old socket's monitor first. libzmq had meanwhile redialed the old socket on its own,
and that handshake's event, sent with a blocking send on libzmq's end of the monitor (which had no
peer any more), blocked the client context's only I/O thread: no socket of it ever handshook again
and the client gave up after its gateway timeout. :meth:`HandshakeWatch.detach` now stops the
monitor before closing our end.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import zmq

from peer.net.contexts import new_context, terminate
from peer.net.dial import DialTransport
from peer.net.handshakes import HandshakeWatch
from peer.net.transport import CurveKeys, Transport, TransportConfig, listener_address, reserve_listeners

pytestmark = pytest.mark.processes

HANDSHAKE_BOUND_S = 10.0    # an honest handshake on 127.0.0.1 takes milliseconds


def _gateway(config: TransportConfig, client_keys: list[bytes]) -> tuple[Transport, bytes]:
    (listener,) = reserve_listeners(1)
    public, secret = zmq.curve_keypair()
    gateway = Transport(listen=listener_address(listener), neighbours={}, config=config,
                        listen_fd=listener.detach(),
                        curve=CurveKeys(public_key=public, secret_key=secret, server_keys={},
                                        allowed_client_keys=frozenset(client_keys)))
    return gateway, public


def _dealer(context: zmq.Context, keys: tuple[bytes, bytes, bytes]) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = keys
    return sock


def test_an_event_after_detach_does_not_block_the_context() -> None:
    """The mechanism, deterministically: a socket detached from its watch handshakes afterwards
    (the event libzmq would send on the monitor); a second socket of the same context must still
    connect. With our end of the monitor closed before the monitor was stopped, that event blocked
    the context's I/O thread and the second socket never connected."""
    public, secret = zmq.curve_keypair()
    gateway, server_key = _gateway(TransportConfig(), [public])
    context = new_context()
    first = second = None
    try:
        first = _dealer(context, (public, secret, server_key))
        watch = HandshakeWatch(gateway.config, Counter())
        watch.attach(first)
        watch.detach()                  # as a redial does, before the socket itself is closed
        first.connect(gateway.listen)   # its handshake now ends with nobody reading its monitor
        deadline = time.monotonic() + HANDSHAKE_BOUND_S
        while gateway.connections["handshake_succeeded"] < 1:
            assert time.monotonic() < deadline, "the detached socket never handshook"
            gateway.poll(0.02)
        second = _dealer(context, (public, secret, server_key))
        second.connect(gateway.listen)
        while gateway.connections["handshake_succeeded"] < 2:
            assert time.monotonic() < deadline, \
                "a socket of the same context never handshook: its I/O thread is blocked"
            gateway.poll(0.02)
        assert second.poll(int(HANDSHAKE_BOUND_S * 1000), zmq.POLLOUT)    # and it can send
    finally:
        for sock in (first, second):
            if sock is not None:
                sock.close(linger=0)
        terminate(context)
        gateway.close()


def test_redials_at_any_moment_of_a_handshake_leave_the_client_able_to_connect() -> None:
    """End to end through DialTransport: its socket is replaced at moments spread over a handshake
    (the refusal redial racing libzmq's own reconnect, as after a shed); each client connects
    afterwards. Before the fix about one trial in seven never connected again."""
    public, secret = zmq.curve_keypair()
    config = TransportConfig(reconnect_ms=100, reconnect_max_ms=1000)
    gateway, server_key = _gateway(config, [public])
    with gateway:
        for trial in range(30):
            with DialTransport(gateway.listen, config=config, curve=(public, secret, server_key)) as client:
                for redial in range(5):
                    # the gateway gets on with the handshake for a moment (0 to ~5 ms), then the
                    # client replaces its socket: some land before, some during, some after its end
                    for _ in range((trial + redial) % 6):
                        gateway.poll(0.001)
                    client._redial()
                deadline = time.monotonic() + HANDSHAKE_BOUND_S
                while not client.handshakes:
                    assert time.monotonic() < deadline, f"trial {trial}: the client never connected again"
                    gateway.poll(0.01)
                    client.poll(0.01)
                assert client.send([b"in"])


@pytest.mark.parametrize("cap", [1, 3])
def test_clients_dialing_at_once_past_the_handshake_cap_all_connect(cap: int) -> None:
    """Four edge clients dial a gateway that keeps ``cap`` connections mid-handshake at once (it
    sheds the oldest beyond): each shed one redials and every client completes a handshake."""
    keys = [zmq.curve_keypair() for _ in range(4)]
    config = TransportConfig(reconnect_ms=50, reconnect_max_ms=500, max_handshaking_connections=cap)
    gateway, server_key = _gateway(config, [public for public, _ in keys])
    shed = 0
    with gateway:
        for trial in range(10):
            clients = [DialTransport(gateway.listen, config=config, curve=(public, secret, server_key))
                       for public, secret in keys]
            try:
                deadline = time.monotonic() + HANDSHAKE_BOUND_S
                while not all(client.handshakes for client in clients):
                    assert time.monotonic() < deadline, (
                        f"trial {trial}: " + repr([(c.handshakes, dict(c.handshake_refused), c.redialed)
                                                   for c in clients]))
                    gateway.poll(0.002)
                    for client in clients:
                        client.poll(0.002)
            finally:
                for client in clients:
                    client.close()
        shed = gateway.connections["shed_mid_handshake"]
    if cap == 1:
        assert shed > 0     # the cap was reached: the redials after a shed were exercised

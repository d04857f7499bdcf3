"""Closing a watched socket while it dials a neighbour that does not answer (a cut) must not freeze
its context: libzmq sends the socket's ``EVENT_CLOSED`` to the monitor's PAIR blocking, from its
I/O thread, and a PAIR whose reader was closed first never takes it. ``HandshakeWatch.detach``
stops the monitor before closing the reader (peer/net/handshakes.py). Found by
tests/test_hosts_partition.py: an outbox redialed mid-split left its peer deaf and mute for good."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import zmq

from peer.net.handshakes import HandshakeWatch
from peer.net.transport import TransportConfig

pytestmark = pytest.mark.processes


def syn_sent_to(port: int) -> int:
    """Connections to 127.0.0.1:``port`` still in their handshake (TCP state SYN_SENT)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(row[2] == f"0100007F:{port:04X}" and row[3] == "02" for row in rows)


@pytest.fixture
def unanswering() -> Iterator[int]:
    """A port whose accept queue is full: a new connection's SYN is dropped, as across a cut."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    while not syn_sent_to(port) and len(fillers) < 8:
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
        time.sleep(0.05)    # polled: a connection the queue takes completes its handshake at once
    assert syn_sent_to(port), "could not fill the accept queue"
    yield port
    for filler in fillers:
        filler.close()
    listener.close()


def test_a_socket_closed_mid_connect_leaves_its_context_working(unanswering: int) -> None:
    # Prepare: a watched DEALER dialing the port that does not answer, its connect under way
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    watch = HandshakeWatch(TransportConfig(), Counter())
    dialer = context.socket(zmq.DEALER)
    watch.attach(dialer)
    before = syn_sent_to(unanswering)
    dialer.connect(f"tcp://127.0.0.1:{unanswering}")
    deadline = time.monotonic() + 10
    while syn_sent_to(unanswering) == before and time.monotonic() < deadline:
        time.sleep(0.01)    # polled: libzmq's I/O thread starts the connect
    assert syn_sent_to(unanswering) > before, "the DEALER's connect never started"
    # Execute: the owner's redial: the watch first, then the socket
    watch.detach()
    dialer.close(linger=0)
    # Assert: another socket of the context still gets a message through
    sender = context.socket(zmq.DEALER)
    sender.connect(f"tcp://127.0.0.1:{port}")
    sender.send(b"still here")
    assert router.poll(5000), "the context froze: the closed socket's event blocked its I/O thread"
    for sock in (sender, router):
        sock.close(linger=0)
    context.term()

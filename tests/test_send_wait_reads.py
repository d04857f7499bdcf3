"""Two peers that send each other a message larger than the receiving queue and the kernel's buffers
hold, then wait for their own sends, get both messages whole when the wait reads the inbox
(``while_waiting``); without it each waits for the other to read until the stall timeout abandons
the sends (issue 29: a 340 MB model message stalled every round). On 127.0.0.1; each transport is
driven from its own thread, as each peer's loop is its own process's."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from peer.net.transport import Arrival, Transport, TransportConfig, listener_address, reserve_listeners

pytestmark = pytest.mark.processes

FRAME_BYTES = 1 << 20
FRAMES = 64     # 64 MiB each way: several times the 8 frames a connection reads ahead plus the kernel's
STALL_S = 1.0   # the round deadline: how long a wait tolerates a connection that moves no byte
CONNECT_S = 10.0


@dataclass
class Side:
    """One peer: what it took in, what its send and wait did, and (once made) its transport."""

    received: int = 0
    sent = False
    waited_s: float = 0.0   # in send and wait_sent
    errors: list[BaseException] = field(default_factory=list)
    transport: Transport = field(init=False)

    def take(self, arrivals: list[Arrival]) -> bool:
        self.received += sum(len(arrival.frame) for arrival in arrivals)
        return True


def pair(*, reads_while_waiting: bool) -> tuple[Side, Side]:
    listeners = reserve_listeners(2)
    addresses = [listener_address(listener) for listener in listeners]
    config = TransportConfig(stall_timeout_s=STALL_S)
    sides = (Side(), Side())
    for index, (side, listener) in enumerate(zip(sides, listeners, strict=True)):
        side.transport = Transport(listen=addresses[index], neighbours={"other": addresses[1 - index]},
                                   listen_fd=listener.detach(), config=config,
                                   while_waiting=side.take if reads_while_waiting else None)
    return sides


def exchange(side: Side, payload: bytearray, started: threading.Barrier, *, read_rest: bool) -> None:
    """Send ``payload`` as 1 MiB frames once both are connected, wait for the send, then (``read_rest``)
    read the rest of the other's."""
    try:
        transport = side.transport
        end = time.monotonic() + CONNECT_S
        while not transport.send("other", [b"hello"]) and time.monotonic() < end:  # IMMEDIATE refuses
            side.take(transport.poll(0.02))                                         # until connected
        started.wait(CONNECT_S)
        view = memoryview(payload)
        began = time.monotonic()
        frames = [view[i:i + FRAME_BYTES] for i in range(0, len(payload), FRAME_BYTES)]
        side.sent = transport.send("other", frames)
        transport.wait_sent()
        side.waited_s = time.monotonic() - began
        end = time.monotonic() + CONNECT_S
        while read_rest and side.received < len(payload) + len(b"hello") and time.monotonic() < end:
            side.take(transport.poll(0.1))
    except BaseException as error:      # reported by the test's thread
        side.errors.append(error)


def run_pair(*, reads_while_waiting: bool) -> tuple[Side, Side]:
    a, b = pair(reads_while_waiting=reads_while_waiting)
    started = threading.Barrier(2)
    payloads = [bytearray(FRAMES * FRAME_BYTES), bytearray(FRAMES * FRAME_BYTES)]
    threads = [threading.Thread(target=exchange, args=(side, payload, started),
                                kwargs={"read_rest": reads_while_waiting})
               for side, payload in zip((a, b), payloads, strict=True)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60.0)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        a.transport.close()
        b.transport.close()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    return a, b


def test_waiting_for_sends_reads_the_inbox_so_both_large_messages_arrive_whole() -> None:
    a, b = run_pair(reads_while_waiting=True)
    whole = FRAMES * FRAME_BYTES + len(b"hello")
    for side in (a, b):
        assert side.sent
        assert not side.transport.abandoned and not side.transport.dropped
        assert side.received == whole
        assert side.transport.bytes_sent == side.transport.bytes_received == whole


def test_without_reading_while_waiting_the_two_waits_stall_each_other() -> None:
    """The cause, kept visible: neither reads, so neither's frames are released until the stall
    timeout gives them up (what the daemon did before it passed ``while_waiting``)."""
    a, b = run_pair(reads_while_waiting=False)
    assert a.transport.abandoned and b.transport.abandoned
    assert min(a.waited_s, b.waited_s) >= STALL_S

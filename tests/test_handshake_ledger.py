"""The inbox's handshake cap (peer/net/handshake_ledger.py) under every order of the monitor's events.

A Hypothesis state machine plays a world of connections (issue 32 item 6): each is accepted, then
completes its handshake, fails it, hangs up or is shed; libzmq reuses the lowest free descriptor
number at once; the monitor's events wait in a FIFO that the ledger reads whenever the machine
chooses, so any event may lag any other. The kernel probe answers the truth about whichever
connection holds a number now. After every step: the connections truly mid-handshake that the
ledger has heard of and not shed are at most the cap, and no connection past its handshake was
ever shed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from peer.net.handshake_ledger import (
    HONEST_HANDSHAKE_BYTES,
    NOTHING,
    Accepted,
    Disconnected,
    Event,
    Failed,
    FirstMessage,
    HandshakeLedger,
    Look,
    Stage,
    Succeeded,
)

CAP = 3


class Truth(Enum):
    MID = "mid-handshake"
    DONE = "handshake succeeded"
    GONE = "closed"


@dataclass
class Connection:
    fd: int
    truth: Truth = Truth.MID
    heard: bool = False     # its Accepted reached the ledger
    received_bytes: int = 0
    shed: bool = False


class MonitorEvents(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = HandshakeLedger(max_handshaking=CAP, look=self._kernel)
        self.connections: list[Connection] = []
        self.queue: deque[tuple[Event, Connection | None]] = deque()

    # the world
    def _holding(self, fd: int) -> Connection | None:
        return next((c for c in self.connections if c.fd == fd and c.truth is not Truth.GONE), None)

    def _kernel(self, fd: int) -> Look:
        holder = self._holding(fd)
        if holder is None:
            return NOTHING
        return Look(done=holder.truth is Truth.DONE, received_bytes=holder.received_bytes)

    def _open(self, truth: Truth | None = None) -> list[Connection]:
        return [c for c in self.connections
                if c.truth is not Truth.GONE and (truth is None or c.truth is truth)]

    def _close(self, connection: Connection, *, failed: bool) -> None:
        if failed:
            self.queue.append((Failed(), connection))
        connection.truth = Truth.GONE
        self.queue.append((Disconnected(connection.fd), connection))

    @rule(received_bytes=st.sampled_from([0, 266, 600, HONEST_HANDSHAKE_BYTES + 1, 1 << 20, 16 << 20]))
    def connect(self, received_bytes: int) -> None:
        """A connection, and what it will have sent by the time anybody looks."""
        taken = {c.fd for c in self._open()}
        fd = next(n for n in range(5, 10_000) if n not in taken)    # the lowest free number, as POSIX
        connection = Connection(fd, received_bytes=received_bytes)
        self.connections.append(connection)
        self.queue.append((Accepted(fd), connection))

    @precondition(lambda self: any(not c.shed for c in self._open(Truth.MID)))
    @rule(data=st.data())
    def complete_handshake(self, data: st.DataObject) -> None:
        connection = data.draw(st.sampled_from([c for c in self._open(Truth.MID) if not c.shed]))
        connection.truth = Truth.DONE
        self.queue.append((Succeeded(), connection))

    @precondition(lambda self: bool(self._open(Truth.MID)))
    @rule(data=st.data(), with_event=st.booleans())
    def fail_or_cut_short(self, data: st.DataObject, with_event: bool) -> None:
        """A refused or timed-out handshake (with its failure event), or bytes that are not ZMTP
        (none: a bare DISCONNECTED)."""
        self._close(data.draw(st.sampled_from(self._open(Truth.MID))), failed=with_event)

    @precondition(lambda self: bool(self._open(Truth.DONE)))
    @rule(data=st.data())
    def member_hangs_up(self, data: st.DataObject) -> None:
        self._close(data.draw(st.sampled_from(self._open(Truth.DONE))), failed=False)

    @precondition(lambda self: bool(self._open(Truth.DONE)))
    @rule(data=st.data())
    def member_speaks(self, data: st.DataObject) -> None:
        """The driver reads a message (its SRCFD), whenever that is beside the monitor's events."""
        self.ledger.handle(FirstMessage(data.draw(st.sampled_from(self._open(Truth.DONE))).fd))

    @precondition(lambda self: bool(self.queue))
    @rule()
    def monitor_delivers(self) -> None:
        event, connection = self.queue.popleft()
        if isinstance(event, Accepted) and connection is not None:
            connection.heard = True
        for fd in self.ledger.handle(event):
            self._shut_down(fd)

    @precondition(lambda self: bool(self.ledger.unmatched))
    @rule()
    def monitor_looks_again(self) -> None:
        self.ledger.match()

    def _shut_down(self, fd: int) -> None:
        victim = self._holding(fd)
        if victim is None:
            return      # closed already: shut_down finds no connection of ours there
        assert victim.truth is not Truth.DONE, f"shed a connection past its handshake: {victim}"
        victim.shed = True
        self._close(victim, failed=True)       # HANDSHAKE_FAILED_NO_DETAIL, then DISCONNECTED

    # what must hold after every step
    @invariant()
    def the_cap_holds(self) -> None:
        mid = [c for c in self._open(Truth.MID) if c.heard and not c.shed]
        assert len(mid) <= CAP, (mid, self.ledger.handshaking)

    @invariant()
    def every_truly_mid_handshake_connection_heard_of_is_counted(self) -> None:
        for connection in self._open(Truth.MID):
            if connection.heard and not connection.shed:
                assert self.ledger.stage(connection.fd) is Stage.HANDSHAKING

    @invariant()
    def a_connection_past_its_handshake_is_never_shed(self) -> None:
        assert not any(c.shed and c.truth is Truth.DONE for c in self.connections)

    def teardown(self) -> None:
        """Every event delivered: the ledger holds exactly the open connections, every refusal and
        close counted once."""
        while self.queue:
            self.monitor_delivers()
        open_fds = {c.fd for c in self._open()}
        held = {fd for fd in open_fds if self.ledger.stage(fd) is not None}
        assert held == open_fds
        counts = self.ledger.connections
        assert counts["accepted"] == len(self.connections)


MonitorEvents.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
test_the_handshake_cap_holds_under_any_order_of_events = MonitorEvents.TestCase


def test_a_burst_of_silent_members_is_never_shed_and_half_sent_handshakes_beyond_the_cap_are() -> None:
    """The issue's case: 200 members connect and say nothing yet, then 20 strangers half-send."""
    done: set[int] = set()
    ledger = HandshakeLedger(max_handshaking=CAP,
                             look=lambda fd: Look(done=fd in done, received_bytes=(16 << 20) * (fd >= 200)))
    shed: list[int] = []
    for fd in range(200):
        shed += ledger.handle(Accepted(fd))
        done.add(fd)
        shed += ledger.handle(Succeeded())
    for fd in range(200, 220):
        shed += ledger.handle(Accepted(fd))
    assert sorted(shed) == list(range(200, 217))
    assert ledger.handshaking == CAP
    assert all(ledger.stage(fd) is Stage.ADMITTED for fd in range(200))


def test_a_success_the_probe_does_not_show_yet_is_matched_when_it_does() -> None:
    done: set[int] = set()
    ledger = HandshakeLedger(max_handshaking=CAP, look=lambda fd: Look(done=fd in done))
    for fd in (7, 8):
        ledger.handle(Accepted(fd))
    ledger.handle(Succeeded())        # 8's, before our READY reached its socket
    assert ledger.unmatched == 1 and not ledger.match()
    done.add(8)
    assert ledger.match()
    assert ledger.stage(8) is Stage.ADMITTED and ledger.stage(7) is Stage.HANDSHAKING


def test_strangers_that_sent_the_most_are_shed_before_quiet_handshakes() -> None:
    sent = {1: 300, 2: 16 << 20, 3: 0, 4: 1 << 20, 5: 500}
    ledger = HandshakeLedger(max_handshaking=2, look=lambda fd: Look(done=False, received_bytes=sent[fd]))
    shed = [fd for fd in sent for fd in ledger.handle(Accepted(fd))]
    assert shed == [2, 4, 1]      # the two heavy ones, most first; then the oldest quiet one


@pytest.mark.parametrize("cap", [0, -1])
def test_a_cap_below_one_is_refused(cap: int) -> None:
    with pytest.raises(ValueError, match="max_handshaking"):
        HandshakeLedger(max_handshaking=cap, look=lambda fd: NOTHING)

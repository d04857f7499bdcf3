"""Which of a listener's connections are mid-handshake, and which to shed: events in, descriptors out.

Sans-IO: peer/net/admission.py feeds it the inbox monitor's events and the driver's first message
on a connection, and shuts down the descriptors it answers with. A connection is mid-handshake
from ``Accepted`` until its handshake is known to have ended: succeeded (the monitor said so and
the kernel shows which descriptor, or a message came on it) or closed. Failed handshakes end in
``Disconnected`` at once, so they need no descriptor.

Why a kernel probe: libzmq (4.3.5) names the descriptor in ``ACCEPTED`` and ``DISCONNECTED`` only;
``HANDSHAKE_SUCCEEDED`` and ``HANDSHAKE_FAILED_*`` name none, so a success can only be matched to its
connection by what the connection did: our READY command is on the wire
(:func:`peer.net.admission.look`, injected). Without that, "until
its first message" was the stand-in, and a member that connected and had not spoken yet counted as
a stranger: it was shed first (the oldest), and the half-sent handshakes behind it were kept.

Invariants (tests/test_handshake_ledger.py runs a Hypothesis state machine over every order of
events): after each event, the connections truly mid-handshake that the ledger has heard of and not
shed number at most ``max_handshaking``; a connection whose handshake completed is never shed. The
first holds because every accepted descriptor not known done counts (a closed one whose event is
still queued counts too: that errs towards shedding more), and each decision asks the probe first;
the second because a victim is one the probe shows not done at that moment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Accepted:
    fd: int


@dataclass(frozen=True)
class Succeeded:
    """The monitor's HANDSHAKE_SUCCEEDED: some connection's, not named."""


@dataclass(frozen=True)
class Failed:
    """The monitor's HANDSHAKE_FAILED_*: some connection's, not named (its refusal is counted by
    the caller, by reason)."""


@dataclass(frozen=True)
class Disconnected:
    fd: int


@dataclass(frozen=True)
class FirstMessage:
    """A message arrived on ``fd`` (the driver read its ZMQ_SRCFD): its handshake succeeded."""

    fd: int


Event = Accepted | Succeeded | Failed | Disconnected | FirstMessage

# an honest CurveZMQ client sends its greeting (64 bytes), HELLO (202) and INITIATE (about 300 and its
# metadata) before our READY: a connection mid-handshake that sent more holds a stranger's command
HONEST_HANDSHAKE_BYTES = 4096


@dataclass(frozen=True)
class Look:
    """What the kernel shows of a connection: past its handshake (our READY written), and the bytes
    it sent us (what a handshake command being read can pin)."""

    done: bool
    received_bytes: int = 0


NOTHING = Look(done=False)      # a descriptor closed, reused by another process's file, or unreadable


class Stage(Enum):
    HANDSHAKING = "handshaking"
    ADMITTED = "admitted"      # handshake succeeded: never shed
    SHED = "shed"              # shut down mid-handshake by us; its own events are to come


class HandshakeLedger:
    """The inbox's connections by stage; ``handle`` answers with the descriptors to shut down.

    ``look(fd)``: what the kernel shows of the connection on ``fd`` (a closed or foreign descriptor:
    :data:`NOTHING`). Counts go to ``connections`` (``accepted``,
    ``handshake_succeeded``, ``closed_after_handshake``, ``shed_mid_handshake``) and
    ``closed_before_handshake`` (a refusal, for the caller's refusal counts)."""

    def __init__(self, *, max_handshaking: int, look: Callable[[int], Look]) -> None:
        if max_handshaking < 1:
            raise ValueError(f"max_handshaking must be positive, got {max_handshaking}")
        self.max_handshaking = max_handshaking
        self._look = look
        self._stage: dict[int, Stage] = {}     # accept order, oldest first
        self._unmatched = 0                    # successes not matched to a descriptor yet
        self._ahead = 0                        # descriptors admitted before their success's event
        self._failures = 0                     # failed handshakes whose DISCONNECTED is to come
        self._early: set[int] = set()          # a message came on it before its ACCEPTED did
        self.connections: Counter[str] = Counter()
        self.closed_before_handshake = 0

    @property
    def handshaking(self) -> int:
        """Connections counted mid-handshake (an upper bound on those truly mid-handshake)."""
        return sum(stage is Stage.HANDSHAKING for stage in self._stage.values())

    @property
    def unmatched(self) -> int:
        """Successes whose descriptor the probe did not show yet (our READY still being written)."""
        return self._unmatched

    def stage(self, fd: int) -> Stage | None:
        return self._stage.get(fd)

    def handle(self, event: Event) -> list[int]:
        """Take one event; the descriptors to shut down now (each once)."""
        match event:
            case Accepted(fd):
                self.connections["accepted"] += 1
                self._stage.pop(fd, None)       # (a number reused before its DISCONNECTED came)
                if fd in self._early:
                    self._early.discard(fd)
                    self._stage[fd] = Stage.ADMITTED
                    self._ahead += 1
                else:
                    self._stage[fd] = Stage.HANDSHAKING
                return self._enforce_cap()
            case Succeeded():
                self.connections["handshake_succeeded"] += 1
                if self._ahead:
                    self._ahead -= 1
                else:
                    self._unmatched += 1
                    self.match()
            case Failed():
                self._failures += 1
            case Disconnected(fd):
                self._early.discard(fd)
                self._closed(fd)
            case FirstMessage(fd):
                stage = self._stage.get(fd)
                if stage is None:
                    self._early.add(fd)
                elif stage is not Stage.ADMITTED:
                    self._admit(fd)
        return []

    def match(self) -> bool:
        """Match unmatched successes to the descriptors the probe shows done; whether all are."""
        for fd, stage in list(self._stage.items()):
            if not self._unmatched:
                break
            if stage is Stage.HANDSHAKING and self._look(fd).done:
                self._admit(fd)
        return not self._unmatched

    def _admit(self, fd: int) -> None:
        self._stage[fd] = Stage.ADMITTED
        if self._unmatched:
            self._unmatched -= 1
        else:
            self._ahead += 1

    def _enforce_cap(self) -> list[int]:
        """Shed connections mid-handshake beyond the cap, after asking the probe about each: one it
        shows done is admitted (its success's event may still be on its way). The victims: those
        that sent more than an honest handshake, most first (what they pin), then the oldest (an
        honest handshake takes milliseconds, so it is seldom the oldest)."""
        if self.handshaking <= self.max_handshaking:
            return []
        looks: dict[int, Look] = {}
        for fd, stage in list(self._stage.items()):
            if stage is Stage.HANDSHAKING:
                looks[fd] = self._look(fd)
                if looks[fd].done:
                    self._admit(fd)
                    del looks[fd]
        age = {fd: index for index, fd in enumerate(self._stage)}
        heavy = sorted((fd for fd, look in looks.items() if look.received_bytes > HONEST_HANDSHAKE_BYTES),
                       key=lambda fd: (-looks[fd].received_bytes, age[fd]))
        light = [fd for fd in looks if looks[fd].received_bytes <= HONEST_HANDSHAKE_BYTES]
        excess = len(looks) - self.max_handshaking
        shed = (heavy + light)[:max(0, excess)]
        for fd in shed:
            self._stage[fd] = Stage.SHED
            self.connections["shed_mid_handshake"] += 1
        return shed

    def _closed(self, fd: int) -> None:
        stage = self._stage.pop(fd, None)
        if stage is Stage.ADMITTED:
            self.connections["closed_after_handshake"] += 1
        elif stage is not None:
            if self._failures:                  # its failure was counted, by reason
                self._failures -= 1
            elif self._unmatched:               # it succeeded, and closed before it was matched
                self._unmatched -= 1
                self.connections["closed_after_handshake"] += 1
            else:
                self.closed_before_handshake += 1

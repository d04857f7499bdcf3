"""A fault schedule keyed by rounds: one description of a test's faults that both drivers honour.

A differential test runs one schedule in the daemon (real processes) and in
the simulator and asks both to make the same decisions. Faults placed on wall
or virtual time cannot give that: the same moment finds the members at
different rounds. So every fault here fires at a member's *work point* for a
round: the round has begun (its messages are sent) and its local steps are
not done yet (the daemon: before it trains the steps asked; the simulator:
when it carries out ``StartWork``). A fault due at round ``r`` fires at the
first work point at round ``r`` or later (a member that jumps past ``r``
fires it at the next one). Conditions are events, never time: ``Reached``
(a member has been at a work point of a round, or later), all of them.

==========  ===============================================================
fault       at the member's work point for ``at_round``
==========  ===============================================================
``Hold``    no local work until ``until`` is met (messages go on); faults
            of the same member due later in the schedule wait for it
``Stop``    a clean stop (SIGTERM: checkpoint, exit); the driver restarts
            it from that checkpoint once ``restart_when`` is met, and it
            syncs its state (``resumed``)
``Flood``   ``requests`` state-sync requests to neighbour ``to`` at once
``Cut``     (each member of either side) its neighbours on the other side
            are down for its machine (``NeighbourDown``, from here, not
            from a timeout); until ``heal_when`` is met, nothing it sends
            to them for round ``from_round`` or later goes out; then they
            are up (``NeighbourUp``: it resends its round)
``Join``    (no round: the member is not started with the others) it starts
            once ``when`` is met and joins by state sync
==========  ===============================================================

The cut drops by the message's round rather than from the work point on: the
round's messages leave before its work point, and a message of round
``from_round`` that crossed on one side and not the other would make the two
drivers mix different things. A schedule that must be deterministic holds
both sides before it heals (``heal_when`` names rounds where they are held),
and holds what a joiner or a restarted member syncs from.

Pure: :class:`MemberFaults` is told each work point's round and asked what
fires; the driver supplies how far each member has reached (files between
processes, a dict in the simulator). Used by tests only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocols.messages import Message


@dataclass(frozen=True)
class Reached:
    """Met once ``member`` has been at a work point of ``round`` or a later one."""

    member: str
    round: int


Condition = tuple[Reached, ...]  # all of them


@dataclass(frozen=True, kw_only=True)
class Hold:
    member: str
    at_round: int
    until: Condition


@dataclass(frozen=True, kw_only=True)
class Stop:
    member: str
    at_round: int
    restart_when: Condition


@dataclass(frozen=True, kw_only=True)
class Flood:
    member: str
    at_round: int
    to: str
    requests: int


@dataclass(frozen=True, kw_only=True)
class Cut:
    side_a: frozenset[str]
    side_b: frozenset[str]
    from_round: int
    heal_when: Condition

    def across(self, name: str) -> frozenset[str]:
        """The members on the other side from ``name`` (none when it is on neither)."""
        if name in self.side_a:
            return self.side_b
        return self.side_a if name in self.side_b else frozenset()


@dataclass(frozen=True, kw_only=True)
class Join:
    member: str
    when: Condition


Fault = Hold | Stop | Flood | Cut | Join


@dataclass(frozen=True)
class Schedule:
    faults: tuple[Fault, ...] = ()

    def joins_later(self) -> frozenset[str]:
        """Members not started with the others (each has a ``Join``)."""
        return frozenset(f.member for f in self.faults if isinstance(f, Join))

    def joins(self) -> list[Join]:
        return [f for f in self.faults if isinstance(f, Join)]

    def stops(self) -> list[Stop]:
        return [f for f in self.faults if isinstance(f, Stop)]


def met(condition: Condition, reached: Callable[[str], int]) -> bool:
    """Whether every ``Reached`` of ``condition`` holds (``reached``: a member's highest work-point
    round, -1 before its first)."""
    return all(reached(c.member) >= c.round for c in condition)


@dataclass
class MemberFaults:
    """One member's side of a schedule, across its lives (``fired`` survives a restart)."""

    schedule: Schedule
    name: str
    reached: Callable[[str], int]
    fired: set[int] = field(default_factory=set)   # indexes into schedule.faults
    healed: set[int] = field(default_factory=set)  # cuts healed here
    _hold: Hold | None = None

    def _mine(self) -> list[tuple[int, Hold | Stop | Flood | Cut]]:
        return [(i, f) for i, f in enumerate(self.schedule.faults)
                if (isinstance(f, Hold | Stop | Flood) and f.member == self.name)
                or (isinstance(f, Cut) and f.across(self.name))]

    def work_point(self, round_index: int) -> list[Hold | Stop | Flood | Cut]:
        """The faults that fire now (in schedule order), at a work point in ``round_index``. Call it
        again while ``holding()``: the faults after a hold fire once it is released."""
        fired: list[Hold | Stop | Flood | Cut] = []
        for index, fault in self._mine():
            at = fault.from_round if isinstance(fault, Cut) else fault.at_round
            if index in self.fired or at > round_index:
                continue
            if self.holding():
                break
            self.fired.add(index)
            fired.append(fault)
            if isinstance(fault, Hold):
                self._hold = fault
            if isinstance(fault, Stop):
                break  # nothing fires after a stop in this life
        return fired

    def holding(self) -> bool:
        """Whether a hold that fired here is still waiting for its condition."""
        if self._hold is not None and met(self._hold.until, self.reached):
            self._hold = None
        return self._hold is not None

    def heals(self) -> list[str]:
        """The members across a cut that fired here and whose ``heal_when`` is now met: up again
        (sorted; each cut heals once)."""
        names: set[str] = set()
        for index, fault in enumerate(self.schedule.faults):
            if (isinstance(fault, Cut) and index in self.fired and index not in self.healed
                    and met(fault.heal_when, self.reached)):
                self.healed.add(index)
                names |= fault.across(self.name)
        return sorted(names)

    def heal_due(self) -> bool:
        """Whether :meth:`heals` would bring a member up now (nothing is marked healed here)."""
        return any(isinstance(fault, Cut) and index in self.fired and index not in self.healed
                   and met(fault.heal_when, self.reached) for index, fault in enumerate(self.schedule.faults))

    def drops(self, recipient: str, message: Message) -> bool:
        """Whether a cut in force here keeps ``message`` from ``recipient``: a cut not healed here
        between us, and the message of its ``from_round`` or later (a kind without a round, such as
        a state-sync request, goes through; the daemon's heartbeats do not reach the machine)."""
        round_index = getattr(message, "round", None)
        if not isinstance(round_index, int):
            return False
        return any(isinstance(f, Cut) and i not in self.healed and recipient in f.across(self.name)
                   and round_index >= f.from_round for i, f in enumerate(self.schedule.faults))


# ------------------------------------------------------------ plain data (an environment variable)

_KINDS: Mapping[str, type[Any]] = {"hold": Hold, "stop": Stop, "flood": Flood, "cut": Cut, "join": Join}
_CONDITIONS = ("until", "restart_when", "heal_when", "when")


def to_plain(schedule: Schedule) -> list[dict[str, Any]]:
    """JSON-able form: one object per fault, its kind under ``kind``."""
    out: list[dict[str, Any]] = []
    for fault in schedule.faults:
        kind = next(k for k, cls in _KINDS.items() if isinstance(fault, cls))
        item: dict[str, Any] = {"kind": kind}
        for key, value in vars(fault).items():
            if key in _CONDITIONS:
                value = [[c.member, c.round] for c in value]
            elif isinstance(value, frozenset):
                value = sorted(value)
            item[key] = value
        out.append(item)
    return out


def from_plain(items: Sequence[Mapping[str, Any]] | Iterable[Mapping[str, Any]]) -> Schedule:
    """The schedule of ``to_plain``'s form; ValueError/TypeError/KeyError name what is wrong."""
    faults: list[Fault] = []
    for item in items:
        values = dict(item)
        cls = _KINDS[values.pop("kind")]
        for key in list(values):
            if key in _CONDITIONS:
                values[key] = tuple(Reached(str(m), int(r)) for m, r in values[key])
            elif key in ("side_a", "side_b"):
                values[key] = frozenset(values[key])
        faults.append(cls(**values))
    return Schedule(tuple(faults))

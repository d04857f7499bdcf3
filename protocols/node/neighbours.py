"""The failure detector: which neighbours are up, from when each was last heard. One for both drivers.

A driver reports what it accepted (``heard``, and a heartbeat's content with
``beat``) and asks, as time passes, who fell silent (``expire``). The rule:

* a neighbour is *up* from the first message of it that we accept while we can
  reach it (the daemon tries a heartbeat first; the simulator's links are
  symmetric), and *down* once nothing of it was accepted for ``timeout_s``, or
  when it said goodbye;
* at ``Start`` the neighbours not up are told to the machine as down
  (``absent``): the rounds go on without them until they are heard;
* a neighbour whose last heartbeat said it had finished, and then fell silent,
  is ``FINISHED``, not ``DOWN`` (protocols/node/liveness.py decides what that
  means for us).

The caller feeds the machine ``NeighbourUp`` for each name ``heard`` returns
True for and ``NeighbourDown`` for each name ``expire`` returns, once the
machine has started. Pure: time is the ``now`` handed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from protocols.node.liveness import Presence


@dataclass
class Neighbour:
    last_seen: float = -math.inf  # the driver's clock (s) when something of it was last accepted
    up: bool = False
    finished: bool = False           # its last heartbeat said it has finished its run
    step: int = -1                   # its trainer step, from its last heartbeat

    def presence(self) -> Presence:
        if self.up:
            return Presence.UP
        if self.last_seen == -math.inf:
            return Presence.NEVER_HEARD
        return Presence.FINISHED if self.finished else Presence.DOWN


N = TypeVar("N", bound=Neighbour)


class Neighbourhood(Generic[N]):
    """Up/down/finished of each neighbour of one member."""

    def __init__(self, members: Mapping[str, N], *, timeout_s: float) -> None:
        """``members``: a fresh record per neighbour (a driver may extend :class:`Neighbour`)."""
        self.timeout_s = timeout_s
        self.members: dict[str, N] = dict(sorted(members.items()))

    def __contains__(self, name: object) -> bool:
        return name in self.members

    def __getitem__(self, name: str) -> N:
        return self.members[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self.members)

    def join(self, name: str, record: N) -> bool:
        """A new neighbour (membership changed): known from now on, not up until heard. True when new."""
        if name in self.members:
            return False
        members = sorted([*self.members.items(), (name, record)])
        self.members.clear()      # in place: a driver may hold this dict
        self.members.update(members)
        return True

    def forget(self, name: str) -> bool:
        """A neighbour no longer (membership changed): True when it was one."""
        return self.members.pop(name, None) is not None

    def heard(self, name: str, now: float, *, reachable: bool = True) -> bool:
        """Something of ``name`` was accepted at ``now``. True when it has just come up."""
        neighbour = self.members.get(name)
        if neighbour is None:
            return False
        neighbour.last_seen = now
        if neighbour.up or not reachable:
            return False
        neighbour.up = True
        return True

    def beat(self, name: str, *, step: int, finished: bool) -> None:
        """What a heartbeat of ``name`` said (after ``heard``)."""
        neighbour = self.members.get(name)
        if neighbour is not None:
            neighbour.step = step
            neighbour.finished = finished

    def overdue(self, now: float) -> list[str]:
        """The neighbours up until now whose silence has passed the timeout (nothing changes)."""
        return [name for name, n in self.members.items() if n.up and now - n.last_seen > self.timeout_s]

    def expire(self, now: float) -> list[str]:
        """The ``overdue`` neighbours, down from now on."""
        silent = self.overdue(now)
        for name in silent:
            self.members[name].up = False
        return silent

    def goodbye(self, name: str) -> bool:
        """``name`` said it leaves: down at once. True when it was up."""
        neighbour = self.members.get(name)
        if neighbour is None or not neighbour.up:
            return False
        neighbour.up = False
        return True

    def up_names(self) -> tuple[str, ...]:
        """The neighbours up now."""
        return tuple(name for name, n in self.members.items() if n.up)

    def absent(self) -> list[str]:
        """The neighbours not up: what the machine is told is down when it starts."""
        return [name for name, n in self.members.items() if not n.up]

    def all_up(self) -> bool:
        return all(n.up for n in self.members.values())

    def presence(self) -> dict[str, Presence]:
        return {name: n.presence() for name, n in self.members.items()}

"""One action interpreter for every host: the timer table, the work queue and the send counters.

A host (the daemon, the edge client, the simulator, a test's driver) is
sockets or links, a clock, a trainer and files. It implements :class:`Port`
and lets :class:`Host` carry out what its member (protocols/node/member.py),
or a bare machine, answers, in order:

==================  ===================================================
action              carried out as
==================  ===================================================
``Send``            ``port.send`` (the port counts what goes out in
                    ``Host.counters``: only it knows the bytes)
``StartWork``       the work queue: ``port.work_point(steps)`` at once, or
                    :meth:`Host.next_work` (a host with its own loop)
``Train``           ``port.train(steps)``
``SetTimer``        the timer table; ``port.wake(at, key, token)``
``CancelTimer``     the timer table
``Metric``          ``Host.metrics`` (the last value of each)
``Checkpoint``      ``port.save(final)``
``Note``            ``port.say``
``Connect``         ``port.connect``
anything else       ``port.mark`` (what the host keeps of the life:
                    exits, crashes, phases, progress, the trainer step)
==================  ===================================================

A life ends with :meth:`Host.end_life`: the actions still to carry out,
the timers and the queued work of that life are dropped. Pure: ``now``
comes in, timers are deadlines, the heap here is the table's own order.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocols.events import CancelTimer, Metric, Send, SetTimer, StartWork, TimerFired
from protocols.node.member import Checkpoint, Train
from protocols.node.membership import Connect
from protocols.node.node import Note


class Port(Protocol):
    """What a host gives the interpreter."""

    def send(self, send: Send) -> None: ...

    def work_point(self, steps: int) -> None:
        """Work the machine asked for is taken from the queue: a member's ``WorkPoint`` (a bare
        machine's: its training)."""

    def train(self, steps: int) -> None: ...

    def save(self, final: bool) -> None: ...

    def say(self, note: Note) -> None: ...

    def connect(self, connect: Connect) -> None: ...

    def wake(self, at: float, key: str, token: int) -> None:
        """Call :meth:`Host.fire` with ``key`` and ``token`` at ``at`` (a polling host: nothing,
        it calls :meth:`Host.fire_due`)."""

    def mark(self, action: Any) -> None: ...


class TimerTable:
    """Timers by key, the latest ``set`` of a key the live one; cancelled or replaced ones never fire."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[float, int]] = {}
        self._order: list[tuple[float, int, str]] = []
        self._tokens = 0

    def set(self, key: str, at: float) -> int:
        """Arm ``key`` for ``at`` (replacing what it was); the token that fires it."""
        self._tokens += 1
        self._live[key] = (at, self._tokens)
        heapq.heappush(self._order, (at, self._tokens, key))
        if len(self._order) > 2 * len(self._live) + 16:   # a host firing by token never pops: prune
            self._order = [(t, token, k) for k, (t, token) in self._live.items()]
            heapq.heapify(self._order)
        return self._tokens

    @property
    def held(self) -> int:
        """Entries held, live or stale: bounded by the live timers, however many were set."""
        return len(self._order)

    def cancel(self, key: str) -> None:
        self._live.pop(key, None)

    def take(self, key: str, token: int) -> bool:
        """Whether ``token`` is ``key``'s live timer; it is fired (gone) if so."""
        live = self._live.get(key)
        if live is None or live[1] != token:
            return False
        del self._live[key]
        return True

    def next_at(self) -> float | None:
        """The earliest live deadline (None: none armed)."""
        while self._order and self._live.get(self._order[0][2], (0.0, -1))[1] != self._order[0][1]:
            heapq.heappop(self._order)
        return self._order[0][0] if self._order else None

    def pop_due(self, now: float) -> str | None:
        """The earliest key due by ``now``, fired (gone); None when none is due."""
        at = self.next_at()
        if at is None or at > now:
            return None
        _, token, key = heapq.heappop(self._order)
        self.take(key, token)
        return key

    def due(self, now: float) -> list[str]:
        """The keys due by ``now``, earliest first (fired: gone)."""
        keys: list[str] = []
        while (key := self.pop_due(now)) is not None:
            keys.append(key)
        return keys

    def clear(self) -> None:
        self._live.clear()
        self._order.clear()


@dataclass
class SendCounters:
    """What a member sent, one count per copy that left for a recipient."""

    messages_sent: int = 0
    wire_bytes_sent: int = 0
    payload_bytes_sent: int = 0
    messages_by_kind: Counter[str] = field(default_factory=Counter)
    wire_bytes_by_kind: Counter[str] = field(default_factory=Counter)

    def count(self, kind: str, *, wire_bytes: int, payload_bytes: int) -> None:
        self.messages_sent += 1
        self.wire_bytes_sent += wire_bytes
        self.payload_bytes_sent += payload_bytes
        self.messages_by_kind[kind] += 1
        self.wire_bytes_by_kind[kind] += wire_bytes


Handler = Callable[[float, Any], Sequence[Any]]  # (now, event) -> actions: Member.handle, or a machine's


class Host:
    """Carries out ``handler``'s actions through ``port``; ``work_at_once``: False for a host that
    takes queued work itself (:meth:`next_work`)."""

    def __init__(self, handler: Handler, port: Port, *, work_at_once: bool = True) -> None:
        self.handler = handler
        self.port = port
        self.work_at_once = work_at_once
        self.timers = TimerTable()
        self.work: deque[int] = deque()
        self.counters = SendCounters()
        self.metrics: dict[str, float] = {}
        self.life = 0  # a life's actions, timers and work end with it

    def handle(self, now: float, event: Any) -> None:
        """Hand ``event`` in and carry out the answer."""
        self.carry_out(self.handler(now, event))

    def carry_out(self, actions: Sequence[Any]) -> None:
        life = self.life
        for action in actions:
            if self.life != life:
                return  # the life ended (a stop at its work point): the rest died with it
            self._act(action)

    def fire(self, now: float, key: str, token: int) -> None:
        """A timer's wake-up: ``TimerFired`` if it is still the live one."""
        if self.timers.take(key, token):
            self.handle(now, TimerFired(key))

    def fire_due(self, now: float) -> None:
        """Every timer due by ``now`` (a polling host)."""
        for key in self.timers.due(now):
            self.handle(now, TimerFired(key))

    def next_work(self) -> int | None:
        return self.work.popleft() if self.work else None

    def end_life(self) -> None:
        self.life += 1
        self.timers.clear()
        self.work.clear()

    def _act(self, action: Any) -> None:
        match action:
            case Send():
                self.port.send(action)
            case StartWork(steps=steps):
                self.work.append(steps)
                if self.work_at_once:
                    self.port.work_point(self.work.popleft())
            case Train(steps=steps):
                self.port.train(steps)
            case SetTimer(key=key, at=at):
                self.port.wake(at, key, self.timers.set(key, at))
            case CancelTimer(key=key):
                self.timers.cancel(key)
            case Metric(name=name, value=value):
                self.metrics[name] = float(value)
            case Checkpoint(final=final):
                self.port.save(final)
            case Note():
                self.port.say(action)
            case Connect():
                self.port.connect(action)
            case _:
                self.port.mark(action)

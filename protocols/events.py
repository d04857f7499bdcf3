"""The sans-IO contract: what a driver feeds a state machine, and what it gets back.

A driver (the ZeroMQ daemon, the simulator, or the list-based test driver)
calls ``machine.handle(event, now)`` and carries out the returned actions in
order. Time is the number ``now`` in seconds (wall clock for the daemon,
virtual for the simulator); timers are actions, never sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from protocols.messages import Message

# ---------------------------------------------------------------- events in


@dataclass(frozen=True)
class Start:
    """The driver is ready: the machine may ask for work or send its first messages."""


@dataclass(frozen=True)
class Received:
    """A verified message from roster member ``sender`` (a name, never a raw key)."""

    sender: str
    message: Message


@dataclass(frozen=True)
class TimerFired:
    """A timer set by ``SetTimer(key, at)`` has reached its deadline."""

    key: str


@dataclass(frozen=True)
class WorkDone:
    """The local work asked by ``StartWork`` is done; parameters were updated in place."""

    steps: int
    loss: float


@dataclass(frozen=True)
class NeighbourUp:
    name: str


@dataclass(frozen=True)
class NeighbourDown:
    name: str


Event = Start | Received | TimerFired | WorkDone | NeighbourUp | NeighbourDown

# -------------------------------------------------------------- actions out


@dataclass(frozen=True)
class Send:
    """Send ``message`` to each of ``recipients`` (roster names, sorted)."""

    recipients: tuple[str, ...]
    message: Message


@dataclass(frozen=True)
class StartWork:
    """Run ``steps`` local training steps on the machine's parameters, then feed WorkDone."""

    steps: int


@dataclass(frozen=True)
class SetTimer:
    """Feed ``TimerFired(key)`` at time ``at`` (seconds); setting a key again replaces it."""

    key: str
    at: float


@dataclass(frozen=True)
class CancelTimer:
    key: str


@dataclass(frozen=True)
class Metric:
    """A named number for logs, status and reports (``bytes_sent``, ``missed_deadline``...)."""

    name: str
    value: float


@dataclass(frozen=True)
class Finished:
    """The machine has done all the work it was configured for."""


Action = Send | StartWork | SetTimer | CancelTimer | Metric | Finished

# ------------------------------------------------------------ the machine

ProtocolState = tuple[dict[str, torch.Tensor], dict[str, Any]]
"""What a machine exports for a checkpoint: named tensors plus JSON-able scalars."""


class Machine(Protocol):
    """An algorithm as a pure state machine."""

    def handle(self, event: Event, now: float) -> list[Action]: ...

    def export_state(self) -> ProtocolState: ...

    def restore_state(self, state: ProtocolState) -> None: ...

    def notes(self) -> list[str]:
        """What an operator should read at start-up (settings the machine chose, and why)."""
        ...

    def warnings(self) -> list[str]:
        """What an operator must not miss now (a setting the machine had to change while running)."""
        ...

"""The sans-IO contract: what a driver feeds a state machine, and what it gets back.

A driver (the ZeroMQ daemon, the simulator, or the list-based test driver)
calls ``machine.handle(event, now)`` and carries out the returned actions in
order. Time is the number ``now`` in seconds (wall clock for the daemon,
virtual for the simulator); timers are actions, never sleeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from protocols.messages import Message

if TYPE_CHECKING:
    from protocols.gossip.config import GossipConfig

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
    left: bool = False  # it said it leaves (a goodbye), rather than fell silent


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


@dataclass(frozen=True)
class SetTrainerStep:
    """Set the trainer's step counter (and with it its learning-rate schedule) to ``step``.

    The schedule position moved without local work: rounds skipped to catch up, or a state sync
    adopted. Both drivers apply it, so a simulated peer's learning rate follows the network as a
    real one's does (the step is the machine's ``steps_done``, never behind the trainer's)."""

    step: int


Action = Send | StartWork | SetTimer | CancelTimer | Metric | Finished | SetTrainerStep

# ------------------------------------------------------------ the machine

ProtocolState = tuple[dict[str, torch.Tensor], dict[str, Any]]
"""What a machine exports for a checkpoint: named tensors plus JSON-able scalars."""


class Role(Protocol):
    """What the Node asks of every role a member holds: the message kinds it takes, and its
    events. A member's model role is a :class:`Machine`; a role beside it (a FedAvg server on a
    gateway) need be no more than this."""

    @property
    def accepts(self) -> frozenset[type[Message]]:
        """The message kinds it takes: the Node routes these to it and counts any other kind."""
        ...

    def handle(self, event: Event, now: float) -> list[Action]: ...


class Machine(Role, Protocol):
    """An algorithm as a pure state machine: everything a driver (or the Node) asks of one.

    Drivers use a machine through this interface only: no ``getattr``, no casts, no branching on
    the algorithm's name."""

    config: GossipConfig
    params: torch.Tensor
    """The flat vector the machine mixes in place (the trainer's ``mixed``): a state sync copies into it."""

    @property
    def position(self) -> tuple[int, int]:
        """(round, steps_done): where the machine is in the schedule, without exporting its state."""
        ...

    @property
    def joinable(self) -> bool:
        """Whether ``join_at`` can take a neighbour's state (False: its shared state cannot move)."""
        ...

    @property
    def last_round(self) -> int:
        """The highest round any honest member can be in or send."""
        ...

    def join_at(self, round_index: int, steps_done: int) -> None:
        """Continue from a neighbour's parameters (already copied into ``params``) at ``round_index``;
        raises HivemeshError when not ``joinable``."""
        ...

    def set_graph(self, topology: Any) -> None:
        """Membership changed: ``topology`` (a GraphView, per round) holds from now on; raises
        HivemeshError when the algorithm cannot follow a change while running."""
        ...

    def sender_params(self, message: Message) -> torch.Tensor | None:
        """The sender's own parameters, flat, when ``message`` carries them whole; None otherwise."""
        ...

    @property
    def counters(self) -> Mapping[str, int]:
        """Running totals by name (reported as ``Metric`` actions when they change)."""
        ...

    def gauges(self) -> dict[str, float]:
        """Settings the machine chose or changed while running (``Metric`` actions when they change)."""
        ...

    def export_state(self) -> ProtocolState: ...

    def restore_state(self, state: ProtocolState) -> None: ...

    def notes(self) -> list[str]:
        """What an operator should read at start-up (settings the machine chose, and why)."""
        ...

    def warnings(self) -> list[str]:
        """What an operator must not miss now (a setting the machine had to change while running)."""
        ...

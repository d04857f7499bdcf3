"""The Node: one member around its machine, routing what it hears. Both drivers host it.

A driver (the daemon with sockets and the wall clock, the simulator with its
link model and virtual clock) opens and verifies frames, then hands each
message to :meth:`Node.receive`; it calls :meth:`Node.start` when the member
starts its rounds, :meth:`Node.handle` for its own events (work done, a timer),
and :meth:`Node.expire` as time passes. It carries out the actions that come
back, in order: the machine's (``Send``, ``StartWork``, timers, ``Metric``,
``Finished``, ``SetTrainerStep``) and the Node's own :class:`Note` lines.

Routing by kind, one rule for both drivers:

==========================  ============================================================
message                     what the Node does
==========================  ============================================================
anything from a neighbour   the failure detector hears it (``NeighbourUp`` once started)
``Heartbeat``               its step and "finished" flag are noted
``StateSyncRequest``        answered, rate-limited per requester (protocols/node/sync.py);
                            an answered neighbour that was up already has restarted:
                            the machine is told it is up, so it resends its round
``StateSyncResponse``       (or a refusal: ``ErrorReply`` ``sync_refused``) checked and
                            collected while syncing; the best is adopted once
                            every asked neighbour that is up has answered (or at the
                            attempt's timeout); after (a second answer from one
                            neighbour, or none asked) counted ``sync_answer_late``
a kind the machine does    counted ``no_role_for_<kind>`` (``no_role_for_param_pull``)
not take (``accepts``)      (federation's kinds get their role when it comes)
anything else, not started  held (protocols/node/early.py), fed after ``Start``
anything else, started      fed to the machine (which counts what arrives after it
                            finished as ``after_finish``)
==========================  ============================================================

Pure, like the machines: no sockets, threads, clocks or global RNG. What the
Node cannot know (the trainer's step, a host copy of the parameters for a
state-sync answer) it asks its driver through ``answer_source``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

import torch

from protocols.compress import BadParts
from protocols.events import (
    Action,
    Event,
    Finished,
    Machine,
    NeighbourDown,
    NeighbourUp,
    Received,
    Send,
    Start,
)
from protocols.messages import ErrorReply, Heartbeat, Message, StateSyncRequest, StateSyncResponse
from protocols.node.config import NodeConfig
from protocols.node.early import EarlyMessages
from protocols.node.neighbours import N, Neighbourhood
from protocols.node.sync import REFUSED_CODE, Adoption, StateSync, SyncOffer, best_offer


@dataclass(frozen=True)
class Note:
    """A line for the operator (the driver logs it; ``warning``: at warning level)."""

    text: str
    warning: bool = False


NodeAction = Action | Note

# (what the machine mixes, as a copy the driver may send; the trainer's step)
AnswerSource = Callable[[], tuple[torch.Tensor, int]]


class Node(Generic[N]):
    """One member: its machine, state sync, failure detector and messages heard before Start."""

    def __init__(self, name: str, machine: Machine, *, neighbours: Mapping[str, N], config: NodeConfig,
                 early_per_neighbour: int, answer_source: AnswerSource) -> None:
        self.name = name
        self.machine = machine
        self.config = config
        names = frozenset(neighbours)
        self.sync = StateSync(config, names)
        self.early = EarlyMessages(names, per_neighbour=early_per_neighbour)
        self.neighbourhood: Neighbourhood[N] = Neighbourhood(neighbours, timeout_s=config.neighbour_timeout_s)
        self.answer_source = answer_source
        self.rejected: Counter[str] = Counter()  # the Node's own refusals, by reason
        self.started = False
        self.syncing = False
        self.finished = False
        self.adoption: Adoption | None = None  # what became of the last answer adopted (None: none yet)
        self._asked: tuple[str, ...] = ()  # whom the current attempt asked
        self._answered: set[str] = set()  # who answered it (usable or not)
        self._offers: dict[str, SyncOffer] = {}  # its usable answers, by sender
        # neighbours the machine was told are up since their last answered request: that
        # NeighbourUp already resent the round, the request needs no second resend
        self._told_up: set[str] = set()

    # ------------------------------------------------------------ lifecycle

    def begin_sync(self, *, resumed: bool) -> list[NodeAction]:
        """Ask the neighbours for their state (the first attempt), before the member starts: an
        adopted state replaces the parameters, which a running machine may be working on. Nothing
        to do without neighbours, or once started."""
        if not self.neighbourhood.names() or self.started:
            return []
        self.syncing = True
        self.adoption = None
        heard_anyone = any(n.up for n in self.neighbourhood.members.values())
        self.sync.begin_asking(resumed=resumed, heard_anyone=heard_anyone)
        return self._ask()

    def sync_timed_out(self) -> list[NodeAction]:
        """The current attempt's time is up: adopt the best answer it had, else ask again, or give up
        (``syncing`` turns False)."""
        if not self.syncing:
            return []
        return self._adopt_best() if self._offers else self._ask()

    def _ask(self) -> list[NodeAction]:
        if self.sync.ask():
            # up neighbours first: they are the ones likely to answer
            targets = sorted(self.neighbourhood.names(), key=lambda n: (not self.neighbourhood[n].up, n))
            self._asked, self._answered, self._offers = tuple(targets), set(), {}
            return [Send(tuple(targets), StateSyncRequest(reason="join"))]
        self.syncing = False
        # what it does next (train on, or stop: protocols/node/liveness.py) the driver says
        return [Note(f"every state-sync attempt ({self.sync.attempts}) went unanswered")]

    def start(self, now: float) -> list[NodeAction]:
        """The member starts its rounds: ``Start``, the neighbours not heard told down, then what
        arrived before, in arrival order."""
        self.syncing = False
        self.started = True
        actions = self._machine(Start(), now)
        for name in self.neighbourhood.absent():  # the rounds go on without it until it is heard
            actions += self._machine(NeighbourDown(name), now)
        for sender, message in self.early.release():
            actions += self._machine(Received(sender, message), now)
        return actions

    def stop(self) -> None:
        """The member stopped (crash, leave): forget what it held."""
        self.early.clear()
        self.syncing = False
        self._asked, self._answered, self._offers = (), set(), {}
        self._told_up.clear()

    def restart(self, machine: Machine, neighbours: Mapping[str, N]) -> None:
        """The member starts again (restored ``machine``, knowing nothing of its neighbours yet);
        its counters and the state-sync rate limits carry over."""
        self.machine = machine
        self.neighbourhood = Neighbourhood(neighbours, timeout_s=self.config.neighbour_timeout_s)
        self.early.clear()
        self._told_up.clear()
        self.started = self.syncing = self.finished = False

    # ------------------------------------------------------------ events

    def handle(self, event: Event, now: float) -> list[NodeAction]:
        """The member's own events for its machine (work done, a timer), once started."""
        return self._machine(event, now) if self.started else []

    def receive(self, sender: str, message: Message, now: float, *,
                reachable: bool = True) -> list[NodeAction]:
        """A verified message from ``sender`` (``reachable``: whether we can answer it now)."""
        actions: list[NodeAction] = []
        if self.neighbourhood.heard(sender, now, reachable=reachable) and self._live():
            self._told_up.add(sender)
            actions += self._machine(NeighbourUp(sender), now)
        match message:
            case Heartbeat():
                self.neighbourhood.beat(sender, step=message.step, finished=message.finished)
            case StateSyncRequest():
                actions += self._answer(sender, now)
            case StateSyncResponse():
                actions += self._take_answer(sender, message)
            case ErrorReply() if message.code == REFUSED_CODE:
                actions += self._take_answer(sender, None)
            case _ if type(message) not in self.machine.accepts:
                self.rejected[f"no_role_for_{message.KIND}"] += 1  # a kind no role here takes
            case _ if not self.started:
                self.early.hold(sender, message)
            case _:
                actions += self._machine(Received(sender, message), now)
        return actions

    def expire(self, now: float) -> tuple[list[str], list[NodeAction]]:
        """The neighbours that fell silent (now down), and what the machine does about it."""
        silent = self.neighbourhood.expire(now)
        actions: list[NodeAction] = []
        if self._live():
            for name in silent:
                actions += self._machine(NeighbourDown(name), now)
        if self.syncing and silent:
            actions += self._sync_complete()  # an asked neighbour gone silent is waited for no more
        return silent, actions

    def goodbye(self, name: str, now: float) -> list[NodeAction]:
        """``name`` said it leaves."""
        if self.neighbourhood.goodbye(name) and self._live():
            return self._machine(NeighbourDown(name), now)
        return []

    # ------------------------------------------------------------ state sync

    def _answer(self, requester: str, now: float) -> list[NodeAction]:
        if not self.sync.may_answer(requester, now, started=self.started):
            # counted by reason; a neighbour is told, so that its sync does not wait for us
            refusal = ErrorReply(code=REFUSED_CODE)
            return [Send((requester,), refusal)] if requester in self.neighbourhood else []
        actions: list[NodeAction] = []
        if requester in self._told_up:
            self._told_up.discard(requester)  # its NeighbourUp resent the round already
        elif self._live() and self.neighbourhood[requester].up:
            # Up all along, yet it asks: it restarted faster than the failure detector noticed, and
            # what we sent its old life is lost. Told up, the machine resends its round (bounded by
            # the answer's rate limit), as it does for one heard again after a silence.
            actions += self._machine(NeighbourUp(requester), now)
        params, trainer_step = self.answer_source()
        answer = self.sync.answer(self.machine, params, trainer_step=trainer_step)
        return [*actions, Send((requester,), answer)]

    def _take_answer(self, sender: str, message: StateSyncResponse | None) -> list[NodeAction]:
        """An answer to our request (None: a refusal), while syncing."""
        if not self.syncing or sender in self._answered:
            self.rejected["sync_answer_late"] += 1
            return []
        if message is None:
            offer: SyncOffer | BadParts = BadParts("refused", "not started, or asked too often")
            if sender not in self._asked:
                self.rejected["sync_answer_late"] += 1
                return []
        else:
            offer = self.sync.check(sender, message, self.machine)
        notes: list[NodeAction] = []
        if sender in self._asked:
            self._answered.add(sender)
        if isinstance(offer, SyncOffer):
            self._offers[sender] = offer
        elif message is not None:
            notes.append(Note(f"state sync from {sender}: unusable answer ({offer}); waiting for another",
                              warning=True))
        return [*notes, *self._sync_complete()]

    def _sync_complete(self) -> list[NodeAction]:
        """Adopt the best answer once every asked neighbour that is up has answered (and one could
        be used); else nothing yet."""
        waited_for = [n for n in self._asked if self.neighbourhood[n].up]
        if self._offers and all(n in self._answered for n in waited_for):
            return self._adopt_best()
        return []

    def _adopt_best(self) -> list[NodeAction]:
        """Adopt the best answer of this attempt (protocols/node/sync.py, "Choosing")."""
        sender = best_offer(self._offers)
        offer = self._offers[sender]
        outcome, actions = self.sync.adopt(offer, self.machine)
        self._asked, self._answered, self._offers = (), set(), {}
        self.syncing = False
        self.adoption = outcome
        note = {
            Adoption.KEPT: Note(f"{sender} is behind us (round {offer.round}); kept our state"),
            Adoption.REFUSED: Note("this algorithm cannot join by state sync (its shared state cannot be "
                                   "handed over); training on from our own state", warning=True),
            Adoption.ADOPTED: Note(f"synced from {sender}: round {offer.round}, step {offer.steps_done}"),
        }[outcome]
        return [*actions, note]

    # ------------------------------------------------------------ the machine

    def _live(self) -> bool:
        return self.started and not self.finished

    def _machine(self, event: Event, now: float) -> list[NodeAction]:
        actions: Sequence[Action] = self.machine.handle(event, now)
        if any(isinstance(a, Finished) for a in actions):
            self.finished = True
        return list(actions)

    def all_rejections(self) -> Counter[str]:
        """Every refusal the Node counted (its own, state sync's, early messages')."""
        return self.rejected + self.sync.rejected + self.early.rejected

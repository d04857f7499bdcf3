"""The Node: one member around its machine, routing what it hears. Both drivers host it.

A driver opens and verifies frames, then hands each message to :meth:`Node.receive`;
it calls :meth:`Node.start` when the member starts its rounds, :meth:`Node.handle`
for its own events (work done, a timer), :meth:`Node.tick` (the heartbeat, when
due) and :meth:`Node.expire` as time passes, and, before the first round,
:meth:`Node.start_wait`. It carries out the actions that come back, in order: the
machine's (``Send``, ``StartWork``, timers, ``Metric``, ``Finished``,
``SetTrainerStep``) and the Node's own :class:`Note` lines.

Routing by kind is one table for both drivers: refusals first (``after_leaving``,
``sender_revoked``, ``roster_version_mismatch``); heartbeats noted; state sync
answered or collected (protocols/node/sync.py); a kind no role takes counted
``no_role_for_<kind>``; anything else held before ``Start`` (protocols/node/early.py)
and fed to the role that takes its kind after; a message whose handling raises is
dropped and counted ``internal_error``, and the member lives on.

Roles: the machine plus any named roles (a gateway's FedAvg server), one role per
message kind; the members the roles serve (``clients``) have a failure detector
of their own. A role's timer keys and metric names carry its name as a prefix.
Roster versions come in through :meth:`Node.change_membership`
(protocols/node/membership.py). Pure: what the Node cannot know it asks its
driver through ``answer_source``. The routing table in full: docs/design/node.md.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

import torch

from protocols.compress import BadParts
from protocols.errors import HivemeshError
from protocols.events import (
    Action,
    CancelTimer,
    Event,
    Finished,
    Machine,
    Metric,
    NeighbourDown,
    NeighbourUp,
    Received,
    Role,
    Send,
    SetTimer,
    Start,
    TimerFired,
)
from protocols.messages import ErrorReply, Heartbeat, Message, StateSyncRequest, StateSyncResponse
from protocols.node.check import SyncOffer
from protocols.node.config import NodeConfig
from protocols.node.early import EarlyMessages
from protocols.node.liveness import Verdict, Wait, reason, start_wait, verdict
from protocols.node.membership import Connect, Membership, Serving, UnsignedKeyChange
from protocols.node.neighbours import N, Neighbour, Neighbourhood
from protocols.node.sync import REFUSED_CODE, Adoption, StateSync, best_offer
from protocols.roster import Roster
from topology.membership import ChangingGraph, RoundGraph


@dataclass(frozen=True)
class Note:
    """A line for the operator (the driver logs it; ``warning``: at warning level)."""

    text: str
    warning: bool = False


NodeAction = Action | Note | Connect

# (what the machine mixes, as a copy the driver may send; the trainer's step)
AnswerSource = Callable[[], tuple[torch.Tensor, int]]


class Node(Generic[N]):
    """One member: its machine, state sync, failure detector and messages heard before Start."""

    def __init__(self, name: str, machine: Machine, *, neighbours: Mapping[str, N], config: NodeConfig,
                 early_per_neighbour: int, answer_source: AnswerSource,
                 roles: Mapping[str, Role] | None = None, clients: Iterable[str] = (),
                 serving: Serving | None = None) -> None:
        """``roles``: what the member holds beside its machine, by name; ``clients``: the members
        those roles serve now (see the module docstring); ``serving``: which ``edge`` members they
        serve in each later roster version (a gateway; None: ``clients`` for good)."""
        self.name = name
        self.machine = machine
        self.roles: dict[str, Role] = dict(sorted((roles or {}).items()))
        for role_name in self.roles:
            if not role_name or "/" in role_name:
                raise ValueError(f"a role's name must be non-empty and without '/', got {role_name!r}")
        self.owners = self._owners()
        self.config = config
        names = frozenset(neighbours)
        self.sync = StateSync(config, names)
        self.early = EarlyMessages(names, per_neighbour=early_per_neighbour)
        self.neighbourhood: Neighbourhood[N] = Neighbourhood(neighbours, timeout_s=config.neighbour_timeout_s)
        served = {name: Neighbour() for name in clients if name not in names}
        self.clients: Neighbourhood[Neighbour] = Neighbourhood(served, timeout_s=config.neighbour_timeout_s)
        # only roles serve clients: a plain gossip peer (no role) takes no edge member in, whatever it is
        # told, so an edge's heartbeat to it stays refused (heartbeat_not_neighbour)
        self.serving = serving if self.roles else None
        self.answer_source = answer_source
        self.rejected: Counter[str] = Counter()  # the Node's own refusals, by reason
        self.internal_errors: Counter[str] = Counter()  # messages an exception dropped, by sender
        self._errors_said: set[tuple[str, str]] = set()  # (sender, exception type) already said
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
        self.membership = Membership(Roster(()))  # version 1 from round 0 until set_membership says more
        self.graph: RoundGraph | None = None      # the machine's graph, for a change to build on
        self.left = False                          # removed from the roster: it takes no part any more
        self._version_said: set[tuple[str, int]] = set()  # (sender, their version) already named
        # neighbours that told of a later roster than ours, cleared when ours changes: bounded by the
        # neighbours whatever they send
        self._behind_said: set[str] = set()
        self._revoked: frozenset[str] = frozenset()  # members whose key the roster revoked: never sent to
        self.next_beat_s = -math.inf  # when the next heartbeat is due

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
        for name, client in self.clients.members.items():  # heard before Start: up, so that a
            if client.up:                                    # server's first round asks them all
                actions += self._roles(NeighbourUp(name), now)
        for role in self.roles:
            actions += self._role(role, Start(), now)
        for name in self.neighbourhood.absent():  # the rounds go on without it until it is heard
            actions += self._machine(NeighbourDown(name), now)
        for sender, message in self.early.release():
            actions += self._deliver_guarded(sender, message, now)
        return actions

    def stop(self) -> None:
        """The member stopped (crash, leave): forget what it held."""
        self.early.clear()
        self.syncing = False
        self._asked, self._answered, self._offers = (), set(), {}
        self._told_up.clear()

    def restart(self, machine: Machine, neighbours: Mapping[str, N], *,
                roles: Mapping[str, Role] | None = None) -> None:
        """The member starts again (restored ``machine``, knowing nothing of its neighbours yet);
        its counters, the state-sync rate limits and its membership carry over. ``roles``: the
        restored roles (a gateway's server), under the names it had; None: its roles go on."""
        if roles is not None:
            if set(roles) != set(self.roles):
                raise ValueError(f"a restart keeps the member's roles {sorted(self.roles)}, "
                                 f"not {sorted(roles)}")
            self.roles = dict(sorted(roles.items()))
        if isinstance(self.graph, ChangingGraph):
            machine.set_graph(self.graph)   # a roster change learnt before the restart still holds
        self.machine = machine
        self.owners = self._owners()
        self.neighbourhood = Neighbourhood(neighbours, timeout_s=self.config.neighbour_timeout_s)
        self.clients = Neighbourhood({name: Neighbour() for name in self.clients.names()},
                                     timeout_s=self.config.neighbour_timeout_s)
        self.early.clear()
        self._told_up.clear()
        self.started = self.syncing = self.finished = False
        self.next_beat_s = -math.inf

    # ------------------------------------------------------------ heartbeats and the start wait

    def tick(self, now: float, *, step: int, loss: float, stamp_s: float = 0.0) -> list[NodeAction]:
        """The heartbeat to every neighbour, when due (every ``heartbeat_interval_s``): liveness,
        the trainer's ``step`` and ``loss``, whether we finished. ``stamp_s``: the sender's wall
        clock, for the receiver's latency estimate (a simulator leaves it 0). A gateway beats to
        its clients up too: a client not asked into a round hears from it that it is registered."""
        if now < self.next_beat_s:
            return []
        self.next_beat_s = now + self.config.heartbeat_interval_s
        to = self.neighbourhood.names() + self.clients.up_names()
        if not to:
            return []
        return [Send(to, self.heartbeat(step=step, loss=loss, stamp_s=stamp_s))]

    def farewell(self, *, step: int, loss: float, stamp_s: float = 0.0) -> list[NodeAction]:
        """The heartbeat that says we leave (``finished``), to every neighbour up: what an edge client
        sends its gateway as it stops, so no round waits for it."""
        to = self.neighbourhood.up_names()
        beat = dataclasses.replace(self.heartbeat(step=step, loss=loss, stamp_s=stamp_s), finished=True)
        return [Send(to, beat)] if to else []

    def heartbeat(self, *, step: int, loss: float, stamp_s: float = 0.0) -> Heartbeat:
        """What our heartbeat says now (the daemon also sends one to try a connection)."""
        return Heartbeat(step=step, loss=loss, sent_at_s=stamp_s, finished=self.finished,
                         roster_version=self.membership.current.version)

    def start_wait(self, *, waited_s: float, resumed: bool, ahead_steps: float,
                   all_reachable: bool = True, later: frozenset[str] = frozenset()) -> Wait:
        """Whether the wait for the neighbours before the first round is over, and how the member
        starts (protocols/node/liveness.py's table). ``ahead_steps``: how far on (trainer steps) a
        neighbour may be for us still to start at round 0 with it (inf: wait for every one, and
        ask them all); ``later``: neighbours not waited for (a test's schedule starts them later)."""
        hood = self.neighbourhood
        return start_wait(hood.presence(), {name: n.step for name, n in hood.members.items()},
                          waited_s=waited_s, resumed=resumed, ahead_steps=ahead_steps,
                          all_reachable=all_reachable, neighbour_timeout_s=self.config.neighbour_timeout_s,
                          start_timeout_s=self.config.start_timeout_s, later=later)

    def judge(self, *, resumed: bool, start_wait_over: bool) -> str:
        """Why this member stops short of the end (protocols/node/liveness.py's verdict, in one line
        naming its neighbours), or "" to go on. Asked after the state sync and whenever
        neighbours fall silent; the driver stops the member (its checkpoint kept)."""
        presence = self.neighbourhood.presence()
        outcome = verdict(presence, resumed=resumed, start_wait_over=start_wait_over)
        return "" if outcome is Verdict.GO_ON else reason(presence, outcome)

    # ------------------------------------------------------------ events

    def handle(self, event: Event, now: float) -> list[NodeAction]:
        """The member's own events (work done, a timer), once started: a timer whose key a role's
        name prefixes goes to that role, everything else to the machine."""
        if not self.started or self.left:
            return []
        if isinstance(event, TimerFired):
            role, _, key = event.key.partition("/")
            if key and role in self.roles:
                return self._role(role, TimerFired(key), now)
        return self._machine(event, now)

    def receive(self, sender: str, message: Message, now: float, *,
                reachable: bool = True) -> list[NodeAction]:
        """A verified message from ``sender`` (``reachable``: whether we can answer it now).

        Whatever it holds, it cannot end the member: an exception raised while handling it (what
        its content met in our code, a bug to fix, never the sender's right) drops it, counted
        ``internal_error`` and by sender in ``internal_errors``, and said once per sender and error."""
        try:
            return self._receive(sender, message, now, reachable=reachable)
        except Exception as error:  # the one place every host hands a member's input in
            return self._internal_error(sender, message, error)

    def _deliver_guarded(self, sender: str, message: Message, now: float) -> list[NodeAction]:
        """A message held before Start, fed now: what raises is dropped as if it had come after Start."""
        try:
            return self._deliver(sender, message, now)
        except Exception as error:  # the member's input, handed in by start() rather than receive()
            return self._internal_error(sender, message, error)

    def _internal_error(self, sender: str, message: Message, error: Exception) -> list[NodeAction]:
        self.rejected["internal_error"] += 1
        self.internal_errors[sender] += 1
        said = (sender, type(error).__name__)
        if said in self._errors_said:
            return []
        self._errors_said.add(said)
        frame = traceback.extract_tb(error.__traceback__)[-1]
        return [Note(f"{message.KIND} from {sender} dropped: internal_error: {type(error).__name__}: "
                     f"{str(error)[:200]} (at {frame.filename}:{frame.lineno})", warning=True)]

    def _receive(self, sender: str, message: Message, now: float, *, reachable: bool) -> list[NodeAction]:
        refused = self._refuse_version(sender, message)
        if refused is not None:
            return refused
        actions: list[NodeAction] = []
        if self.neighbourhood.heard(sender, now, reachable=reachable) and self._live():
            self._told_up.add(sender)
            actions += self._machine(NeighbourUp(sender), now)
        if self.clients.heard(sender, now, reachable=reachable) and self.started and not self.left:
            # also once the machine finished: a finished server answers a late client with the end
            actions += self._roles(NeighbourUp(sender), now)
        match message:
            case Heartbeat() if sender in self.clients:  # liveness, and an edge client's goodbye
                self.clients.beat(sender, step=message.step, finished=message.finished)
                if message.finished:
                    actions += self.goodbye(sender, now)
            case Heartbeat() if sender not in self.neighbourhood:
                self.rejected["client_not_served_yet" if self._serves_later(sender)
                              else "heartbeat_not_neighbour"] += 1
            case Heartbeat():
                self.neighbourhood.beat(sender, step=message.step, finished=message.finished)
                actions += self._roster_behind(sender, message.roster_version)
            case StateSyncRequest():
                actions += self._answer(sender, now)
            case StateSyncResponse():
                actions += self._take_answer(sender, message)
            case ErrorReply() if message.code == REFUSED_CODE:
                actions += self._take_answer(sender, None)
            case _ if type(message) not in self.owners:
                self.rejected[f"no_role_for_{message.KIND}"] += 1  # a kind no role here takes
            case _ if not self.started:
                self.early.hold(sender, message)
            case _:
                actions += self._deliver(sender, message, now)
        return actions

    def may_write_params(self, message: Message) -> bool:
        """Whether receiving ``message`` now may change the parameters in place (a state-sync answer
        while syncing; what the machine takes once started): a driver whose sends still read them
        lets those go first. A heartbeat or a request never does. A role's message may (a
        ClientUpdate that closes a gateway's round writes the global model into the parameters the
        machine shares), but nothing a role sends shares them: a RoundStart is encoded afresh
        (``Payload.encode``; tests/test_round_start_unshared.py), so no send in flight is torn and
        the driver need not wait."""
        if isinstance(message, StateSyncResponse):
            return self.syncing
        return self.started and self.owners.get(type(message)) == ""

    def expire(self, now: float) -> tuple[list[str], list[NodeAction]]:
        """The neighbours that fell silent (now down), and what the machine does about it."""
        silent = self.neighbourhood.expire(now)
        actions: list[NodeAction] = []
        if self._live():
            for name in silent:
                actions += self._machine(NeighbourDown(name), now)
        if self.syncing and silent:
            actions += self._sync_complete()  # an asked neighbour gone silent is waited for no more
        for name in self.clients.expire(now):
            if self._live():
                actions += self._roles(NeighbourDown(name), now)
        return silent, actions

    def goodbye(self, name: str, now: float) -> list[NodeAction]:
        """``name`` said it leaves (an edge client: a heartbeat saying ``finished`` as it stops), so
        nothing waits for it until it is heard again."""
        if self.neighbourhood.goodbye(name) and self._live():
            return self._machine(NeighbourDown(name, left=True), now)
        if self.clients.goodbye(name) and self._live():
            return self._roles(NeighbourDown(name, left=True), now)
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
        return [*actions, Send((requester,), self.membership.stamp(answer))]

    def _take_answer(self, sender: str, message: StateSyncResponse | None) -> list[NodeAction]:
        """An answer to our request (None: a refusal), while syncing."""
        if not self.syncing or sender in self._answered:
            self.rejected["sync_answer_late"] += 1
            return []
        if sender not in self._asked:
            # nobody asked it in this attempt: a refusal is one for an earlier attempt; an answer
            # is dropped unread, since an unasked offer must not sway the choice of the best one
            self.rejected["sync_answer_late" if message is None else "sync_answer_unasked"] += 1
            return []
        if message is None:
            offer: SyncOffer | BadParts = BadParts("refused", "not started, or asked too often")
        else:
            offer = self.sync.check(sender, message, self.machine)
        notes: list[NodeAction] = []
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

    # ------------------------------------------------------------ the roles

    def _owners(self) -> dict[type[Message], str]:
        """Which role takes each kind ("": the machine); a kind two roles take is refused."""
        owners: dict[type[Message], str] = {kind: "" for kind in self.machine.accepts}
        for role_name, role in self.roles.items():
            for kind in sorted(role.accepts, key=lambda k: k.KIND):
                if kind in owners:
                    first = owners[kind] or "the machine"
                    raise ValueError(f"roles {first} and {role_name} both take {kind.KIND} messages")
                owners[kind] = role_name
        return owners

    def _deliver(self, sender: str, message: Message, now: float) -> list[NodeAction]:
        owner = self.owners[type(message)]
        event = Received(sender, message)
        return self._role(owner, event, now) if owner else self._machine(event, now)

    def _roles(self, event: Event, now: float) -> list[NodeAction]:
        """Every role, in name order, handles ``event`` (a client up or down)."""
        actions: list[NodeAction] = []
        for name in self.roles:
            actions += self._role(name, event, now)
        return actions

    def _role(self, name: str, event: Event, now: float) -> list[NodeAction]:
        """A role beside the machine handles ``event``; its timer keys and metric names are prefixed."""
        return self.role_actions(name, self.roles[name].handle(event, now))

    def role_actions(self, name: str, done: Sequence[Action]) -> list[NodeAction]:
        """What role ``name`` returned, its timer keys and metric names prefixed: for a driver's
        direct call on a role (a gateway's ``resume`` after its gossip rounds), as for its events."""
        actions: list[NodeAction] = []
        for action in done:
            match action:
                case SetTimer(key=key, at=at):
                    actions.append(SetTimer(f"{name}/{key}", at))
                case CancelTimer(key=key):
                    actions.append(CancelTimer(f"{name}/{key}"))
                case Metric(name=metric, value=value):
                    actions.append(Metric(f"{name}.{metric}", value))
                case _:
                    actions.append(action)
        return actions

    # ------------------------------------------------------------ the machine

    def _live(self) -> bool:
        return self.started and not self.finished

    def _machine(self, event: Event, now: float) -> list[NodeAction]:
        actions: Sequence[Action] = self.machine.handle(event, now)
        if any(isinstance(a, Finished) for a in actions):
            self.finished = True
        return [*self._stamped(actions), *self._settle(now)]

    def all_rejections(self) -> Counter[str]:
        """Every refusal the Node counted (its own, state sync's, early messages')."""
        return self.rejected + self.sync.rejected + self.early.rejected

    # ------------------------------------------------------------ membership (protocols/node/membership.py)

    def set_membership(self, roster: Roster, graph: RoundGraph) -> None:
        """The roster and graph this member starts with (the machine was built on ``graph``)."""
        self.membership = Membership(roster)
        self.graph = graph

    def change_membership(self, roster: Roster, after: RoundGraph, now: float, *,
                          make_neighbour: Callable[[], N]) -> list[NodeAction]:
        """A later roster version was learnt: ``after`` is the graph over its members, in force from
        ``roster.effective_round``. The machine reads the old graph for the rounds before it; new
        neighbours are known (down until heard) at once, the removed ones forgotten at that round."""
        if self.graph is None:
            raise ValueError("change_membership needs set_membership first")
        try:
            membership = self.membership.changed_to(roster)
        except UnsignedKeyChange as error:
            self.rejected["roster_key_change_unsigned"] += 1
            return [Note(f"{error}: ignored", warning=True)]
        except ValueError as error:
            self.rejected["roster_not_newer"] += 1
            return [Note(f"{error}: ignored", warning=True)]
        view = ChangingGraph(self.graph, after, roster.effective_round)
        try:
            self.machine.set_graph(view)
        except HivemeshError as error:
            self.rejected["roster_change_refused"] += 1
            return [Note(f"{membership.describe()}: not applied: {error}", warning=True)]
        old_version = self.membership.current.version
        self.membership, self.graph = membership, view
        self._behind_said.clear()
        actions: list[NodeAction] = [Note(membership.describe())]
        round_now = self.machine.position[0]
        if self.started and round_now > roster.effective_round:
            actions.append(Note(f"roster version {roster.version} arrived at round {round_now}, after its "
                                f"effective round {roster.effective_round}: rounds {roster.effective_round}"
                                f"-{round_now - 1} went by version {old_version} here "
                                f"(members already on version {roster.version} refused them)", warning=True))
        accepted = membership.either()   # a revoked member is refused at once: no longer dialled either
        if self.name not in accepted:
            return actions + self._leave(f"our key was revoked at roster version {roster.version}: leaving "
                                         "the run", membership.previous or membership.current)
        # a revoked neighbour is gone at once: not heard, not sent to, not waited for
        before = membership.previous or membership.current
        self._revoked = frozenset(name for name in before.names if name not in accepted)
        revoked = [name for name in self.neighbourhood.names() if name in self._revoked]
        for name in revoked:
            self.neighbourhood.forget(name)
        names = tuple(name for name in view.neighbours(self.name) if name not in self._revoked)
        added = [name for name in names if self.neighbourhood.join(name, make_neighbour())]
        self._follow(names)
        actions.append(Connect(accepted, names))
        if self._live():
            for name in [*revoked, *added]:  # added: not waited for until heard (NeighbourUp), like a
                actions += self._machine(NeighbourDown(name), now)     # neighbour absent at Start
        return actions + self._revoke_clients(roster.version, now) + self._settle(now)

    def _revoke_clients(self, version: int, now: float) -> list[NodeAction]:
        """A served edge client whose key was revoked is gone for the roles at once, like a revoked
        neighbour (not at the version's round, nor at its neighbour timeout): not asked again, its
        messages refused (``sender_revoked``)."""
        revoked = [name for name in self.clients.names() if name in self._revoked]
        if not revoked:
            return []
        actions: list[NodeAction] = []
        for name in revoked:
            self.clients.forget(name)
            if self.started:
                actions += self._roles(NeighbourDown(name), now)
        return [*actions, Note(f"edge clients revoked at roster version {version}: "
                               f"{', '.join(revoked)} let go at once")]

    def _settle(self, now: float) -> list[NodeAction]:
        """From the change's round on: forget the removed neighbours, or leave if we were removed."""
        membership, graph = self.membership, self.graph
        if membership.previous is None or not isinstance(graph, ChangingGraph):
            return []
        round_now = self.machine.position[0]
        if not membership.in_force(round_now):
            return []
        self.membership = membership.settled()
        roster = membership.current
        if self.name not in roster:    # we were removed: no neighbour any more, and done
            return self._leave(f"removed from the roster at version {roster.version} (round "
                               f"{roster.effective_round}): leaving the run", membership.previous)
        keep = graph.neighbours_from(self.name)
        for name in self.neighbourhood.names():
            if name not in keep:
                self.neighbourhood.forget(name)
        self._follow(keep)
        return [Connect(roster, keep),
                Note(f"roster version {roster.version} in effect from round {roster.effective_round} "
                     f"(we are at {round_now}): neighbours {', '.join(keep) or 'none'}"),
                *self._serve(roster, now)]

    def _serve(self, roster: Roster, now: float) -> list[NodeAction]:
        """From a version's round on, a member that serves the roster's edge clients serves its
        ``edge`` members: one added is known (not up until heard: its next heartbeat registers it),
        one removed is gone for the roles (``NeighbourDown``: not asked again)."""
        if self.serving is None:
            return []
        edges = self.serving.clients(roster)
        added = [name for name in edges if self.clients.join(name, Neighbour())]
        removed = [name for name in self.clients.names() if name not in edges]
        actions: list[NodeAction] = []
        for name in removed:
            self.clients.forget(name)
            if self._live():
                actions += self._roles(NeighbourDown(name), now)
        if added or removed:
            actions.append(Note(f"edge clients from roster version {roster.version}: added "
                                f"{', '.join(added) or 'none'}, removed {', '.join(removed) or 'none'}"))
        return actions

    def _serves_later(self, name: str) -> bool:
        """Whether ``name`` is an edge client we serve from the learnt version's round on (its key is
        admitted already: it may connect and heartbeat before that round)."""
        return (self.serving is not None and self.membership.previous is not None
                and name in self.serving.clients(self.membership.current))

    def _leave(self, why: str, roster: Roster) -> list[NodeAction]:
        """No neighbour any more, and done (``roster``: what the endpoint verifies against meanwhile)."""
        self.left = self.finished = True
        self.early.clear()
        for name in self.neighbourhood.names():
            self.neighbourhood.forget(name)
        self._follow(())
        return [Note(why), Connect(roster, ()), Finished()]

    def _follow(self, names: Sequence[str]) -> None:
        """State sync and early messages take these neighbours from now on."""
        self.sync.neighbours = frozenset(names)
        self.early.neighbours = frozenset(names)

    def _stamped(self, actions: Sequence[Action]) -> list[Action]:
        """Our roster version for its round on every round-bearing message we send (to no member
        whose key is revoked, though the machine's graph still has it until the change's round)."""
        stamped: list[Action] = []
        for action in actions:
            if isinstance(action, Send):
                recipients = tuple(name for name in action.recipients if name not in self._revoked)
                if recipients:
                    stamped.append(Send(recipients, self.membership.stamp(action.message)))
            else:
                stamped.append(action)
        return stamped

    def _roster_behind(self, sender: str, theirs: int) -> list[NodeAction]:
        """Said once per neighbour and our version: it knows a later roster than ours (a key rotated or
        revoked there is accepted here until our roster file says so too)."""
        if theirs <= self.membership.current.version or sender in self._behind_said:
            return []
        self._behind_said.add(sender)
        ours = self.membership.current.version
        return [Note(f"{sender} holds roster version {theirs}, {self.name} {ours}: is this member's roster "
                     "file up to date?", warning=True)]

    def _refuse_version(self, sender: str, message: Message) -> list[NodeAction] | None:
        """None to go on; else the refusal (counted) of a message we must not take: we left the run,
        its sender's key was revoked, or its roster version for its round is not ours."""
        if self.left:
            self.rejected["after_leaving"] += 1
            return []
        if sender in self._revoked:     # verified before its revocation was learnt, handed over after
            self.rejected["sender_revoked"] += 1
            return []
        mismatch = self.membership.mismatch(message)
        if mismatch is None:
            return None
        round_index, theirs, ours = mismatch
        self.rejected["roster_version_mismatch"] += 1
        if (sender, theirs) in self._version_said:
            return []
        self._version_said.add((sender, theirs))
        return [Note(f"{self.name} refused {sender}'s {message.KIND} for round {round_index}: roster version "
                     f"{theirs} (theirs) != {ours} (ours)", warning=True)]

"""The member lifecycle around its Node, once for every host: wait, sync, train, then end.

A host (the daemon, the simulator, a test's list) launches a :class:`Member`,
feeds it what happens (:data:`MemberEvent`) with the ``now`` it reads, and
carries out the actions it answers (:data:`MemberAction`), in order; its own
clock asks :meth:`Member.next_deadline` when to come back. Phases:

=========  ===========================================  =========================
phase      left on                                       to
=========  ===========================================  =========================
idle       ``Launch``                                    waiting
waiting    ``Node.start_wait`` over (a ``Beat`` or an     syncing (a restart, a late
           ``Arrived``)                                  joiner, the network ahead),
                                                         else training
syncing    an answer adopted, the asked fallen silent,   training, or stranded when
           or the last attempt's timer                   ``Node.judge`` says so
training   ``Finished`` from the machine; a silent       finished, stranded; stopped
           neighbour judged; a schedule's ``Stop``       (``Exit`` with the fault)
any        ``Halt`` (the host stopped it: a crash)       stopped
=========  ===========================================  =========================

A work point (``WorkPoint``: the host takes the machine's ``StartWork`` from
its work queue; the round's messages are out, its steps not done) is where a
checkpoint falls due (:class:`CheckpointSchedule`), where a crash placed on
progress fires (``ArmCrash``), and where a test's fault schedule fires
(protocols/node/schedule.py): ``Stop``, ``Flood``, ``Cut`` and heals, ``Hold``
(the work deferred until ``Release``). What is left is ``Train(steps)``. Files,
processes and links stay the host's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

from protocols.events import (
    Finished,
    NeighbourDown,
    NeighbourUp,
    Send,
    SetTimer,
    SetTrainerStep,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.messages import Message, StateSyncRequest
from protocols.node.checkpoints import CheckpointConfig, CheckpointSchedule
from protocols.node.liveness import Wait
from protocols.node.membership import Connect
from protocols.node.neighbours import Neighbour
from protocols.node.node import Node, NodeAction, Note
from protocols.node.schedule import Condition, Cut, Flood, Hold, MemberFaults, Schedule, Stop
from protocols.roster import Roster
from topology.membership import RoundGraph

N = TypeVar("N", bound=Neighbour)

EXIT_STRANDED = 3  # no neighbour left to train with (finished or gone): the run did not complete
SYNC_TIMER = "member/sync"  # the state-sync attempt's deadline (never a role's: roles are named by hosts)


class Phase(Enum):
    IDLE = "idle"
    WAITING = "waiting for neighbours"
    SYNCING = "syncing"
    TRAINING = "training"
    FINISHED = "finished"
    STRANDED = "stranded"
    STOPPED = "stopped"


def ahead_steps(*, max_rounds_ahead: int, local_steps: int, scheduled: bool) -> float:
    """How far on (trainer steps) a neighbour may be for a member still to start at round 0 with it:
    what its machine buffers; unbounded under a test's fault schedule, where every running
    neighbour is waited for and a sync asks them all."""
    return math.inf if scheduled else float(max_rounds_ahead * local_steps)


@dataclass(frozen=True, kw_only=True)
class MemberConfig:
    ahead_steps: float  # see :func:`ahead_steps`
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    keeps_checkpoints: bool = True  # writes them when due (a simulated member no crash brings back: no)
    checkpoint_at_launch: bool = True  # the first at launch (a process finds none on disk: it starts fresh)
    checkpoint_jumps_at_once: bool = False  # a forward ``SetTrainerStep`` at once, not at the next work point
    work_is_steps: bool = True  # ``Train`` moves the step (a gateway's work is a FedAvg round: it does not)


# ------------------------------------------------------------ events in


@dataclass(frozen=True)
class Launch:
    """The member's process is up at trainer step ``step``: it heartbeats and waits for its
    neighbours. ``sync``: it asks their state first (a late joiner); ``resumed``: restored from its
    checkpoint (it syncs too)."""

    step: int
    sync: bool = False
    resumed: bool = False
    stamp_s: float = 0.0  # its first heartbeat's (``Beat``)


@dataclass(frozen=True)
class Beat:
    """The heartbeat's time (``Member.next_beat_s``); while waiting: whether the wait is over.
    ``all_reachable``: whether the host reaches every neighbour it waits for; ``stamp_s``: its wall
    clock, for the receivers' latency estimate (a simulator leaves it 0)."""

    all_reachable: bool = True
    stamp_s: float = 0.0


@dataclass(frozen=True)
class Arrived:
    """A verified message; ``reachable``: whether the host can answer ``sender`` now."""

    sender: str
    message: Message
    reachable: bool = True


@dataclass(frozen=True)
class Expire:
    """The failure detector's check: silent neighbours go down (and may strand the member)."""


@dataclass(frozen=True)
class WorkPoint:
    """The host takes ``steps`` of work the machine asked for (``StartWork``) from its queue."""

    steps: int


@dataclass(frozen=True)
class Goodbye:
    """Neighbour ``name`` said it leaves."""

    name: str


@dataclass(frozen=True)
class RosterChange:
    """A new roster version (graph ``graph`` over its members) learnt now; the Node applies it from
    its effective round. ``make_neighbour``: what the host keeps per new neighbour."""

    roster: Roster
    graph: RoundGraph
    make_neighbour: Callable[[], Any]


@dataclass(frozen=True)
class Heal:
    """The schedule's conditions may have moved: cuts whose heal is met are up again."""


@dataclass(frozen=True)
class Release:
    """The schedule's conditions may have moved: held work goes on once its hold is over."""


@dataclass(frozen=True)
class ArmCrash:
    """A crash placed on progress: at the first work point at trainer step ``at_step`` or later."""

    at_step: int


@dataclass(frozen=True)
class Halt:
    """The host stopped the member (a crash, a leave): this life is over."""


MemberEvent = (Launch | Beat | Arrived | Expire | WorkPoint | Goodbye | RosterChange | Heal | Release
               | ArmCrash | Halt | WorkDone | TimerFired)

# ------------------------------------------------------------ actions out


@dataclass(frozen=True)
class Train:
    """Run ``steps`` trainer steps now, then feed ``WorkDone``."""

    steps: int


@dataclass(frozen=True)
class Checkpoint:
    """Write the member's state now (``final``: its last, the run finished)."""

    final: bool


@dataclass(frozen=True)
class Exit:
    """This life ends: ``code`` for the process, ``why`` for the operator; ``restart_when``: a
    schedule's stop, restarted from its checkpoint once that is met."""

    code: int
    why: str
    restart_when: Condition | None = None


@dataclass(frozen=True)
class Crash:
    """The crash armed for ``at_step`` is due: the host kills the member now (``kill -9``)."""

    at_step: int


@dataclass(frozen=True)
class Reached:
    """The member is at a work point of ``round`` (its highest so far): the schedule's conditions
    read it, the host publishes it."""

    round: int


@dataclass(frozen=True)
class ScheduleMoved:
    """A work point passed under a schedule: the host checks its conditions now."""


@dataclass(frozen=True)
class Silent:
    """The failure detector found ``names`` silent (now down)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Entered:
    """The member entered ``phase`` (from ``was``)."""

    phase: Phase
    was: Phase


MemberAction = NodeAction | Train | Checkpoint | Exit | Crash | Reached | ScheduleMoved | Silent | Entered


class Member(Generic[N]):
    """One member's lifecycle around ``node``; it outlives restarts (its schedule, its progress)."""

    def __init__(self, node: Node[N], config: MemberConfig, *, schedule: Schedule | None = None,
                 reached: Callable[[str], int] = lambda name: -1, fired: Collection[int] = (),
                 reached_round: int = -1) -> None:
        """``schedule``: a test's faults; ``reached``: the other members' highest work-point rounds,
        as the host learns them (-1 before their first); ``fired`` and ``reached_round``: this
        member's, from an earlier life (a process restarted)."""
        self.node = node
        self.name = node.name
        self.config = config
        self.schedule = schedule or Schedule()
        self.reached_round = reached_round
        self.faults = MemberFaults(self.schedule, self.name, fired=set(fired),
                                   reached=lambda m: self.reached_round if m == self.name else reached(m))
        self.phase = Phase.IDLE
        self.step = 0           # the trainer's: set at launch, moved by training and SetTrainerStep
        self.loss = math.nan    # the last work's, for heartbeats
        self.saves = CheckpointSchedule(config.checkpoint)
        self.saved_once = False
        self.resumed = False
        self.sync_at_start = False
        self.waiting_since_s = math.nan
        self.stranded = ""      # why it stopped short of the end
        self.deferred_steps = 0  # work a schedule's hold keeps back
        self.armed: list[int] = []  # crashes placed on progress, by trainer step, in arming order
        self.neighbour_names = tuple(node.neighbourhood.names())
        self._sync_deadline_s = math.inf
        self._all_reachable = True

    @property
    def alive(self) -> bool:
        return self.phase in (Phase.WAITING, Phase.SYNCING, Phase.TRAINING, Phase.FINISHED)

    @property
    def next_beat_s(self) -> float:
        return self.node.next_beat_s

    def next_deadline(self) -> float:
        """When the host must come back without any input: the next heartbeat or sync deadline."""
        if not self.alive:
            return math.inf
        return min(self.node.next_beat_s, self._sync_deadline_s)

    def heal_due(self) -> bool:
        """Whether a ``Heal`` now brings a neighbour up (the host waits for its sends in flight first:
        the machine may mix)."""
        return bool(self.schedule.faults) and self.alive and self.faults.heal_due()

    def drops(self, recipient: str, message: Message) -> bool:
        """Whether a schedule's cut keeps ``message`` from ``recipient``."""
        return bool(self.schedule.faults) and self.faults.drops(recipient, message)

    # ------------------------------------------------------------ the one entry point

    def handle(self, now: float, event: MemberEvent) -> list[MemberAction]:
        match event:
            case Launch():
                return self._launch(now, event)
            case ArmCrash(at_step=at_step):
                self.armed.append(at_step)
                return []
            case Halt():
                if self.alive:
                    self._halt(Phase.STOPPED)
                return []
        if not self.alive:
            return []
        match event:
            case Beat(all_reachable=all_reachable, stamp_s=stamp_s):
                self._all_reachable = all_reachable
                beat = self.node.tick(now, step=self.step, loss=self.loss, stamp_s=stamp_s)
                actions = self._pass(now, beat)
                return actions + self._check_wait(now) if self.phase is Phase.WAITING else actions
            case Arrived(sender=sender, message=message, reachable=reachable):
                return self._arrived(now, sender, message, reachable)
            case Expire():
                return self._expire(now) if self.phase is not Phase.WAITING else []
            case WorkPoint(steps=steps):
                return self._work_point(now, steps)
            case Goodbye(name=name):
                return self._pass(now, self.node.goodbye(name, now))
            case RosterChange(roster=roster, graph=graph, make_neighbour=make_neighbour):
                return self._pass(now, self.node.change_membership(roster, graph, now,
                                                                   make_neighbour=make_neighbour))
            case Heal():
                return self._heal(now)
            case Release():
                return self._release(now)
            case TimerFired(key=key) if key == SYNC_TIMER:
                return self._sync_timer(now)
            case WorkDone(loss=loss):
                self.loss = loss
                return self._pass(now, self.node.handle(event, now))
            case TimerFired():
                return self._pass(now, self.node.handle(event, now))
        raise TypeError(f"not a member event: {event!r}")

    # ------------------------------------------------------------ phases

    def _enter(self, phase: Phase) -> list[MemberAction]:
        was, self.phase = self.phase, phase
        return [Entered(phase, was)]

    def _launch(self, now: float, launch: Launch) -> list[MemberAction]:
        self.step = launch.step
        if launch.resumed:
            self.saves = CheckpointSchedule(self.config.checkpoint, start_step=launch.step)
        self.resumed, self.sync_at_start = launch.resumed, launch.sync or launch.resumed
        self.waiting_since_s = now
        self.stranded = ""
        actions = self._enter(Phase.WAITING)
        if self.config.keeps_checkpoints and self.config.checkpoint_at_launch and not self.saved_once:
            actions += self._checkpoint(now)  # none yet: a crash restarts it from here
        return actions + self.handle(now, Beat(stamp_s=launch.stamp_s))

    def _check_wait(self, now: float) -> list[MemberAction]:
        """Whether the wait for the neighbours is over (``Node.start_wait``); then sync or start."""
        outcome = self.node.start_wait(waited_s=now - self.waiting_since_s, resumed=self.resumed,
                                       ahead_steps=self.config.ahead_steps, all_reachable=self._all_reachable,
                                       later=self.schedule.joins_later())
        if outcome is Wait.WAIT:
            return []
        said: list[MemberAction] = []
        if outcome is Wait.TIMED_OUT:
            absent = ", ".join(self.node.neighbourhood.absent())
            said.append(Note(f"neighbours not heard within {self.node.config.start_timeout_s:g} s: {absent}; "
                             "starting without them (their rounds will be left out)", warning=True))
        if self.sync_at_start or outcome is Wait.JOIN:
            asked = self.node.begin_sync(resumed=self.resumed)
            return said + self._enter(Phase.SYNCING) + self._asked(now, asked)
        return said + self._begin(now)

    def _asked(self, now: float, actions: list[NodeAction]) -> list[MemberAction]:
        """One state-sync attempt made (its deadline set), or, synced or none left, start."""
        done = self._pass(now, actions)
        if not self.node.syncing:
            return done + self._synced(now, unanswered=self.node.adoption is None)
        self._sync_deadline_s = now + self.node.config.sync_timeout_s
        return [*done, SetTimer(SYNC_TIMER, self._sync_deadline_s)]

    def _sync_timer(self, now: float) -> list[MemberAction]:
        if self.phase is not Phase.SYNCING or not self.node.syncing:
            return []
        sync = self.node.sync
        said = Note(f"state-sync attempt {sync.attempts_made}/{sync.attempts} timed out", warning=True)
        return [said, *self._asked(now, self.node.sync_timed_out())]

    def _synced(self, now: float, *, unanswered: bool) -> list[MemberAction]:
        """The sync is over: start, unless the Node finds nobody left to train with."""
        self._sync_deadline_s = math.inf
        why = self.node.judge(resumed=self.resumed, start_wait_over=unanswered)
        if why:
            return self._strand(now, why)
        alone = Note("training on without state sync", warning=True)
        return ([alone] if unanswered else []) + self._begin(now)

    def _begin(self, now: float) -> list[MemberAction]:
        """Start the machine (the Node hands it what arrived before)."""
        return self._enter(Phase.TRAINING) + self._pass(now, self.node.start(now))

    def _strand(self, now: float, why: str) -> list[MemberAction]:
        """Stop short of the end, what it trained kept."""
        actions = self._checkpoint(now) if self.node.started else []
        self.stranded, was = why, self.phase
        self._halt(Phase.STRANDED)
        return [*actions, Entered(Phase.STRANDED, was), Exit(EXIT_STRANDED, why)]

    def _halt(self, phase: Phase) -> None:
        self.node.stop()
        self.phase = phase
        self.deferred_steps = 0
        self._sync_deadline_s = math.inf

    def _arrived(self, now: float, sender: str, message: Message, reachable: bool) -> list[MemberAction]:
        was_syncing = self.node.syncing
        actions = self._pass(now, self.node.receive(sender, message, now, reachable=reachable))
        if self.phase is Phase.WAITING:
            return actions + self._check_wait(now)
        if was_syncing and not self.node.syncing:  # an answer was taken
            return actions + self._synced(now, unanswered=False)
        return actions

    def _expire(self, now: float) -> list[MemberAction]:
        syncing = self.node.syncing
        silent, found = self.node.expire(now)
        actions: list[MemberAction] = [Silent(tuple(silent))] if silent else []
        actions += self._pass(now, found)
        if syncing and not self.node.syncing:  # a silent neighbour was all it still waited for
            return actions + self._synced(now, unanswered=False)
        if silent and self.node.started and not self.node.finished:
            why = self.node.judge(resumed=self.resumed, start_wait_over=True)
            if why:
                return actions + self._strand(now, why)
        return actions

    # ------------------------------------------------------------ the Node's actions

    def _pass(self, now: float, actions: list[NodeAction]) -> list[MemberAction]:
        """The Node's actions, as the lifecycle follows them (the trainer's step, the neighbours, the end)."""
        out: list[MemberAction] = []
        for action in actions:
            match action:
                case SetTrainerStep(step=step):
                    self.saves.step_set(self.step, step)
                    self.step = step
                case Connect(neighbours=neighbours):
                    self.neighbour_names = neighbours
                case Finished():
                    if self.phase is Phase.TRAINING and self.node.finished:  # not a role's (a server's) end
                        out += self._enter(Phase.FINISHED)
            out.append(action)
        if self.config.checkpoint_jumps_at_once and self.config.keeps_checkpoints and self.saves.jumped:
            out += self._checkpoint(now)  # a kill before the next work point would lose the jump
        return out

    def _checkpoint(self, now: float, *, final: bool = False) -> list[MemberAction]:
        self.saves.saved(self.step, now)
        self.saved_once = True
        return [Checkpoint(final)]

    def _train(self, steps: int) -> list[MemberAction]:
        if self.config.work_is_steps:
            self.step += steps
        return [Train(steps)]

    def _work_point(self, now: float, steps: int) -> list[MemberAction]:
        """The round's messages are out, its steps not done: a checkpoint when due, a crash armed
        for this step, the schedule's faults, then the work (unless held, or stopped)."""
        actions: list[MemberAction] = []
        if self.config.keeps_checkpoints and self.saves.should_save(self.step, now):
            actions += self._checkpoint(now)
        crash = next((at for at in self.armed if self.step >= at), None)
        if crash is not None:
            self.armed.remove(crash)
            return [*actions, Crash(crash)]
        if not self.schedule.faults:
            return actions + self._train(steps)
        round_index = self.node.machine.position[0]
        self.reached_round = max(self.reached_round, round_index)
        actions += [Reached(self.reached_round), *self._heal(now)]  # before a hold is released by it
        for fault in self.faults.work_point(round_index):
            actions += self._fire(now, fault)
        if not self.alive:
            return actions
        if self.faults.holding():
            self.deferred_steps = steps
        else:
            actions += self._train(steps)
        return [*actions, ScheduleMoved()]

    def _fire(self, now: float, fault: Hold | Stop | Flood | Cut) -> list[MemberAction]:
        match fault:
            case Stop(restart_when=restart_when):
                saved = self._checkpoint(now)  # as a SIGTERM: its state is the checkpoint
                self._halt(Phase.STOPPED)
                return [*saved, Exit(0, "stopped by the fault schedule", restart_when)]
            case Flood(to=to, requests=requests):
                return [Send((to,), StateSyncRequest(reason="flood")) for _ in range(requests)]
            case Cut():
                actions: list[MemberAction] = []
                for name in sorted(fault.across(self.name) & set(self.neighbour_names)):
                    actions += self._pass(now, self.node.handle(NeighbourDown(name), now))
                return actions
        return []

    def _heal(self, now: float) -> list[MemberAction]:
        """Its neighbours across a cut whose heal condition is met: up again for the machine."""
        actions: list[MemberAction] = []
        for other in self.faults.heals():
            if other in self.neighbour_names and self.alive:
                actions += self._pass(now, self.node.handle(NeighbourUp(other), now))
        return actions

    def _release(self, now: float) -> list[MemberAction]:
        """Held work back in the host's queue: its work point again (faults after the hold fire then)."""
        if not self.deferred_steps or self.faults.holding():
            return []
        steps, self.deferred_steps = self.deferred_steps, 0
        return [StartWork(steps)]


"""The simulator's driver of the gossip state machines: the same machines the daemon drives.

For each member: a real :class:`peer.train.trainer.Trainer`, a machine from
:func:`protocols.gossip.make_machine` mixing the trainer's ``mixed`` vector in
place, and a :class:`protocols.wire.Endpoint`. Actions map to the engine:

* ``StartWork(n)``: the trainer runs ``n`` real SGD steps now; ``WorkDone``
  is fed ``n * step_time`` (modelled) later.
* ``Send``: sealed by the sender's Endpoint (real signature, real bytes); each
  recipient's copy crosses the link model and is opened by the recipient's
  Endpoint, whose rejections are counted by reason, then fed as ``Received``.
* ``SetTimer`` / ``CancelTimer``: ``TimerFired`` at the virtual time asked.

Checkpoints are the daemon's: at each work point a member asks
:class:`peer.train.checkpoint.CheckpointSchedule` (the scenario's
``[checkpoint]``, a peer file's) whether one is due, counting from the last one
it wrote, and writes one at once after a jump of its step (``SetTrainerStep``:
an adopted state sync, a catch-up), as the daemon does. A crash (a ``kill -9``)
loses what it did since: a restart restores trainer, machine and replay
windows from its last checkpoint (a member that never wrote one: its state at
its start, as a daemon with an empty data folder) with the next epoch; a
machine restored at a work point asks for that work again at ``Start``
(protocols/gossip), as the daemon's does. A clean stop (a schedule's ``Stop``,
at a work point; a stranded member, before its start: never mid-work) writes
one first, as the daemon does. Each restart is reported (``restarts_detail``): the step the crashed
member had reached, the step it resumed from (the steps lost) and the seconds
from the restart until its state sync was over (``recovery_s``). A crash may
be placed on progress (``ChurnEvent.at_step``) and bring its own restart
(``down_s``), to replay a real run's kills.

A member that joins late or restarts first asks its neighbours for their
state, as the daemon does, with the same code (protocols/node's
``StateSync``: answers rate-limited per requester; the answers of the
neighbours asked collected and the best adopted, unless behind us or the
algorithm cannot join, with the trainer's step following), then feeds ``Start``; with no answer within
``NodeConfig.sync_timeout_s`` it starts from what it has. Messages that arrive
meanwhile are held as the daemon holds them (``EarlyMessages``: per
neighbour, newest kept) and fed after ``Start``. ``SetTrainerStep`` (a
catch-up or an adopted sync) sets the trainer's step, as in the daemon.

Liveness is the daemon's, the same code (protocols/node): every running
member sends the Node's heartbeat every ``heartbeat_interval_s`` (a real
signed message over the link model, as any other); a neighbour is up from its
first accepted message, down once nothing of it was accepted for
``neighbour_timeout_s`` (``NeighbourDown``), and up again at its next accepted
message (``NeighbourUp``). Before its first round a member waits for its
neighbours as the daemon does (``Node.start_wait``: all up, one far ahead so
it joins by state sync, or the start timeout); at ``Start`` the neighbours not
heard yet are told down. Forgers are never heard, so their honest neighbours
start only at ``start_timeout_s``, as real peers would. A member that leaves
says goodbye: its neighbours are told at once.

A test may hand the run a fault schedule keyed by rounds (``faults``:
protocols/node/schedule.py, the one the daemon honours through its test hooks):
its faults fire when a member carries out ``StartWork`` (the round's work
point), holds defer that work, a stop keeps the member's state as its
checkpoint and restarts it (with a state sync) once its condition is met,
joins start a member, and cuts drop what crosses them and tell the machines
their neighbours are down, then up, by the schedule. Conditions are checked
after every work point, all at one instant of the virtual clock.

``verify_fraction < 1`` (scale runs only): each honest message is opened by
the codec with that probability (a counter-based draw per link and message);
the others are handed over as the sender's message object, after the same
link delay and with the same byte count. Attackers' messages are always
verified, so a sampled run never lets a forgery through.
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch

from protocols.codec import encode
from protocols.events import (
    CancelTimer,
    Event,
    Finished,
    Machine,
    Metric,
    NeighbourDown,
    NeighbourUp,
    Send,
    SetTimer,
    SetTrainerStep,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.identity import Identity
from protocols.messages import Message, StateSyncRequest
from protocols.node import Neighbour, Node, NodeAction, Note, Wait
from protocols.node.checkpoints import CheckpointConfig, CheckpointSchedule
from protocols.node.membership import Connect
from protocols.node.schedule import Cut, Flood, MemberFaults, Schedule, Stop, met
from protocols.roster import Member, Roster, run_id
from protocols.wire import Endpoint, Opened, wire_size
from sim.network import uniform
from sim.node import churn_events, flip_signature, sim_identity, tamper, work_seconds
from sim.scenario import ChurnEvent
from sim.world import Progress, Recorder, ScenarioResult, World, merge_counts, new_result
from topology import Topology

_ALWAYS_VERIFIED = ("stale-replay", "forged-key", "forged-signature")
# a schedule's join or restart is a process starting: what was sent to it meanwhile, in flight when
# its condition was met, has landed on nobody (as on a port nobody listens on) before it runs
PROCESS_START_S = 1.0


@dataclass(frozen=True)
class SimCheckpoint:
    """What a member wrote at a work point (or a clean stop): it restarts from this after a crash."""

    step: int                                   # the trainer's step: what the checkpoint is named by
    trainer: dict[str, Any]
    machine: tuple[dict[str, torch.Tensor], Any]
    endpoint: dict[str, object]


@dataclass
class RestartRecord:
    """One crash and restart of a member, as the multi-host kill test measures it."""

    crashed_at_s: float
    reached_step: int               # what the crashed member had trained (its time up)
    restarted_at_s: float = math.nan
    resumed_step: int = -1          # its checkpoint's
    synced_at_s: float = math.nan   # its state sync over (adopted, refused or unanswered)

    def as_dict(self) -> dict[str, float | int]:
        return {"crashed_at_s": self.crashed_at_s, "reached_step": self.reached_step,
                "restarted_at_s": self.restarted_at_s, "resumed_step": self.resumed_step,
                "steps_lost": self.reached_step - self.resumed_step if self.resumed_step >= 0 else -1,
                "synced_at_s": self.synced_at_s, "recovery_s": self.synced_at_s - self.restarted_at_s}


@dataclass(frozen=True)
class Waiting:
    """A member waiting for its neighbours (``Node.start_wait``), then to sync or start."""

    since_s: float
    sync: bool       # joins late or restarts: asks its neighbours for their state first
    resumed: bool    # restarted from its checkpoint


class SimPeer:
    """One member: its trainer, machine, endpoint, liveness and counters."""

    def __init__(self, name: str, index: int, identity: Identity, endpoint: Endpoint, behaviour: str, *,
                 neighbours: Iterable[str], node: Callable[[SimPeer], Node[Neighbour]],
                 checkpoint: CheckpointConfig) -> None:
        self.name = name
        self.index = index
        self.identity = identity
        self.endpoint = endpoint
        self.behaviour = behaviour
        self.alive = False
        self.started = False  # ever started (a member that joins later has not, until it joins)
        self.incarnation = 0
        self.timers: dict[str, int] = {}
        self.timer_tokens = 0
        self.work_index = 0
        self.send_index = 0
        self.bytes_sent = 0
        self.payload_bytes_sent = 0
        self.messages_sent = 0
        self.sent_by_kind: Counter[str] = Counter()   # messages, times recipients, by kind
        self.bytes_by_kind: Counter[str] = Counter()  # their wire bytes, by kind
        self.started_at_s = math.nan                  # when it first started its rounds
        self.steps_done = 0
        self.restarts = 0
        self.rejections: Counter[str] = Counter()  # from endpoints retired by restarts
        self.dropped: Counter[str] = Counter()     # this member's messages that never arrived
        self.metric_last: dict[str, float] = {}
        self.captured: dict[tuple[str, ...], list[bytes]] = {}  # stale-replay: first frames per recipients
        self.checkpoint: SimCheckpoint | None = None
        self.saves = CheckpointSchedule(checkpoint)  # when the next one is due (after a step jump: at once)
        self.restarts_detail: list[RestartRecord] = []
        self.pending_work: WorkDone | None = None  # asked for, its maths done, its time not yet up
        self.last_loss = math.nan                  # what its heartbeats say
        self.waiting: Waiting | None = None        # waiting for its neighbours before its first round
        self.resumed = False                       # this life began from its checkpoint
        self.stranded = ""                         # why it stopped short of the end (Node.judge)
        self.deferred_steps = 0  # work a schedule's hold keeps back
        self.trainer_steps_set: list[int] = []  # each SetTrainerStep (catch-up, sync), as the daemon shows
        self.neighbour_names = tuple(sorted(neighbours))
        self.node = node(self)  # machine, state sync, failure detector, early messages: protocols/node

    def fresh_neighbours(self) -> dict[str, Neighbour]:
        """What a (re)started member knows of its neighbours: nothing yet."""
        return {name: Neighbour() for name in self.neighbour_names}

    def all_rejections(self) -> Counter[str]:
        return self.rejections + self.endpoint.rejections + self.node.all_rejections()


class GossipRun:
    """Everything a gossip scenario needs in the engine; :meth:`run` returns the result."""

    def __init__(self, world: World, progress: Progress | None = None, *,
                 faults: Schedule | None = None) -> None:
        """``faults``: a test's fault schedule (see the module docstring)."""
        from protocols.gossip import make_machine

        self.world = world
        self.scenario = world.scenario
        self.engine = world.engine
        assert world.network is not None
        self.network = world.network
        self.config = world.scenario.gossip_config()
        self._make_machine = make_machine
        names = world.names
        identities = {name: sim_identity(self.scenario.seed, name) for name in names}
        # Addresses are nominal (a roster requires one; nothing is ever dialled in a simulation).
        self.roster = Roster(members=tuple(
            Member(name=name, public_id=identities[name].public_id, address=f"tcp://127.0.0.1:{20000 + i}")
            for i, name in enumerate(names)))
        self.run_id = run_id({"scenario": self.scenario.name, "seed": self.scenario.seed})
        self.rogue = sim_identity(self.scenario.seed, "rogue", "forged-key")
        self.node_config = self.scenario.nodes.node_config()
        self.peers: dict[str, SimPeer] = {}
        for index, name in enumerate(names):
            endpoint = Endpoint(identities[name], self.roster, self.run_id, epoch=0)
            self.peers[name] = SimPeer(name, index, identities[name], endpoint, self.scenario.behaviour(name),
                                       neighbours=world.neighbours(name), node=self._node,
                                       checkpoint=self.scenario.checkpoint)
        self.result = new_result(world, f"gossip:{self.config.algorithm}")
        for _, peer in sorted(self.peers.items()):   # every member derives the same settings: say each once
            self.result.notes.extend(n for n in peer.node.machine.notes() if n not in self.result.notes)
        self.recorder = Recorder(world, self.result, running=lambda n: self.peers[n].alive,
                                 bytes_sent=self._bytes_sent, progress=progress)
        self.schedule = faults or Schedule()
        self.reached: dict[str, int] = {}  # each member's latest work-point round
        self.faults = {name: MemberFaults(self.schedule, name, reached=lambda m: self.reached.get(m, -1))
                       for name in names}
        self._joined: set[str] = set()
        self._stopped: dict[str, Stop] = {}  # stopped by the schedule, waiting to restart
        self._restartable: set[str] = set()  # members a crash brings back: their state at start is kept
        self._step_crashes: list[ChurnEvent] = []  # armed crashes placed on progress, in time order

    def _node(self, peer: SimPeer) -> Node[Neighbour]:
        trainer = self.world.trainers[peer.name]
        node = Node(peer.name, self._machine(peer.name), neighbours=peer.fresh_neighbours(),
                    config=self.node_config, early_per_neighbour=self.config.max_rounds_ahead + 1,
                    # what the machine mixes (buffers too when averaged), as it is between rounds
                    answer_source=lambda: (trainer.mixed.detach().clone(), trainer.step))
        node.set_membership(self.roster, self.world.topology)
        return node

    def _machine(self, name: str) -> Machine:
        trainer = self.world.trainers[name]
        # trainer.mixed: the parameters, and the floating buffers when trainer.buffers = "average";
        # the shapes as the daemon gives them (peer/runtime/assemble.py), so per-layer compressors match it
        machine: Machine = self._make_machine(
            self.config, name=name, topology=cast(Any, self.world.topology), params=trainer.mixed,
            seed=self.scenario.seed, shapes=trainer.mixed_shapes, trained_numel=trainer.flat_params.numel())
        return machine

    def _bytes_sent(self) -> int:
        return sum(peer.bytes_sent for _, peer in sorted(self.peers.items()))

    # ------------------------------------------------------------ running

    def run(self) -> ScenarioResult:
        started = time.perf_counter()  # wall time for the progress line only; never in the result
        self.begin()
        self.engine.run(until_s=self.scenario.duration_s)
        return self.end(time.perf_counter() - started)

    def begin(self) -> None:
        """Schedule the starts, the churn and the evaluations (a test may then step the engine)."""
        churn = churn_events(self.scenario, self.world.names)
        joins_later = {e.node for e in churn if e.kind == "join"} | self.schedule.joins_later()
        first_join = {e.node: e.at_s for e in sorted(churn, key=lambda e: e.at_s) if e.kind == "join"}
        first = [peer for name, peer in sorted(self.peers.items())
                 if name not in joins_later or first_join.get(name, math.inf) <= 0.0]
        self.engine.at(0.0, functools.partial(self._start_together, first))
        self._restartable = {e.node for e in churn if e.kind == "restart" or e.down_s >= 0}
        for event in churn:
            if event.kind == "join" and event.at_s <= 0.0:
                continue
            arm = self._step_crashes.append if event.at_step >= 0 else self._churn
            self.engine.at(max(event.at_s, 0.0), functools.partial(arm, event))
        self.recorder.start()
        self.engine.at(0.0, self._check_liveness)

    def _check_liveness(self) -> None:
        """Every running member's failure detector (protocols/node/neighbours.py), every quarter of
        the timeout: the silent neighbours go down."""
        now = self.engine.now_s
        for _, peer in sorted(self.peers.items()):
            if peer.alive and peer.waiting is None:
                syncing = peer.node.syncing
                silent, actions = peer.node.expire(now)
                self._carry_out(peer, actions)
                if syncing and not peer.node.syncing:  # a silent neighbour was all it still waited for
                    self._synced(peer, unanswered=False)
                elif silent and peer.node.started and not peer.node.finished:
                    why = peer.node.judge(resumed=peer.resumed, start_wait_over=True)
                    if why:
                        self._strand(peer, why)
        self.engine.at(now + self.node_config.neighbour_timeout_s / 4, self._check_liveness)

    def _tick(self, peer: SimPeer, incarnation: int) -> None:
        """The member's heartbeat (the Node's, when due) and, while it waits, whether the wait is over."""
        if peer.incarnation != incarnation:
            return
        self._carry_out(peer, peer.node.tick(self.engine.now_s, step=self.world.trainers[peer.name].step,
                                             loss=peer.last_loss))
        if peer.waiting is not None:
            self._check_wait(peer)
        self.engine.at(peer.node.next_beat_s, functools.partial(self._tick, peer, incarnation))

    def end(self, wall_s: float = 0.0) -> ScenarioResult:
        """Evaluate everyone once more and fill in the result."""
        self.recorder.evaluate()
        result = self.result
        result.simulated_time_s = self.engine.now_s
        result.events_run = self.engine.events_run
        result.wall_s = wall_s
        for name, peer in sorted(self.peers.items()):
            metrics = self.recorder.final_peer_metrics(name)
            result.peers[name] = {
                "behaviour": peer.behaviour, "running": peer.alive, "finished": peer.node.finished,
                "steps": self.world.trainers[name].step, "restarts": peer.restarts,
                "restarts_detail": [r.as_dict() for r in peer.restarts_detail],
                "final_loss": metrics.get("loss"), "final_accuracy": metrics.get("accuracy"),
                "bytes_sent": peer.bytes_sent, "payload_bytes_sent": peer.payload_bytes_sent,
                "messages_sent": peer.messages_sent,
                "messages_sent_by_kind": dict(sorted(peer.sent_by_kind.items())),
                "bytes_sent_by_kind": dict(sorted(peer.bytes_by_kind.items())),
                "started_at_s": peer.started_at_s,
                "state_sync": dict(sorted(peer.node.sync.outcomes.items())), "stranded": peer.stranded,
                "sync_answers_sent": peer.node.sync.answers_sent,
                "early_held": peer.node.early.held_total,
                "trainer_steps_set": list(peer.trainer_steps_set),
                "rejections": dict(sorted(peer.all_rejections().items())),
                "metrics": {key: peer.metric_last[key] for key in sorted(peer.metric_last)},
            }
            merge_counts(result.rejections, peer.all_rejections())
            merge_counts(result.dropped, peer.dropped)
        merge_counts(result.dropped, self.network.dropped)
        result.links = self.network.traffic()
        # Machines report running totals (counters) and gauges ("round"): the sum and the largest.
        for _, peer in sorted(self.peers.items()):
            for key, value in sorted(peer.metric_last.items()):
                result.metrics[key] = result.metrics.get(key, 0.0) + value
                result.metrics[f"{key}.max"] = max(result.metrics.get(f"{key}.max", value), value)
        result.metrics = dict(sorted(result.metrics.items()))
        return result

    # ------------------------------------------------------------ lifecycle

    def _start_together(self, peers: list[SimPeer]) -> None:
        """The members there from the start, launched at once: each then waits for its neighbours."""
        for peer in peers:
            peer.alive = True
        for peer in peers:
            self._start(peer)

    def _start(self, peer: SimPeer, *, sync: bool = False, resumed: bool = False) -> None:
        """The member's process is up: it heartbeats and waits for its neighbours (``_check_wait``)."""
        peer.alive = True
        peer.started = True
        peer.waiting = Waiting(since_s=self.engine.now_s, sync=sync, resumed=resumed)
        peer.resumed = resumed
        peer.stranded = ""
        if peer.checkpoint is None and peer.name in self._restartable:
            self._save(peer)  # no checkpoint yet: a crash restarts it from here
        self._tick(peer, peer.incarnation)

    def _check_wait(self, peer: SimPeer) -> None:
        """Whether its wait for its neighbours is over (``Node.start_wait``, as in the daemon); then
        it asks for their state (a late joiner, a restart, or one that finds the network ahead)
        or starts its rounds."""
        waiting = peer.waiting
        assert waiting is not None
        # under a test's schedule, as in the daemon: members it starts later are not waited for,
        # and every running neighbour is (no far-ahead shortcut): a sync then asks them all
        later = self.schedule.joins_later()
        ahead_steps = (math.inf if self.schedule.faults
                       else self.config.max_rounds_ahead * self.config.local_steps)
        outcome = peer.node.start_wait(waited_s=self.engine.now_s - waiting.since_s, resumed=waiting.resumed,
                                       ahead_steps=ahead_steps, later=later)
        if outcome is Wait.WAIT:
            return
        peer.waiting = None
        if waiting.sync or outcome is Wait.JOIN:
            self._asked(peer, peer.node.begin_sync(resumed=waiting.resumed))
        else:
            self._begin(peer)

    def _asked(self, peer: SimPeer, actions: list[NodeAction]) -> None:
        """One state-sync attempt made (its timeout set), or, synced or none left, start."""
        self._carry_out(peer, actions)
        if not peer.node.syncing:
            self._synced(peer, unanswered=peer.node.adoption is None)
            return
        attempt = peer.node.sync.attempts_made
        self.engine.after(self.node_config.sync_timeout_s,
                          functools.partial(self._sync_timeout, peer, peer.incarnation, attempt))

    def _synced(self, peer: SimPeer, *, unanswered: bool) -> None:
        """The state sync is over: the member starts, unless the Node finds nobody left to train
        with (as the daemon does after its sync)."""
        if peer.resumed and peer.restarts_detail and math.isnan(peer.restarts_detail[-1].synced_at_s):
            peer.restarts_detail[-1].synced_at_s = self.engine.now_s
        why = peer.node.judge(resumed=peer.resumed, start_wait_over=unanswered)
        if why:
            self._strand(peer, why)
        else:
            self._begin(peer)

    def _strand(self, peer: SimPeer, why: str) -> None:
        """The member stops short of the end (the daemon exits with status 3), its state kept."""
        peer.stranded = why
        self._stop(peer, keep_checkpoint=True)
        self._maybe_end()

    def _maybe_end(self) -> None:
        if all(p.node.finished or not p.alive for _, p in sorted(self.peers.items())):
            self.engine.stop()

    def _begin(self, peer: SimPeer) -> None:
        """Start the machine (the Node hands it what arrived before; a machine restored at a work
        point asks for that work again: protocols/gossip)."""
        if math.isnan(peer.started_at_s):
            peer.started_at_s = self.engine.now_s
        self._carry_out(peer, peer.node.start(self.engine.now_s))

    def _sync_timeout(self, peer: SimPeer, incarnation: int, attempt: int) -> None:
        if peer.incarnation == incarnation and peer.node.syncing and peer.node.sync.attempts_made == attempt:
            self._asked(peer, peer.node.sync_timed_out())


    def _churn(self, event: ChurnEvent) -> None:
        peer = self.peers[event.node]
        if event.kind in ("crash", "leave"):
            if not peer.alive:
                return
            if event.kind == "crash":
                self._crash(peer)
                if event.down_s >= 0:
                    self.engine.after(event.down_s, functools.partial(
                        self._churn, ChurnEvent(node=peer.name, kind="restart", at_s=self.engine.now_s)))
                return
            self._stop(peer, keep_checkpoint=False)
            if event.kind == "leave":  # a goodbye; a crash is noticed by the failure detector
                for other in peer.node.neighbourhood.names():
                    neighbour = self.peers[other]
                    if neighbour.alive:
                        self._carry_out(neighbour, neighbour.node.goodbye(peer.name, self.engine.now_s))
        elif event.kind == "restart":
            if peer.alive or peer.checkpoint is None:
                return
            self._restart(peer)
        elif event.kind == "join" and not peer.alive and not peer.started:
            self._start(peer, sync=True)

    def _restart(self, peer: SimPeer) -> None:
        """From its checkpoint, syncing first (a schedule's stop)."""
        self._restore(peer)
        self._start(peer, sync=True, resumed=True)

    def _crash(self, peer: SimPeer) -> None:
        """A ``kill -9``: what it did since its last checkpoint is lost (restored at the restart)."""
        pending = peer.pending_work.steps if peer.pending_work is not None else 0
        peer.restarts_detail.append(RestartRecord(crashed_at_s=self.engine.now_s,
                                                  reached_step=self.world.trainers[peer.name].step - pending))
        self._stop(peer, keep_checkpoint=False)
        peer.pending_work = None  # its maths were done on a state the restart throws away

    def _save(self, peer: SimPeer) -> None:
        """Write its checkpoint now (a work point's: its work asked for, not done; or a clean stop's)."""
        trainer = self.world.trainers[peer.name]
        trainer_state = trainer.state_dict()
        tensors, meta = peer.node.machine.export_state()
        peer.checkpoint = SimCheckpoint(
            step=trainer.step,
            trainer={"tensors": {k: v.clone() for k, v in trainer_state["tensors"].items()},
                     "meta": dict(trainer_state["meta"])},
            machine=({k: v.clone() for k, v in tensors.items()}, _deep_copy(meta)),
            endpoint=peer.endpoint.export_state())
        peer.saves.saved(trainer.step, self.engine.now_s)

    def _stop(self, peer: SimPeer, *, keep_checkpoint: bool) -> None:
        if keep_checkpoint:
            self._save(peer)  # a clean stop: its state now
        peer.alive = False
        peer.waiting = None
        peer.deferred_steps = 0
        peer.node.stop()
        peer.incarnation += 1  # pending work, timers and deliveries of this life are void
        peer.timers.clear()

    def _restore(self, peer: SimPeer) -> None:
        checkpoint = peer.checkpoint
        assert checkpoint is not None
        # a copy each time: the trainer and machine take the tensors over, and a later crash may
        # restart from the same checkpoint
        self.world.trainers[peer.name].load_state_dict(
            {"tensors": {k: v.clone() for k, v in checkpoint.trainer["tensors"].items()},
             "meta": dict(checkpoint.trainer["meta"])})
        machine = self._machine(peer.name)
        machine.restore_state(({k: v.clone() for k, v in checkpoint.machine[0].items()},
                               _deep_copy(checkpoint.machine[1])))
        endpoint_state = checkpoint.endpoint
        peer.pending_work = None
        peer.saves = CheckpointSchedule(self.scenario.checkpoint, start_step=checkpoint.step)
        if peer.restarts_detail and peer.restarts_detail[-1].resumed_step < 0:
            peer.restarts_detail[-1].restarted_at_s = self.engine.now_s
            peer.restarts_detail[-1].resumed_step = checkpoint.step
        peer.node.restart(machine, peer.fresh_neighbours())
        peer.rejections += peer.endpoint.rejections
        peer.endpoint = Endpoint(peer.identity, self.roster, self.run_id, epoch=peer.endpoint.epoch + 1)
        peer.endpoint.restore_state(endpoint_state)
        peer.restarts += 1

    # ------------------------------------------------------------ events and actions

    def _feed(self, peer: SimPeer, event: Event) -> None:
        if peer.alive:
            self._carry_out(peer, peer.node.handle(event, self.engine.now_s))

    def _carry_out(self, peer: SimPeer, actions: list[NodeAction]) -> None:
        incarnation = peer.incarnation
        for action in actions:
            if peer.incarnation != incarnation:
                return  # stopped (a schedule's stop at its work point): the rest died with it
            self._act(peer, action)

    def _act(self, peer: SimPeer, action: NodeAction) -> None:
        now = self.engine.now_s
        match action:
            case Send():
                self._send(peer, action)
            case StartWork(steps=steps):
                self._work_point(peer, steps)
            case SetTimer(key=key, at=at):
                peer.timer_tokens += 1
                peer.timers[key] = peer.timer_tokens
                self.engine.at(max(at, now), functools.partial(
                    self._timer, peer, peer.incarnation, key, peer.timer_tokens))
            case CancelTimer(key=key):
                peer.timers.pop(key, None)
            case Metric(name=name, value=value):
                peer.metric_last[name] = float(value)
            case Finished():
                if peer.node.left:      # removed by a roster version: gone, like a member that left
                    peer.alive = False
                self._maybe_end()
            case SetTrainerStep(step=step):
                peer.saves.step_set(self.world.trainers[peer.name].step, step)
                self.world.trainers[peer.name].step = step  # the learning-rate schedule follows the network
                peer.trainer_steps_set.append(step)
            case Note():
                pass  # the operator's lines: a simulation reports counters instead
            case Connect(roster=roster, neighbours=neighbours):
                peer.endpoint.set_roster(roster)   # links need no dialling: the network model reaches all
                peer.neighbour_names = neighbours

    def change_roster(self, roster: Roster, topology: Topology, *, skip: Collection[str] = ()) -> None:
        """Every running member (but ``skip``: it never learns) learns roster ``roster`` (graph
        ``topology`` over its members) now; each applies it from ``roster.effective_round``
        (protocols/node/membership.py)."""
        now = self.engine.now_s
        for _, peer in sorted(self.peers.items()):
            if peer.alive and peer.name not in skip:
                self._carry_out(peer, peer.node.change_membership(roster, topology, now,
                                                                  make_neighbour=Neighbour))

    def _work(self, peer: SimPeer, steps: int) -> None:
        """Run ``steps`` real SGD steps now; ``WorkDone`` comes after their modelled time."""
        loss = self.world.trainers[peer.name].run_steps(steps)
        duration_s = work_seconds(self.scenario, self.world.speeds[peer.name], peer.name,
                                  peer.work_index, steps)
        peer.work_index += 1
        peer.steps_done += steps
        peer.pending_work = WorkDone(steps, loss)
        self.engine.at(self.engine.now_s + duration_s, functools.partial(
            self._work_done, peer, peer.incarnation))

    # ------------------------------------------------------------ a test's fault schedule

    def _work_point(self, peer: SimPeer, steps: int) -> None:
        """The round's messages are out, its steps not done: what the schedule fires here, then the
        work (unless a hold keeps it back, or a stop ends this life). A checkpoint is written here
        when due, and a crash placed on progress fires here."""
        trainer_step = self.world.trainers[peer.name].step
        if peer.name in self._restartable and peer.saves.should_save(trainer_step, self.engine.now_s):
            self._save(peer)  # (only a member a crash brings back needs one)
        crash = next((e for e in self._step_crashes if e.node == peer.name and trainer_step >= e.at_step),
                     None)
        if crash is not None:
            self._step_crashes.remove(crash)
            self._churn(crash)
            return
        if not self.schedule.faults:
            self._work(peer, steps)
            return
        round_index = peer.node.machine.position[0]
        self.reached[peer.name] = max(self.reached.get(peer.name, -1), round_index)
        self._heal(peer)  # before a hold is released by the same condition
        faults = self.faults[peer.name]
        for fault in faults.work_point(round_index):
            match fault:
                case Stop():
                    self._stop(peer, keep_checkpoint=True)  # as a SIGTERM: its state is the checkpoint
                    self._stopped[peer.name] = fault
                case Flood(to=to, requests=requests):
                    for _ in range(requests):
                        self._send(peer, Send((to,), StateSyncRequest(reason="flood")))
                case Cut():
                    for name in sorted(fault.across(peer.name) & set(peer.neighbour_names)):
                        self._feed(peer, NeighbourDown(name))
        if peer.alive:
            if faults.holding():
                peer.deferred_steps = steps
            else:
                self._work(peer, steps)
        self.engine.at(self.engine.now_s, self._check_schedule)

    def _heal(self, peer: SimPeer) -> None:
        """Its neighbours across a cut whose heal condition is met: up again for the machine."""
        for other in self.faults[peer.name].heals():
            if other in peer.neighbour_names:
                self._feed(peer, NeighbourUp(other))

    def _check_schedule(self) -> None:
        """Whatever conditions the last work point met: joins, restarts, heals, then holds released."""
        def reached(member: str) -> int:
            return self.reached.get(member, -1)

        for join in self.schedule.joins():
            if join.member not in self._joined and met(join.when, reached):
                self._joined.add(join.member)
                self.engine.after(PROCESS_START_S, functools.partial(self._start, self.peers[join.member],
                                                                     sync=True))
        for name, stop in sorted(self._stopped.items()):
            if met(stop.restart_when, reached):
                del self._stopped[name]
                self.engine.after(PROCESS_START_S, functools.partial(self._restart, self.peers[name]))
        for _, peer in sorted(self.peers.items()):
            if peer.alive:
                self._heal(peer)
        for _, peer in sorted(self.peers.items()):
            if peer.alive and peer.deferred_steps and not self.faults[peer.name].holding():
                steps, peer.deferred_steps = peer.deferred_steps, 0
                self._work_point(peer, steps)  # faults after the hold fire now, then the work

    def _work_done(self, peer: SimPeer, incarnation: int) -> None:
        if peer.incarnation == incarnation and peer.pending_work is not None:
            event, peer.pending_work = peer.pending_work, None
            peer.last_loss = event.loss
            self._feed(peer, event)

    def _timer(self, peer: SimPeer, incarnation: int, key: str, token: int) -> None:
        if peer.incarnation == incarnation and peer.timers.get(key) == token:
            del peer.timers[key]
            self._feed(peer, TimerFired(key))

    # ------------------------------------------------------------ the wire

    def _seal(self, peer: SimPeer, recipients: tuple[str, ...], message: Message) -> list[bytes]:
        behaviour = peer.behaviour
        if behaviour == "forged-key":
            keys = [self.roster.member(r).public_key for r in recipients]
            forged = encode(message, identity=self.rogue, recipients=keys, run_id=self.run_id,
                            epoch=peer.endpoint.epoch, seq=peer.send_index)
            return [bytes(f) for f in forged]
        frames = [bytes(f) for f in peer.endpoint.seal(recipients, message)]
        if behaviour == "forged-signature":
            return flip_signature(frames)
        if behaviour == "stale-replay":
            captured = peer.captured.setdefault(recipients, frames)
            return captured
        return frames

    def _send(self, peer: SimPeer, send: Send) -> None:
        now = self.engine.now_s
        recipients = tuple(send.recipients)
        message = tamper(send.message, peer.behaviour, self.scenario.faults.attack, seed=self.scenario.seed,
                         name=peer.name, index=peer.send_index)
        frames = self._seal(peer, recipients, message)
        index = peer.send_index
        peer.send_index += 1
        nbytes = wire_size(frames)
        payload = nbytes - len(frames[0]) - len(frames[-1])
        fraction = self.scenario.verify_fraction
        for recipient in recipients:
            if self.faults[peer.name].drops(recipient, send.message):
                peer.dropped["schedule_cut"] += 1  # a test's cut (the daemon: test_cut_dropped)
                continue
            peer.bytes_sent += nbytes
            peer.payload_bytes_sent += payload
            peer.messages_sent += 1
            peer.sent_by_kind[message.KIND] += 1
            peer.bytes_by_kind[message.KIND] += nbytes
            transfer = self.network.transmit(peer.name, recipient, nbytes, now)
            if transfer.arrival_s is None:
                peer.dropped[transfer.dropped or "dropped"] += 1
                continue
            verify = (fraction >= 1.0 or peer.behaviour in _ALWAYS_VERIFIED
                      or uniform(self.scenario.seed, f"{peer.name}->{recipient}", index, "verify") < fraction)
            # Verified: each recipient its own copy of the bytes, as off a socket. Sampled out: the
            # sender's message object itself (a machine never modifies a Send's tensors, nor a
            # received message's, which off the wire are read-only views of the frames).
            delivery: list[bytes] | Message = [bytes(f) for f in frames] if verify else message
            self.engine.at(transfer.arrival_s,
                           functools.partial(self._arrive, peer.name, recipient, delivery))

    def _arrive(self, sender: str, recipient: str, delivery: list[bytes] | Message) -> None:
        peer = self.peers[recipient]
        if not peer.alive:
            self.peers[sender].dropped["receiver_down"] += 1
            return
        if isinstance(delivery, list):
            opened = peer.endpoint.open(delivery, now_s=self.engine.now_s)
            if not isinstance(opened, Opened):
                return  # counted by the endpoint, by reason
            sender, message = opened.sender, opened.message
        else:
            message = delivery
        was_syncing = peer.node.syncing
        self._carry_out(peer, peer.node.receive(sender, message, self.engine.now_s))
        if peer.waiting is not None:
            self._check_wait(peer)
        elif was_syncing and not peer.node.syncing:  # an answer was taken
            self._synced(peer, unanswered=False)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


def run_gossip(world: World, progress: Progress | None = None) -> ScenarioResult:
    return GossipRun(world, progress).run()

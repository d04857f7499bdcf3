"""The simulator's host of gossip members: the same Member, Node and machines the daemon runs.

For each member: a real :class:`peer.train.trainer.Trainer`, a machine from
:func:`protocols.gossip.make_machine` mixing the trainer's ``mixed`` vector in
place, a :class:`protocols.wire.Endpoint`, and its lifecycle,
protocols/node/member.py's :class:`Member` (start wait, state sync, stranded
verdict, work points, checkpoints due, a test's fault schedule ``faults``),
whose actions protocols/node/host.py's :class:`Host` carries out through
:class:`SimPort`. This module adds the engine, the links and the copies:

* ``Train(n)``: the trainer runs ``n`` real SGD steps now; ``WorkDone`` is
  fed ``n * step_time`` (modelled) later.
* ``Send``: sealed by the sender's Endpoint (real signature, real bytes); each
  copy crosses the link model and is opened by the recipient's Endpoint
  (rejections counted by reason), then handed in as ``Arrived``.
* ``Checkpoint``: trainer, machine and replay windows copied; a crash (a
  ``kill -9``, on time or on progress: ``ChurnEvent.at_step``) restarts from it
  with the next epoch (``restarts_detail``: steps lost, ``recovery_s``).
* heartbeats every ``heartbeat_interval_s`` and the failure detector every
  quarter of ``neighbour_timeout_s`` (``Beat``, ``Expire``); a leave says goodbye.
* a schedule's joins and restarts start processes ``PROCESS_START_S`` after their
  condition is met, checked after every work point at one virtual instant.

``verify_fraction < 1`` (scale runs only): each honest message is opened by the
codec with that probability (a counter-based draw per link and message); the
others are handed over as the sender's object, same delay, same byte count.
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
from protocols.events import Finished, Machine, Send, SetTrainerStep, TimerFired, WorkDone
from protocols.identity import Identity
from protocols.messages import Message
from protocols.node import Neighbour, Node, Note
from protocols.node import member as lifecycle
from protocols.node.host import Host
from protocols.node.membership import Connect
from protocols.node.schedule import Condition, Schedule, met
from protocols.roster import Member as RosterMember
from protocols.roster import Roster, run_id
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


class SimPeer:
    """One member: its trainer's place in the engine, its Member, Host, endpoint and counters."""

    def __init__(self, name: str, index: int, identity: Identity, endpoint: Endpoint, behaviour: str, *,
                 neighbours: Iterable[str], node: Callable[[SimPeer], Node[Neighbour]],
                 member: Callable[[Node[Neighbour]], lifecycle.Member[Neighbour]],
                 host: Callable[[SimPeer], Host]) -> None:
        self.name = name
        self.index = index
        self.identity = identity
        self.endpoint = endpoint
        self.behaviour = behaviour
        self.alive = False
        self.started = False  # ever started (a member that joins later has not, until it joins)
        self.work_index = 0
        self.send_index = 0
        self.started_at_s = math.nan                  # when it first started its rounds
        self.steps_done = 0
        self.restarts = 0
        self.rejections: Counter[str] = Counter()  # from endpoints retired by restarts
        self.dropped: Counter[str] = Counter()     # this member's messages that never arrived
        self.captured: dict[tuple[str, ...], list[bytes]] = {}  # stale-replay: first frames per recipients
        self.checkpoint: SimCheckpoint | None = None
        self.restarts_detail: list[RestartRecord] = []
        self.pending_work: WorkDone | None = None  # asked for, its maths done, its time not yet up
        self.trainer_steps_set: list[int] = []  # each SetTrainerStep (catch-up, sync), as the daemon shows
        self.neighbour_names = tuple(sorted(neighbours))
        self.node = node(self)  # machine, state sync, failure detector, early messages: protocols/node
        self.member = member(self.node)   # its lifecycle around the Node
        self.host = host(self)            # what carries out the member's actions here

    @property
    def messages_sent(self) -> int:
        return self.host.counters.messages_sent

    @property
    def metric_last(self) -> dict[str, float]:
        return self.host.metrics

    def fresh_neighbours(self) -> dict[str, Neighbour]:
        """What a (re)started member knows of its neighbours: nothing yet."""
        return {name: Neighbour() for name in self.neighbour_names}

    def all_rejections(self) -> Counter[str]:
        return self.rejections + self.endpoint.rejections + self.node.all_rejections()


class SimPort:
    """The simulator's side of protocols/node/host.py's port, for one member."""

    def __init__(self, run: GossipRun, peer: SimPeer) -> None:
        self.run = run
        self.peer = peer

    def send(self, send: Send) -> None:
        self.run._send(self.peer, send)

    def work_point(self, steps: int) -> None:
        self.run._work_point(self.peer, steps)

    def train(self, steps: int) -> None:
        self.run._work(self.peer, steps)

    def save(self, final: bool) -> None:
        self.run._save(self.peer)

    def say(self, note: Note) -> None:
        pass  # the operator's lines: a simulation reports counters instead

    def connect(self, connect: Connect) -> None:
        self.peer.endpoint.set_roster(connect.roster)  # links need no dialling: the network reaches all
        self.peer.neighbour_names = connect.neighbours

    def wake(self, at: float, key: str, token: int) -> None:
        engine = self.run.engine
        engine.at(max(at, engine.now_s), functools.partial(self.run._timer, self.peer, self.peer.host.life,
                                                           key, token))

    def mark(self, action: Any) -> None:
        self.run._mark(self.peer, action)


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
            RosterMember(name=name, public_id=identities[name].public_id,
                         address=f"tcp://127.0.0.1:{20000 + i}") for i, name in enumerate(names)))
        self.run_id = run_id({"scenario": self.scenario.name, "seed": self.scenario.seed})
        self.rogue = sim_identity(self.scenario.seed, "rogue", "forged-key")
        self.node_config = self.scenario.nodes.node_config()
        self.schedule = faults or Schedule()
        self.reached: dict[str, int] = {}  # each member's latest work-point round
        self._churn_events = churn_events(self.scenario, names)
        # members a crash brings back: their state at start is kept, and a checkpoint when due
        self._restartable = {e.node for e in self._churn_events if e.kind == "restart" or e.down_s >= 0}
        self.peers: dict[str, SimPeer] = {}
        for index, name in enumerate(names):
            endpoint = Endpoint(identities[name], self.roster, self.run_id, epoch=0)
            self.peers[name] = SimPeer(name, index, identities[name], endpoint, self.scenario.behaviour(name),
                                       neighbours=world.neighbours(name), node=self._node,
                                       member=self._member,
                                       host=lambda peer: Host(peer.member.handle, SimPort(self, peer)))
        self.result = new_result(world, f"gossip:{self.config.algorithm}")
        for _, peer in sorted(self.peers.items()):   # every member derives the same settings: say each once
            self.result.notes.extend(n for n in peer.node.machine.notes() if n not in self.result.notes)
        self.recorder = Recorder(world, self.result, running=lambda n: self.peers[n].alive,
                                 bytes_sent=self._bytes_sent, progress=progress)
        self._joined: set[str] = set()
        self._stopped: dict[str, Condition] = {}  # stopped by the schedule, restarted once this is met
        self._step_crashes: list[ChurnEvent] = []  # armed crashes placed on progress, in time order

    def _node(self, peer: SimPeer) -> Node[Neighbour]:
        trainer = self.world.trainers[peer.name]
        node = Node(peer.name, self._machine(peer.name), neighbours=peer.fresh_neighbours(),
                    config=self.node_config, early_per_neighbour=self.config.max_rounds_ahead + 1,
                    # what the machine mixes (buffers too when averaged), as it is between rounds
                    answer_source=lambda: (trainer.mixed.detach().clone(), trainer.step))
        node.set_membership(self.roster, self.world.topology)
        return node

    def _member(self, node: Node[Neighbour]) -> lifecycle.Member[Neighbour]:
        ahead = lifecycle.ahead_steps(max_rounds_ahead=self.config.max_rounds_ahead,
                                      local_steps=self.config.local_steps,
                                      scheduled=bool(self.schedule.faults))
        config = lifecycle.MemberConfig(ahead_steps=ahead, checkpoint=self.scenario.checkpoint,
                                        keeps_checkpoints=node.name in self._restartable)
        return lifecycle.Member(node, config, schedule=self.schedule,
                                reached=lambda m: self.reached.get(m, -1))

    def _machine(self, name: str) -> Machine:
        trainer = self.world.trainers[name]
        # trainer.mixed: the parameters, and the floating buffers when trainer.buffers = "average";
        # the shapes as the daemon gives them (peer/runtime/assemble.py), so per-layer compressors match it
        machine: Machine = self._make_machine(
            self.config, name=name, topology=cast(Any, self.world.topology), params=trainer.mixed,
            seed=self.scenario.seed, shapes=trainer.mixed_shapes, trained_numel=trainer.flat_params.numel())
        return machine

    def _bytes_sent(self) -> int:
        return sum(peer.host.counters.wire_bytes_sent for _, peer in sorted(self.peers.items()))

    # ------------------------------------------------------------ running

    def run(self) -> ScenarioResult:
        started = time.perf_counter()  # wall time for the progress line only; never in the result
        self.begin()
        self.engine.run(until_s=self.scenario.duration_s)
        return self.end(time.perf_counter() - started)

    def begin(self) -> None:
        """Schedule the starts, the churn and the evaluations (a test may then step the engine)."""
        churn = self._churn_events
        joins_later = {e.node for e in churn if e.kind == "join"} | self.schedule.joins_later()
        first_join = {e.node: e.at_s for e in sorted(churn, key=lambda e: e.at_s) if e.kind == "join"}
        first = [peer for name, peer in sorted(self.peers.items())
                 if name not in joins_later or first_join.get(name, math.inf) <= 0.0]
        self.engine.at(0.0, functools.partial(self._start_together, first))
        for event in churn:
            if event.kind == "join" and event.at_s <= 0.0:
                continue
            arm = self._arm if event.at_step >= 0 else self._churn
            self.engine.at(max(event.at_s, 0.0), functools.partial(arm, event))
        self.recorder.start()
        self.engine.at(0.0, self._check_liveness)

    def _arm(self, event: ChurnEvent) -> None:
        """A crash placed on progress: the member fires it at its first work point at that step."""
        self._step_crashes.append(event)
        self.peers[event.node].member.handle(self.engine.now_s, lifecycle.ArmCrash(event.at_step))

    def _check_liveness(self) -> None:
        """Every running member's failure detector (protocols/node/neighbours.py), every quarter of
        the timeout: the silent neighbours go down (and may strand it)."""
        now = self.engine.now_s
        for _, peer in sorted(self.peers.items()):
            if peer.alive:
                peer.host.handle(now, lifecycle.Expire())
        self.engine.at(now + self.node_config.neighbour_timeout_s / 4, self._check_liveness)

    def _tick(self, peer: SimPeer, life: int) -> None:
        """The member's heartbeat (the Node's, when due) and, while it waits, whether the wait is over."""
        if peer.host.life != life:
            return
        peer.host.handle(self.engine.now_s, lifecycle.Beat())
        self.engine.at(peer.member.next_beat_s, functools.partial(self._tick, peer, life))

    def end(self, wall_s: float = 0.0) -> ScenarioResult:
        """Evaluate everyone once more and fill in the result."""
        self.recorder.evaluate()
        result = self.result
        result.simulated_time_s = self.engine.now_s
        result.events_run = self.engine.events_run
        result.wall_s = wall_s
        for name, peer in sorted(self.peers.items()):
            metrics = self.recorder.final_peer_metrics(name)
            counters = peer.host.counters
            result.peers[name] = {
                "behaviour": peer.behaviour, "running": peer.alive, "finished": peer.node.finished,
                "steps": self.world.trainers[name].step, "restarts": peer.restarts,
                "warnings": self.world.trainers[name].warnings(),
                "restarts_detail": [r.as_dict() for r in peer.restarts_detail],
                "final_loss": metrics.get("loss"), "final_accuracy": metrics.get("accuracy"),
                "bytes_sent": counters.wire_bytes_sent, "payload_bytes_sent": counters.payload_bytes_sent,
                "messages_sent": counters.messages_sent,
                "messages_sent_by_kind": dict(sorted(counters.messages_by_kind.items())),
                "bytes_sent_by_kind": dict(sorted(counters.wire_bytes_by_kind.items())),
                "started_at_s": peer.started_at_s,
                "state_sync": dict(sorted(peer.node.sync.outcomes.items())), "stranded": peer.member.stranded,
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

    # ------------------------------------------------------------ lifecycle: processes and checkpoints

    def _start_together(self, peers: list[SimPeer]) -> None:
        """The members there from the start, launched at once: each then waits for its neighbours."""
        for peer in peers:
            peer.alive = True
        for peer in peers:
            self._start(peer)

    def _start(self, peer: SimPeer, *, sync: bool = False, resumed: bool = False) -> None:
        """The member's process is up: it heartbeats and waits for its neighbours (``Launch``)."""
        peer.alive = True
        peer.started = True
        life = peer.host.life
        step = self.world.trainers[peer.name].step
        peer.host.handle(self.engine.now_s, lifecycle.Launch(step=step, sync=sync, resumed=resumed))
        self.engine.at(peer.member.next_beat_s, functools.partial(self._tick, peer, life))

    def _synced(self, peer: SimPeer) -> None:
        """Its state sync is over (adopted, refused or unanswered): a restart's recovery ends here."""
        if peer.member.resumed and peer.restarts_detail and math.isnan(peer.restarts_detail[-1].synced_at_s):
            peer.restarts_detail[-1].synced_at_s = self.engine.now_s

    def _maybe_end(self) -> None:
        if all(p.node.finished or not p.alive for _, p in sorted(self.peers.items())):
            self.engine.stop()

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
            self._stop(peer)
            if event.kind == "leave":  # a goodbye; a crash is noticed by the failure detector
                for other in peer.node.neighbourhood.names():
                    neighbour = self.peers[other]
                    if neighbour.alive:
                        neighbour.host.handle(self.engine.now_s, lifecycle.Goodbye(peer.name))
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
        self._stop(peer)
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

    def _stop(self, peer: SimPeer) -> None:
        """Its process is gone: pending work, timers and deliveries of this life are void."""
        peer.alive = False
        peer.host.handle(self.engine.now_s, lifecycle.Halt())
        peer.host.end_life()

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
        if peer.restarts_detail and peer.restarts_detail[-1].resumed_step < 0:
            peer.restarts_detail[-1].restarted_at_s = self.engine.now_s
            peer.restarts_detail[-1].resumed_step = checkpoint.step
        peer.node.restart(machine, peer.fresh_neighbours())
        peer.rejections += peer.endpoint.rejections
        peer.endpoint = Endpoint(peer.identity, self.roster, self.run_id, epoch=peer.endpoint.epoch + 1)
        peer.endpoint.restore_state(endpoint_state)
        peer.restarts += 1

    # ------------------------------------------------------------ what the member's host marks

    def _mark(self, peer: SimPeer, action: Any) -> None:
        now = self.engine.now_s
        match action:
            case Finished():
                if peer.node.left:      # removed by a roster version: gone, like a member that left
                    peer.alive = False
                self._maybe_end()
            case SetTrainerStep(step=step):
                self.world.trainers[peer.name].step = step  # the learning-rate schedule follows the network
                peer.trainer_steps_set.append(step)
            case lifecycle.Entered(phase=phase, was=was):
                if was is lifecycle.Phase.SYNCING:
                    self._synced(peer)
                if phase is lifecycle.Phase.TRAINING and math.isnan(peer.started_at_s):
                    peer.started_at_s = now
            case lifecycle.Exit(restart_when=restart_when):   # its checkpoint written: a clean stop
                self._stop(peer)
                if restart_when is not None:
                    self._stopped[peer.name] = restart_when
                    self.engine.at(now, self._check_schedule)
                else:
                    self._maybe_end()
            case lifecycle.Crash(at_step=at_step):
                event = next(e for e in self._step_crashes if e.node == peer.name and e.at_step == at_step)
                self._step_crashes.remove(event)
                self._churn(event)
            case lifecycle.Reached(round=round_index):
                self.reached[peer.name] = round_index
            case lifecycle.ScheduleMoved():
                self.engine.at(now, self._check_schedule)

    def change_roster(self, roster: Roster, topology: Topology, *, skip: Collection[str] = ()) -> None:
        """Every running member (but ``skip``: it never learns) learns roster ``roster`` (graph
        ``topology`` over its members) now; each applies it from ``roster.effective_round``
        (protocols/node/membership.py)."""
        now = self.engine.now_s
        for _, peer in sorted(self.peers.items()):
            if peer.alive and peer.name not in skip:
                peer.host.handle(now, lifecycle.RosterChange(roster, topology, Neighbour))

    def _feed(self, peer: SimPeer, event: Any) -> None:
        if peer.alive:
            peer.host.handle(self.engine.now_s, event)

    def _work_point(self, peer: SimPeer, steps: int) -> None:
        """The machine's work taken from the host's queue at once: the member's work point (a
        checkpoint when due, a crash placed on progress, the schedule's faults, then the work)."""
        self._feed(peer, lifecycle.WorkPoint(steps))

    def _work(self, peer: SimPeer, steps: int) -> None:
        """Run ``steps`` real SGD steps now; ``WorkDone`` comes after their modelled time."""
        loss = self.world.trainers[peer.name].run_steps(steps)
        duration_s = work_seconds(self.scenario, self.world.speeds[peer.name], peer.name,
                                  peer.work_index, steps)
        peer.work_index += 1
        peer.steps_done += steps
        peer.pending_work = WorkDone(steps, loss)
        self.engine.at(self.engine.now_s + duration_s, functools.partial(
            self._work_done, peer, peer.host.life))

    def _check_schedule(self) -> None:
        """Whatever conditions the last work point met: joins, restarts, heals, then holds released."""
        def reached(member: str) -> int:
            return self.reached.get(member, -1)

        for join in self.schedule.joins():
            if join.member not in self._joined and met(join.when, reached):
                self._joined.add(join.member)
                self.engine.after(PROCESS_START_S, functools.partial(self._start, self.peers[join.member],
                                                                     sync=True))
        for name, restart_when in sorted(self._stopped.items()):
            if met(restart_when, reached):
                del self._stopped[name]
                self.engine.after(PROCESS_START_S, functools.partial(self._restart, self.peers[name]))
        for event in (lifecycle.Heal(), lifecycle.Release()):
            for _, peer in sorted(self.peers.items()):
                self._feed(peer, event)

    def _work_done(self, peer: SimPeer, life: int) -> None:
        if peer.host.life == life and peer.pending_work is not None:
            event, peer.pending_work = peer.pending_work, None
            self._feed(peer, event)

    def _timer(self, peer: SimPeer, life: int, key: str, token: int) -> None:
        if peer.host.life == life and peer.host.timers.take(key, token) and peer.alive:
            peer.host.handle(self.engine.now_s, TimerFired(key))

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
            if peer.member.drops(recipient, send.message):
                peer.dropped["schedule_cut"] += 1  # a test's cut (the daemon: test_cut_dropped)
                continue
            peer.host.counters.count(message.KIND, wire_bytes=nbytes, payload_bytes=payload)
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
        peer.host.handle(self.engine.now_s, lifecycle.Arrived(sender, message))


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

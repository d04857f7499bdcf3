"""The peer daemon: drives one gossip state machine with ZeroMQ, the trainer and the wall clock.

A driver only — no protocol maths. One thread, one loop:

1. poll the inbox with a timeout equal to the next deadline (machine timers,
   heartbeat, status refresh);
2. open each message through the Endpoint (a rejection is counted, never
   raised); heartbeats and state-sync requests are the driver's own business,
   everything else goes to ``machine.handle(Received(...), now)``;
3. carry out the actions: ``Send`` -> seal once for all recipients -> one
   transport send each; ``StartWork(n)`` -> ``trainer.run_steps(n)`` (on a
   worker thread, while the loop heartbeats and reads; what arrives goes to
   the Node after the steps) -> ``WorkDone``; ``SetTimer`` -> a heap keyed by
   ``time.monotonic()``; ``Metric`` -> counters; ``Finished`` -> final
   evaluation, checkpoint, exit.

Before anything may change a tensor in place (training, or any event the
machine handles, since mixing happens there) the driver waits until ZeroMQ
has released every zero-copy frame it was given (``Transport.wait_sent``): up to
``[transport] send_timeout_s`` while a neighbour's connection still moves bytes
(a slow link), but no longer than the round deadline (``deadline_s``) once it
moves none (a cut): what it still holds is then abandoned and counted, so a cut
cable never stalls a peer for longer, and a slow one still gets its message.
The wait reads meanwhile (``Transport(while_waiting=...)``): frames go to the
endpoint, and the messages they complete to the Node once the wait is over. Two
peers waiting for their sends to each other without reading stalled each other
as soon as a message outgrew the receiving queue and the kernel's buffers.

The wire's two driver hooks (peer/net/digests.py): payload digests are computed
on a small thread pool (BLAKE3 releases the GIL; open copies frames while they
hash, and the loop's thread hashes too), and multi-frame tensors are gathered into a pool of reused receive
buffers, one handed out again only once nothing (the machine's round buffers
included) holds it, so a 100 MB model does not page-fault on every message.

Steps: the machine's ``steps_done`` is the schedule position; when it skips
rounds to catch up after a partition (protocols/gossip/rounds.py, "Catching
up"), or a state sync is adopted, it emits ``SetTrainerStep`` and the trainer's
step (its learning rate schedule) is set to match. ``step`` in the status is
the trainer's (it leads ``steps_done`` by the steps of a round still open),
``steps_done`` the machine's.

Start-up: the epoch is incremented and stored before the first message; a
checkpoint, if any, is restored; the peer then waits until it has heard every
neighbour (or ``start_timeout_s``); a restarted or late peer first asks its
neighbours for their state (StateSyncRequest) and adopts the best answer
(highest round, ties to the lowest name) once every neighbour it asked that is
up has answered, or the attempt's time is up (an unusable one is counted). Answering and
adopting are protocols/node's ``StateSync``, the simulator's too.

What a neighbour sends cannot grow memory or work without bound: messages
heard before training starts are held by protocols/node's ``EarlyMessages``
(per neighbour, the newest ``max_rounds_ahead + 1``, none from
non-neighbours); a neighbour's state-sync requests are answered at most once
per ``sync_answer_interval_s`` (``StateSync``). Each refusal is counted by
reason in the status's ``rejections`` (with the wire's own).
Test hooks (peer/runtime/testhooks.py) hold, kill or stop the peer when its trainer
reaches a given step, so process tests place faults on progress, not time. A
fault schedule keyed by rounds (protocols/node/schedule.py, which the simulator
honours too) fires at the work point of a round, before its steps are trained:
holds, a SIGTERM stop, a flood of state-sync requests, and cuts whose
neighbours go down and up for the machine by the schedule, never by a timeout.
A test may also have the peer write its parameters every few steps (a params
trace), to follow the consensus distance over time.

Membership changes without a restart (peer/runtime/rosterwatch.py): the periodic
pass re-reads the roster file when it changed; a later version goes to the
Node, which applies it from its ``effective_round`` and answers ``Connect``
(verify against this roster, exchange with these neighbours): the daemon dials
who is new and drops who left, and the transport admits the new roster's curve
keys only, shutting down a leaver's open connections. A gateway serves the new
version's edge clients (``Serving`` in protocols/node/membership.py: those its
config lists, or every one if it lists none, and those whose roster entry
names it) from its round on; their keys are admitted at once.
SIGHUP (``hivemesh roster reload``) makes the next periodic pass read the file
at once, changed or not, and say what it found (``SIGHUP: roster ... re-read``);
a SIGHUP that arrives before the daemon's handler is in place is ignored, never
fatal (the first pass reads the file anyway).

Only members reach the decoder (``[peer] curve``, on by default): a message is
opened only if its connection's CURVE key (ZAP's User-Id) is still admitted,
and its header is refused unless signed by the member whose curve key that
is (``connection_key_mismatch``, before its payload is read or the sender's
replay window moves), so no member speaks through another's connection. The
transport counts refused connections by reason (``transport_refused`` in the
status).

A gateway (the config has a ``[federation]`` table): the Node also hosts the
FedAvg (or FedBuff) server as its ``fedavg`` role, on the vector the gossip
machine mixes (the trainer's, which a gateway never trains), with the roster's
edge clients as the Node's ``clients``. A gossip round's work is a FedAvg round
or nothing (protocols/federation/interleave.py's ``GatewayWork``). Edge clients
dial in and listen nowhere, so what the gateway sends one goes back on the
connection its last accepted message came on (``Transport.reply``); a client's
connection is learnt only from a message the endpoint accepted (signature,
replay window), so a replayed or forged frame cannot redirect its replies.
The global model is evaluated after each closed round (``rounds.jsonl`` in
the data folder: one line per round, its report and accuracy); the status's
``federation`` block shows the round, who was asked, answered, late and
refused, and each client's last contact and bytes each way; with differential
privacy on, its ``privacy`` block and each round's ``epsilon`` the budget spent.

SIGHUP: re-read the roster now (above). SIGINT/SIGTERM: the loop ends at the
next turn (no training step or send is interrupted halfway), waits for sends in
flight, writes a checkpoint, exits 0.

Checkpoints (peer/files/statefiles.py ``CheckpointStore``): the store first
clears what a dead writer left (a complete copy is put back in place) before
anything is loaded; the schedule counts ``every_steps`` from the step on disk
(a gateway's steps are its rounds: it trains nothing; under FedBuff its model versions too),
and a step that jumps (``SetTrainerStep``: an adopted state sync, a catch-up)
is written at once, so a kill loses at most the interval. A save that fails (a
full disk) is said once (``cannot checkpoint: ...``), counted in the status,
and tried again an interval later; the peer trains on.

Neighbours that are gone for good (protocols/node/liveness.py decides): a
finishing peer says so in its heartbeats during its finish grace, and a
neighbour that then goes silent is recorded as finished, not down. A peer
with no neighbour up and one finished stops training alone; so does a peer
restarted from a checkpoint that hears no neighbour within
``neighbour_timeout_s`` and gets no answer to one state-sync attempt (its
neighbours finished while it was away). Either says why in one line naming
the neighbours, writes a checkpoint if it trained, and exits with status
``EXIT_STRANDED`` (3): the run did not complete for it. While it waits for its
neighbours at start-up it says whom it waits for, on change only
(``waiting for p01, p03 (1/3 up)``), and its status shows the same.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from peer.files.console import MismatchNotices, ensure_logging
from peer.files.keydir import find_identity
from peer.files.statefiles import CheckpointStore, StatusWriter
from peer.net.digests import BufferPool, ThreadDigester
from peer.net.transport import Arrival, Transport, TransportConfig, TransportError
from peer.runtime.assemble import Parts, assemble, gateway_serving, not_owned_hint, peer_topology, tcp_address
from peer.runtime.memory import peak_mib, resident_mib
from peer.runtime.peerconfig import PeerConfig, load_peer_config
from peer.runtime.rosterwatch import NewVersion, RosterWatch, Unusable
from peer.runtime.tensorboard import ScalarLog
from peer.runtime.testhooks import (
    Hook,
    Hooks,
    ParamsWriter,
    ScheduleFiles,
    hooks_from_environment,
    params_writer_from_environment,
    protocol_version_from_environment,
    save_point_from_environment,
    schedule_from_environment,
)
from peer.train.checkpoint import SavePoint
from protocols.assembly import AssemblyConfig, model_message_bytes
from protocols.consensus import max_relative_distance
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
from protocols.federation import report_row
from protocols.federation.interleave import GatewayWork
from protocols.messages import Heartbeat, Message, StateSyncRequest
from protocols.node import (
    Neighbour,
    Node,
    NodeAction,
    Note,
    Wait,
    waiting_line,
)
from protocols.node.checkpoints import CheckpointSchedule
from protocols.node.host import TimerTable
from protocols.node.member import EXIT_STRANDED, ahead_steps
from protocols.node.membership import Connect
from protocols.node.schedule import Cut, Flood, Stop
from protocols.roster import Roster
from protocols.wire import Opened, Rejection, wire_messages, wire_size
from topology.errors import HivemeshError

MAX_LATENCY_MS = 3_600_000.0   # a heartbeat "older" than an hour says the sender's clock is wrong
CLOCK_SKEW_MS = 1000.0     # clocks of different hosts may disagree this much without being absurd
SERVER_PREFIX = "fedavg/"     # a gateway's checkpoint: its server's tensors beside the machine's
ROUNDS_FILE = "rounds.jsonl"  # a gateway: one line per closed round (its report and the global accuracy)
# while the trainer's steps run, the loop reads its inbox this often: a poll drains up to 64 MiB, so
# this keeps up with a link of over 1 GB/s (and a step that ends wakes the loop at once)
WORK_LOOK_S = 0.02


@dataclass
class NeighbourInfo(Neighbour):
    """What protocols/node/neighbours.py tracks (up, last seen on the monotonic clock, step,
    finished), plus what only the daemon shows."""

    latency_ms: float = math.nan      # one-way, from the heartbeat's wall-clock stamp (same host: exact)
    params: torch.Tensor | None = None  # last full parameters heard (for the consensus estimate)
    reachable: bool = True            # the last message we sent it went out (its connection is up)


@dataclass
class Counters:
    payload_bytes_sent: int = 0        # tensor bytes in sealed messages, times recipients
    wire_bytes_sent: int = 0           # whole sealed messages, times recipients (what the wire carries)
    messages_sent: int = 0
    messages_sent_by_kind: Counter[str] = field(default_factory=Counter)  # heartbeat, param_push, ...
    wire_bytes_sent_by_kind: Counter[str] = field(default_factory=Counter)  # times recipients
    messages_accepted: int = 0
    wire_bytes_accepted_by_kind: Counter[str] = field(default_factory=Counter)
    unreachable: Counter[str] = field(default_factory=Counter)
    metrics: dict[str, float] = field(default_factory=dict)       # the machine's Metric actions, latest
    rejected: Counter[str] = field(default_factory=Counter)     # the driver's own refusals, by reason
    neighbour_down: Counter[str] = field(default_factory=Counter)   # times each went silent (timeout)
    neighbour_finished: Counter[str] = field(default_factory=Counter)  # went silent after saying it finished
    test_cut_dropped: Counter[str] = field(default_factory=Counter)  # "sent"/"received" by a cut test hook
    absent_at_start: Counter[str] = field(default_factory=Counter)  # not up when we started training
    bytes_received_from: Counter[str] = field(default_factory=Counter)  # accepted messages, by sender
    trainer_steps_set: list[int] = field(default_factory=list)  # each SetTrainerStep (catch-up, sync)
    client_bytes_sent: Counter[str] = field(default_factory=Counter)      # a gateway's, by edge client
    client_bytes_received: Counter[str] = field(default_factory=Counter)  # accepted, by edge client
    client_unreachable: Counter[str] = field(default_factory=Counter)     # no connection learnt yet / gone
    roster_reloads: int = 0            # SIGHUPs acted on (`hivemesh roster reload`)
    work_s: float = 0.0                # in the trainer's steps (the rest of train_s is the loop's)


class PeerDaemon:
    """One running peer. ``run()`` returns the process exit code."""

    def __init__(self, config: PeerConfig, *, parts: Parts | None = None, listen_fd: int | None = None,
                 hooks: Sequence[Hook] = (),
                 schedule_for: Callable[[str], ScheduleFiles | None] | None = None,
                 protocol_version: int | None = None, at_save_point: SavePoint | None = None,
                 params_trace: ParamsWriter | None = None) -> None:
        """``listen_fd``: a listening socket already bound to this peer's address (peer.runtime.launch);
        ``hooks``: test hooks, ``schedule_for``: this peer's side of a fault schedule, by its name,
        ``protocol_version``: the highest protocol version spoken, as by a member not yet upgraded,
        ``at_save_point``: a test hook inside checkpoint writes, ``params_trace``: a test's record of the
        parameters over time (both peer.runtime.testhooks)."""
        self.timeline: dict[str, float] = {"created": time.time()}   # wall-clock marks, for status
        self.config = config
        self.parts = parts or assemble(config)
        self.timeline["assembled"] = time.time()
        self.name = self.parts.name
        self.trainer = self.parts.trainer
        self.endpoint = self.parts.endpoint
        self.digester = ThreadDigester()    # busy only while a large message is sealed or opened
        # the trainer's steps run here while the loop keeps heartbeating and reading (_run_steps)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hivemesh-train")
        # what a machine holds at once: about one message per neighbour for this round and the next,
        # of the one size a model-sized tensor has (smaller ones arrive in one frame, not gathered)
        mixed = self.trainer.mixed
        pooled = 2 * len(self.parts.neighbours) + 2
        self.receive_buffers = BufferPool(max_buffers=pooled,
                                          max_bytes=pooled * mixed.numel() * mixed.element_size(),
                                          sizes=frozenset({(mixed.dtype, mixed.numel())}))
        # a message carries at most one model's worth, at the widest any codec writes it: the bound
        # on what one header may announce, and on one sender's bytes in flight
        policy = self.endpoint.policy
        message_bytes = model_message_bytes(mixed.numel(), header_bytes=policy.max_header_bytes)
        self.endpoint.use(allocate=self.receive_buffers.allocate, digest=self.digester,
                          policy=dataclasses.replace(policy, max_message_bytes=message_bytes,
                                                     max_elements=min(policy.max_elements, message_bytes)),
                          assembly=AssemblyConfig(max_in_flight_bytes=2 * message_bytes))
        # messages opened but not yet handed to the Node (those read while our sends were waited for),
        # with the connection each came on; a wait reads on while they hold less than one sender's
        # budget per neighbour
        self._opened_queue: deque[tuple[Opened | Rejection, bytes | None]] = deque()
        self._queued_bytes_limit = 2 * message_bytes * max(1, len(self.parts.neighbours))
        if protocol_version is not None:
            low, _ = self.endpoint.policy.accepted_versions
            self.endpoint.use(policy=dataclasses.replace(self.endpoint.policy,
                                                         accepted_versions=(low, protocol_version)))
        self.store = CheckpointStore(config.data_dir, keep=config.checkpoint.keep, at_point=at_save_point)
        # first, now the data folder is ours: a dead writer's temporaries (a complete one is put into
        # place), before anything is loaded or written (they may be what fills the disk)
        self._recovered = self.store.recover()
        self.schedule = CheckpointSchedule(config.checkpoint)
        self.status = StatusWriter(config.data_dir, name=self.name, progress=config.peer.progress,
                                   total_steps=config.gossip.total_steps)
        self.mismatches = MismatchNotices(self.name)     # a differently set-up member, said once
        self.transport: Transport | None = None
        self._listen_fd = listen_fd
        self._dialled = dict(self.parts.neighbours)   # name -> the address its socket dials
        self.hooks = Hooks(hooks)
        self.params_trace = params_trace
        self.faults = schedule_for(self.name) if schedule_for is not None else None
        self._was_held = False      # the schedule held the last work point
        trainer = self.trainer
        # the protocol around the machine, as the simulator hosts it (protocols/node/node.py); a
        # state-sync answer carries what the machine mixes, copied to the host (it may be sent
        # while mixing goes on), and the trainer's step
        self.node: Node[NeighbourInfo] = Node(
            self.name, self.parts.machine, neighbours={n: NeighbourInfo() for n in self.parts.neighbours},
            config=config.peer.node_config(),
            early_per_neighbour=config.gossip.max_rounds_ahead + 1,  # the machine buffers that many rounds
            answer_source=lambda: (trainer.host_mixed().detach().clone(), trainer.step),
            roles={"fedavg": self.parts.server} if self.parts.server is not None else None,
            clients=self.parts.clients,
            serving=gateway_serving(config, self.name) if self.parts.server is not None else None)
        # a gateway: what its gossip machine's work is, and the connection each edge client dialled
        self.gateway_work = (GatewayWork(self.parts.server, gossip_rounds=config.federation.gossip_rounds)
                             if self.parts.server is not None and config.federation is not None else None)
        self.routes: dict[str, bytes] = {}
        self._rounds_evaluated = 0
        self.node.set_membership(self.parts.roster, self.parts.topology)
        self.roster_watch = RosterWatch(config.roster_path, self.parts.roster)  # picked up while running
        self.neighbours = self.node.neighbourhood.members
        self.counters = Counters()
        self._t0 = time.monotonic()
        self.timers = TimerTable()
        self._work: list[int] = []
        self._stop_signal: int | None = None
        self._reload_asked = False     # SIGHUP: the roster file is read at the next periodic pass
        self._last_loss = math.nan
        self._last_eval: dict[str, float] = {}
        self._last_eval_step = -1
        self._train_start_s = math.nan
        self._train_end_s = math.nan
        self._stranded = ""     # why this peer stops short of the end (protocols/node/liveness.py)
        self._resumed = False
        self.state = "starting"
        self._published: dict[str, Any] | None = None    # the last status written (the metrics endpoint's)
        self.scalars: ScalarLog | None = None      # TensorBoard, when [peer] tensorboard

    @property
    def machine(self) -> Machine:
        """The Node's machine (the model role this member trains and gossips)."""
        return self.node.machine

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        """Seconds since this daemon started (the machine's clock)."""
        return time.monotonic() - self._t0

    # ------------------------------------------------------------------ running

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.parts.lock.release()

    def _run(self) -> int:
        self._install_signals()
        resumed = self._resumed = self._restore()
        try:
            self.transport = Transport(listen=self._listen_address(), neighbours=self.parts.neighbours,
                                       config=transport_config(self.config.transport,
                                                               self.config.gossip.deadline_s),
                                       curve=self._curve_keys(),
                                       listen_fd=self._listen_fd, while_waiting=self._take_in)
        except TransportError as error:
            # name where the address came from: the peer's own listen key, else its roster entry
            where = ("key 'peer.listen'" if self.config.peer.listen else
                     f"key 'peer.roster' ({self.name!r}'s address in {self.config.roster_path})")
            hint = not_owned_hint(self._listen_address())
            raise HivemeshError(f"{self.config.source}: {where}: peer {self.name}: {error}{hint}") from None
        metrics = None
        try:
            if self.config.peer.metrics_port:
                from peer.runtime.prometheus import MetricsServer

                metrics = MetricsServer(lambda: self._published, host=self.config.peer.metrics_host,
                                        port=self.config.peer.metrics_port,
                                        key=f"{self.config.source}: [peer] metrics_port (or --metrics-port)")
            if self.config.peer.tensorboard:
                self.scalars = ScalarLog(self.config.data_dir,
                                         key=f"{self.config.source}: [peer] tensorboard")
            running = self._wait_for_neighbours()
            self.timeline["neighbours"] = time.time()
            late_join = self.config.peer.late_join or self.name in self._joins_later()
            if self._stop_signal is None and (resumed or running or late_join):
                unanswered = self._state_sync(resumed=resumed)
                self.timeline["synced"] = time.time()
                if self._stop_signal is None:
                    self._judge_neighbours(start_wait_over=unanswered)
                if unanswered and not self._stranded:
                    self._warn("training on without state sync")
            if self._stop_signal is None and not self._stranded:
                self._train()
            return self._shutdown()
        finally:
            if metrics is not None:
                metrics.close()
            if self.scalars is not None:
                self.status.guarded("tensorboard", self.scalars.close)
            self.transport.close()
            self.digester.close()
            self.worker.shutdown()
            self.status.close()

    def _listen_address(self) -> str:
        return tcp_address(self.config.peer.listen or self.parts.roster.member(self.name).address)

    def _curve_keys(self) -> Any:
        if not self.config.peer.curve:
            return None
        from peer.net.transport import CurveKeys

        roster = self.parts.roster
        missing = [n for n in self.parts.neighbours if not roster.member(n).curve_key]
        if missing:
            raise HivemeshError(f"peer.curve is on but roster members {missing} have no curve_key")
        return CurveKeys(
            public_key=self.parts.identity.curve_public_key.encode(),
            secret_key=self.parts.identity.curve_secret_key.encode(),
            server_keys={n: roster.member(n).curve_key.encode() for n in self.parts.neighbours},
            allowed_client_keys=frozenset(k.encode() for k in roster.curve_allowlist()))

    def _install_signals(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            self._stop_signal = signum

        def reload(signum: int, frame: FrameType | None) -> None:
            self._reload_asked = True     # acted on between steps, never inside the handler

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGHUP, reload)

    # ------------------------------------------------------------------ phases

    def _wait_for_neighbours(self) -> bool:
        """Heartbeat until every neighbour has been heard from and is reachable, or the start timeout.

        True when the network is already running without us: a neighbour's heartbeat shows it
        further on than the machine can buffer (``max_rounds_ahead`` rounds), so we join by state
        sync instead of starting at round 0 (and instead of waiting for neighbours that may
        never come).
        """
        self.state = "waiting for neighbours"
        began = self.now()
        gossip = self.config.gossip
        said = ""
        outcome = Wait.WAIT
        # under a test's schedule, members it starts later are not waited for, and every running
        # neighbour is (the simulator's start hears them all at once): a sync then asks them all
        later = self._joins_later()
        ahead = ahead_steps(max_rounds_ahead=gossip.max_rounds_ahead, local_steps=gossip.local_steps,
                            scheduled=self.faults is not None)
        while self._stop_signal is None:
            self._tick()
            reachable = all(info.reachable for name, info in self.neighbours.items() if name not in later)
            outcome = self.node.start_wait(waited_s=self.now() - began, resumed=self._resumed,
                                           ahead_steps=ahead, later=later, all_reachable=reachable)
            if outcome is not Wait.WAIT:
                break
            line = waiting_line(self.node.neighbourhood.presence())
            if line and line != said:    # on change only
                said = line
                self.status.say(f"{self.name}: {line}")
            self._write_status()
            self._pump(min(0.1, self.config.peer.heartbeat_interval_s))
        if outcome is Wait.TIMED_OUT:
            self._warn(f"neighbours not heard within {self.config.peer.start_timeout_s:g} s: "
                       f"{', '.join(self.node.neighbourhood.absent())}; starting without them "
                       "(their rounds will be left out)")
        return outcome is Wait.JOIN

    def _joins_later(self) -> frozenset[str]:
        return self.faults.faults.schedule.joins_later() if self.faults is not None else frozenset()

    def _judge_neighbours(self, *, start_wait_over: bool) -> None:
        """Stop (``_stranded``) when protocols/node/liveness.py says there is nobody left to train with."""
        why = self.node.judge(resumed=self._resumed, start_wait_over=start_wait_over)
        if why and not self._stranded:
            self._stranded = why
            self.timeline["stranded"] = time.time()

    def _state_sync(self, *, resumed: bool) -> bool:
        """Ask the neighbours for their current state, as often as protocols/node/sync.py says;
        the Node adopts the best answer. True when every attempt went unanswered."""
        self.state = "syncing"
        sync = self.node.sync
        self._carry_out(self.node.begin_sync(resumed=resumed))
        while self.node.syncing and self._stop_signal is None:
            deadline = self.now() + sync.config.sync_timeout_s
            while self.node.syncing and self.now() < deadline and self._stop_signal is None:
                self._pump(0.1)       # an answer is adopted as it arrives (Node.receive)
                silent, actions = self.node.expire(self.now())   # or once the rest fell silent
                self.counters.neighbour_down.update(silent)
                self._carry_out(actions)
                self._tick()
                self._write_status()    # "syncing", for `hivemesh status`
            if self.node.syncing and self._stop_signal is None:
                self._warn(f"state-sync attempt {sync.attempts_made}/{sync.attempts} timed out")
                self._carry_out(self.node.sync_timed_out())
        return sync.outcomes["no_answer"] > 0     # (a peer process syncs once)

    def _train(self) -> None:
        self.state = "training"
        self._train_start_s = self.now()
        for note in self.machine.notes():
            self.status.say(f"{self.name}: {note}")
        self.counters.absent_at_start.update(self.node.neighbourhood.absent())  # told down at Start
        self._wait_sent()
        self._carry_out(self.node.start(self.now()))
        while not self.node.finished and self._stop_signal is None and not self._stranded:
            if self._work and not self._held():
                self._do_work(self._work.pop(0))
                self._pump(0.0)
            else:
                self._pump(self._poll_timeout())
            self._fire_timers()
            self._heal()
            self._periodic()

    def _held(self) -> bool:
        """A test hook holds training at this step (a gateway's: its rounds, as its checkpoints
        count them) (or has just stopped the peer)."""
        held = (self.hooks.holding(self._work_done(), self.now()) or self._work_point()
                or self._stop_signal is not None)
        self.state = "held by a test hook" if held else "training"
        return held

    def _work_point(self) -> bool:
        """What a test's fault schedule fires before this round's steps are trained; True while it
        holds them (protocols/node/schedule.py)."""
        if self.faults is None:
            return False
        round_index = self.machine.position[0]
        self.faults.reached(round_index)    # first: it may be what a heal or a hold waits for
        self._heal()    # before a hold is released by the same condition
        for fault in self.faults.work_point(round_index):
            match fault:
                case Stop():
                    os.kill(os.getpid(), signal.SIGTERM)    # the clean path: checkpoint, exit 0
                case Flood(to=to, requests=requests):
                    for _ in range(requests):
                        self._send(Send((to,), StateSyncRequest(reason="flood")))
                case Cut():
                    for name in sorted(fault.across(self.name) & set(self.neighbours)):
                        self._feed(NeighbourDown(name))
        held = self.faults.faults.holding()
        # conditions only grow: one that has just released a hold may also heal a cut, which must
        # be in force before the steps are trained (another peer's file may have appeared since)
        self._heal()
        if self._was_held and not held:
            # what arrived while held is handled before the steps: a peer starved of CPU meanwhile
            # would otherwise read it only after them (a jump then mixes without it)
            self._pump(0.0)
        self._was_held = held
        return held

    def _heal(self) -> None:
        """Neighbours across a cut whose heal condition is met: up again for the machine."""
        if self.faults is not None:
            for name in self.faults.faults.heals():
                if name in self.neighbours:
                    self._feed(NeighbourUp(name))

    def _shutdown(self) -> int:
        assert self.transport is not None
        self.transport.wait_sent(timeout_s=5.0)
        if self.node.finished:
            self.state = "finished"
            self._evaluate()
            self._checkpoint(final=True)
            self._write_status(force=True)
            grace_end = self.now() + self.config.peer.finish_grace_s
            while self.now() < grace_end and self._stop_signal is None:
                self._pump(0.05)
                self._tick()
            self.transport.wait_sent(timeout_s=5.0)
            self._write_status(force=True)
            return 0
        if self._stranded:
            self.state = "stranded"
            if self.node.started:
                self._checkpoint(final=False)    # what it trained is kept
            self._write_status(force=True)
            self.status.say(f"{self.name}: {self._stranded}; exiting at step {self.trainer.step} "
                            f"(status {EXIT_STRANDED})")
            return EXIT_STRANDED
        self.state = "stopped"
        written = self._checkpoint(final=False)
        self._write_status(force=True)
        signame = signal.Signals(self._stop_signal).name if self._stop_signal else "stop"
        what = "checkpoint written" if written else "no checkpoint written"
        self.status.say(f"{self.name}: {signame}: {what} at step {self.trainer.step}; exiting")
        return 0

    # ------------------------------------------------------------------ the loop's pieces

    def _poll_timeout(self) -> float:
        now = self.now()
        deadlines = [self.node.next_beat_s, self.status.next_due]
        timer_at = self.timers.next_at()
        if timer_at is not None:
            deadlines.append(timer_at)
        return max(0.0, min(min(deadlines) - now, 0.1 if self._work else 0.5))

    def _pump(self, timeout_s: float) -> None:
        """Receive for up to ``timeout_s`` and dispatch everything that arrived (at once when
        messages read during a send wait are queued)."""
        assert self.transport is not None
        self._take_in(self.transport.poll(0.0 if self._opened_queue else timeout_s))
        self._opened_queue.extend((released, None) for released in self.endpoint.expire(self.now()))
        for connection in self.transport.closed_connections():     # released at once, not when idle
            released = self.endpoint.forget(connection)
            if released is not None:
                self._opened_queue.append((released, None))
        while self._opened_queue:   # a dispatch may wait for sends, which queues what it reads
            self._opened(*self._opened_queue.popleft())

    def _take_in(self, arrivals: list[Arrival]) -> bool:
        """Feed frames to the endpoint, in the order they arrived, and queue the messages they
        complete; nothing is handed to the Node here, so the transport calls this while it waits
        for our sends (``while_waiting``): no tensor changes. Whether it takes more."""
        assert self.transport is not None
        for arrival in arrivals:
            key = self.transport.connection_key(arrival.frame)
            if key is None:
                continue    # its key left the roster or cools down (counted by the transport)
            # one frame of the header-first wire: the endpoint verifies a header (and that it came on
            # its sender's own connection) before it accepts the frames it announced, and hashes each
            # as it arrives (protocols/assembly.py)
            opened = self.endpoint.receive(arrival.connection, arrival.frame.buffer, now_s=self.now(),
                                           connection_key=key.decode() if key else None)
            if opened is not None:
                self._opened_queue.append((opened, arrival.connection))
        queued = sum(o.wire_bytes for o, _ in self._opened_queue if isinstance(o, Opened))
        return queued < self._queued_bytes_limit

    def _opened(self, opened: Opened | Rejection, connection: bytes | None = None) -> None:
        if isinstance(opened, Rejection):   # counted by the endpoint; a member set up differently
            notice = self.mismatches.first(opened.reason, opened.sender, opened.detail)  # is said once
            if notice:
                self.status.warn(notice)
        elif self.hooks.cutting(self.now()):
            self.counters.test_cut_dropped["received"] += 1
        else:
            self.counters.messages_accepted += 1
            self.counters.bytes_received_from[opened.sender] += opened.wire_bytes
            self.counters.wire_bytes_accepted_by_kind[opened.message.KIND] += opened.wire_bytes
            if opened.sender in self.node.clients and connection is not None:
                # accepted (signed, new in its replay window): replies go back on this connection
                self.routes[opened.sender] = connection
                self.counters.client_bytes_received[opened.sender] += opened.wire_bytes
            self._dispatch(opened)

    def _dispatch(self, opened: Opened) -> None:
        """Hand a verified message to the Node (it routes by kind); what only a daemon shows
        (heartbeat latency, the neighbours' last parameters for the consensus estimate) is kept here."""
        sender, message = opened.sender, opened.message
        info = self.neighbours.get(sender)
        if info is not None:
            if isinstance(message, Heartbeat):
                latency_ms = heartbeat_latency_ms(message.sent_at_s, time.time())
                if latency_ms is None:
                    self.counters.rejected["heartbeat_bad_latency"] += 1
                else:
                    info.latency_ms = latency_ms
            self._remember_params(info, message)
        reachable = info is None or info.up or self._can_send(sender)  # (tried only when it matters)
        if self.node.may_write_params(message) or (info is not None and not info.up):
            self._wait_sent()   # a NeighbourUp may close a round and mix too
        self._carry_out(self.node.receive(sender, message, self.now(), reachable=reachable))

    def _feed(self, event: Event) -> None:
        """Hand one of our own events (work done, a timer) to the Node and carry out what it asks."""
        self._wait_sent()
        self._carry_out(self.node.handle(event, self.now()))

    def _wait_sent(self) -> None:
        """The machine mixes (and a state sync adopts) in place: tensors still being sent must go first.

        A neighbour whose connection moved no byte for the round deadline (a cut cable:
        :func:`transport_config`) has its sends abandoned (counted in ``abandoned``) instead of
        holding up every step; a slow one is waited for up to ``send_timeout_s``."""
        assert self.transport is not None
        if self.transport.pending_sends():
            self.transport.wait_sent()

    def _carry_out(self, actions: Sequence[NodeAction]) -> None:
        for action in actions:
            match action:
                case Send():
                    self._send(action)
                case StartWork():
                    self._work.append(action.steps)
                case SetTimer():
                    self._set_timer(action.key, action.at)
                case CancelTimer():
                    self.timers.cancel(action.key)
                case Metric():
                    self.counters.metrics[action.name] = action.value   # running totals
                    self._machine_warnings()
                case Finished():
                    self._train_end_s = self.now()
                    self.timeline["finished"] = time.time()
                case SetTrainerStep():
                    self.schedule.step_set(self.trainer.step, action.step)  # a jump: a checkpoint due
                    self.trainer.step = action.step     # the learning-rate schedule follows the network
                    self.counters.trainer_steps_set.append(action.step)
                case Note(text=text, warning=warning):
                    if warning:
                        self._warn(text)
                    else:
                        self.status.say(f"{self.name}: {text}")
                case Connect():
                    self._connect(action)
        if self.schedule.jumped:    # at once (CheckpointSchedule.step_set)
            self._checkpoint(final=False)
        if self.gateway_work is not None:
            self._gateway_progress()

    def _do_work(self, steps: int) -> None:
        assert self.transport is not None
        if self.gateway_work is not None:   # a gateway trains nothing: its work is a FedAvg round
            begun, done = self.gateway_work.begin(self.now(), self.machine.position[0])
            self._carry_out(self.node.role_actions("fedavg", begun))
            if done:
                self._feed(WorkDone(steps, 0.0))
            return
        self._wait_sent()    # training changes the parameters in place
        if self.params_trace is not None:
            self.params_trace.at_work_point(self.trainer.step, self.trainer.flat_params)
        began = time.monotonic()
        loss = self._run_steps(steps)
        self.counters.work_s += time.monotonic() - began
        self._last_loss = loss
        self._machine_warnings()
        self._feed(WorkDone(steps, loss))

    def _run_steps(self, steps: int) -> float:
        """The trainer's steps, on the worker thread: meanwhile this thread sends our heartbeats and
        reads the inbox (frames to the endpoint, messages queued for the Node until the steps are
        done: they own the parameters), so a step longer than the neighbour timeout does not look
        like a dead peer, nor hold up a neighbour's send to us past the round deadline."""
        assert self.transport is not None
        done = self.worker.submit(self._paced_steps, steps)
        while True:
            try:
                return done.result(timeout=WORK_LOOK_S)
            except TimeoutError:
                self._tick()
                self._take_in(self.transport.poll(0.0))

    def _paced_steps(self, steps: int) -> float:
        began = time.monotonic()
        loss = self.trainer.run_steps(steps)
        if self.hooks.step_pace_s:  # a test's slower machine: the steps take that long, as compute would
            time.sleep(max(0.0, began + steps * self.hooks.step_pace_s - time.monotonic()))
        return loss

    def _gateway_progress(self) -> None:
        """After a gateway acted: a FedAvg round closed is its gossip machine's work done; the global
        model is evaluated once per closed round."""
        assert self.gateway_work is not None
        server = self.gateway_work.server
        if len(server.reports) > self._rounds_evaluated:
            self._last_eval = self.trainer.evaluate()
            for index in sorted(server.reports)[self._rounds_evaluated:]:   # reports are only added
                row = {**report_row(server.reports[index]),
                       "accuracy": self._last_eval.get("accuracy", math.nan)}
                self.status.append_line(ROUNDS_FILE, row)
            self._rounds_evaluated = len(server.reports)
            self._last_eval_step = self._rounds_evaluated
            self.status.metric_line(self._snapshot())
        if self.gateway_work.closed():
            self._feed(WorkDone(1, 0.0))

    def _send(self, action: Send) -> None:
        assert self.transport is not None
        frames = wire_messages(self.endpoint.seal(action.recipients, action.message))   # header first
        size = wire_size(frames)
        payload = sum(t.numel() * t.element_size() for t in getattr(action.message, "tensors", {}).values())
        for recipient in action.recipients:
            if recipient in self.node.clients:
                self._reply(recipient, frames, size, action.message)
                continue
            info = self.neighbours.get(recipient)
            if info is None:
                self.counters.unreachable[recipient] += 1
                continue
            if self.hooks.cutting(self.now()) or (self.faults is not None
                                                  and self.faults.faults.drops(recipient, action.message)):
                self.counters.test_cut_dropped["sent"] += 1
                continue
            info.reachable = self.transport.send(recipient, frames)
            if info.reachable:
                self.counters.messages_sent += 1
                self.counters.messages_sent_by_kind[action.message.KIND] += 1
                self.counters.wire_bytes_sent_by_kind[action.message.KIND] += size
                self.counters.wire_bytes_sent += size
                self.counters.payload_bytes_sent += payload
            else:
                self.counters.unreachable[recipient] += 1

    def _reply(self, client: str, frames: list[Any], size: int, message: Message) -> None:
        """To an edge client: on the connection its last accepted message came on."""
        assert self.transport is not None
        connection = self.routes.get(client)
        if connection is None or not self.transport.reply(connection, frames):
            self.counters.client_unreachable[client] += 1
            return
        self.counters.messages_sent += 1
        self.counters.messages_sent_by_kind[message.KIND] += 1
        self.counters.wire_bytes_sent_by_kind[message.KIND] += size
        self.counters.wire_bytes_sent += size
        self.counters.client_bytes_sent[client] += size

    # ------------------------------------------------------------------ timers

    def _set_timer(self, key: str, at: float) -> None:
        self.timers.set(key, at)

    def _fire_timers(self) -> None:
        now = self.now()
        while not self.node.finished and (key := self.timers.pop_due(now)) is not None:
            self._feed(TimerFired(key))

    # ------------------------------------------------------------------ periodic duties

    def _tick(self) -> None:
        """The Node's heartbeat, when due (stamped with the wall clock for the latency estimate)."""
        self._carry_out(self.node.tick(self.now(), step=self.trainer.step, loss=self._last_loss,
                                       stamp_s=time.time()))

    def _can_send(self, name: str) -> bool:
        """Whether a message to ``name`` goes out now: a heartbeat is tried. A neighbour is up when
        we hear it *and* reach it. Hearing comes first when it has just started (its connection to
        us may be ready before ours to it); the machine resends the round's message on
        ``NeighbourUp``, which would be lost on a connection not yet made."""
        assert self.transport is not None
        if self.hooks.cutting(self.now()):
            self.counters.test_cut_dropped["sent"] += 1
            return False
        beat = self.node.heartbeat(step=self.trainer.step, loss=self._last_loss, stamp_s=time.time())
        return self.transport.send(name, wire_messages(self.endpoint.seal((name,), beat)))

    def _periodic(self) -> None:
        self._tick()
        self._follow_roster()
        now = self.now()
        if self.node.neighbourhood.overdue(now):
            self._wait_sent()   # the machine may close a round (and mix) on NeighbourDown
        silent, actions = self.node.expire(now)
        for name in silent:
            info = self.neighbours[name]
            if info.finished:
                self.counters.neighbour_finished[name] += 1
                self.status.say(f"{self.name}: neighbour {name} has finished")
            else:
                self.counters.neighbour_down[name] += 1
                self._warn(f"neighbour {name} silent for {now - info.last_seen:.1f} s")
        self._carry_out(actions)
        if silent and self.node.started and not self.node.finished:
            self._judge_neighbours(start_wait_over=True)
        every = self.config.peer.eval_every_steps
        if every and self.trainer.step - max(self._last_eval_step, 0) >= every:
            self._evaluate()
        if self.schedule.should_save(self._work_done(), now):
            self._checkpoint(final=False)
        self._write_status()

    # ------------------------------------------------------------------ membership

    def _follow_roster(self) -> None:
        """A new roster version in the file goes to the Node, which applies it at its round; on SIGHUP
        the file is read now, and what was found is said."""
        forced, self._reload_asked = self._reload_asked, False
        found = self.roster_watch.poll(self.now(), force=forced)
        if forced:
            self.counters.roster_reloads += 1
            held = self.roster_watch.roster
            what = (f"version {found.roster.version} (effective from round {found.roster.effective_round})"
                    if isinstance(found, NewVersion) else
                    "cannot be used" if isinstance(found, Unusable) else
                    f"nothing new (version {held.version})")
            self.status.say(f"{self.name}: SIGHUP: roster {self.roster_watch.path} re-read: {what}")
        if isinstance(found, Unusable):
            self._warn(found.reason)
        elif isinstance(found, NewVersion):
            try:
                topology = peer_topology(self.config, found.roster)
            except HivemeshError as error:
                self._warn(f"roster version {found.roster.version} not applied: {error}")
            else:
                self._wait_sent()     # the machine's graph changes: no tensor of ours may be in flight
                self._carry_out(self.node.change_membership(found.roster, topology, self.now(),
                                                            make_neighbour=NeighbourInfo))
            # not applied (refused by the Node, or no graph): the status shows the version in use
            self.roster_watch.held(self.node.membership.current)

    def _connect(self, connect: Connect) -> None:
        """The Node's new roster and neighbour set: verify against it, dial who is new or moved, drop who
        left."""
        assert self.transport is not None
        roster = connect.roster
        self._hold_own_key(roster)
        self.endpoint.set_roster(roster)
        curve = self.config.peer.curve
        for name in connect.neighbours:
            member = roster.member(name)
            address = tcp_address(member.address)
            if name in self.transport.neighbours and self._dialled.get(name, address) != address:
                # moved (`hivemesh roster set-address`): dial it where it listens now
                self.transport.drop_neighbour(name)
                self.status.say(f"{self.name}: dials {name} at its new address {address}")
            if name not in self.transport.neighbours:
                server_key = member.curve_key.encode() if curve and member.curve_key else None
                self.transport.add_neighbour(name, address, server_key=server_key)
                self._dialled[name] = address
        for name in self.transport.neighbours:
            if name not in connect.neighbours:
                self.transport.drop_neighbour(name)
        if curve:
            self.transport.allow(frozenset(k.encode() for k in roster.curve_allowlist()))
            for name in connect.neighbours:     # a neighbour's rotated key, once the roster lists it
                self.transport.set_server_key(name, roster.member(name).curve_key.encode())
            own = self.endpoint.identity   # a rotation of ours, once in force: serve and dial with it
            if own.curve_public_key.encode() != self.transport.curve_public_key:
                self.transport.rekey(own.curve_public_key.encode(), own.curve_secret_key.encode())
                self.status.say(f"{self.name}: serves and dials with its rotated CurveZMQ key")

    def _hold_own_key(self, roster: Roster) -> None:
        """A rotation of our own key: the endpoint gets the new key file (beside the configured one,
        peer/files/keydir.py) as soon as the roster names it; it signs with it once that roster is in
        force. Not found: said at each roster change; the peer fails when the rotation's round comes."""
        ours = [entry for entry in (*roster.members, *roster.also) if entry.name == self.name]
        for entry in ours:
            if entry.public_key in self.endpoint.identities:
                continue
            identity = find_identity(self.config.key_path, entry.public_id)
            if identity is not None:
                self.endpoint.add_identity(identity)
                self.status.say(f"{self.name}: holds its rotated key {entry.public_id[:12]}...")
            else:
                self._warn(f"the roster gives {self.name} the key {entry.public_id}, but no key file beside "
                           f"{self.config.key_path} holds it: put it there before the rotation's round")

    def _evaluate(self) -> None:
        if self._last_eval_step == self.trainer.step:
            return
        self._last_eval = self.trainer.evaluate()
        self._last_eval_step = self.trainer.step
        snapshot = self._snapshot()
        self.status.metric_line(snapshot)
        scalars = self.scalars
        if scalars is not None:     # a full disk: lost and counted (status_write_failures), as a line is
            self.status.guarded("tensorboard", lambda: scalars.write(snapshot))

    # ------------------------------------------------------------------ persistence

    def _restore(self) -> bool:
        for line in self._recovered:
            self.status.say(f"{self.name}: checkpoints: {line}")
        state = self.store.load_latest()
        if state is None:
            return False
        trainer_state, protocol_state, extra = state
        self.trainer.load_state_dict(trainer_state)
        protocol_state = self._restore_server(protocol_state)
        self.machine.restore_state(protocol_state)
        if self.gateway_work is not None:
            self.gateway_work.restarted()
        # the machine reports counters and gauges only when they change: start from where they are
        self.counters.metrics.update({k: float(v) for k, v in self.machine.counters.items()})
        self.counters.metrics.update(self.machine.gauges())
        endpoint_state = extra.get("endpoint")
        if isinstance(endpoint_state, dict):
            self.endpoint.restore_state(endpoint_state)
        self.status.say(f"{self.name}: resumed from checkpoint at step {self._work_done()} "
                        f"(epoch {self.parts.epoch})")
        self.schedule.saved(self._work_done(), self.now())  # the interval counts from what is on disk
        return True

    def _work_done(self) -> int:
        """What the checkpoint interval counts (and a checkpoint is named by): the trainer's steps,
        or on a gateway, which trains nothing, its rounds (``GatewayWork.rounds_done``: its machine's
        steps, one per gossip round, a FedAvg round its work; under FedBuff its model versions too),
        so a killed gateway loses at most ``every_steps`` rounds."""
        if self.gateway_work is not None:
            return self.gateway_work.rounds_done(self.machine.position[1])
        return self.trainer.step

    def _checkpoint(self, *, final: bool) -> bool:
        """Write one; False when it could not be (a full disk: said when it starts failing and
        when it writes again, counted in the status; the peer trains on, the older ones stay).

        No wait for sends in flight: a checkpoint only reads tensors, synchronously on the loop's
        thread, so nothing writes them meanwhile, and what ZeroMQ still sends are fresh encodes it
        only reads too. Waiting stalled a gateway (which checkpoints every round) up to the round
        deadline while its RoundStart replies drained to slow edges."""
        failing = self.store.error
        reason = self.store.save(self.trainer.state_dict(), self._protocol_state(),
                                 {"endpoint": self.endpoint.export_state(), "final": final,
                                  "epoch": self.parts.epoch}, step=self._work_done())
        self.schedule.saved(self._work_done(), self.now())  # a failure is tried again an interval on
        if reason and reason != failing:
            self._warn(f"cannot checkpoint: {reason}")
        elif not reason and failing:
            self.status.say(f"{self.name}: checkpoint written again at step {self.trainer.step}")
        return not reason

    def _protocol_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The machine's state and, on a gateway, its server's (tensors under ``fedavg/``, meta under
        ``fedavg``): one checkpoint, taken at one moment, so the two agree after a restart."""
        tensors, meta = self.machine.export_state()
        if self.gateway_work is None:
            return tensors, meta
        server_tensors, server_meta = self.gateway_work.server.export_state()
        return ({**tensors, **{f"{SERVER_PREFIX}{k}": v for k, v in server_tensors.items()}},
                {**meta, "fedavg": server_meta})

    def _restore_server(self, state: Any) -> Any:
        """A gateway's checkpoint: restore its server (a round open when it was written is asked
        again), hand back the machine's part."""
        tensors, meta = state
        if self.gateway_work is None:
            return state
        if "fedavg" not in meta:
            raise HivemeshError(f"{self.config.data_dir}: the checkpoint is a plain peer's, not this "
                                "gateway's (no server state): use a new data_dir for a gateway")
        own = {k: v for k, v in tensors.items() if not k.startswith(SERVER_PREFIX)}
        served = {k[len(SERVER_PREFIX):]: v for k, v in tensors.items() if k.startswith(SERVER_PREFIX)}
        server = self.gateway_work.server
        server.restore_state((served, meta["fedavg"]))
        server.forget_registrations()   # its clients register again as they are heard
        return own, {k: v for k, v in meta.items() if k != "fedavg"}

    # ------------------------------------------------------------------ status

    def _consensus_estimate(self) -> float:
        """``max_relative_distance`` over {self} ∪ neighbours, from the last full parameters heard;
        nan (unknown, not 0) before any neighbour's parameters arrived."""
        heard = [info.params for info in self.neighbours.values() if info.params is not None]
        if not heard:
            return math.nan
        return max_relative_distance([self.trainer.flat_params.detach().cpu(), *heard])

    def _remember_params(self, info: NeighbourInfo, message: Message) -> None:
        if self.trainer.flat_params.numel() > 10_000_000:
            return      # big models: no copy per message just for the estimate
        params = self.machine.sender_params(message)    # None: compressed, push-sum shares, ...
        if params is not None:
            # the estimate is over parameters: a mixed vector's buffers (its tail) are left out
            info.params = params[:self.trainer.flat_params.numel()].to(torch.float32).clone()

    def _snapshot(self) -> dict[str, Any]:
        assert self.transport is not None
        now = self.now()
        return {
            "name": self.name, "state": self.state, "epoch": self.parts.epoch, "uptime_s": round(now, 3),
            "step": self.trainer.step, "steps_done": self.machine.position[1],
            "loss": self._last_loss,
            "train_s": (self._train_end_s if self.node.finished else now) - self._train_start_s,
            "work_s": self.counters.work_s,
            "accuracy": self._last_eval.get("accuracy", math.nan),
            "test_loss": self._last_eval.get("loss", math.nan), "eval_step": self._last_eval_step,
            "consensus_max_relative": self._consensus_estimate(),
            "neighbours": {
                name: {"up": info.up, "presence": info.presence().value, "finished": info.finished,
                       "last_seen_s": (now - info.last_seen) if info.last_seen > -math.inf
                       else None, "latency_ms": info.latency_ms, "step": info.step}
                for name, info in self.neighbours.items()},
            "bytes_sent": self.transport.bytes_sent, "bytes_received": self.transport.bytes_received,
            "bytes_sent_to": dict(self.transport.bytes_sent_to),
            "bytes_received_from": dict(self.counters.bytes_received_from),
            "payload_bytes_sent": self.counters.payload_bytes_sent,
            "gossip_wire_bytes_sent": self.counters.wire_bytes_sent,
            "messages_sent": self.counters.messages_sent,
            "messages_sent_by_kind": dict(self.counters.messages_sent_by_kind),
            "bytes_sent_by_kind": dict(self.counters.wire_bytes_sent_by_kind),
            "messages_accepted": self.counters.messages_accepted,
            "bytes_accepted_by_kind": dict(self.counters.wire_bytes_accepted_by_kind),
            "rejections": dict(self.endpoint.rejections + self.counters.rejected
                               + self.node.all_rejections()),
            "internal_errors": dict(self.node.internal_errors),
            "frames_dropped": dict(self.endpoint.assembler.frames_dropped + self.transport.hostile),
            "sync_answers_sent": self.node.sync.answers_sent,
            "early_held": self.node.early.held_total,
            "state_sync": dict(sorted(self.node.sync.outcomes.items())),
            "trainer_steps_set": list(self.counters.trainer_steps_set),
            "unreachable": dict(self.counters.unreachable),
            "neighbour_down": dict(self.counters.neighbour_down),
            "neighbour_finished": dict(self.counters.neighbour_finished),
            "test_cut_dropped": dict(self.counters.test_cut_dropped),
            "stranded": self._stranded,
            "checkpoint_step": self.store.step,
            "checkpoints_written": self.store.written,
            "checkpoint_failures": dict(self.store.failures),
            "checkpoint_error": self.store.error,
            "checkpoint_nonfinite": dict(self.store.nonfinite),
            "status_write_failures": dict(self.status.failures),
            "status_values_replaced": dict(self.status.replaced),
            "roster_version": self.roster_watch.roster.version,
            "roster_reloads": self.counters.roster_reloads,
            "waiting_for": (waiting_line(self.node.neighbourhood.presence())
                            if self.state == "waiting for neighbours" else ""),
            "absent_at_start": dict(self.counters.absent_at_start),
            "abandoned_sends": dict(self.transport.abandoned),
            "curve": self.config.peer.curve,
            "memory_peak_mib": peak_mib(),
            "memory_rss_mib": resident_mib(),
            "transport_refused": dict(self.transport.refused),
            "transport_connections": dict(self.transport.connections),
            "redialed": dict(self.transport.redialed),
            "handshake_refused": dict(self.transport.handshake_refused),
            "receive_buffers": {"reused": self.receive_buffers.reused, "fresh": self.receive_buffers.fresh,
                                "held": self.receive_buffers.held},
            "metrics": self.counters.metrics,
            "federation": self._federation_status(now),
            "warnings": [*self.machine.warnings(), *self.trainer.warnings()],
            "timeline": self.timeline,
        }

    def _federation_status(self, now: float) -> dict[str, Any]:
        """A gateway's rounds and clients (empty for a plain peer): the server's own view, its last
        closed rounds, its counters, and each client's last contact and bytes each way."""
        if self.gateway_work is None:
            return {}
        server = self.gateway_work.server
        status = server.status()
        contact = status.pop("last_contact_s", {})
        reports = [report_row(server.reports[i]) for i in sorted(server.reports)[-3:]]
        return {**status, "rounds_closed": len(server.reports), "last_rounds": reports,
                "counters": dict(sorted(server.counters.items())),
                "clients": {name: {"up": name in self.routes and self.node.clients.members[name].up,
                                   "last_contact_s": (now - contact[name]) if name in contact else None,
                                   "bytes_sent": self.counters.client_bytes_sent[name],
                                   "bytes_received": self.counters.client_bytes_received[name],
                                   "unreachable": self.counters.client_unreachable[name]}
                            for name in self.node.clients.names()}}

    def _write_status(self, *, force: bool = False) -> None:
        if force or self.now() >= self.status.next_due:
            self._published = self._snapshot()
            self.status.write(self._published, now=self.now(), interval_s=self.config.peer.status_interval_s)

    def _machine_warnings(self) -> None:
        """Say each new warning of the machine (its metrics are the only time it can change) and of
        the trainer (its work) once."""
        for text in [*self.machine.warnings(), *self.trainer.warnings()]:
            self.status.warn_once(f"{self.name}: warning: {text}")

    def _warn(self, text: str) -> None:
        self.status.warn(f"{self.name}: warning: {text}")


def transport_config(transport: TransportConfig, deadline_s: float) -> TransportConfig:
    """``[transport]`` with ``stall_timeout_s`` at most the round deadline (``[network.gossip]
    deadline_s``): how long the loop waits for its zero-copy sends to a neighbour whose connection
    moves no byte (``wait_sent``, and the rest of a message whose first frames filled the queue)
    before it may change a tensor.

    The round machine waits that long for a missing neighbour and then goes on without it, so a cut
    neighbour (a partition: nothing is acknowledged, its frames stay ours) must not hold the peer
    longer either; waiting ``send_timeout_s`` (30 s) stalled every peer of a split ring. What is
    still queued then is abandoned and counted (``abandoned`` in the transport). A slow but healthy
    link keeps moving bytes and is waited for up to ``send_timeout_s``: abandoning at the deadline
    lost its message every round (peer/net/progress.py)."""
    return dataclasses.replace(transport, stall_timeout_s=min(transport.stall_timeout_s, deadline_s))


def heartbeat_latency_ms(sent_at_s: float, now_s: float) -> float | None:
    """One-way latency of a heartbeat stamped ``sent_at_s`` (wall clock), or None when the stamp is
    absurd: NaN, infinite, more than ``CLOCK_SKEW_MS`` in the future, or more than ``MAX_LATENCY_MS``
    ago (a peer sent it). Hosts' clocks differ a little, so a stamp slightly ahead reads as 0 ms."""
    try:
        latency_ms = (now_s - float(sent_at_s)) * 1000.0
    except OverflowError:       # an int stamp too large for a float
        return None
    if not -CLOCK_SKEW_MS <= latency_ms <= MAX_LATENCY_MS:    # also False for NaN
        return None
    return max(latency_ms, 0.0)


def run_peer(config_path: str, *, quiet: bool = False, listen_fd: int | None = None,
             overrides: Sequence[str] = (), metrics_port: int | None = None) -> int:
    """Load the config, run the peer, return the exit code (errors as one line on stderr).

    ``quiet``: no progress line on the console, whatever the config says; ``listen_fd``: a socket
    bound to the peer's address (peer.runtime.launch); ``metrics_port``: instead of the config's
    ``[peer] metrics_port``. Test hooks come from the environment."""
    ensure_logging()
    # until the daemon's own handler is in place (it reads the roster then anyway), a `hivemesh roster
    # reload` must not kill a peer that is still starting (SIGHUP's default action)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        config = load_peer_config(config_path, overrides)   # overrides: `hivemesh peer --set`
        if metrics_port is not None:
            try:
                peer = dataclasses.replace(config.peer, metrics_port=metrics_port)
            except ValueError as error:
                raise HivemeshError(f"--metrics-port: {error}") from None
            config = dataclasses.replace(config, peer=peer)
        if quiet:
            config = dataclasses.replace(config, peer=dataclasses.replace(config.peer, progress=False))
        return PeerDaemon(config, listen_fd=listen_fd, hooks=hooks_from_environment(),
                          schedule_for=schedule_from_environment,
                          protocol_version=protocol_version_from_environment(),
                          at_save_point=save_point_from_environment(),
                          params_trace=params_writer_from_environment(config.peer.name)).run()
    except HivemeshError as error:
        print(f"hivemesh: error: {error}", file=sys.stderr, flush=True)
        return 2

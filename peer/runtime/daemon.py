"""The peer daemon: one member's lifecycle (protocols/node/member.py) hosted with ZeroMQ, the trainer
and the wall clock.

A host only: the member decides (the start wait, the state sync, the work
points with their checkpoints and a test's fault schedule, the stranded
verdict, the end); protocols/node/host.py's ``Host`` carries its actions out
through peer/runtime/daemon_port.py. One thread, one loop, each turn:

1. the member's queued work, unless a test hook holds it: ``WorkPoint``, then
   the steps on a worker thread while the loop heartbeats and reads;
2. else the inbox (peer/runtime/inbox.py), polled until the next deadline;
   each verified message goes to the member as ``Arrived``;
3. timers due, then the periodic duties: ``Beat``, the roster file, ``Expire``,
   evaluations, the schedule's ``Heal``, the status file.

Before anything may change a tensor in place (training, or an event the
machine mixes on) the loop waits until ZeroMQ released the zero-copy frames
it was given (``Transport.wait_sent``), reading meanwhile. SIGHUP: re-read the
roster now. SIGINT/SIGTERM: the loop ends at the next turn, waits for sends in
flight, writes a checkpoint, exits 0. A finished member evaluates, writes its
final checkpoint and lingers ``finish_grace_s`` so its neighbours hear it; a
stranded one exits ``EXIT_STRANDED`` (3). A gateway's FedAvg side is
peer/runtime/gateway.py. Why each of these: docs/design/daemon.md.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

from peer.files.console import MismatchNotices
from peer.files.statefiles import CheckpointStore, StatusWriter
from peer.net.digests import ThreadDigester
from peer.net.transport import Transport, TransportError
from peer.runtime import daemon_files, dial
from peer.runtime.assemble import Parts, assemble, not_owned_hint, peer_topology, tcp_address
from peer.runtime.daemon_parts import Counters, NeighbourInfo
from peer.runtime.daemon_port import DaemonPort
from peer.runtime.daemon_status import remember_params, snapshot
from peer.runtime.gateway import GatewayRounds
from peer.runtime.inbox import Inbox
from peer.runtime.links import heartbeat_latency_ms, transport_config
from peer.runtime.membersetup import daemon_member, member_node
from peer.runtime.peerconfig import PeerConfig
from peer.runtime.refusals import SettingsRefusals
from peer.runtime.rosterwatch import RosterWatch, reread
from peer.runtime.tensorboard import ScalarLog
from peer.runtime.testhooks import Hook, Hooks, ParamsWriter, ScheduleFiles
from peer.train.checkpoint import SavePoint
from peer.train.trainer import StepsStopped
from protocols.events import Event, Machine, TimerFired, WorkDone
from protocols.federation.interleave import GatewayWork
from protocols.federation.server_base import SERVER_ROLE
from protocols.messages import Heartbeat, SettingsRefusal
from protocols.node import member as lifecycle
from protocols.node import waiting_line
from protocols.node.host import Host
from protocols.node.membership import Connect
from protocols.wire import Opened, Rejection, wire_messages
from topology.errors import HivemeshError

# while the trainer's steps run, the loop reads its inbox this often: a poll drains up to 64 MiB, so
# this keeps up with a link of over 1 GB/s (and a step that ends wakes the loop at once)
WORK_LOOK_S = 0.02
LIVE = (lifecycle.Phase.WAITING, lifecycle.Phase.SYNCING, lifecycle.Phase.TRAINING)


class PeerDaemon:
    """One running peer. ``run()`` returns the process exit code."""

    def __init__(self, config: PeerConfig, *, parts: Parts | None = None, listen_fd: int | None = None,
                 hooks: Sequence[Hook] = (),
                 schedule_for: Callable[[str], ScheduleFiles | None] | None = None,
                 protocol_version: int | None = None, at_save_point: SavePoint | None = None,
                 params_trace: ParamsWriter | None = None, signals: bool = True) -> None:
        """``listen_fd``: a listening socket already bound to this peer's address (peer.runtime.launch);
        ``hooks``: test hooks, ``schedule_for``: this peer's side of a fault schedule, by its name,
        ``protocol_version``: the highest protocol version spoken, as by a member not yet upgraded,
        ``at_save_point``: a test hook inside checkpoint writes, ``params_trace``: a test's record of the
        parameters over time (both peer.runtime.testhooks); ``signals``: False for a member hosted in
        another program's process (peer/library.py), which stops it with :meth:`stop`, not a signal."""
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
        self._t0 = time.monotonic()
        self.inbox = Inbox(self.endpoint, self.trainer.mixed, neighbours=len(self.parts.neighbours),
                           digester=self.digester, now=self.now, transport=lambda: self.transport)
        self.receive_buffers = self.inbox.buffers
        if protocol_version is not None:
            low, _ = self.endpoint.policy.accepted_versions
            self.endpoint.use(policy=dataclasses.replace(self.endpoint.policy,
                                                         accepted_versions=(low, protocol_version)))
        self.store = CheckpointStore(config.data_dir, keep=config.checkpoint.keep, at_point=at_save_point)
        # first, now the data folder is ours: a dead writer's temporaries (a complete one is put into
        # place), before anything is loaded or written (they may be what fills the disk)
        self.recovered = self.store.recover()
        # a gateway's bar counts its FedAvg rounds (peer_reading), a peer's its steps
        total, unit = ((config.federation.rounds, "rounds") if config.federation is not None
                       else (config.gossip.total_steps, "steps"))
        self.status = StatusWriter(config.data_dir, name=self.name, progress=config.peer.progress,
                                   total_steps=total, unit=unit)
        self.mismatches = MismatchNotices(self.name)     # a differently set-up member, said once
        # ... and answered with our settings, so it can name what differs (a gateway: once a round)
        self.refusals = SettingsRefusals(self.endpoint, config.shared(), interval_s=(
            config.federation.round_timeout_s if config.federation is not None
            else config.peer.neighbour_timeout_s))
        self.transport: Transport | None = None
        self._listen_fd = listen_fd
        self._dialled = dict(self.parts.neighbours)   # name -> the address its socket dials
        self.hooks = Hooks(hooks)
        self.params_trace = params_trace
        self.faults = schedule_for(self.name) if schedule_for is not None else None
        self.node = member_node(config, self.parts)
        # a gateway: what its gossip machine's work is, and the connection each edge client dialled
        self.gateway_work = (GatewayWork(self.parts.server, gossip_rounds=config.federation.gossip_rounds)
                             if self.parts.server is not None and config.federation is not None else None)
        self.gateway = (GatewayRounds(self.gateway_work, config.checkpoint)
                        if self.gateway_work is not None else None)
        # what the gateway's settings risk for the clients it serves (said once, kept in status)
        self.config_warnings = ([] if self.gateway is None or config.federation is None
                                else config.federation.warnings(len(self.parts.clients)))
        self.routes: dict[str, bytes] = {}
        self.roster_watch = RosterWatch(config.roster_path, self.parts.roster)  # picked up while running
        self.neighbours = self.node.neighbourhood.members
        self.member = daemon_member(self.node, config, faults=self.faults, gateway=self.gateway is not None)
        self.host = Host(self.member.handle, DaemonPort(self), work_at_once=False)
        self.counters = Counters()
        self.to_train: int | None = None    # the steps the member's last work point asked for
        self.exit: lifecycle.Exit | None = None
        self._stop_why: str | None = None   # a signal's name (SIGTERM), or why :meth:`stop` was called
        self._signals = signals
        self._reload_asked = False     # SIGHUP: the roster file is read at the next periodic pass
        self._saved = True             # the last checkpoint attempt wrote one
        self._said_waiting = ""
        self.last_loss = math.nan
        self.last_eval: dict[str, float] = {}
        self.last_eval_step = -1
        self.train_start_s = math.nan
        self.train_end_s = math.nan
        self.state = "starting"
        self._published: dict[str, Any] | None = None    # the last status written (the metrics endpoint's)
        self.scalars: ScalarLog | None = None      # TensorBoard, when [peer] tensorboard

    @property
    def machine(self) -> Machine:
        """The Node's machine (the model role this member trains and gossips)."""
        return self.node.machine

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
        if self._signals:
            self._install_signals()
        resumed = self._restore()
        try:
            self.transport = Transport(listen=self._listen_address(), neighbours=self.parts.neighbours,
                                       config=transport_config(self.config.transport,
                                                               self.config.gossip.deadline_s),
                                       curve=self._curve_keys(),
                                       listen_fd=self._listen_fd, while_waiting=self.inbox.take_in)
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
            self.launch(resumed=resumed)
            while self._stop_why is None and self.exit is None and self.member.phase in LIVE:
                self._turn()
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

    def launch(self, *, resumed: bool) -> None:
        """The member's process is up: it heartbeats and waits for its neighbours (a late joiner, a
        member the schedule starts later, or a restarted one syncs first)."""
        late = self.config.peer.late_join or self.name in self.member.schedule.joins_later()
        self._feed(lifecycle.Launch(step=self.trainer.step, sync=late, resumed=resumed, stamp_s=time.time()))

    def _listen_address(self) -> str:
        return tcp_address(self.config.peer.listen or self.parts.roster.member(self.name).address)

    def _curve_keys(self) -> Any:
        return dial.curve_keys(self.config, self.parts.identity, self.parts.roster, self.parts.neighbours)

    def stop(self, why: str) -> None:
        """End the run at the loop's next turn, as SIGTERM does (any thread; ``why`` is said)."""
        self._stop_why = why

    def _install_signals(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            self.stop(signal.Signals(signum).name)

        def reload(signum: int, frame: FrameType | None) -> None:
            self._reload_asked = True     # acted on between steps, never inside the handler

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGHUP, reload)

    def _turn(self) -> None:
        """One pass of the loop: work or the inbox, timers, the periodic duties."""
        if self.faults is not None and self.member.deferred_steps:
            self._feed(lifecycle.Release())    # the schedule's hold may be over
            if self.host.work:
                self._pump(0.0)   # what arrived while held first: a jump would otherwise mix without it
        steps = self._next_work()
        if steps is not None:
            self._work_point(steps)
            self._pump(0.0)
        else:
            self._pump(self._poll_timeout())
        now, timers = self.now(), self.host.timers
        while self.member.alive and not self.node.finished and (key := timers.pop_due(now)) is not None:
            self._feed(TimerFired(key), mixes=True)
        if self.member.heal_due():
            self._feed(lifecycle.Heal(), mixes=True)
        self._periodic()

    def _next_work(self) -> int | None:
        """The member's queued work, unless a test hook holds it at this step (a gateway's: its
        rounds, as its checkpoints count them) or the peer is stopping."""
        if self.member.phase is not lifecycle.Phase.TRAINING:
            return None
        held = bool(self.host.work) and (self.hooks.holds(self._work_done(), self.now())
                                         or self._stop_why is not None)
        self.state = ("held by a test hook" if held or self.member.deferred_steps
                      else self.member.phase.value)
        return None if held else self.host.next_work()

    def _work_point(self, steps: int) -> None:
        """The member's work point (a checkpoint when due, the schedule's faults), then its steps."""
        self.to_train = None
        self._feed(lifecycle.WorkPoint(steps), mixes=self.faults is not None)  # a cut, a heal: may mix
        if self.faults is not None:
            self.faults.record(self.member.faults.fired)
        if self.to_train is not None and self.exit is None:
            self._do_work(self.to_train)

    def _shutdown(self) -> int:
        assert self.transport is not None
        self.transport.wait_sent(timeout_s=5.0)
        self._gateway_rounds(flush=True)    # the end, or a stop: what closed, with the model held now
        if self.node.finished:
            self.state = "finished"
            self._evaluate()
            self._checkpoint(final=True)
            self._write_status(force=True)
            grace_end = self.now() + self.config.peer.finish_grace_s
            while self.now() < grace_end and self._stop_why is None:
                self._pump(0.05)
                self._beat()
            self.transport.wait_sent(timeout_s=5.0)
            self._write_status(force=True)
            return 0
        if self.exit is not None and self.exit.code == lifecycle.EXIT_STRANDED:
            self.state = "stranded"
            self._write_status(force=True)
            self.status.say(f"{self.name}: {self.exit.why}; exiting at {daemon_files.progress_words(self)} "
                            f"(status {self.exit.code})")
            return self.exit.code
        self.state = "stopped"
        if self.exit is None:
            self._checkpoint(final=False)
        self._write_status(force=True)
        why = self.exit.why if self.exit is not None else self._stop_why or "stop"
        what = "checkpoint written" if self._saved else "no checkpoint written"
        self.status.say(f"{self.name}: {why}: {what} at {daemon_files.progress_words(self)}; exiting")
        return self.exit.code if self.exit is not None else 0

    # ------------------------------------------------------------------ the loop's pieces

    def _poll_timeout(self) -> float:
        at = self.host.timers.next_at()
        due = min(self.member.next_deadline(), self.status.next_due, math.inf if at is None else at)
        busy = self.host.work or self.member.phase is not lifecycle.Phase.TRAINING
        return max(0.0, min(due - self.now(), 0.1 if busy else 0.5))

    def _pump(self, timeout_s: float) -> None:
        """Receive for up to ``timeout_s`` and dispatch everything that arrived (at once when
        messages read during a send wait are queued)."""
        self.inbox.poll(timeout_s)
        while (taken := self.inbox.next()) is not None:   # a dispatch may wait for sends, which queues
            self._opened(*taken)

    def _opened(self, opened: Opened | Rejection, connection: bytes | None = None) -> None:
        if isinstance(opened, Rejection):   # counted by the endpoint; a member set up differently
            notice = self.mismatches.first(opened.reason, opened.sender, opened.detail)  # is said once
            if notice:
                self.status.warn(notice)
            self._answer(opened, connection)
        elif isinstance(opened.message, SettingsRefusal):
            self.status.warn_once(f"{self.name}: {self.refusals.heard(opened.sender, opened.message)}")
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

    def _answer(self, rejection: Rejection, connection: bytes | None) -> None:
        """A member refused for its run id gets our settings (SettingsRefusal): a client on the
        connection it dialled (never kept as its route: nothing of it was accepted), a neighbour on
        ours to it."""
        assert self.transport is not None
        frames = self.refusals.answer(rejection, self.now())
        if frames is None:
            return
        if rejection.sender in self.neighbours:
            self.transport.send(rejection.sender, frames)
        elif connection is not None:
            self.transport.reply(connection, frames)

    def _dispatch(self, opened: Opened) -> None:
        """Hand a verified message to the member; what only a daemon shows (heartbeat latency, the
        neighbours' last parameters for the consensus estimate) is kept here."""
        sender, message = opened.sender, opened.message
        info = self.neighbours.get(sender)
        if info is not None:
            if isinstance(message, Heartbeat):
                latency_ms = heartbeat_latency_ms(message.sent_at_s, time.time())
                if latency_ms is None:
                    self.counters.rejected["heartbeat_bad_latency"] += 1
                else:
                    info.latency_ms = latency_ms
            carried = self.machine.sender_params
            remember_params(info, lambda: carried(message), self.trainer.flat_params.numel())
        reachable = info is None or info.up or self._can_send(sender)  # (tried only when it matters)
        mixes = self.node.may_write_params(message) or (info is not None and not info.up)
        self._feed(lifecycle.Arrived(sender, message, reachable), mixes=mixes)  # NeighbourUp may mix too

    def _feed(self, event: lifecycle.MemberEvent | Event, *, mixes: bool = False) -> None:
        """Hand ``event`` to the member and carry out what it answers; ``mixes``: the machine may
        change a tensor in place, so our sends in flight go first."""
        if mixes:
            self._wait_sent()
        self.host.handle(self.now(), event)
        if self.gateway is not None:
            self._gateway_progress()
        for text in [*self.config_warnings, *self.machine.warnings(), *self.trainer.warnings()]:  # once each
            self.status.warn_once(f"{self.name}: warning: {text}")

    def _wait_sent(self) -> None:
        """The machine mixes (and a state sync adopts) in place: tensors still being sent must go first.
        A neighbour whose connection moved no byte for the round deadline has its sends abandoned
        (:func:`transport_config`); a slow one is waited for up to ``send_timeout_s``."""
        assert self.transport is not None
        if self.transport.pending_sends():
            self.transport.wait_sent()

    def _do_work(self, steps: int) -> None:
        if self.gateway_work is not None:   # a gateway trains nothing: its work is a FedAvg round
            begun, done = self.gateway_work.begin(self.now(), self.machine.position[0])
            self.host.carry_out(self.node.role_actions(SERVER_ROLE, begun))
            self._gateway_progress()
            if done:
                self._feed(WorkDone(steps, 0.0), mixes=True)
            return
        self._wait_sent()    # training changes the parameters in place
        if self.params_trace is not None:
            self.params_trace.at_work_point(self.trainer.step, self.trainer.flat_params)
        began = time.monotonic()
        try:
            self.last_loss = self._run_steps(steps)
        except StepsStopped:   # no WorkDone: stopped, as SIGTERM leaves a peer between rounds
            return
        finally:
            self.counters.work_s += time.monotonic() - began
        self._feed(WorkDone(steps, self.last_loss), mixes=True)

    def _run_steps(self, steps: int) -> float:
        """The trainer's steps, on the worker thread: meanwhile this thread sends our heartbeats and
        reads the inbox (messages queued until the steps are done: they own the parameters), so a
        long step does not look like a dead peer, nor hold up a neighbour's send past its deadline."""
        assert self.transport is not None
        done = self.worker.submit(self._paced_steps, steps)
        while True:
            try:
                return done.result(timeout=WORK_LOOK_S)
            except TimeoutError:
                self._beat()
                self.inbox.take_in(self.transport.poll(0.0))

    def _paced_steps(self, steps: int) -> float:
        began = time.monotonic()
        loss = self.trainer.run_steps(steps)
        if self.hooks.step_pace_s:  # a test's slower machine: the steps take that long, as compute would
            time.sleep(max(0.0, began + steps * self.hooks.step_pace_s - time.monotonic()))
        return loss

    def _gateway_progress(self) -> None:
        """After a gateway acted: closed rounds evaluated and written once; a FedAvg round closed is
        its gossip machine's work done."""
        assert self.gateway_work is not None
        self._gateway_rounds(flush=False)
        if self.gateway_work.closed():
            self._feed(WorkDone(1, 0.0), mixes=True)

    def _gateway_rounds(self, *, flush: bool) -> None:
        """A gateway's closed rounds whose gossip is over (all of them when ``flush``) evaluated and
        written to rounds.jsonl, once."""
        if self.gateway is None:
            return
        found = self.gateway.closed_rounds(self.machine.position[0], self.trainer.evaluate,
                                           self.status.append_line, flush=flush,
                                           warn=lambda line: self.status.warn(f"{self.name}: {line}"))
        if found is not None:
            self.last_eval, self.last_eval_step = found, daemon_files.progress(self)
            self.status.metric_line(self._snapshot())

    # ------------------------------------------------------------------ periodic duties

    def _beat(self) -> None:
        """The member's heartbeat, when due (stamped with the wall clock for the latency estimate);
        while it waits, the neighbours it waits for must also be reachable."""
        later = self.member.schedule.joins_later()
        reachable = all(info.reachable for name, info in self.neighbours.items() if name not in later)
        self.host.handle(self.now(), lifecycle.Beat(all_reachable=reachable, stamp_s=time.time()))

    def _can_send(self, name: str) -> bool:
        """Whether a message to ``name`` goes out now: a heartbeat is tried. A neighbour is up when
        we hear it *and* reach it; the machine resends the round's message on ``NeighbourUp``, which
        would be lost on a connection not yet made."""
        assert self.transport is not None
        if self.hooks.cutting(self.now()):
            self.counters.test_cut_dropped["sent"] += 1
            return False
        beat = self.node.heartbeat(step=self.trainer.step, loss=self.last_loss, stamp_s=time.time())
        return self.transport.send(name, wire_messages(self.endpoint.seal((name,), beat)))

    def _periodic(self) -> None:
        self._beat()
        self._follow_roster()
        if self.member.phase is lifecycle.Phase.WAITING:
            line = waiting_line(self.node.neighbourhood.presence())
            if line and line != self._said_waiting:    # on change only
                self._said_waiting = line
                self.status.say(f"{self.name}: {line}")
        else:
            self._feed(lifecycle.Expire(), mixes=bool(self.node.neighbourhood.overdue(self.now())))
        every = self.config.peer.eval_every_steps
        if self.node.started and every and self.trainer.step - max(self.last_eval_step, 0) >= every:
            self._evaluate()
        if self.gateway is not None and self.gateway.due(self._work_done(), self.now()):
            self._checkpoint(final=False)
        self._write_status()

    def _follow_roster(self) -> None:
        """A new roster version in the file goes to the member's Node, which applies it at its round;
        on SIGHUP the file is read now, and what was found is said."""
        forced, self._reload_asked = self._reload_asked, False
        self.counters.roster_reloads += forced
        found = reread(self.roster_watch, self.now(), forced=forced, name=self.name, say=self.status.say,
                       warn=self._warn)
        if found is None:
            return
        try:
            topology = peer_topology(self.config, found.roster)
        except HivemeshError as error:
            self._warn(f"roster version {found.roster.version} not applied: {error}")
        else:   # the machine's graph changes: no tensor of ours may be in flight
            self._feed(lifecycle.RosterChange(found.roster, topology, NeighbourInfo), mixes=True)
        # not applied (refused by the Node, or no graph): the status shows the version in use
        self.roster_watch.held(self.node.membership.current)

    def _connect(self, connect: Connect) -> None:
        assert self.transport is not None
        dial.connect(connect, name=self.name, config=self.config, transport=self.transport,
                     endpoint=self.endpoint, dialled=self._dialled,
                     say=self.status.say, warn=self._warn)

    def _evaluate(self) -> None:
        at = daemon_files.progress(self)    # a gateway's is its rounds closed
        if self.last_eval_step == at:
            return
        self.last_eval = self.trainer.evaluate()
        self.last_eval_step = at
        found = self._snapshot()
        self.status.metric_line(found)
        scalars = self.scalars
        if scalars is not None:     # a full disk: lost and counted (status_write_failures), as a line is
            self.status.guarded("tensorboard", lambda: scalars.write(found))

    def _restore(self) -> bool:
        return daemon_files.restore(self)

    def _work_done(self) -> int:
        return daemon_files.work_done(self)

    def _checkpoint(self, *, final: bool) -> bool:
        self._saved = daemon_files.checkpoint(self, final=final)
        return self._saved

    def _snapshot(self) -> dict[str, Any]:
        return snapshot(self)

    def _write_status(self, *, force: bool = False) -> None:
        if force or self.now() >= self.status.next_due:
            self._published = self._snapshot()
            self.status.write(self._published, now=self.now(), interval_s=self.config.peer.status_interval_s)

    def _warn(self, text: str) -> None:
        self.status.warn(f"{self.name}: warning: {text}")

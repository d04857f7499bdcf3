"""``hivemesh edge``: an edge client's driver. Its Node hosts a FedAvg client; the gateway decides.

A driver only, like the peer daemon (peer/runtime/daemon.py): the Node
(protocols/node) with the client as its machine (protocols/federation/edge_machine.py)
and the gateway as its one neighbour decides everything; this loop carries its
actions out with one dial-out connection (peer/net/dial.py: nothing listens,
so it works behind NAT), the trainer and the monotonic clock:

1. poll the connection until the next deadline (a timer, the heartbeat, the status);
2. each frame goes through the Endpoint (header first, signature, replay window,
   run id): a rejection is counted, an accepted message goes to ``Node.receive``;
3. ``Send`` (its updates, its heartbeats: what keeps it registered) -> seal ->
   the connection; ``StartWork(n)`` -> ``n`` steps on its own data at the federation's place
   on the learning-rate schedule (peer/train/federated.py, with FedProx's pull toward the
   round's global model when ``prox_mu > 0``) -> ``WorkDone``
   (the client uploads the delta, compressed with error feedback);
   ``Finished`` (the gateway's final model arrived) -> checkpoint, exit 0.

Nothing but updates (deltas of the model, compressed) and heartbeats leaves
the device; what it holds is the model, its round anchor and its error
feedback residual (each the model's size) and its own data.

Restarts: after each upload and at exit the trainer's and the client's state
(the error-feedback residual, the round) and the replay windows are written
to ``data_dir`` (peer/train/checkpoint.py: safetensors and a JSON header, no
pickle); a restarted client resumes from them with a new epoch. A restarted
gateway: ZeroMQ redials, the next heartbeat re-registers the client, and the
server asks it again in a later round.

The end: the gateway's ``RoundResult`` (the federation's final model, sent to
every registered client, and to one that registers later while the gateway is
still up: protocols/federation/server_base.py) -> exit 0. A client that misses it
(it was away until its gateway exited) or whose gateway never comes up would
wait for ever, so it gives up after
``[edge] gateway_timeout_s`` (0 = never) with neither a connection to the
gateway nor a message from it: a send that ZeroMQ takes means a connection
whose handshake (CurveZMQ, the gateway's admission) completed, so a gateway
that is up but samples other clients for a long while keeps it waiting, one
that exited or never started does not. It then writes its checkpoint and
status (state ``gave up``), says why with its counters, and exits
:data:`protocols.node.member.EXIT_STRANDED` (3). Until then it says what it waits for, in words
(peer/runtime/edgewait.py, its status's ``waiting_for``): no connection to its gateway and why
(from the socket's monitor: peer/net/reach.py), no answer yet, or not sampled since a round.

SIGINT/SIGTERM: the loop ends at its next turn, the gateway is told we leave (a heartbeat
saying ``finished``: no round of it waits for us to its deadline), a checkpoint is written,
exit 0.
SIGHUP is ignored from the start: an edge client reads its roster when it
starts, and a `hivemesh roster reload` aimed at its folder must not end it.
Test hooks (peer/runtime/testhooks.py, from the environment) fire on the
trainer's step before a round's work is trained: a process test kills a
sampled client mid-round that way, without sleeps, makes a client an attacker
(``signflip``: its trained model is flipped by peer/train/attack.py before the
upload, as the simulator's attackers are; ``attack``: its upload forged too, by the
same module) or a slow device (``pace``: the
round's ``WorkDone`` waits, the loop polling, until its steps took that long).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from types import FrameType
from typing import Any

from peer.files.console import ensure_logging
from peer.files.statefiles import CheckpointStore, StatusWriter
from peer.files.units import counts_in_words
from peer.net.dial import DialTransport
from peer.runtime.assemble import next_epoch, tcp_address
from peer.runtime.datalock import DataDirLock
from peer.runtime.edgeconfig import EdgeConfig, edge_identity_and_roster, load_edge_config
from peer.runtime.edgewait import GatewayWait
from peer.runtime.refusals import heard
from peer.runtime.testhooks import Hook, Hooks, hooks_from_environment
from peer.train.attack import forge, sign_flip
from peer.train.federated import Fit, fit_round, train_round
from peer.train.tasks import load_function
from peer.train.trainer import Trainer
from protocols.assembly import AssemblyConfig, model_message_bytes
from protocols.events import CancelTimer, Finished, Metric, Send, SetTimer, StartWork, TimerFired, WorkDone
from protocols.federation import FedAvgClient, SecureClient
from protocols.federation.edge_machine import EdgeMachine
from protocols.federation.secure import roster_verify
from protocols.identity import Identity
from protocols.messages import SettingsRefusal
from protocols.node import Neighbour, Node, NodeAction, Note
from protocols.node.host import TimerTable
from protocols.node.member import EXIT_STRANDED
from protocols.roster import Roster, run_id
from protocols.wire import Endpoint, Opened, wire_messages
from topology.errors import HivemeshError


def edge_trainer(config: EdgeConfig, roster: Roster) -> Trainer:
    """The client's trainer: on its own data (``[edge] data``), else its shard of the task among the
    roster's edge clients (demos and tests)."""
    from peer.train.build import build_trainers

    edges = [m.name for m in roster.with_role("edge")]
    if not config.data:
        return build_trainers(config.network, config.trainer, members=edges,
                              wanted=(config.edge.name,))[1][config.edge.name]
    import numpy as np

    from peer.train.local_data import load_local_data
    from peer.train.tasks import get_task

    task = get_task(config.network.task, **config.network.task_options)
    if task.lazy:
        raise HivemeshError(f"[edge] data: task {config.network.task} holds Datasets; an edge client's "
                            "own data file cannot stand in for them yet (leave data out)")
    x, y = load_local_data(config.data, label_column=config.edge.label_column)
    own = dataclasses.replace(task, train_x=x, train_y=y, _cast_cache={})
    return Trainer(own, config.trainer, np.arange(len(x)), seed=config.network.seed,
                   member_index=sorted(edges).index(config.edge.name))


class EdgeClient:
    """One running edge client. ``run()`` returns the process exit code."""

    def __init__(self, config: EdgeConfig, *, hooks: Sequence[Hook] = ()) -> None:
        self.config = config
        self.hooks = Hooks(hooks)
        edge = config.edge
        self.name = edge.name
        identity, roster, gateway = edge_identity_and_roster(config)
        self.gateway = edge.gateway
        self.address = tcp_address(edge.gateway_address or gateway.address)
        self.curve: tuple[bytes, bytes, bytes] | None = None
        if edge.curve:
            if not gateway.curve_key:
                raise HivemeshError(f"{config.source}: key 'edge.curve': the gateway {edge.gateway!r} has no "
                                    f"curve_key on the roster {config.roster_path}")
            self.curve = (identity.curve_public_key.encode(), identity.curve_secret_key.encode(),
                          gateway.curve_key.encode())
        self.lock = DataDirLock(config.data_dir)
        try:
            self.epoch = next_epoch(config.data_dir)
            self.endpoint = Endpoint(identity, roster, run_id(config.shared()), self.epoch)
            self.trainer = edge_trainer(config, roster)
            self.fit: Fit | None = load_function(config.fit) if config.fit else None
            self.edge_names = sorted(m.name for m in roster.with_role("edge"))
        except BaseException:
            self.lock.release()
            raise
        params = self.trainer.flat_params
        bound = model_message_bytes(params.numel(), header_bytes=self.endpoint.policy.max_header_bytes)
        policy = self.endpoint.policy
        self.endpoint.use(policy=dataclasses.replace(policy, max_message_bytes=bound,
                                                     max_elements=min(policy.max_elements, bound)),
                          assembly=AssemblyConfig(max_in_flight_bytes=2 * bound))
        self.client = FedAvgClient(config.federation, name=self.name, server=self.gateway, params=params,
                                   num_samples=len(self.trainer.shard),
                                   steps_per_epoch=self.trainer.steps_per_epoch,
                                   secure=self._secure(config, identity))
        self.store = CheckpointStore(config.data_dir, keep=2)
        self._recovered = self.store.recover()     # a dead writer's temporaries, before any load
        # its bar: the federation's round as it last heard it (the gateway decides which it trains)
        self.status = StatusWriter(config.data_dir, name=self.name, progress=edge.progress,
                                   total_steps=config.federation.rounds, unit="rounds")
        self.resumed = self._restore()
        self.node: Node[Neighbour] = Node(
            self.name, EdgeMachine(self.client), neighbours={self.gateway: Neighbour()},
            config=edge.node_config(), early_per_neighbour=2,
            answer_source=lambda: (params.detach().clone(), self.trainer.step))
        self.transport: DialTransport | None = None
        self.wait = GatewayWait(gateway=self.gateway, address=self.address, federation=config.federation,
                                heartbeat_interval_s=edge.heartbeat_interval_s)
        self._t0 = time.monotonic()
        self.timers = TimerTable()
        self._work: list[int] = []
        self._trained: tuple[float, int, float] | None = None   # (WorkDone due at, steps, loss)
        self._stop_signal: int | None = None
        self._finished = False
        self._saved = True               # the last checkpoint attempt wrote one
        self._last_loss = math.nan
        self._contact_s = 0.0        # last accepted message from the gateway, or send it took (now())
        self.refused = ""     # what the gateway's last refusal of our settings named (SettingsRefusal)
        self.unsent: Counter[str] = Counter()
        self.state = "starting"

    def _secure(self, config: EdgeConfig, identity: Identity) -> SecureClient | None:
        """This client's side of secure aggregation (None: off): a fresh secret per process (each
        round's keys are derived from it with the run and round), its roster key signs."""
        secure = config.federation.secure_aggregation
        if secure is None:
            return None
        return SecureClient(secure, name=self.name, server=self.gateway, run_id=self.endpoint.run_id.hex(),
                            client_secret=os.urandom(32), sign=identity.sign,
                            verify=roster_verify(lambda: self.endpoint.roster))

    def now(self) -> float:
        return time.monotonic() - self._t0

    @property
    def rounds_trained(self) -> int:
        """Rounds this client trained for, over all its starts (a round asked again counts once)."""
        return self.client.counters["rounds_trained"]

    @property
    def updates_sent(self) -> int:
        """Updates this client uploaded, over all its starts (``unsent``: those no connection took)."""
        return self.client.counters["updates_sent"]

    def federation_round(self) -> int:
        """The federation's round as this client last heard it: the rounds closed before the round it
        was last asked to train (that round's 0-based index; -1: none yet), all of them once the final
        model came."""
        return self.config.federation.rounds if self._finished else self.client.round

    # ------------------------------------------------------------------ running

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.lock.release()

    def _run(self) -> int:
        def stop(signum: int, frame: FrameType | None) -> None:
            self._stop_signal = signum

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        self.transport = DialTransport(self.address, config=self.config.transport, curve=self.curve)
        self._contact_s = self.now()     # the give-up's clock starts with the dial
        self.status.say(f"{self.name}: dials its gateway {self.gateway} at {self.address}")
        try:
            self.state = "registered" if self.resumed else "starting"
            self._carry_out(self.node.start(self.now()))
            self.state = "waiting for a round"
            gave_up = False
            while not self._finished and self._stop_signal is None:
                held = bool(self._work) and self.hooks.holds(self.trainer.step, self.now())
                if self._work and not held and self._trained is None:
                    self._train(self._work.pop(0))
                self._work_done()
                self._pump(0.05 if held else self._poll_timeout())
                self._say_connection()
                self._fire_timers()
                self._carry_out(self.node.tick(self.now(), step=self.trainer.step, loss=self._last_loss))
                self._carry_out(self.node.expire(self.now())[1])
                self._write_status()
                if self._gateway_lost():
                    gave_up = True
                    break
            self.state = "finished" if self._finished else "gave up" if gave_up else "stopped"
            if self.state == "stopped":  # said, so the gateway's round waits for us no more
                self._carry_out(self.node.farewell(step=self.trainer.step, loss=self._last_loss))
            self.transport.wait_sent(timeout_s=5.0)
            self._checkpoint()
            self._write_status(force=True)
            if gave_up:
                self.status.warn(self._give_up_line())
                return EXIT_STRANDED
            if self._finished:
                self.status.say(f"{self.name}: the federation finished; "
                                f"{self.rounds_trained} rounds trained here")
            else:
                self.status.say(f"{self.name}: {signal.Signals(self._stop_signal or signal.SIGTERM).name}: "
                                f"{self._checkpoint_words()}; exiting")
            return 0
        finally:
            self.transport.close()
            self.status.close()

    def _gateway_lost(self) -> bool:
        """Whether ``gateway_timeout_s`` passed with no connection to the gateway and no word from it."""
        timeout_s = self.config.edge.gateway_timeout_s
        return timeout_s > 0 and self.now() - self._contact_s > timeout_s

    def _give_up_line(self) -> str:
        assert self.transport is not None
        last_seen = self.node.neighbourhood.members[self.gateway].last_seen
        heard = f"last heard at {last_seen:.1f} s" if math.isfinite(last_seen) else "never heard"
        reach = self.transport.reach
        connection = reach.reason(time.monotonic()) or "connected, but silent"
        trained = f"last trained round {self.client.round}" if self.client.round >= 0 else "no round trained"
        rejections = self.endpoint.rejections + self.node.all_rejections()
        return (f"{self.name}: gave up on gateway {self.gateway} at {self.address}: no connection to it "
                f"and no message from it for {self.config.edge.gateway_timeout_s:g} s "
                f"([edge] gateway_timeout_s; {heard}; connection: {connection}; it may have finished while "
                f"this client was away, or never started); exiting {EXIT_STRANDED} at {self.now():.1f} s "
                f"with {self.rounds_trained} rounds trained, {self.updates_sent} updates sent, {trained}; "
                f"unsent: {counts_in_words(self.unsent)}; rejected: {counts_in_words(rejections)}")

    def _say_connection(self) -> None:
        """An outage of the connection to the gateway, said in the log as it lasts, and its end."""
        assert self.transport is not None
        reach, now_s = self.transport.reach, time.monotonic()
        down_for_s = reach.last_outage_s if reach.up else reach.down_for_s(now_s)
        line = self.wait.outage_line(up=reach.up, down_for_s=down_for_s, reason=reach.reason(now_s))
        if line is not None:
            (self.status.say if reach.up else self.status.warn)(f"{self.name}: {line}")

    def _waiting_for(self) -> str:
        """What the client waits for, in words (peer/runtime/edgewait.py); "" when it does not."""
        if self.state != "waiting for a round" or self.transport is None:
            return ""
        if self.refused:     # the gateway said why it takes nothing of ours: that is the wait
            return self.refused
        reach = self.transport.reach
        return self.wait.note(up=reach.up, reason=reach.reason(time.monotonic()),
                              heard=self.node.neighbourhood.members[self.gateway].up,
                              last_round=self.client.round)

    def _poll_timeout(self) -> float:
        assert self.transport is not None
        deadlines = [self.node.next_beat_s, self.status.next_due]
        reach = self.transport.reach
        if not reach.up:     # the outage's next line (peer/runtime/edgewait.py) is said on time
            deadlines.append(self.now() + reach.down_since_s + self.wait.next_line_s() - time.monotonic())
        timer_at = self.timers.next_at()
        if timer_at is not None:
            deadlines.append(timer_at)
        if self._trained is not None:
            deadlines.append(self._trained[0])
        if self._work and self._trained is None:
            return 0.0
        return max(0.0, min(min(deadlines) - self.now(), 0.5))

    def _pump(self, timeout_s: float) -> None:
        assert self.transport is not None
        for arrival in self.transport.poll(timeout_s):
            opened = self.endpoint.receive(arrival.connection, arrival.frame.buffer, now_s=self.now())
            if isinstance(opened, Opened):
                if opened.sender == self.gateway:
                    self._contact_s = self.now()
                if isinstance(opened.message, SettingsRefusal):   # our run id is not the gateway's
                    self.refused = heard(opened.sender, self.config.shared(), opened.message)
                    self.status.warn_once(f"{self.name}: {self.refused}")
                    continue
                if self.node.may_write_params(opened.message):
                    self.transport.wait_sent()   # a RoundStart overwrites the model our update reads
                self._carry_out(self.node.receive(opened.sender, opened.message, self.now()))
        self.endpoint.expire(self.now())

    def _train(self, steps: int) -> None:
        assert self.transport is not None
        self.state = "training"
        self.transport.wait_sent()       # training changes the parameters in place
        began = self.now()
        if self.fit is None:
            loss = train_round(self.trainer, self.client, steps)
        else:
            loss = fit_round(self.trainer, self.client, steps, self.fit,
                             member_index=self.edge_names.index(self.name), members=len(self.edge_names))
        if self.hooks.attack.flip_scale > 0 and self.client.anchor is not None:   # a test's attacker
            sign_flip(self.trainer.flat_params, self.client.anchor, self.hooks.attack.flip_scale)
        if self.client.secure is not None:    # a test's SecAgg insider, from the rounds after
            self.client.secure.insider = dict(self.hooks.attack.secagg)
        for text in self.trainer.warnings():
            self.status.warn_once(f"{self.name}: warning: {text}")
        self._trained = (began + steps * self.hooks.step_pace_s, steps, loss)
        self._work_done()

    def _work_done(self) -> None:
        """The trained round's ``WorkDone``, once due (at once unless a test's ``pace`` hook slows it)."""
        if self._trained is None or self.now() < self._trained[0]:
            return
        _, steps, self._last_loss = self._trained
        self._trained = None
        self._carry_out(self.node.handle(WorkDone(steps, self._last_loss), self.now()))
        self._checkpoint()               # the error feedback of this upload survives a restart
        self.state = "waiting for a round"

    def _carry_out(self, actions: Sequence[NodeAction]) -> None:
        for action in actions:
            match action:
                case Send():
                    self._send(action)
                case StartWork():
                    self._work.append(action.steps)
                case SetTimer():
                    self.timers.set(action.key, action.at)
                case CancelTimer():
                    self.timers.cancel(action.key)
                case Finished():
                    self._finished = True
                case Note(text=text):
                    self.status.say(f"{self.name}: {text}")
                case Metric():
                    pass

    def _send(self, action: Send) -> None:
        assert self.transport is not None
        message = forge(action.message, self.hooks.attack)    # honest unless a test's hook says
        frames = wire_messages(self.endpoint.seal(action.recipients, message))
        if self.transport.send(frames):
            self._contact_s = self.now()    # a connection the gateway's handshake admitted
        else:
            self.unsent[action.message.KIND] += 1   # no connection now: the gateway asks again later

    def _fire_timers(self) -> None:
        while (key := self.timers.pop_due(self.now())) is not None:
            self._carry_out(self.node.handle(TimerFired(key), self.now()))

    # ------------------------------------------------------------------ persistence and status

    def _restore(self) -> bool:
        for line in self._recovered:
            self.status.say(f"{self.name}: checkpoints: {line}")
        state = self.store.load_latest()
        if state is None:
            return False
        trainer_state, protocol_state, extra = state
        self.trainer.load_state_dict(trainer_state)
        self.client.restore_state(protocol_state)
        windows = extra.get("endpoint")
        if isinstance(windows, dict):
            self.endpoint.restore_state(windows)
        self.status.say(f"{self.name}: resumed from checkpoint {self._held()} ({self.rounds_trained} rounds "
                        f"trained, {self.updates_sent} updates sent; epoch {self.epoch})")
        return True

    def _checkpoint(self) -> None:
        assert self.transport is not None
        self.transport.wait_sent()
        failing = self.store.error
        reason = self.store.save(self.trainer.state_dict(), self.client.export_state(),
                                 {"endpoint": self.endpoint.export_state(), "epoch": self.epoch})
        if reason and reason != failing:    # a full disk: the client trains on, the older ones stay
            self.status.warn(f"{self.name}: warning: cannot checkpoint: {reason}")
        self._saved = not reason

    def _held(self) -> str:
        """The round a checkpoint of now holds: ``after training round 5``, or ``before any round``."""
        return f"after training round {self.client.round}" if self.client.round >= 0 else "before any round"

    def _checkpoint_words(self) -> str:
        """What the checkpoint written at a stop holds, for the console."""
        if not self._saved:
            return "no checkpoint written"
        return f"checkpoint written {self._held()} ({self.rounds_trained} rounds trained)"

    def snapshot(self) -> dict[str, Any]:
        assert self.transport is not None
        gateway = self.node.neighbourhood.members[self.gateway]
        return {"name": self.name, "role": "edge", "state": self.state, "waiting_for": self._waiting_for(),
                "epoch": self.epoch,
                "uptime_s": round(self.now(), 3), "gateway": self.gateway, "gateway_address": self.address,
                "gateway_up": gateway.up, "round": self.federation_round(),
                "rounds": self.config.federation.rounds, "rounds_trained": self.rounds_trained,
                "last_round_asked": self.client.round,     # the round (0-based) it was last asked to train
                # the gateway refuses our messages: the first of our settings that differs from its
                "settings_refused": self.refused,
                "updates_sent": self.updates_sent, "unsent": dict(self.unsent), "step": self.trainer.step,
                # what the last local step used: the rate, and its place on the federation's schedule
                "lr": self.trainer.last_lr, "schedule_step": self.trainer.last_schedule_step,
                "loss": self._last_loss, "num_samples": len(self.trainer.shard),
                "bytes_sent": self.transport.bytes_sent, "bytes_received": self.transport.bytes_received,
                "listening": list(self.transport.listening()),
                # handshakes the gateway refused (``auth``: its roster does not admit us, yet or any
                # more), each followed by a redial after a backoff (peer/net/dial.py)
                "handshake_refused": dict(self.transport.handshake_refused),
                "handshakes": self.transport.handshakes, "redialed": self.transport.redialed,
                "rejections": dict(self.endpoint.rejections + self.node.all_rejections()),
                "internal_errors": dict(self.node.internal_errors),
                "frames_dropped": dict(self.endpoint.assembler.frames_dropped + self.transport.hostile),
                "client": dict(sorted(self.client.counters.items())),
                "checkpoint_step": self.store.step, "checkpoints_written": self.store.written,
                "checkpoint_failures": dict(self.store.failures), "checkpoint_error": self.store.error,
                "checkpoint_nonfinite": dict(self.store.nonfinite),
                "status_write_failures": dict(self.status.failures),
                "status_values_replaced": dict(self.status.replaced),
                "warnings": self.trainer.warnings()}

    def _write_status(self, *, force: bool = False) -> None:
        if force or self.now() >= self.status.next_due:
            self.status.write(self.snapshot(), now=self.now(), interval_s=self.config.edge.status_interval_s)


def run_edge(config_path: str, *, quiet: bool = False) -> int:
    """Load the config, run the client, return the exit code (errors as one line on stderr)."""
    ensure_logging()
    # an edge client reads its roster when it starts, and takes no SIGHUP: a `hivemesh roster reload`
    # aimed at its folder (before its first status names it an edge) must not end it (SIGHUP's default)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        config = load_edge_config(config_path)
        if quiet:
            config = dataclasses.replace(config, edge=dataclasses.replace(config.edge, progress=False))
        return EdgeClient(config, hooks=hooks_from_environment()).run()
    except HivemeshError as error:
        print(f"hivemesh: error: {error}", file=sys.stderr, flush=True)
        return 2

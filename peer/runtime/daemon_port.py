"""The daemon's side of protocols/node/host.py's port: sockets, the trainer, files and the console.

:class:`DaemonPort` is what :class:`protocols.node.host.Host` carries the
member's actions out through (protocols/node/member.py decides them):

* ``send``: sealed once, header first, then one transport send per recipient
  (an edge client's on the connection its last accepted message came on),
  counted in ``Host.counters``; a test's cut drops it (counted);
* ``train``: the steps are run by the loop once the member's turn is over
  (peer/runtime/daemon.py's ``_work_point``: on the worker thread);
* ``save``: a checkpoint file (peer/files/statefiles.py); ``say``: a line;
* ``connect``: peer/runtime/dial.py; ``wake``: nothing (the loop polls the
  timer table);
* ``mark``: what the process keeps of the life: its state and timeline, the
  trainer's step, silent neighbours counted and said, the schedule's files,
  and the exit the loop ends with.
"""

from __future__ import annotations

import time
from typing import Any

from peer.runtime.daemon_parts import Daemon
from protocols.events import Finished, Send, SetTrainerStep
from protocols.messages import Message
from protocols.node import Note
from protocols.node.member import Entered, Exit, Phase, Reached, Silent
from protocols.node.membership import Connect
from protocols.wire import wire_messages, wire_size


def tensor_bytes(message: Message) -> int:
    """The payload a message carries (its tensors' bytes)."""
    return sum(t.numel() * t.element_size() for t in getattr(message, "tensors", {}).values())


class DaemonPort:
    """One daemon's port (its loop's thread only)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def send(self, send: Send) -> None:
        daemon = self.daemon
        transport, counters = daemon.transport, daemon.counters
        assert transport is not None
        frames = wire_messages(daemon.endpoint.seal(send.recipients, send.message))   # header first
        size, payload, kind = wire_size(frames), tensor_bytes(send.message), send.message.KIND
        for recipient in send.recipients:
            if recipient in daemon.node.clients:
                connection = daemon.routes.get(recipient)
                if connection is None or not transport.reply(connection, frames):
                    counters.client_unreachable[recipient] += 1
                    continue
                daemon.host.counters.count(kind, wire_bytes=size, payload_bytes=0)
                counters.client_bytes_sent[recipient] += size
                continue
            info = daemon.neighbours.get(recipient)
            if info is None:
                counters.unreachable[recipient] += 1
                continue
            if daemon.hooks.cutting(daemon.now()) or daemon.member.drops(recipient, send.message):
                counters.test_cut_dropped["sent"] += 1
                continue
            info.reachable = transport.send(recipient, frames)
            if info.reachable:
                daemon.host.counters.count(kind, wire_bytes=size, payload_bytes=payload)
            else:
                counters.unreachable[recipient] += 1

    def work_point(self, steps: int) -> None:
        raise AssertionError("the daemon takes its work from the queue itself")  # Host(work_at_once=False)

    def train(self, steps: int) -> None:
        self.daemon.to_train = steps

    def save(self, final: bool) -> None:
        self.daemon._checkpoint(final=final)

    def say(self, note: Note) -> None:
        if note.warning:
            self.daemon._warn(note.text)
        else:
            self.daemon.status.say(f"{self.daemon.name}: {note.text}")

    def connect(self, connect: Connect) -> None:
        self.daemon._connect(connect)

    def wake(self, at: float, key: str, token: int) -> None:
        pass   # the loop polls the timer table (Host.timers)

    def mark(self, action: Any) -> None:
        daemon = self.daemon
        match action:
            case Entered(phase=phase, was=was):
                self._entered(phase, was)
            case Finished():
                daemon.train_end_s = daemon.now()
                daemon.timeline["finished"] = time.time()
            case SetTrainerStep(step=step):
                if daemon.gateway is not None:
                    daemon.gateway.trainer_step_set(daemon.trainer.step, step)
                daemon.trainer.step = step     # the learning-rate schedule follows the network
                daemon.counters.trainer_steps_set.append(step)
            case Silent(names=names):
                now = daemon.now()
                for name in names:
                    info = daemon.neighbours[name]
                    if info.finished:
                        daemon.counters.neighbour_finished[name] += 1
                        daemon.status.say(f"{daemon.name}: neighbour {name} has finished")
                    else:
                        daemon.counters.neighbour_down[name] += 1
                        daemon._warn(f"neighbour {name} silent for {now - info.last_seen:.1f} s")
            case Reached(round=round_index):
                if daemon.faults is not None:
                    daemon.faults.reached(round_index)
            case Exit():
                daemon.exit = action

    def _entered(self, phase: Phase, was: Phase) -> None:
        daemon = self.daemon
        if phase in (Phase.WAITING, Phase.SYNCING, Phase.TRAINING):  # an end is shown once, at the exit
            daemon.state = phase.value
        if was is Phase.WAITING:
            daemon.timeline["neighbours"] = time.time()
        if was is Phase.SYNCING:
            daemon.timeline["synced"] = time.time()
        if phase is Phase.TRAINING:
            daemon.train_start_s = daemon.now()
            for note in daemon.machine.notes():
                daemon.status.say(f"{daemon.name}: {note}")
            daemon.counters.absent_at_start.update(daemon.node.neighbourhood.absent())  # told down at Start
        if phase is Phase.STRANDED:
            daemon.timeline["stranded"] = time.time()

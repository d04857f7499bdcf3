"""The tiny in-process driver of the gossip machines, for tests only.

The network and the clock are the simulator's engine (sim/engine.py: deliveries
in time order, then by send order); each machine's actions are carried out by
protocols/node/host.py's :class:`Host` (its timer table, work queue and send
counters) through this module's port. ``StartWork(n)`` runs the peer's worker at
once (the machine does not touch its parameters until ``WorkDone``) and delivers
``WorkDone`` after ``n * step_time_s``; a ``Send`` is sealed and opened through
real wire Endpoints when they are given, so byte counts are the codec's.
``cut(sender, recipient, now)`` returning True drops that delivery (a
partition); ``schedule`` feeds any event at a later time. No production code
path uses this module.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from protocols.events import (
    Action,
    Event,
    Finished,
    Machine,
    Received,
    Send,
    SetTrainerStep,
    Start,
    TimerFired,
    WorkDone,
)
from protocols.identity import Identity
from protocols.messages import Message, ParamPush
from protocols.node import Note
from protocols.node.host import Host
from protocols.node.membership import Connect
from protocols.roster import Roster, run_id
from protocols.wire import Endpoint, Opened, wire_size
from sim.engine import Engine


class Worker(Protocol):
    """What the driver needs of a trainer (``peer.train.trainer.Trainer`` is one)."""

    flat_params: torch.Tensor
    step: int   # where the learning-rate schedule stands; SetTrainerStep moves it, as in both real drivers

    def run_steps(self, n: int) -> float: ...


Tamper = Callable[[str, Message], Message]


def tensor_bytes(message: Message) -> int:
    tensors = getattr(message, "tensors", {})
    return sum(t.numel() * t.element_size() for t in tensors.values())


class _Port:
    """The driver's side of the host port, for machine ``name``."""

    def __init__(self, driver: Driver, name: str) -> None:
        self.driver = driver
        self.name = name

    def send(self, send: Send) -> None:
        self.driver._send(self.name, send)

    def work_point(self, steps: int) -> None:
        self.driver._train(self.name, steps)   # a bare machine: its work is trained at once

    def train(self, steps: int) -> None:
        self.driver._train(self.name, steps)

    def save(self, final: bool) -> None:
        pass   # a bare machine never asks

    def say(self, note: Note) -> None:
        pass

    def connect(self, connect: Connect) -> None:
        pass

    def wake(self, at: float, key: str, token: int) -> None:
        self.driver._push(at, self.name, TimerFired(key), token)

    def mark(self, action: Any) -> None:
        match action:
            case Finished():
                self.driver.finished.add(self.name)
                self.driver.finished_at.setdefault(self.name, self.driver.now)
            case SetTrainerStep(step=step):
                self.driver.workers[self.name].step = step


class Driver:
    """Drives named machines and workers over a modelled network and clock."""

    def __init__(self, machines: Mapping[str, Machine], workers: Mapping[str, Worker], *,
                 step_time_s: float | Mapping[str, float] = 1.0, latency_s: float = 0.01,
                 endpoints: Mapping[str, Endpoint] | None = None, tamper: Mapping[str, Tamper] | None = None,
                 observe: Callable[[Driver], None] | None = None,
                 cut: Callable[[str, str, float], bool] | None = None) -> None:
        self.machines = dict(machines)
        self.workers = dict(workers)
        names = sorted(self.machines)
        self.step_time_s = ({n: float(step_time_s) for n in names} if isinstance(step_time_s, int | float)
                            else dict(step_time_s))
        self.latency_s = latency_s
        self.endpoints = dict(endpoints) if endpoints else None
        self.tamper = dict(tamper or {})
        self.observe = observe
        self.cut = cut
        self.dropped = 0  # deliveries cut
        self.engine = Engine()  # the network and the timers: deliveries in flight
        self.hosts = {name: Host(functools.partial(self._handle, name), _Port(self, name)) for name in names}
        self._flying: dict[int, tuple[str, str, Message]] = {}  # deliveries of message objects not yet made
        self._flights = 0
        self.steps: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()  # wire rejections by reason
        self.finished: set[str] = set()
        self.finished_at: dict[str, float] = {}
        self.events = 0

    @property
    def now(self) -> float:
        return self.engine.now_s

    @property
    def metrics(self) -> dict[str, dict[str, float]]:
        return {name: host.metrics for name, host in self.hosts.items()}

    @property
    def bytes_sent(self) -> Counter[str]:
        """Whole messages on the wire (header, frames, signature); tensor bytes without endpoints."""
        return Counter({name: host.counters.wire_bytes_sent for name, host in self.hosts.items()})

    @property
    def payload_bytes(self) -> Counter[str]:
        """Tensor frames only."""
        return Counter({name: host.counters.payload_bytes_sent for name, host in self.hosts.items()})

    @property
    def messages_sent(self) -> Counter[str]:
        return Counter({name: host.counters.messages_sent for name, host in self.hosts.items()})

    # ------------------------------------------------------------ running

    def start(self) -> None:
        for name in sorted(self.machines):
            self.feed(name, Start())

    def run(self, *, until_s: float = math.inf, max_events: int = 10_000_000,
            pause_after: int | None = None) -> bool:
        """Deliver events in time order until none is left or ``until_s``: True when done.

        ``pause_after``: return False after that many deliveries (to checkpoint, then run again).
        """
        for delivered in range(max_events):
            at = self.engine.next_at()
            if at is None or at > until_s:
                return True
            if pause_after is not None and delivered >= pause_after:
                return False
            self.engine.step()
        raise AssertionError(f"driver did not settle within {max_events} events")

    def feed(self, name: str, event: Event) -> None:
        self.events += 1
        self.hosts[name].handle(self.now, event)
        if self.observe is not None:
            self.observe(self)

    def schedule(self, at: float, name: str, event: Event) -> None:
        """Feed ``event`` to ``name`` at time ``at`` (NeighbourDown/Up of a modelled failure detector)."""
        self._push(at, name, event)

    # ------------------------------------------------------------ actions

    def _handle(self, name: str, now: float, event: Event) -> list[Action]:
        return self.machines[name].handle(event, now)   # looked up each time: a test may swap machines

    def _push(self, at: float, target: str, event: Any, token: int = 0) -> None:
        """``event`` (an Event, or ``("frames", sender, frames)`` to open) reaches ``target`` at ``at``;
        a timer's only if ``token`` is still its live one."""
        self._flights += 1
        if isinstance(event, Received):
            self._flying[self._flights] = (event.sender, target, event.message)
        self.engine.at(at, functools.partial(self._deliver, self._flights, target, event, token))

    def _deliver(self, flight: int, target: str, event: Any, token: int) -> None:
        self._flying.pop(flight, None)
        if isinstance(event, TimerFired) and not self.hosts[target].timers.take(event.key, token):
            return  # cancelled or replaced
        opened = self._open(target, event) if isinstance(event, tuple) else event
        if opened is not None:
            self.feed(target, opened)

    def _send(self, name: str, send: Send) -> None:
        recipients, message = send.recipients, send.message
        if name in self.tamper:
            message = self.tamper[name](name, message)
        if self.cut is not None:
            self.dropped += sum(self.cut(name, r, self.now) for r in recipients)
            recipients = tuple(r for r in recipients if not self.cut(name, r, self.now))
            if not recipients:
                return
        payload = tensor_bytes(message)
        if self.endpoints is None:
            for r in recipients:
                self.hosts[name].counters.count(message.KIND, wire_bytes=payload, payload_bytes=payload)
                self._push(self.now + self.latency_s, r, Received(name, message))
        else:
            frames = self.endpoints[name].seal(recipients, message)
            size = wire_size(frames)
            for r in recipients:
                self.hosts[name].counters.count(message.KIND, wire_bytes=size, payload_bytes=payload)
                self._push(self.now + self.latency_s, r, ("frames", name, frames))

    def _train(self, name: str, steps: int) -> None:
        loss = self.workers[name].run_steps(steps)
        self.steps[name] += steps
        self._push(self.now + steps * self.step_time_s[name], name, WorkDone(steps, loss))

    def _open(self, target: str, event: tuple[str, str, Any]) -> Event | None:
        assert self.endpoints is not None
        _, sender, frames = event
        opened = self.endpoints[target].open(frames)
        if not isinstance(opened, Opened):
            self.rejections[opened.reason] += 1
            return None
        assert opened.sender == sender
        return Received(opened.sender, opened.message)

    # ------------------------------------------------------------ looking inside

    def in_flight(self) -> list[tuple[str, str, Message]]:
        """(sender, recipient, message) of every delivery not yet made."""
        return list(self._flying.values())


def endpoints_for(names: Sequence[str], *, shared: Mapping[str, Any] | None = None) -> dict[str, Endpoint]:
    """A fresh roster of ``names`` with new keys, and one wire Endpoint per member."""
    identities = {name: Identity.generate() for name in names}
    roster = Roster.from_dict({"member": [
        {"name": name, "public_id": identities[name].public_id, "role": "peer",
         "address": f"tcp://127.0.0.1:{9000 + i}"} for i, name in enumerate(names)]})
    rid = run_id({"roster": roster, **(shared or {"test": "gossip"})})
    return {name: Endpoint(identities[name], roster, rid, 1) for name in names}


# ------------------------------------------------------------ tiny workers of our own


class LogRegWorker:
    """Full-batch binary logistic regression in float64: reproducible by a numpy recursion."""

    def __init__(self, x: np.ndarray, y: np.ndarray, lr: float, w0: np.ndarray) -> None:
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(y)
        self.lr = lr
        self.flat_params = torch.from_numpy(w0.copy())
        self.step = 0

    @staticmethod
    def gradient(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x.T @ (1.0 / (1.0 + np.exp(-(x @ w))) - y) / len(y)

    def run_steps(self, n: int) -> float:
        loss = 0.0
        for _ in range(n):
            z = self.x @ self.flat_params
            p = torch.sigmoid(z)
            loss += float(torch.nn.functional.binary_cross_entropy_with_logits(z, self.y))
            self.flat_params -= self.lr * (self.x.T @ (p - self.y)) / len(self.y)
            self.step += 1
        return loss / max(n, 1)


class QuadraticWorker:
    """SGD on ``0.5 ||x - target||^2``: each step moves ``lr`` of the way to the peer's target."""

    def __init__(self, x0: torch.Tensor, target: torch.Tensor, lr: float) -> None:
        self.flat_params = x0.clone()
        self.target = target
        self.lr = lr
        self.step = 0

    def run_steps(self, n: int) -> float:
        for _ in range(n):
            self.flat_params -= self.lr * (self.flat_params - self.target)
            self.step += 1
        return float(0.5 * (self.flat_params - self.target).square().sum())

    def state_dict(self) -> dict[str, Any]:
        return {"x": self.flat_params.clone(), "step": self.step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.flat_params.copy_(state["x"])
        self.step = int(state["step"])


def sent_param_pushes(actions: Sequence[Action]) -> list[ParamPush]:
    return [a.message for a in actions if isinstance(a, Send) and isinstance(a.message, ParamPush)]


# ------------------------------------------------------------ real training networks


@dataclass
class Network:
    """A gossip run on a real task: trainers, machines, and the driver that moves them."""

    names: tuple[str, ...]
    trainers: dict[str, Any]
    machines: dict[str, Any]
    driver: Driver

    def run(self, *, until_s: float = math.inf) -> Network:
        self.driver.start()
        self.driver.run(until_s=until_s)
        return self

    def accuracies(self, names: Sequence[str] | None = None) -> dict[str, float]:
        return {n: self.trainers[n].evaluate()["accuracy"] for n in (names or self.names)}

    def average_accuracy(self, names: Sequence[str] | None = None) -> float:
        """Test accuracy of the average of the peers' mixed vectors (parameters, and buffers when
        averaged), evaluated on a scratch trainer."""
        chosen = list(names or self.names)
        scratch = self.trainers[chosen[0]]
        saved = scratch.mixed.clone()
        scratch.mixed.copy_(torch.stack([self.trainers[n].mixed for n in chosen]).mean(dim=0))
        accuracy = float(scratch.evaluate()["accuracy"])
        scratch.mixed.copy_(saved)
        return accuracy

    def consensus(self, names: Sequence[str] | None = None) -> float:
        from protocols.consensus import max_relative_distance

        return max_relative_distance([self.trainers[n].flat_params for n in (names or self.names)])


def digits_network(config: Any, topology_spec: str, *, n: int = 8, lr: float = 0.1, batch_size: int = 16,
                   alpha: float = 0.5, seed: int = 0, wire: bool = False,
                   step_time_s: float | Mapping[str, float] = 1.0, latency_s: float = 0.01,
                   tamper: Mapping[str, Tamper] | None = None, task: str = "digits-mlp",
                   observe: Callable[[Driver], None] | None = None,
                   trainer_options: Mapping[str, Any] | None = None) -> Network:
    """``n`` peers training ``task`` on Dirichlet(``alpha``) shards, gossiping by ``config``."""
    from peer.train.partition import partition
    from peer.train.tasks import get_task
    from peer.train.trainer import Trainer, TrainerConfig
    from protocols.gossip import make_machine
    from topology import build

    topology = build(topology_spec)
    names = topology.names
    data = get_task(task)
    shards = partition(data.labels, names, scheme="dirichlet", seed=seed, alpha=alpha)
    trainer_config = TrainerConfig(lr=lr, batch_size=batch_size, threads=1, device="cpu",
                                   **(trainer_options or {}))
    trainers = {name: Trainer(data, trainer_config, shards[name], seed=seed, member_index=i)
                for i, name in enumerate(names)}
    # trainer.mixed: parameters, and floating buffers when trainer_options' buffers = "average"
    machines = {name: make_machine(config, name=name, topology=topology, params=trainers[name].mixed,
                                   seed=seed, shapes=trainers[name].mixed_shapes,
                                   trained_numel=trainers[name].flat_params.numel()) for name in names}
    endpoints = endpoints_for(names) if wire else None
    driver = Driver(machines, trainers, step_time_s=step_time_s, latency_s=latency_s, endpoints=endpoints,
                    tamper=tamper, observe=observe)
    return Network(names, trainers, machines, driver)

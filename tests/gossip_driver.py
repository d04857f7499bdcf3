"""The tiny in-process driver of the gossip machines, for tests only.

The network is a list of in-flight deliveries (kept as a heap ordered by
delivery time, then by send order), the clock is a number. ``StartWork(n)``
runs the peer's worker at once (the machine does not touch its parameters
until ``WorkDone``) and delivers ``WorkDone`` after ``n * step_time_s``; a
``Send`` is sealed and opened through real wire Endpoints when they are given,
so byte counts are the codec's. ``cut(sender, recipient, now)`` returning True
drops that delivery (a partition); ``schedule`` feeds any event at a later time.
No production code path uses this module.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from protocols.events import (
    Action,
    CancelTimer,
    Event,
    Finished,
    Machine,
    Metric,
    Received,
    Send,
    SetTimer,
    SetTrainerStep,
    Start,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.identity import Identity
from protocols.messages import Message, ParamPush
from protocols.roster import Roster, run_id
from protocols.wire import Endpoint, Opened, wire_size


class Worker(Protocol):
    """What the driver needs of a trainer (``peer.train.trainer.Trainer`` is one)."""

    flat_params: torch.Tensor
    step: int   # where the learning-rate schedule stands; SetTrainerStep moves it, as in both real drivers

    def run_steps(self, n: int) -> float: ...


Tamper = Callable[[str, Message], Message]


@dataclass(order=True)
class _Item:
    at: float
    seq: int
    target: str = field(compare=False)
    event: Any = field(compare=False)  # an Event, or ("frames", sender, frames) to open on delivery
    token: int = field(compare=False, default=0)  # timers: delivered only if still the live token


def tensor_bytes(message: Message) -> int:
    tensors = getattr(message, "tensors", {})
    return sum(t.numel() * t.element_size() for t in tensors.values())


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
        self.now = 0.0
        self.queue: list[_Item] = []  # the network and the timers: deliveries in flight
        self._seq = 0
        self._timers: dict[tuple[str, str], int] = {}
        self.steps: Counter[str] = Counter()
        self.bytes_sent: Counter[str] = Counter()  # whole messages on the wire (header, frames, signature)
        self.payload_bytes: Counter[str] = Counter()  # tensor frames only
        self.messages_sent: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()  # wire rejections by reason
        self.metrics: dict[str, dict[str, float]] = {n: {} for n in names}
        self.finished: set[str] = set()
        self.finished_at: dict[str, float] = {}
        self.events = 0

    # ------------------------------------------------------------ running

    def start(self) -> None:
        for name in sorted(self.machines):
            self.feed(name, Start())

    def run(self, *, until_s: float = math.inf, max_events: int = 10_000_000,
            pause_after: int | None = None) -> bool:
        """Deliver events in time order until the queue is empty or ``until_s``: True when done.

        ``pause_after``: return False after that many deliveries (to checkpoint, then run again).
        """
        for delivered in range(max_events):
            if not self.queue or self.queue[0].at > until_s:
                return True
            if pause_after is not None and delivered >= pause_after:
                return False
            item = heapq.heappop(self.queue)
            self.now = item.at
            if isinstance(item.event, TimerFired):
                if self._timers.get((item.target, item.event.key)) != item.token:
                    continue  # cancelled or replaced
                del self._timers[(item.target, item.event.key)]
            event = self._open(item) if isinstance(item.event, tuple) else item.event
            if event is not None:
                self.feed(item.target, event)
        raise AssertionError(f"driver did not settle within {max_events} events")

    def feed(self, name: str, event: Event) -> None:
        self.events += 1
        for action in self.machines[name].handle(event, self.now):
            self._act(name, action)
        if self.observe is not None:
            self.observe(self)

    def schedule(self, at: float, name: str, event: Event) -> None:
        """Feed ``event`` to ``name`` at time ``at`` (NeighbourDown/Up of a modelled failure detector)."""
        self._push(at, name, event)

    # ------------------------------------------------------------ actions

    def _push(self, at: float, target: str, event: Any, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.queue, _Item(at, self._seq, target, event, token))

    def _act(self, name: str, action: Action) -> None:
        match action:
            case Send(recipients=recipients, message=message):
                if name in self.tamper:
                    message = self.tamper[name](name, message)
                if self.cut is not None:
                    self.dropped += sum(self.cut(name, r, self.now) for r in recipients)
                    recipients = tuple(r for r in recipients if not self.cut(name, r, self.now))
                    if not recipients:
                        return
                self.messages_sent[name] += len(recipients)
                self.payload_bytes[name] += tensor_bytes(message) * len(recipients)
                if self.endpoints is None:
                    self.bytes_sent[name] += tensor_bytes(message) * len(recipients)
                    for r in recipients:
                        self._push(self.now + self.latency_s, r, Received(name, message))
                else:
                    frames = self.endpoints[name].seal(recipients, message)
                    self.bytes_sent[name] += wire_size(frames) * len(recipients)
                    for r in recipients:
                        self._push(self.now + self.latency_s, r, ("frames", name, frames))
            case StartWork(steps=n):
                loss = self.workers[name].run_steps(n)
                self.steps[name] += n
                self._push(self.now + n * self.step_time_s[name], name, WorkDone(n, loss))
            case SetTimer(key=key, at=at):
                self._seq += 1
                self._timers[(name, key)] = self._seq
                self._push(at, name, TimerFired(key), token=self._seq)
            case CancelTimer(key=key):
                self._timers.pop((name, key), None)
            case Metric(name=metric, value=value):
                self.metrics[name][metric] = value
            case Finished():
                self.finished.add(name)
                self.finished_at.setdefault(name, self.now)
            case SetTrainerStep(step=step):
                self.workers[name].step = step

    def _open(self, item: _Item) -> Event | None:
        assert self.endpoints is not None
        _, sender, frames = item.event
        opened = self.endpoints[item.target].open(frames)
        if not isinstance(opened, Opened):
            self.rejections[opened.reason] += 1
            return None
        assert opened.sender == sender
        return Received(opened.sender, opened.message)

    # ------------------------------------------------------------ looking inside

    def in_flight(self) -> list[tuple[str, str, Message]]:
        """(sender, recipient, message) of every delivery not yet made."""
        out = []
        for item in self.queue:
            if isinstance(item.event, Received):
                out.append((item.event.sender, item.target, item.event.message))
        return out


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

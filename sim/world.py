"""What every simulated run shares: topology, links, trainers on real data, evaluation, the result.

A :class:`World` is built from a scenario: the topology over sorted member
names, the network (edge attributes of the graph, else the scenario's link
defaults; each member's NIC from its node attributes or the scenario's
``[nodes]``), one real :class:`peer.train.trainer.Trainer` per member on its shard,
and an engine. The gossip driver (:mod:`sim.gossip`) and the baselines
(:mod:`sim.baselines`) both run in a World and both hand back a
:class:`ScenarioResult` made by the same :class:`Recorder`, so their numbers
compare one to one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peer.files.config import ConfigError
from peer.files.statefiles import json_safe
from peer.train.build import build_trainers
from peer.train.tasks import Task
from peer.train.trainer import Trainer
from protocols.consensus import rms_distance
from protocols.rng import numpy_generator
from sim.engine import Engine
from sim.network import LinkSpec, Network, NicSpec
from sim.scenario import NodesConfig, ScenarioConfig
from topology import Topology

Progress = Callable[[float, float, "TracePoint"], None]
"""Called with (simulated seconds so far, simulated seconds in all, the evaluation just made) at each
evaluation."""

GRAPH_FILE_SUFFIXES = (".graphml", ".json", ".edgelist")


def resolve_graph_spec(scenario: ScenarioConfig) -> str:
    """The graph spec, with a graph file's path taken relative to the scenario file."""
    spec = scenario.graph.spec
    if spec.endswith(GRAPH_FILE_SUFFIXES) and not Path(spec).is_absolute():
        return str(Path(scenario.source).parent / spec)
    return spec


def link_specs(topology: Topology, default: LinkSpec) -> dict[tuple[str, str], LinkSpec]:
    """Per directed link: the graph's edge attributes where given, the defaults elsewhere."""
    specs: dict[tuple[str, str], LinkSpec] = {}
    graph = topology.graph
    for u, v in sorted(graph.edges()):
        attrs = graph.edges[u, v]
        given = {key: float(attrs[key]) for key in ("latency_ms", "bandwidth_mbps", "loss", "jitter_ms")
                 if key in attrs}
        if not given:
            continue
        try:
            spec = LinkSpec(**{**default.__dict__, **given})
        except ValueError as error:
            raise ConfigError(f"{topology.spec}: edge {u} - {v}: {error}") from None
        specs[(u, v)] = spec
        if not topology.directed:
            specs[(v, u)] = spec
    return specs


def nic_specs(topology: Topology, nodes: NodesConfig) -> dict[str, NicSpec]:
    """Per member: ``[nodes.nic.NAME]``, else the graph's node attributes, else ``[nodes]``' defaults."""
    nics = {}
    for name in topology.names:
        attrs = topology.graph.nodes[name]
        values = {key: float(nodes.nic.get(name, {}).get(key, attrs.get(key, getattr(nodes, key))))
                  for key in ("uplink_mbps", "downlink_mbps")}
        try:
            nics[name] = NicSpec(**values)
        except ValueError as error:
            raise ConfigError(f"{topology.spec}: node {name}: {error}") from None
    return nics


@dataclass
class World:
    scenario: ScenarioConfig
    topology: Topology
    task: Task
    trainers: dict[str, Trainer]
    speeds: dict[str, float]
    engine: Engine = field(default_factory=Engine)
    network: Network | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self.topology.names

    def honest(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if self.scenario.behaviour(n) in ("honest", "crash"))

    def neighbours(self, name: str) -> tuple[str, ...]:
        """Everyone ``name`` exchanges with in any round of the schedule (the topology's, as the daemon's)."""
        return self.topology.neighbours(name)


def build_world(scenario: ScenarioConfig) -> World:
    """Topology, links, speeds and one trainer per member, from the scenario."""
    topology = scenario.topology(resolve_graph_spec(scenario))
    names = topology.names
    task, trainers = build_trainers(scenario.network(), scenario.trainer_config(), members=names)
    speeds = {}
    for name in names:
        speed = float(topology.graph.nodes[name].get("speed", 1.0))
        speeds[name] = scenario.nodes.speed.get(name, speed)
    network = Network(link_specs(topology, scenario.links), default=scenario.links, seed=scenario.seed,
                      partitions=scenario.faults.partitions, nics=nic_specs(topology, scenario.nodes))
    return World(scenario=scenario, topology=topology, task=task, trainers=trainers, speeds=speeds,
                 network=network)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class TracePoint:
    """The honest, running members at one evaluation."""

    time_s: float
    bytes_sent: int
    mean_loss: float
    mean_accuracy: float
    min_accuracy: float
    consensus_rms: float   # protocols.consensus.rms_distance over honest running members (parameter units)
    running: int


@dataclass
class ScenarioResult:
    name: str
    source: str
    kind: str                      # "gossip:<algorithm>", "allreduce", "parameter-server"
    seed: int
    n_members: int
    n_params: int
    target_accuracy: float
    simulated_time_s: float = 0.0
    events_run: int = 0
    trace: list[TracePoint] = field(default_factory=list)
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    links: list[tuple[str, str, int, int]] = field(default_factory=list)
    rejections: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # what the machines chose at start-up (each once)
    wall_s: float = 0.0            # real seconds; printed, never written into report.json
    scenario: dict[str, Any] = field(default_factory=dict)  # as run (overrides applied), for report.html
    topology: Topology | None = None  # the graph it ran on, for the report's topology plot
    # a federation (sim/federation.py): one row per closed round and gateway (asked, taken, late, ...)
    rounds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def time_to_target_s(self) -> float | None:
        point = self._target_point()
        return None if point is None else point.time_s

    @property
    def bytes_to_target(self) -> int | None:
        point = self._target_point()
        return None if point is None else point.bytes_sent

    @property
    def held_target_from_s(self) -> float | None:
        """From when on the mean accuracy stayed at or above the target to the end (None: it ends below)."""
        point = self._held_point()
        return None if point is None else point.time_s

    @property
    def bytes_to_held_target(self) -> int | None:
        point = self._held_point()
        return None if point is None else point.bytes_sent

    @property
    def ends_below_target(self) -> bool:
        """A target was set and the last evaluation is under it (whatever was reached on the way)."""
        if self.target_accuracy <= 0:
            return False
        return not self.trace or self.trace[-1].mean_accuracy < self.target_accuracy

    def _target_point(self) -> TracePoint | None:
        """The first evaluation at or above the target (a run may fall below it again later)."""
        if self.target_accuracy <= 0:
            return None
        for point in self.trace:
            if point.mean_accuracy >= self.target_accuracy:
                return point
        return None

    def _held_point(self) -> TracePoint | None:
        """The earliest evaluation from which every later one is at or above the target."""
        if self.target_accuracy <= 0:
            return None
        held = None
        for point in reversed(self.trace):
            if point.mean_accuracy < self.target_accuracy:
                break
            held = point
        return held

    @property
    def bytes_sent(self) -> int:
        return sum(int(p["bytes_sent"]) for p in self.peers.values())


class Recorder:
    """Evaluates the honest running members every ``eval_every_s`` and keeps the trace."""

    def __init__(self, world: World, result: ScenarioResult, *, running: Callable[[str], bool],
                 bytes_sent: Callable[[], int], progress: Progress | None = None) -> None:
        self.world = world
        self.result = result
        self.running = running
        self.bytes_sent = bytes_sent
        self.progress = progress
        self.last_metrics: dict[str, dict[str, float]] = {}
        self.last_time_s = -1.0
        self.sample = world.scenario.eval_sample
        draw = numpy_generator(world.scenario.seed, "", 0, "eval-sample")
        honest = list(world.honest())
        self.sampled = sorted(honest[i] for i in draw.permutation(len(honest))[: self.sample])
        self.reached_target = False

    def start(self) -> None:
        self._schedule(0)

    def _schedule(self, k: int) -> None:
        time_s = k * self.world.scenario.eval_every_s
        if time_s <= self.world.scenario.duration_s:
            self.world.engine.at(time_s, lambda: self._tick(k))

    def _tick(self, k: int) -> None:
        point = self.evaluate()
        if self.progress is not None:
            self.progress(self.world.engine.now_s, self.world.scenario.duration_s, point)
        scenario = self.world.scenario
        if scenario.stop_at_target and self.reached_target:
            self.world.engine.stop()
            return
        self._schedule(k + 1)

    def evaluate(self) -> TracePoint:
        names = [n for n in self.world.honest() if self.running(n)]
        if 0 < self.sample < len(names):  # a fixed seeded sample, so the trace follows the same members
            chosen = set(self.sampled)
            names = [n for n in names if n in chosen] or names[: self.sample]
        self.last_time_s = self.world.engine.now_s
        self.last_metrics = {}
        losses, accuracies = [], []
        for name in names:
            metrics = self.world.trainers[name].evaluate()
            self.last_metrics[name] = metrics
            losses.append(float(metrics["loss"]))
            accuracies.append(float(metrics.get("accuracy", math.nan)))
        point = TracePoint(
            time_s=self.world.engine.now_s, bytes_sent=self.bytes_sent(),
            mean_loss=_mean(losses), mean_accuracy=_mean(accuracies),
            min_accuracy=min(accuracies) if accuracies else math.nan,
            consensus_rms=(rms_distance([self.world.trainers[n].flat_params for n in names]) if names
                           else math.nan),   # nobody running: unknown
            running=len(names))
        if self.result.trace and self.result.trace[-1].time_s == point.time_s:
            self.result.trace[-1] = point
        else:
            self.result.trace.append(point)
        target = self.world.scenario.target_accuracy
        if target > 0 and point.mean_accuracy >= target:
            self.reached_target = True
        return point

    def final_peer_metrics(self, name: str) -> dict[str, float]:
        """The member's test metrics now (attackers and stopped members included)."""
        if self.last_time_s == self.world.engine.now_s and name in self.last_metrics:
            metrics = self.last_metrics[name]
        else:
            metrics = self.world.trainers[name].evaluate()
        return {key: float(value) for key, value in sorted(metrics.items())}


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def new_result(world: World, kind: str) -> ScenarioResult:
    scenario = world.scenario
    any_trainer = world.trainers[world.names[0]]
    return ScenarioResult(name=scenario.name, source=scenario.source, kind=kind, seed=scenario.seed,
                          n_members=len(world.names), n_params=any_trainer.flat_params.numel(),
                          target_accuracy=scenario.target_accuracy,
                          scenario=json_safe(dataclasses.asdict(scenario)), topology=world.topology)


def merge_counts(target: dict[str, int], counts: Mapping[str, int]) -> None:
    for key, value in sorted(counts.items()):
        target[key] = target.get(key, 0) + int(value)

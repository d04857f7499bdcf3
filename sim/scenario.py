"""A simulation scenario: graph, links, nodes, algorithm, task, faults, seed — one TOML file.

Loaded once with :func:`peer.files.config.load`, so every bad key or value is
reported with the file and the dotted key. Relative paths (a graph file, a task file, a
partition file) are taken from the scenario file's folder. The settings a scenario
shares with a peer file are one schema (:mod:`peer.files.schema`): ``[partition]`` is
:class:`peer.files.schema.PartitionConfig` (as ``[network.partition]``); ``[algorithm]`` holds
:class:`protocols.gossip.GossipConfig` fields and ``[trainer]``
:class:`peer.train.trainer.TrainerConfig` fields, both checked when the scenario is loaded
by the same functions as a peer file's ``[network.gossip]`` and ``[network.trainer]``;
``[checkpoint]`` is a peer file's (:class:`protocols.node.checkpoints.CheckpointConfig`: when a
member writes the checkpoint a crashed member restarts from);
``[nodes]``' liveness and state-sync keys are :class:`protocols.node.NodeConfig`'s, as
in a peer file's ``[peer]`` (``neighbour_timeout_s``: the old ``neighbour_timeout_ms`` is
refused with the new name). :meth:`ScenarioConfig.network` gives the shared settings
as a peer file's ``[network]``.

A ``[federation]`` table with ``gateways > 0`` makes the scenario a federation of gateways and
edge clients (:class:`ScenarioFederationSection`, run by sim/federation.py); ``[federation.server]`` holds
:class:`protocols.federation.FederationConfig` fields, and ``[algorithm]`` the gateways' gossip.

A minimal scenario::

    name = "ring-16"
    seed = 1
    duration_s = 60.0
    target_accuracy = 0.9

    [graph]
    spec = "ring:16"

    [links]
    latency_ms = 50.0
    bandwidth_mbps = 10.0

    [nodes]
    step_time_ms = 50.0
    uplink_mbps = 20.0       # shared by all of a member's links (default: unlimited)

    [algorithm]
    algorithm = "dpsgd"

    [task]
    name = "digits-mlp"
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from peer.files.config import INTERNAL, ConfigError, apply_override, load, read_toml
from peer.files.federation_layout import federation_names, gateway_of
from peer.files.schema import (
    GOSSIP_TABLE,
    TRAINER_TABLE,
    NetworkSection,
    PartitionConfig,
    gossip_config,
    resolve_network_paths,
    trainer_config,
)
from protocols.errors import HivemeshError
from protocols.node.checkpoints import CheckpointConfig
from protocols.node.config import NodeConfig
from sim.network import LinkSpec, PartitionSpec
from topology import Topology

Behaviour = Literal[
    "honest",            # follows the protocol
    "crash",             # fail-stop at faults.crash_at_s, never comes back
    "sign-flip",         # sends -attack.sign_flip_scale x its honest tensors (valid signature)
    "noise",             # adds Gaussian noise of attack.noise_scale x the tensor's RMS (valid signature)
    "stale-replay",      # re-sends the first frames it ever sealed (old sequence numbers)
    "forged-key",        # signs with a key that is not on the roster
    "forged-signature",  # a roster member's frames with a flipped signature bit
]
ATTACKS = ("sign-flip", "noise", "stale-replay", "forged-key", "forged-signature")


@dataclass(frozen=True, kw_only=True)
class GraphConfig:
    spec: str = "ring:8"         # a topology spec ("ring:16", "exponential:32", ...) or a graph file
    weights: str = "metropolis"  # mixing weights; Metropolis-Hastings is safe on any undirected graph
    members: tuple[str, ...] = ()  # member names (sorted by the topology); empty: p00, p01, ... from spec

    def __post_init__(self) -> None:
        if not self.spec:
            raise ValueError("spec must not be empty")


@dataclass(frozen=True, kw_only=True)
class NodesConfig(NodeConfig):
    """The members' model. Its liveness, start and state-sync keys (``heartbeat_interval_s``,
    ``neighbour_timeout_s``, ``start_timeout_s``, ``sync_answer_interval_s``, ``sync_timeout_s``,
    ``sync_attempts``) are protocols.node.NodeConfig's, as in a peer file's ``[peer]``."""

    step_time_ms: float = 10.0   # one local SGD step; measure it with `hivemesh sim calibrate`
    speed: dict[str, float] = field(default_factory=dict)  # per member; 0.25 = four times slower
    behaviour: dict[str, Behaviour] = field(default_factory=dict)  # members not named are honest
    straggle_probability: float = 0.0  # chance a unit of work is slowed down (transient stragglers)
    straggle_slowdown: float = 4.0     # how much slower such a unit of work is
    # Each member's NIC, shared by all of its links (sim/network.py); inf: unlimited, links only.
    uplink_mbps: float = math.inf     # what a member can send, over all of its links together
    downlink_mbps: float = math.inf   # what a member can receive, over all of its links together
    # per member, e.g. [nodes.nic.p00] uplink_mbps = 100.0; beats the graph file's node attributes,
    # which beat the two defaults above
    nic: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("uplink_mbps", "downlink_mbps"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")
        for name, nic in sorted(self.nic.items()):
            for key, value in sorted(nic.items()):
                if key not in ("uplink_mbps", "downlink_mbps"):
                    raise ValueError(f"nodes.nic.{name}.{key}: unknown key "
                                     "(known: downlink_mbps, uplink_mbps)")
                if not value > 0:
                    raise ValueError(f"nodes.nic.{name}.{key} must be > 0, got {value}")
        if not (math.isfinite(self.step_time_ms) and self.step_time_ms > 0):
            raise ValueError(f"step_time_ms must be > 0, got {self.step_time_ms}")
        for name, speed in sorted(self.speed.items()):
            if not (math.isfinite(speed) and speed > 0):
                raise ValueError(f"nodes.speed.{name} must be > 0, got {speed}")
        if not 0.0 <= self.straggle_probability <= 1.0:
            raise ValueError(f"straggle_probability must be in [0, 1], got {self.straggle_probability}")
        if self.straggle_slowdown < 1.0:
            raise ValueError(f"straggle_slowdown must be >= 1, got {self.straggle_slowdown}")


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    name: str = "digits-mlp"  # small, real, ships with scikit-learn: no download
    options: dict[str, Any] = field(default_factory=dict)  # keyword options of peer.train.tasks.get_task

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")


@dataclass(frozen=True, kw_only=True)
class ChurnEvent:
    """One member going down or coming up. A crash is a ``kill -9``: the member comes back (a
    ``restart``) from its last periodic checkpoint (``[checkpoint]``), not from where it was."""

    node: str                                          # the member it happens to
    kind: Literal["crash", "restart", "leave", "join"]  # crash/leave: down; restart/join: up again
    at_s: float = -1.0                                 # simulated time of the event (-1: not given)
    # a crash placed on progress instead (a real run's kill replayed): at the member's first work
    # point at this trainer step or later (a gateway: its rounds), from at_s on if given; -1: at at_s
    at_step: int = -1
    # a crash followed by a restart this long after it (seconds); -1: none (give a "restart" event)
    down_s: float = -1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.at_s) and (self.at_s >= 0 or (self.at_s == -1.0 and self.at_step >= 0))):
            raise ValueError(f"at_s must be >= 0 (or at_step given, for a crash), got {self.at_s}")
        if self.kind != "crash" and (self.at_step >= 0 or self.down_s >= 0):
            raise ValueError(f"at_step and down_s are a crash's, not a {self.kind}'s")
        if not (math.isfinite(self.down_s) and self.down_s >= -1.0):
            raise ValueError(f"down_s must be >= 0 (or -1: no restart), got {self.down_s}")


@dataclass(frozen=True, kw_only=True)
class ChurnRates:
    """Random crashes: each member crashes at ``crash_rate_per_s`` and stays down ``mean_downtime_s``."""

    crash_rate_per_s: float = 0.0  # 0 = no random churn
    mean_downtime_s: float = 5.0   # exponential downtime, then a restart from the last checkpoint
    nodes: tuple[str, ...] = ()    # members subject to it; empty = all

    def __post_init__(self) -> None:
        if self.crash_rate_per_s < 0 or self.mean_downtime_s <= 0:
            raise ValueError("churn rates need crash_rate_per_s >= 0 and mean_downtime_s > 0")


@dataclass(frozen=True, kw_only=True)
class AttackConfig:
    sign_flip_scale: float = 1.0   # the plain attack: send -x instead of x
    noise_scale: float = 1.0       # noise RMS as a multiple of the honest tensor's RMS
    crash_at_s: float = 0.0        # when "crash" members stop; 0 = half the scenario's duration

    def __post_init__(self) -> None:
        if self.sign_flip_scale <= 0 or self.noise_scale <= 0 or self.crash_at_s < 0:
            raise ValueError("attack scales must be > 0 and crash_at_s >= 0")


@dataclass(frozen=True, kw_only=True)
class FaultsConfig:
    churn: tuple[ChurnEvent, ...] = ()
    rates: ChurnRates = field(default_factory=ChurnRates)
    partitions: tuple[PartitionSpec, ...] = ()
    attack: AttackConfig = field(default_factory=AttackConfig)


@dataclass(frozen=True, kw_only=True)
class BaselineConfig:
    kind: Literal["none", "allreduce", "parameter-server"] = "none"  # none: run the gossip algorithm
    local_steps: int = 1               # steps between synchronisations (1 = plain synchronous SGD)
    server_bandwidth_mbps: float = 0.0  # parameter server's link; 0 = the scenario's link default
    server_latency_ms: float = -1.0     # parameter server's link; -1 = the scenario's link default

    def __post_init__(self) -> None:
        if self.local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {self.local_steps}")
        if self.server_bandwidth_mbps < 0:
            raise ValueError("baseline.server_bandwidth_mbps must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ScenarioFederationSection:
    """A federation instead of a gossip run (sim/federation.py): gateways serving edge clients.

    Clients are ``e000``, ``e001``, ...; the first ``clients`` belong to gateway ``gw0``, the next to
    ``gw1``, and so on. Stragglers and slow uplinks are ``[nodes]``' ``speed``,
    ``straggle_probability`` and ``nic`` keyed by these names; ``[links]`` is every link."""

    gateways: int = 0                 # 0: no federation (the scenario is a gossip run)
    clients: int = 10                 # edge clients per gateway
    gossip_rounds: int = 0            # G: gossip rounds between gateways after every FedAvg round
    availability: str = "always"      # every client's pattern (sim/availability.py) unless named below
    client_availability: dict[str, str] = field(default_factory=dict)  # per client
    attack: dict[str, str] = field(default_factory=dict)  # per client: "signflip:10"
    # protocols.federation.FederationConfig fields (mode, rounds, fraction, aggregator, ...)
    server: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from peer.train.attack import parse_attack
        from sim.availability import Availability

        if self.gateways < 0 or self.clients < 1 or self.gossip_rounds < 0:
            raise ValueError("federation: gateways >= 0, clients >= 1 and gossip_rounds >= 0")
        for spec in (self.availability, *self.client_availability.values()):
            Availability.parse(spec)
        for spec in self.attack.values():
            parse_attack(spec)

    def client_names(self) -> tuple[str, ...]:
        return federation_names(self.gateways, self.gateways * self.clients)[1]

    def gateway_names(self) -> tuple[str, ...]:
        return federation_names(self.gateways, self.gateways * self.clients)[0]

    def gateway_of(self, index: int) -> str:
        """The gateway of the ``index``-th client (the first ``clients`` are ``gw0``'s: the rule of
        ``hivemesh init``'s federations, peer/files/federation_layout.py)."""
        return gateway_of(index, gateways=self.gateways, edges=self.gateways * self.clients)


@dataclass(frozen=True, kw_only=True)
class ScenarioConfig:
    name: str = ""                 # defaults to the file name without .toml
    seed: int = 0                  # the one root of all randomness in the run
    duration_s: float = 60.0       # simulated seconds at most
    steps: int = 0                 # local steps per peer at most (0: until duration_s)
    eval_every_s: float = 1.0      # simulated seconds between evaluations of every peer
    eval_sample: int = 0           # large runs: evaluate this many honest members (a seeded draw); 0 = all
    target_accuracy: float = 0.0   # for time-to-target; 0 = no target
    stop_at_target: bool = False   # end the run once the honest peers' mean accuracy reaches the target
    verify_fraction: float = 1.0   # scale runs only: verify a sample of messages (see sim/world.py)
    graph: GraphConfig = field(default_factory=GraphConfig)
    links: LinkSpec = field(default_factory=LinkSpec)
    nodes: NodesConfig = field(default_factory=NodesConfig)
    # protocols.gossip.GossipConfig fields (a federation: the gateways' gossip between FedAvg rounds)
    algorithm: dict[str, Any] = field(default_factory=dict, metadata=GOSSIP_TABLE)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)  # instead of gossip
    task: TaskConfig = field(default_factory=TaskConfig)
    # peer.train.trainer.TrainerConfig fields
    trainer: dict[str, Any] = field(default_factory=dict, metadata=TRAINER_TABLE)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    # when a member writes the checkpoint a crashed one restarts from: a peer file's [checkpoint]
    # (protocols.node.checkpoints.CheckpointConfig, the daemon's schedule); ``keep`` is not modelled
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    compare_with: tuple[Literal["allreduce", "parameter-server"], ...] = ()  # also run these baselines
    # gateways > 0: a federation
    federation: ScenarioFederationSection = field(default_factory=ScenarioFederationSection)
    # the file it came from, for error messages and the report (the loader's, not the file's)
    source: str = field(default="<scenario>", metadata=INTERNAL)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if not (self.eval_every_s > 0):
            raise ValueError(f"eval_every_s must be > 0, got {self.eval_every_s}")
        if self.eval_sample < 0:
            raise ValueError(f"eval_sample must be >= 0, got {self.eval_sample}")
        if not 0.0 <= self.target_accuracy <= 1.0:
            raise ValueError(f"target_accuracy must be in [0, 1], got {self.target_accuracy}")
        if not 0.0 < self.verify_fraction <= 1.0:
            raise ValueError(f"verify_fraction must be in (0, 1], got {self.verify_fraction}")
        if self.baseline.kind != "none" and self.algorithm:
            raise ValueError("give either [algorithm] (gossip) or [baseline], not both")
        if self.baseline.kind != "none" and self.compare_with:
            raise ValueError("compare_with is for gossip scenarios (it adds baselines to compare with)")

    def network(self) -> NetworkSection:
        """The settings a peer file keeps under ``[network]``, in that schema (peer.files.schema)."""
        return NetworkSection(topology=self.graph.spec, weights=self.graph.weights, seed=self.seed,
                              task=self.task.name, task_options=dict(self.task.options),
                              partition=self.partition, gossip=dict(self.algorithm),
                              trainer=dict(self.trainer))

    def gossip_config(self) -> Any:
        """The [algorithm] table as a GossipConfig, by the peer file's rules (errors name the key)."""
        return gossip_config(self.network(), source=self.source, prefix="algorithm", steps=self.steps)

    def trainer_config(self) -> Any:
        """The [trainer] table as a TrainerConfig, by the peer file's rules (errors name the key)."""
        return trainer_config(self.network(), source=self.source, prefix="trainer", steps=self.steps,
                              federated=self.federation.gateways > 0)

    def check_tables(self) -> None:
        """Check the tables other components own, as a peer file's loader does (errors name the key)."""
        if self.federation.gateways > 0:
            config = self.federation_config()
            if not config.has_rounds and self.federation.gossip_rounds > 0 and self.federation.gateways > 1:
                raise ConfigError(f"{self.source}: key 'federation.gossip_rounds': gateways gossip between "
                                  "FedAvg rounds, and federation mode 'fedbuff' has none (set 0)",
                                  key="federation.gossip_rounds")
            self.gateway_gossip_config(config.rounds)
        elif self.baseline.kind == "none":
            self.gossip_config()
        self.trainer_config()

    def gateway_gossip_config(self, total_steps: int) -> Any:
        """The gateways' gossip (sim/federation.py): [algorithm] (default D-PSGD) on the schedule the
        interleaving needs: one step a round (a FedAvg round, or nothing), mixing after it."""
        from protocols.gossip import GossipConfig

        schedule = {"mixing": "after", "local_steps": 1, "duration_s": 0.0, "seed": self.seed,
                    "total_steps": total_steps}
        try:
            return GossipConfig(**{**self.algorithm, **schedule})
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{self.source}: [algorithm] for the gateways' gossip: {error}",
                              key="algorithm") from None

    def federation_config(self) -> Any:
        """The [federation.server] table as a protocols.federation.FederationConfig (errors name the key)."""
        from protocols.federation import FederationConfig

        try:
            return load(FederationConfig, dict(self.federation.server), source=self.source,
                        prefix="federation.server")
        except ConfigError:
            raise
        except ValueError as error:
            raise ConfigError(f"{self.source}: [federation.server]: {error}",
                              key="federation.server") from None

    def topology(self, spec: str = "") -> Topology:
        """The graph (``spec``: the graph spec, default ``graph.spec``) with every member the
        scenario names checked against it; errors name the file and the key."""
        from topology import build

        try:
            topology = build(spec or self.graph.spec, self.graph.members or None, seed=self.seed,
                             weights=self.graph.weights)
        except HivemeshError as error:
            raise ConfigError(f"{self.source}: key 'graph.spec': {error}", key="graph.spec") from None
        self.check_names(topology.names)
        return topology

    def behaviour(self, name: str) -> str:
        return self.nodes.behaviour.get(name, "honest")

    def check_names(self, names: tuple[str, ...]) -> None:
        """Every member a scenario names must be in the graph; raise ConfigError naming the key."""
        known = set(names)

        def check(key: str, name: str) -> None:
            if name not in known:
                raise ConfigError(f"{self.source}: key '{key}': no member {name!r} in the graph "
                                  f"(members: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''})",
                                  key=key)

        for name in sorted(self.nodes.speed):
            check(f"nodes.speed.{name}", name)
        for name in sorted(self.nodes.behaviour):
            check(f"nodes.behaviour.{name}", name)
        for name in sorted(self.nodes.nic):
            check(f"nodes.nic.{name}", name)
        for index, event in enumerate(self.faults.churn):
            check(f"faults.churn[{index}].node", event.node)
        for name in self.faults.rates.nodes:
            check("faults.rates.nodes", name)
        for index, partition in enumerate(self.faults.partitions):
            for name in partition.names():
                check(f"faults.partitions[{index}]", name)


def variants(scenario: ScenarioConfig) -> list[ScenarioConfig]:
    """The scenario itself, then one copy per ``compare_with`` baseline (same network, task, seed).

    A baseline copy averages every ``algorithm.local_steps`` steps (1 if not given), so it
    compares like with like.
    """
    out = [scenario]
    local_steps = scenario.algorithm.get("local_steps", 1)
    for kind in scenario.compare_with:
        out.append(dataclasses.replace(
            scenario, name=f"{scenario.name}/{kind}", algorithm={}, compare_with=(),
            baseline=BaselineConfig(kind=kind, local_steps=int(local_steps))))
    return out


def load_scenario(path: str | Path, overrides: Sequence[str] = ()) -> ScenarioConfig:
    """Read and validate a scenario file (errors name the file and the key).

    ``overrides`` are ``KEY=VALUE`` assignments applied on top of the file before it is
    checked (see :func:`apply_override`): a smaller run of the same scenario, say.
    """
    path = Path(path)
    data = read_toml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table")
    data = dict(data)
    for assignment in overrides:
        apply_override(data, assignment, source=str(path))
    data.setdefault("name", path.stem.removeprefix("scenario-"))
    scenario = dataclasses.replace(load(ScenarioConfig, data, source=str(path)), source=str(path))
    scenario.check_tables()
    return resolve_paths(scenario, path.resolve().parent)


def resolve_paths(scenario: ScenarioConfig, base: Path) -> ScenarioConfig:
    """``scenario`` with its graph file, task file and partition file taken against ``base`` (the
    scenario file's folder, not the working directory), by the peer file's rule."""
    network = resolve_network_paths(scenario.network(), base)
    return dataclasses.replace(
        scenario, graph=dataclasses.replace(scenario.graph, spec=network.topology),
        task=TaskConfig(name=network.task, options=network.task_options), partition=network.partition)


def scenario_from_dict(data: dict[str, Any], source: str = "<scenario>") -> ScenarioConfig:
    """Build a scenario from a mapping shaped like the TOML file (tests, calibrate)."""
    data = dict(data)
    data.setdefault("name", "scenario")
    scenario = dataclasses.replace(load(ScenarioConfig, data, source=source), source=source)
    scenario.check_tables()
    return scenario

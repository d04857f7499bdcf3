"""The one schema of the settings a peer file and a scenario share, loaded by both.

``hivemesh peer`` reads them from a peer file's ``[network]`` (and ``[peer]``), ``hivemesh sim``
from a scenario; each setting has one dataclass field here (or in its owner's config class),
one default and one validation: the same object, or the same error, through either loader.

=================  ===========================  ===========================  =================
setting            peer file                    scenario                     defined by
=================  ===========================  ===========================  =================
root seed          network.seed                 seed                         NetworkSection
topology           network.topology             graph.spec                   NetworkSection
mixing weights     network.weights              graph.weights                NetworkSection
task               network.task, task_options   task.name, task.options      NetworkSection
partition          [network.partition]          [partition]                  PartitionConfig
gossip algorithm   [network.gossip]             [algorithm]                  gossip_config
trainer            [network.trainer]            [trainer]                    trainer_config
liveness, sync     [peer] neighbour_timeout_s,  [nodes] neighbour_timeout_s, NodeConfig
                   sync_answer_interval_s, ...  sync_answer_interval_s, ...  (protocols.node)
=================  ===========================  ===========================  =================

Defaults: ``partition.scheme = "iid"``; ``neighbour_timeout_s`` 5 s (the old
``nodes.neighbour_timeout_ms`` is refused, naming the new key); ``trainer.total_steps``
the scenario's ``steps``, else ``gossip.total_steps``; ``gossip.seed`` the root seed. No
ZeroMQ, no torch at import time. Why these defaults: docs/design/config.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from peer.files.config import ConfigError, load
from peer.files.paths import from_folder, topology_spec

Scheme = Literal["iid", "dirichlet", "shards", "file"]


def _empty() -> dict[str, Any]:
    return {}


# A table kept as plain data here and checked against its owner's config class (imported only
# then: TrainerConfig's module imports torch). The loaders and `hivemesh config reference` both
# read the class from here.
GOSSIP_TABLE: Mapping[str, Any] = {"checked_as": "protocols.gossip.config:GossipConfig"}
TRAINER_TABLE: Mapping[str, Any] = {"checked_as": "peer.train.trainer:TrainerConfig"}


def checked_as(metadata: Mapping[str, Any]) -> type | None:
    """The config class a plain table (field ``metadata``) is checked against, if any."""
    target = metadata.get("checked_as")
    if target is None:
        return None
    module, name = target.split(":")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


@dataclass(frozen=True, kw_only=True)
class PartitionConfig:
    """How the task's training set is split over the members (peer.train.partition)."""

    scheme: Scheme = "iid"        # no label skew unless asked (see the module docstring)
    alpha: float = 0.5            # Dirichlet label skew; 0.5 is the usual "strongly non-iid" setting
    shards_per_member: int = 2    # the classic FedAvg pathological split
    path: str = ""                # for scheme = "file": a JSON list of index lists, one per member

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be positive, got {self.alpha}")
        if self.shards_per_member < 1:
            raise ValueError(f"shards_per_member must be at least 1, got {self.shards_per_member}")
        if self.scheme == "file" and not self.path:
            raise ValueError("scheme 'file' needs a path")


@dataclass(frozen=True, kw_only=True)
class NetworkSection:
    """What all members agree on (a peer file digests it into the run id)."""

    topology: str = "ring"            # a topology spec or graph file, over the members' names
    weights: str = "metropolis"       # mixing weights; Metropolis-Hastings is safe on any undirected graph
    seed: int = 0                     # the one root of all randomness in the run
    task: str = "digits-mlp"          # small, real, ships with scikit-learn: no download
    # keyword options of peer.train.tasks.get_task
    task_options: dict[str, Any] = field(default_factory=_empty)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    # protocols.gossip.GossipConfig: gossip_config
    gossip: dict[str, Any] = field(default_factory=_empty, metadata=GOSSIP_TABLE)
    # peer.train.trainer.TrainerConfig: trainer_config
    trainer: dict[str, Any] = field(default_factory=_empty, metadata=TRAINER_TABLE)

    def __post_init__(self) -> None:
        if not self.topology:
            raise ValueError("topology must not be empty")
        if not self.task:
            raise ValueError("task must not be empty")


def resolve_network_paths(network: NetworkSection, base: Path) -> NetworkSection:
    """``network`` with its graph file, task file and partition file taken against ``base`` (the
    folder of the file that names them, never the working directory)."""
    from peer.train.tasks import resolve_task_paths

    task, task_options = resolve_task_paths(network.task, network.task_options, base)
    partition = network.partition
    if partition.path:
        partition = dataclasses.replace(partition, path=from_folder(base, partition.path))
    return dataclasses.replace(network, topology=topology_spec(base, network.topology), task=task,
                               task_options=task_options, partition=partition)


def gossip_config(network: NetworkSection, *, source: str, prefix: str, steps: int = 0) -> Any:
    """``network.gossip`` as a GossipConfig; errors name ``source`` and ``prefix.key``.

    ``seed`` defaults to the root seed; ``total_steps`` to ``steps`` when that is set (a
    scenario's own step budget), else GossipConfig's default.
    """
    data = dict(network.gossip)
    data.setdefault("seed", network.seed)
    if steps:
        data.setdefault("total_steps", steps)
    return load(_owner(GOSSIP_TABLE), data, source=source, prefix=prefix)


def trainer_config(network: NetworkSection, *, source: str, prefix: str, steps: int = 0,
                   federated: bool = False) -> Any:
    """``network.trainer`` as a TrainerConfig; errors name ``source`` and ``prefix.key``.

    ``total_steps`` (the horizon of a decaying learning rate) defaults to ``steps``, else to
    the gossip table's ``total_steps``: the trainer decays over the run it is part of. In a
    federation (``federated``) it stays 0 unless written: the schedule then spans the federation's
    rounds (peer/train/federated.py), which the gossip table's steps do not measure.
    """
    data = dict(network.trainer)
    written = network.gossip.get("total_steps", 0)
    # a wrong type there is gossip_config's error to report, under its own key
    horizon = steps or (written if isinstance(written, int) and not isinstance(written, bool) else 0)
    if horizon and "total_steps" not in data and not federated:
        data["total_steps"] = horizon
    config: Any = load(_owner(TRAINER_TABLE), data, source=source, prefix=prefix)
    if config.lr_decay != "none" and config.total_steps == 0 and not federated:
        raise ConfigError(f"{source}: key '{prefix}.total_steps': lr_decay={config.lr_decay!r} needs "
                          f"total_steps > warmup_steps (got 0, and no gossip total_steps to take)",
                          key=f"{prefix}.total_steps")
    return config


def _owner(metadata: Mapping[str, Any]) -> type:
    cls = checked_as(metadata)
    assert cls is not None, "a table constant names its class"
    return cls


__all__ = ["GOSSIP_TABLE", "TRAINER_TABLE", "NetworkSection", "PartitionConfig", "checked_as",
           "gossip_config", "resolve_network_paths", "trainer_config"]

"""One builder of the members' task, data shards and trainers, for the daemon and the simulator.

The daemon (peer.runtime.assemble) builds its own member's trainer, the simulator
(sim.world) every member's, both from a :class:`peer.files.schema.NetworkSection`, so a
simulated member trains on the very shard, data order and initial model its
deployed twin would. No ZeroMQ here: the simulator imports it.
"""

from __future__ import annotations

from collections.abc import Iterable

from peer.files.schema import NetworkSection
from peer.train.partition import partition
from peer.train.tasks import Task, get_task
from peer.train.trainer import Trainer, TrainerConfig


def build_trainers(network: NetworkSection, config: TrainerConfig, *, members: int,
                   indices: Iterable[int] | None = None) -> tuple[Task, dict[int, Trainer]]:
    """The task and the trainers of members ``indices`` (default: all) of ``members``.

    A member's index is its position among the sorted member names (the topology's
    order): it picks the shard and seeds the data order.
    """
    task = get_task(network.task, **network.task_options)
    part = network.partition
    # every member's shard comes from one draw over all members: the split does not depend on who asks
    shards = partition(task.labels, members, scheme=part.scheme, seed=network.seed, alpha=part.alpha,
                       shards_per_member=part.shards_per_member, path=part.path or None)
    wanted = range(members) if indices is None else indices
    return task, {i: Trainer(task, config, shards[i], seed=network.seed, member_index=i) for i in wanted}

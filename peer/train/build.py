"""One builder of the members' task, data shards and trainers, for the daemon and the simulator.

The daemon (peer.runtime.assemble) builds its own member's trainer, the simulator
(sim.world) every member's, both from a :class:`peer.files.schema.NetworkSection`, so a
simulated member trains on the very shard, data order and initial model its
deployed twin would. No ZeroMQ here: the simulator imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peer.files.schema import NetworkSection
from peer.train.partition import iid_shard, partition
from peer.train.tasks import Task, get_task
from peer.train.trainer import Trainer, TrainerConfig


def build_trainers(network: NetworkSection, config: TrainerConfig, *, members: Sequence[str],
                   wanted: Iterable[str] | None = None) -> tuple[Task, dict[str, Trainer]]:
    """The task and the trainers of members ``wanted`` (default: all) of ``members`` (names).

    A member's shard is keyed by its name (peer.train.partition), so it stays put when others
    join or leave. Its data order is still seeded by its position among the sorted ``members``.
    """
    task = get_task(network.task, **network.task_options)
    part = network.partition
    names = sorted(members)
    chosen = names if wanted is None else list(wanted)
    # every member's shard comes from one assignment over all members: the same whoever asks;
    # iid needs only the count, one member's shard at a time (a Dataset of any size, unread)
    if part.scheme == "iid" and task.lazy:
        shards = {name: iid_shard(task.n_train, names, name, seed=network.seed) for name in chosen}
    else:
        shards = partition(task.labels, names, scheme=part.scheme, seed=network.seed, alpha=part.alpha,
                           shards_per_member=part.shards_per_member, path=part.path or None)
    return task, {name: Trainer(task, config, shards[name], seed=network.seed, member_index=names.index(name))
                  for name in chosen}

"""Gossip algorithms as pure state machines (the sans-IO contract of shared/DESIGN.md).

``make_machine(config, name=..., topology=..., params=trainer.flat_params)``
builds the machine of ``config.algorithm``; a driver feeds it events with
``handle(event, now)`` and carries out the returned actions. The machine mixes
``params`` in place, and only between ``WorkDone`` and the next ``StartWork``:
while local work runs the parameters belong to the trainer. Tensors in a
``Send`` are never modified afterwards by the machine (a driver may send them
without copying). Counters (``missed_deadline``, ``rejected_update``,
``stale_message``...) are reported as ``Metric`` actions carrying running
totals, and are readable as ``machine.counters``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from protocols.gossip.adpsgd import ADPSGD
from protocols.gossip.base import GraphView, MachineBase, Phase
from protocols.gossip.choco import Choco
from protocols.gossip.config import GossipConfig
from protocols.gossip.dpsgd import DPSGD
from protocols.gossip.mixing import consensus_distance
from protocols.gossip.pushsum import PushSum
from protocols.gossip.rounds import RoundMachine

__all__ = [
    "ADPSGD",
    "DPSGD",
    "Choco",
    "GossipConfig",
    "GraphView",
    "MachineBase",
    "Phase",
    "PushSum",
    "RoundMachine",
    "consensus_distance",
    "make_machine",
]

_MACHINES: dict[str, type[MachineBase]] = {
    "dpsgd": DPSGD,
    "local": DPSGD,
    "choco": Choco,
    "pushsum": PushSum,
    "adpsgd": ADPSGD,
}


def make_machine(config: GossipConfig, *, name: str, topology: GraphView, params: torch.Tensor,
                 seed: int | None = None, shapes: Sequence[tuple[int, ...]] | None = None) -> MachineBase:
    """The state machine for ``config.algorithm``, as member ``name`` of ``topology``.

    ``params``: the trainer's flat parameter tensor, mixed in place.
    ``seed``: the run's root seed (defaults to ``config.seed``).
    ``shapes``: the model's parameter shapes in flat order (``trainer.param_shapes``), for
    compressors that work per layer (PowerSGD).
    Raises ValueError when the graph does not suit the algorithm.
    """
    cls = _MACHINES[config.algorithm]
    return cls(config, name=name, topology=topology, params=params,
               seed=config.seed if seed is None else seed, shapes=shapes)

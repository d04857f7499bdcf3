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
from protocols.gossip.base import MachineBase, Phase
from protocols.gossip.choco import Choco
from protocols.gossip.config import GossipConfig
from protocols.gossip.dpsgd import DPSGD
from protocols.gossip.pushsum import PushSum
from protocols.gossip.rounds import RoundMachine
from topology.membership import GraphView

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
    "make_machine",
    "suggested_compression",
]

_MACHINES: dict[str, type[MachineBase]] = {
    "dpsgd": DPSGD,
    "local": DPSGD,
    "choco": Choco,
    "pushsum": PushSum,
    "adpsgd": ADPSGD,
}


def suggested_compression(algorithm: str) -> str:
    """The compression a new network of ``algorithm`` starts from (its machine's choice)."""
    if algorithm not in _MACHINES:
        raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {', '.join(sorted(_MACHINES))}")
    return _MACHINES[algorithm].SUGGESTED_COMPRESSION


def make_machine(config: GossipConfig, *, name: str, topology: GraphView, params: torch.Tensor,
                 seed: int | None = None, shapes: Sequence[tuple[int, ...]] | None = None,
                 trained_numel: int | None = None) -> MachineBase:
    """The state machine for ``config.algorithm``, as member ``name`` of ``topology``.

    ``params``: the trainer's flat parameter tensor, mixed in place.
    ``seed``: the run's root seed (defaults to ``config.seed``).
    ``shapes``: the model's parameter shapes in flat order (``trainer.param_shapes``), for
    compressors that work per layer (PowerSGD).
    ``trained_numel``: how many leading elements of ``params`` the trainer's optimiser moves
    (``trainer.flat_params``); the rest (averaged BatchNorm statistics) is mixed but takes no
    outer-optimiser step. None: all of ``params``.
    Raises ValueError when the graph does not suit the algorithm.
    """
    cls = _MACHINES[config.algorithm]
    machine = cls(config, name=name, topology=topology, params=params,
                  seed=config.seed if seed is None else seed, shapes=shapes)
    if trained_numel is not None:
        if not 0 <= trained_numel <= params.numel():
            raise ValueError(f"trained_numel must be in [0, {params.numel()}], not {trained_numel}")
        if machine.outer is not None:
            machine.outer.stepped = trained_numel
    return machine

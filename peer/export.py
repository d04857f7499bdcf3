"""Take a trained model out of the network: latest checkpoint(s) -> named tensors -> safetensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from peer.peerconfig import PeerConfig, load_peer_config
from peer.statefiles import CheckpointStore
from topology.errors import HivemeshError


@dataclass(frozen=True)
class Exported:
    tensors: int
    parameters: int
    peers: int
    steps: tuple[int, ...]


def latest_params(config: PeerConfig) -> tuple[torch.Tensor, int]:
    """The flat parameters and step of a peer's latest checkpoint."""
    state = CheckpointStore(config.data_dir, keep=config.checkpoint.keep).load_latest()
    if state is None:
        raise HivemeshError(f"{config.source}: peer {config.peer.name} has no checkpoint "
                            f"in {config.data_dir}")
    trainer_state = state[0]
    return trainer_state["tensors"]["params"], int(trainer_state["meta"]["step"])


def named_state(config: PeerConfig, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """The task's model with ``flat`` loaded, as its state dict (parameters and buffers)."""
    from peer.tasks import get_task

    task = get_task(config.network.task, **config.network.task_options)
    model = task.build_model(config.network.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    if total != flat.numel():
        raise HivemeshError(f"checkpoint holds {flat.numel()} parameters, task {task.name!r} has {total}")
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    return {name: tensor.detach().contiguous().clone() for name, tensor in model.state_dict().items()}


def export_model(config_paths: Sequence[str | Path], out: str | Path) -> Exported:
    """Average the peers' latest parameters and write them as ``out`` (safetensors)."""
    configs = [load_peer_config(path) for path in config_paths]
    tasks = {(c.network.task, c.network.seed) for c in configs}
    if len(tasks) > 1:
        raise HivemeshError("the peers given train different tasks; export them one at a time")
    loaded = [latest_params(c) for c in configs]
    stacked = torch.stack([p.to(torch.float64) for p, _ in loaded])
    mean = stacked.mean(dim=0).to(loaded[0][0].dtype)
    state = named_state(configs[0], mean)
    save_file(state, str(out), metadata={"hivemesh_peers": ",".join(c.peer.name for c in configs),
                                         "hivemesh_task": configs[0].network.task})
    return Exported(tensors=len(state), parameters=mean.numel(), peers=len(configs),
                    steps=tuple(step for _, step in loaded))

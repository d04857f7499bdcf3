"""A torch.distributed (gloo) data-parallel run of the daemon's training, to compare final parameters with.

Rank ``i`` builds member ``i``'s trainer from the same peer config (same seed,
shard and data order, one thread) and wraps its model in torch's own
``DistributedDataParallel``: every step each rank computes the gradient of
its own next batch, DDP all-reduces the gradients and divides by the world
size during ``backward``, and the trainer's plain SGD step applies the mean
gradient, so every rank computes ``x <- x - lr * mean_i g_i(x)`` and the
ranks stay equal. The trainer's parameters and gradients are views into its
flat vectors, and DDP keeps them in place (checked), so ``flat_params`` is the model.

The same processes then run the control from a fresh trainer: average the
parameters each rank had before its step and apply its own step on top,
``x_i <- mean_j x_j - lr g_i(x_i)``, which is what the daemon's default
(``mixing = "overlap"``) D-PSGD computes on a complete graph. It shows the
comparison can tell the two apart.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel


def run_rank(rank: int, world: int, init_method: str, config_path: str, steps: int, out: str) -> None:
    """Saves ``{"params": data-parallel result, "overlap": the control's}`` of this rank to ``out``."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    from peer.assemble import make_trainer
    from peer.peerconfig import load_peer_config

    config = load_peer_config(config_path)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        trainer = make_trainer(config, members=world, index=rank)
        trainer.model = DistributedDataParallel(trainer.model)  # all-reduces the gradients in backward
        trainer.run_steps(steps)
        _assert_flat_views(trainer)
        data_parallel = trainer.flat_params.detach().clone()

        control = make_trainer(config, members=world, index=rank)
        params = control.flat_params
        average = torch.empty_like(params)
        for _ in range(steps):
            sent = params.detach().clone()
            control.run_steps(1)
            average.copy_(sent)
            dist.all_reduce(average)
            average.div_(world)
            with torch.no_grad():
                params.add_(average - sent)
        save_file({"params": data_parallel, "overlap": params.detach().clone()}, str(Path(out)))
    finally:
        dist.destroy_process_group()


def _assert_flat_views(trainer: Any) -> None:
    """DDP left every parameter and gradient a view at its place in the trainer's flat vectors."""
    offset = 0
    size = trainer.flat_params.element_size()
    for p in trainer.model.parameters():
        assert p.data_ptr() == trainer.flat_params.data_ptr() + offset * size
        assert p.grad is not None and p.grad.data_ptr() == trainer.flat_grads.data_ptr() + offset * size
        offset += p.numel()
    assert offset == trainer.flat_params.numel()

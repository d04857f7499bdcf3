"""A torch.distributed (gloo) run of the same training, to compare the daemon's final parameters with.

Rank ``i`` builds member ``i``'s trainer from the same peer config (same seed,
shard and data order, one thread) and, every step, averages the parameters
it had before the step with all_reduce and applies the local step on top:
``x_i <- mean_j x_j - lr g_i(x_i)``. That is exact averaging after every step
on a complete graph with uniform weights, which is what the daemon's D-PSGD
machine computes there through gossip; here the averaging is gloo's.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file


def run_rank(rank: int, world: int, init_method: str, config_path: str, steps: int, out: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    from peer.assemble import make_trainer
    from peer.peerconfig import load_peer_config

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        trainer = make_trainer(load_peer_config(config_path), members=world, index=rank)
        params = trainer.flat_params
        average = torch.empty_like(params)
        for _ in range(steps):
            sent = params.detach().clone()
            trainer.run_steps(1)
            average.copy_(sent)
            dist.all_reduce(average)
            average.div_(world)
            with torch.no_grad():
                params.add_(average - sent)
        save_file({"params": params.detach().clone()}, str(Path(out)))
    finally:
        dist.destroy_process_group()

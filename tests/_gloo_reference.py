"""A torch.distributed (gloo) data-parallel run of the daemon's training, to compare final states with.

Rank ``i`` builds member ``i``'s trainer from the same peer config (same seed,
shard and data order, one thread) and wraps its model in torch's own
``DistributedDataParallel`` with ``broadcast_buffers=False``: every step each
rank computes the gradient of its own next batch (BatchNorm normalises with
that batch's statistics and updates the rank's own running statistics), DDP
all-reduces the gradients and divides by the world size during ``backward``,
the trainer's plain SGD step applies the mean gradient, and then the floating
buffers are all-reduced and divided by the world size. So every rank computes
``x <- x - lr * mean_i g_i(x)`` and ``b <- mean_i b_i'`` (its running statistics
after its own step, averaged), and the ranks stay equal: what gossip with
``buffers = "average"`` and exact averaging after each step computes. The
trainer's parameters, gradients and buffers are views into its flat vectors,
and DDP keeps them in place (checked), so ``flat_params`` and ``flat_buffers`` are the model.

The same processes then run the control from a fresh trainer: average what
each rank had before its step (parameters and buffers) and apply its own step
on top, ``x_i <- mean_j x_j - lr g_i(x_i)``, which is what the daemon's default
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
    """Saves ``{"params", "buffers": data-parallel result, "overlap", "overlap_buffers": the control's}``
    of this rank to ``out``."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    from peer.runtime.assemble import make_trainer
    from peer.runtime.peerconfig import load_peer_config

    config = load_peer_config(config_path)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        trainer = make_trainer(config)
        # all-reduces the gradients in backward; the running statistics stay each rank's own...
        trainer.model = DistributedDataParallel(trainer.model, broadcast_buffers=False)
        for _ in range(steps):
            trainer.run_steps(1)
            _average(trainer.flat_buffers, world)    # ...until averaged after each step
        _assert_flat_views(trainer)
        data_parallel = {"params": trainer.flat_params.detach().clone(),
                         "buffers": trainer.flat_buffers.detach().clone()}

        control = make_trainer(config)
        state = control.mixed       # parameters and buffers, as gossip mixes them
        for _ in range(steps):
            sent = state.detach().clone()
            control.run_steps(1)
            average = sent.clone()
            _average(average, world)
            with torch.no_grad():
                state.add_(average - sent)
        save_file({**data_parallel, "overlap": control.flat_params.detach().clone(),
                   "overlap_buffers": control.flat_buffers.detach().clone()}, str(Path(out)))
    finally:
        dist.destroy_process_group()


def _average(tensor: torch.Tensor, world: int) -> None:
    """``tensor`` becomes the mean over the ranks, in place."""
    dist.all_reduce(tensor)
    tensor.div_(world)


def _assert_flat_views(trainer: Any) -> None:
    """DDP left every parameter, gradient and floating buffer a view at its place in the flat vectors."""
    offset = 0
    size = trainer.flat_params.element_size()
    for p in trainer.model.parameters():
        assert p.data_ptr() == trainer.flat_params.data_ptr() + offset * size
        assert p.grad is not None and p.grad.data_ptr() == trainer.flat_grads.data_ptr() + offset * size
        offset += p.numel()
    assert offset == trainer.flat_params.numel()
    offset = 0
    for b in (b for b in trainer.model.buffers() if b.is_floating_point()):
        assert b.data_ptr() == trainer.flat_buffers.data_ptr() + offset * size
        offset += b.numel()
    assert offset == trainer.flat_buffers.numel() > 0

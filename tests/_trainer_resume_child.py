"""Helper for tests/test_checkpoint.py: train 10 steps, checkpoint, then die by SIGKILL.

Run as ``python tests/_trainer_resume_child.py CHECKPOINT_DIR``; the test imports
:func:`make_trainer` from here too, so both halves build the very same trainer.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn

from peer.train import checkpoint
from peer.train.partition import partition
from peer.train.tasks import Task, get_task, seeded
from peer.train.trainer import Trainer, TrainerConfig

SHARD = 0  # its shard (seed 20) has 176 samples: 9 steps an epoch, the last one of 16
CONFIG = TrainerConfig(optimizer="adamw", lr=2e-3, weight_decay=0.01, batch_size=20, warmup_steps=4,
                       lr_decay="cosine", total_steps=20, grad_clip=1.0, device="cpu", threads=1)


def make_task() -> Task:
    """logreg's data under an MLP with BatchNorm (buffers to restore); no scikit-learn import."""
    data = get_task("logreg", n_samples=1000, n_features=8, n_classes=4)

    def build(seed: int) -> nn.Module:
        with seeded(seed):
            return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(32, 4))

    return Task(name="logreg-bn", build_model=build, train_x=data.train_x.float(), train_y=data.train_y,
                test_x=data.test_x.float(), test_y=data.test_y)


def make_trainer() -> Trainer:
    """A BatchNorm + dropout model on a label-skewed shard; AdamW with warm-up, decay and clipping."""
    task = make_task()
    names = ["m0", "m1", "m2", "m3"]
    shard = partition(task.labels, names, scheme="dirichlet", seed=20, alpha=0.5)[names[SHARD]]
    return Trainer(task, CONFIG, shard, seed=5, member_index=SHARD)


def protocol_state() -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    return {"public": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, {"round": 7, "phase": "mixing"}


def main(directory: str) -> None:
    trainer = make_trainer()
    trainer.run_steps(10)
    checkpoint.save(directory, trainer.state_dict(), protocol_state(), extra={"writer": "child"}, keep=2)
    os.kill(os.getpid(), signal.SIGKILL)  # no clean shutdown: the checkpoint alone must carry the run


if __name__ == "__main__":
    main(sys.argv[1])

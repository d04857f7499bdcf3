"""The CUDA path of the trainer (skipped by conftest where torch sees no GPU; not yet run in CI)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from peer import checkpoint
from peer.tasks import get_task
from peer.trainer import Trainer, TrainerConfig


@pytest.mark.gpu
def test_cuda_trainer_stages_parameters_through_pinned_memory(tmp_path: Path) -> None:
    task = get_task("digits-cnn")
    trainer = Trainer(task, TrainerConfig(device="auto", optimizer="momentum"), np.arange(256), seed=0,
                      member_index=0)
    assert trainer.flat_params.is_cuda and trainer.flat_grads.is_cuda
    assert all(p.is_cuda for p in trainer.model.parameters())
    trainer.run_steps(5)
    host = trainer.host_params()
    assert not host.is_cuda and host.is_pinned()
    assert torch.equal(host, trainer.flat_params.cpu())
    trainer.flat_params.add_(1.0)  # a later in-place mix shows up in the next staging, not before
    assert not torch.equal(host, trainer.flat_params.cpu())
    assert torch.equal(trainer.host_params(), trainer.flat_params.cpu())
    assert 0.0 <= trainer.evaluate()["accuracy"] <= 1.0

    checkpoint.save(tmp_path, trainer.state_dict(), keep=1)
    loaded = checkpoint.load_latest(tmp_path)
    assert loaded is not None
    other = Trainer(task, TrainerConfig(device="auto", optimizer="momentum"), np.arange(256), seed=1,
                    member_index=0)
    other.load_state_dict(loaded.trainer_state)
    assert torch.equal(other.flat_params, trainer.flat_params)
    assert torch.equal(other.flat_buffers, trainer.flat_buffers)

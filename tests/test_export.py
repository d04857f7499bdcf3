"""peer/runtime/export.py without processes: a checkpoint's trainer state -> the model's whole state dict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from peer.runtime.export import average_states, model_state
from peer.train.checkpoint import load_latest, save
from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig
from protocols.errors import HivemeshError


def _trained(task_name: str, *, dtype: str = "float32", steps: int = 3) -> Trainer:
    task = get_task(task_name)
    trainer = Trainer(task, TrainerConfig(dtype=dtype, batch_size=16), np.arange(200), seed=0, member_index=0)
    trainer.run_steps(steps)
    return trainer


def _through_disk(trainer: Trainer, folder: Path) -> dict[str, torch.Tensor]:
    """The trainer tensors as a checkpoint written by peer.train.checkpoint holds them (format unchanged)."""
    save(folder, trainer.state_dict())
    loaded = load_latest(folder)
    assert loaded is not None
    return loaded.trainer_state["tensors"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_checkpoint_becomes_the_trained_models_state_dict_bit_for_bit(tmp_path: Path, dtype: str) -> None:
    trainer = _trained("digits-cnn", dtype=dtype)
    exported = model_state(trainer.task, 0, _through_disk(trainer, tmp_path))
    expected = trainer.model.state_dict()
    assert sorted(exported) == sorted(expected)
    for name, tensor in expected.items():
        assert exported[name].dtype == tensor.dtype and torch.equal(exported[name], tensor), name
    # negative control: the fresh model (what parameters alone give) has other statistics
    fresh = trainer.task.build_model(0).state_dict()
    assert not torch.equal(fresh["features.1.running_mean"], expected["features.1.running_mean"].float())
    assert int(exported["features.1.num_batches_tracked"]) == 3


def test_a_model_without_buffers_exports_its_parameters(tmp_path: Path) -> None:
    trainer = _trained("digits-mlp")
    tensors = _through_disk(trainer, tmp_path)
    assert "buffers" not in tensors     # digits-mlp checkpoints never had any
    exported = model_state(trainer.task, 0, tensors)
    assert all(torch.equal(exported[n], t) for n, t in trainer.model.state_dict().items())


def test_a_checkpoint_without_the_models_buffers_is_refused(tmp_path: Path) -> None:
    trainer = _trained("digits-cnn", steps=1)
    tensors = dict(_through_disk(trainer, tmp_path))
    del tensors["buffers"]
    with pytest.raises(HivemeshError, match="no buffers"):
        model_state(trainer.task, 0, tensors)


def test_averaging_means_floats_and_takes_the_largest_count() -> None:
    first = {"w": torch.tensor([1.0, 2.0]), "num_batches_tracked": torch.tensor(3)}
    second = {"w": torch.tensor([3.0, 5.0]), "num_batches_tracked": torch.tensor(7)}
    for states in ([first, second], [second, first]):       # the order the peers are given in
        mean = average_states(states)
        assert torch.equal(mean["w"], torch.tensor([2.0, 3.5])) and mean["w"].dtype == torch.float32
        assert torch.equal(mean["num_batches_tracked"], torch.tensor(7))   # not 5, the mean

"""Each built-in task, trained alone on all its data, reaches its stated bar."""

import numpy as np
import pytest
import torch

from peer.tasks import TaskError, get_task
from peer.trainer import Trainer, TrainerConfig

torch.set_num_threads(1)


def train_alone(name: str, config: TrainerConfig, epochs: int, **options: object) -> dict[str, float]:
    task = get_task(name, **options)
    trainer = Trainer(task, config, np.arange(task.n_train), seed=0, member_index=0)
    trainer.run_epochs(epochs)
    metrics = trainer.evaluate()
    assert task.meets_bar(metrics), metrics
    return metrics


@pytest.mark.slow
def test_digits_mlp_reaches_95_percent() -> None:
    metrics = train_alone("digits-mlp", TrainerConfig(optimizer="momentum", lr=0.05, device="cpu"), 6)
    assert metrics["accuracy"] >= 0.95


@pytest.mark.slow
@pytest.mark.parametrize(("options", "lr"), [({}, 2.0), ({"n_classes": 4, "n_features": 10}, 2.0),
                                             ({"binary": True, "n_samples": 5000}, 2.0)])
def test_logreg_reaches_its_optimum_within_1e3(options: dict, lr: float) -> None:
    config = TrainerConfig(dtype="float64", lr=lr, batch_size=0, device="cpu")
    metrics = train_alone("logreg", config, 300, **options)
    assert 0 <= metrics["optimality_gap"] <= 1e-3


def test_logreg_data_has_requested_shape_and_is_seeded() -> None:
    task = get_task("logreg", n_samples=300, n_features=7, n_classes=5, test_samples=50, data_seed=4)
    assert tuple(task.train_x.shape) == (300, 7) and tuple(task.test_x.shape) == (50, 7)
    assert task.train_x.dtype == torch.float64
    assert set(np.unique(task.labels)) <= set(range(5))
    assert len(np.unique(task.labels)) == 5
    again = get_task("logreg", n_samples=300, n_features=7, n_classes=5, test_samples=50, data_seed=4)
    other = get_task("logreg", n_samples=300, n_features=7, n_classes=5, test_samples=50, data_seed=5)
    assert again is task
    assert not torch.equal(other.train_x, task.train_x)


def test_tasks_share_one_copy_of_the_data() -> None:
    task = get_task("digits-mlp")
    a = Trainer(task, TrainerConfig(device="cpu", dtype="float64"), np.arange(10), seed=0, member_index=0)
    b = Trainer(task, TrainerConfig(device="cpu", dtype="float64"), np.arange(10, 20), seed=0, member_index=1)
    assert a._x is b._x  # one float64 cast per process, shared by every trainer
    assert get_task("digits-mlp") is task


def test_digits_split_is_fixed_and_standardised() -> None:
    task = get_task("digits-mlp")
    assert (len(task.train_x), len(task.test_x)) == (1437, 360)
    assert abs(float(task.train_x.mean())) < 1e-3
    assert np.bincount(task.labels).min() >= 135  # stratified: the rarest digit has 174 images


@pytest.mark.parametrize(("name", "options", "needle"), [
    ("mnist", {}, "unknown task"), ("logreg", {"n_classes": 1}, "n_classes"),
    ("logreg", {"colour": "red"}, "bad options"), ("digits-mlp", {"width": 3}, "bad options"),
    ("no_such_module_xyz:make", {}, "cannot import"), ("json:no_function", {}, "no function"),
])
def test_bad_task_requests_are_user_errors(name: str, options: dict, needle: str) -> None:
    with pytest.raises(TaskError, match=needle):
        get_task(name, **options)

"""Each built-in task, trained alone on all its data, reaches its stated bar."""

from pathlib import Path

import numpy as np
import pytest
import torch

from peer.train.tasks import TaskError, get_task
from peer.train.trainer import Trainer, TrainerConfig

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
    config = TrainerConfig(optimizer="momentum", lr=0.05, lr_decay="cosine", total_steps=4 * 45, device="cpu")
    metrics = train_alone("digits-mlp", config, 4)
    assert metrics["accuracy"] >= 0.95


@pytest.mark.slow
def test_digits_cnn_reaches_97_percent() -> None:
    config = TrainerConfig(optimizer="momentum", lr=0.05, lr_decay="cosine", total_steps=6 * 45, device="cpu")
    metrics = train_alone("digits-cnn", config, 6)
    assert metrics["accuracy"] >= 0.97


@pytest.mark.slow
def test_charlm_beats_unigram_entropy_by_half_a_nat() -> None:
    task = get_task("charlm")
    trainer = Trainer(task, TrainerConfig(optimizer="adamw", lr=3e-3, device="cpu"), np.arange(task.n_train),
                      seed=0, member_index=0)
    trainer.run_steps(120)
    metrics = trainer.evaluate()
    assert metrics["loss"] <= task.info["unigram_entropy"] - 0.5
    assert task.meets_bar(metrics)


def test_charlm_on_a_user_text(tmp_path: Path) -> None:
    text = tmp_path / "abc.txt"
    text.write_text("abcabcabd" * 40)
    task = get_task("charlm", path=str(text), context=8, width=16, heads=2, layers=1)
    assert task.info["vocab"] == "abcd"
    assert tuple(task.train_x.shape)[1] == 8 and torch.equal(task.train_x[0, 1:], task.train_y[0, :-1])
    with pytest.raises(TaskError, match="no such text"):
        get_task("charlm", path=str(tmp_path / "missing.txt"))
    with pytest.raises(TaskError, match="too short"):
        (tmp_path / "short.txt").write_text("tiny")
        get_task("charlm", path=str(tmp_path / "short.txt"))


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_task.py"


def test_custom_task_from_a_file_path_reaches_its_bar() -> None:
    task = get_task(f"{EXAMPLE}:make_task", hidden=16)
    assert task.name.endswith("custom_task.py:make_task") and task.n_train == 100
    metrics = train_alone(f"{EXAMPLE}:make_task", TrainerConfig(lr=0.1, batch_size=10, device="cpu"), 30,
                          hidden=16)
    assert metrics["accuracy"] >= 0.9


def test_custom_task_by_module_name_when_examples_is_on_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    task = get_task("custom_task:make_task", hidden=8)
    trainer = Trainer(task, TrainerConfig(device="cpu"), np.arange(10), seed=3, member_index=0)
    assert trainer.flat_params.numel() == 4 * 8 + 8 + 8 * 3 + 3
    assert set(trainer.evaluate()) == {"loss", "accuracy"}


def test_custom_task_returning_something_else_is_a_user_error(tmp_path: Path) -> None:
    module = tmp_path / "broken_task.py"
    module.write_text("def make():\n    return {'model': None}\n\ndef other():\n    return 3\n")
    with pytest.raises(TaskError, match="lacks test, train"):
        get_task(f"{module}:make")
    with pytest.raises(TaskError, match="returned int"):
        get_task(f"{module}:other")
    with pytest.raises(TaskError, match="no such file"):
        get_task(f"{tmp_path}/nothing.py:make")


@pytest.mark.slow
@pytest.mark.parametrize(("options", "lr"), [({}, 2.0), ({"n_classes": 4, "n_features": 10}, 2.0),
                                             ({"binary": True, "n_samples": 5000}, 2.0)])
def test_logreg_reaches_its_optimum_within_1e3(options: dict, lr: float) -> None:
    config = TrainerConfig(dtype="float64", lr=lr, batch_size=0, device="cpu")
    metrics = train_alone("logreg", config, 100, **options)
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

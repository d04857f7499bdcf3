import math
from typing import Any, Literal

import numpy as np
import pytest
import torch

from peer.files.config import ConfigError, load
from peer.train.tasks import get_task
from peer.train.tasks.logreg import full_loss_and_grad
from peer.train.trainer import Trainer, TrainerConfig, epoch_order, lr_at
from protocols.errors import HivemeshError

torch.set_num_threads(1)

F64 = TrainerConfig(dtype="float64", lr=0.3, batch_size=16, device="cpu")


def logreg_trainer(config: TrainerConfig = F64, member_index: int = 0, n_classes: int = 3,
                   shard: np.ndarray | None = None) -> Trainer:
    task = get_task("logreg", n_samples=200, n_features=5, n_classes=n_classes)
    shard = np.arange(0, 200, 2) if shard is None else shard
    return Trainer(task, config, shard, seed=7, member_index=member_index)


def test_parameters_are_views_into_one_flat_tensor() -> None:
    trainer = Trainer(get_task("digits-mlp"), TrainerConfig(device="cpu"), np.arange(100),
                      seed=0, member_index=0)
    params = list(trainer.model.parameters())
    assert trainer.flat_params.is_contiguous() and trainer.flat_params.dim() == 1
    assert trainer.flat_params.numel() == sum(p.numel() for p in params) == 64 * 128 + 128 + 128 * 10 + 10
    x = get_task("digits-mlp").test_x[:4]
    before = trainer.model(x).detach().clone()
    trainer.flat_params.mul_(0.5)  # in-place mixing must change the model
    assert not torch.equal(trainer.model(x).detach(), before)
    trainer.flat_params.zero_()
    assert all(float(p.detach().abs().sum()) == 0.0 for p in params)


def test_gradients_stay_in_the_flat_gradient_buffer() -> None:
    trainer = logreg_trainer()
    pointer = trainer.flat_grads.data_ptr()
    trainer.run_steps(3)
    assert trainer.flat_grads.data_ptr() == pointer
    total = sum(float(p.grad.abs().sum()) for p in trainer.model.parameters() if p.grad is not None)
    assert total == pytest.approx(float(trainer.flat_grads.abs().sum()))
    assert total > 0


def test_plain_sgd_matches_a_numpy_recursion_to_1e12() -> None:
    trainer = logreg_trainer()
    task = trainer.task
    x, y = task.train_x.numpy(), task.train_y.numpy()
    shard = np.arange(0, 200, 2)
    theta = trainer.flat_params.numpy().copy()
    assert not theta.any()  # logreg starts at zero
    epoch, offset = 0, 0
    for _ in range(25):  # crosses epoch boundaries (100 samples, batch 16: last batch has 4)
        order = epoch_order(7, 0, epoch, len(shard)).numpy()
        batch = shard[order[offset:offset + 16]]
        _, grad = full_loss_and_grad(theta, x[batch], y[batch], 3, False)
        theta = theta - 0.3 * grad
        offset += len(batch)
        if offset >= len(shard):
            epoch, offset = epoch + 1, 0
    trainer.run_steps(25)
    assert (trainer.epoch, trainer.offset) == (epoch, offset)
    np.testing.assert_allclose(trainer.flat_params.numpy(), theta, rtol=0, atol=1e-12)


def test_full_batch_gradient_matches_numpy() -> None:
    trainer = logreg_trainer()
    trainer.run_steps(5)
    shard = np.arange(0, 200, 2)
    _, expected = full_loss_and_grad(trainer.flat_params.numpy().copy(), trainer.task.train_x.numpy()[shard],
                                     trainer.task.train_y.numpy()[shard], 3, False)
    np.testing.assert_allclose(trainer.gradient().numpy(), expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
def test_flat_optimizers_match_torch_optim(optimizer: Literal["momentum", "adamw"]) -> None:
    config = TrainerConfig(dtype="float64", lr=0.05, batch_size=8, device="cpu", optimizer=optimizer,
                           weight_decay=0.01, momentum=0.8)
    trainer = logreg_trainer(config)
    reference = trainer.task.build_model(7).double()
    if optimizer == "momentum":
        opt: torch.optim.Optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.8,
                                                     weight_decay=0.01)
    else:
        opt = torch.optim.AdamW(reference.parameters(), lr=0.05, weight_decay=0.01)
    x, y = trainer.task.train_x, trainer.task.train_y
    for _ in range(30):
        batch = trainer.shard[trainer.batch_positions()]
        opt.zero_grad()
        trainer.task.loss_fn(reference(x[batch]), y[batch]).backward()
        opt.step()
        trainer.run_steps(1)
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    torch.testing.assert_close(trainer.flat_params, expected, rtol=0, atol=1e-12)


def test_same_seed_same_run_and_members_differ_only_in_data_order() -> None:
    a, b, c = logreg_trainer(), logreg_trainer(), logreg_trainer(member_index=1)
    assert torch.equal(a.flat_params, c.flat_params)  # same initial model
    loss_a, loss_b = a.run_steps(10), b.run_steps(10)
    c.run_steps(10)
    assert loss_a == loss_b and torch.equal(a.flat_params, b.flat_params)
    assert not torch.equal(a.flat_params, c.flat_params)


def test_run_epochs_counts_epochs() -> None:
    trainer = logreg_trainer()
    assert trainer.steps_per_epoch == 7
    trainer.run_epochs(2)
    assert (trainer.epoch, trainer.offset, trainer.step) == (2, 0, 14)


def test_whole_shard_batches() -> None:
    trainer = logreg_trainer(TrainerConfig(dtype="float64", batch_size=0, device="cpu"))
    assert trainer.batch_size == 100 and trainer.steps_per_epoch == 1
    trainer.run_steps(3)
    assert (trainer.epoch, trainer.offset) == (3, 0)


def test_learning_rate_schedules() -> None:
    warm = TrainerConfig(lr=1.0, warmup_steps=4)
    assert [lr_at(warm, s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = TrainerConfig(lr=1.0, warmup_steps=2, lr_decay="cosine", total_steps=12)
    assert lr_at(cosine, 2) == 1.0
    assert lr_at(cosine, 7) == pytest.approx(0.5)
    assert lr_at(cosine, 12) == pytest.approx(0.0) and lr_at(cosine, 50) == pytest.approx(0.0)
    step = TrainerConfig(lr=1.0, lr_decay="step", total_steps=100)
    assert [lr_at(step, s) for s in (0, 49, 50, 74, 75, 99)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


def test_gradient_clipping_bounds_the_step() -> None:
    config = TrainerConfig(dtype="float64", lr=1.0, batch_size=16, device="cpu", grad_clip=1e-3)
    trainer = logreg_trainer(config)
    before = trainer.flat_params.clone()
    trainer.run_steps(1)
    assert float(torch.linalg.vector_norm(trainer.flat_params - before)) == pytest.approx(1e-3, rel=1e-5)


def test_batchnorm_buffers_are_flat_and_separate() -> None:
    trainer = Trainer(get_task("digits-cnn"), TrainerConfig(device="cpu", buffers="local"), np.arange(64),
                      seed=0, member_index=0)
    assert not trainer.average_buffers
    bn: Any = trainer.model.get_submodule("features.1")
    assert trainer.flat_buffers.numel() == 2 * (16 + 32)
    trainer.run_steps(2)
    assert float(bn.running_mean.abs().sum()) > 0
    trainer.flat_buffers.zero_()
    assert float(bn.running_mean.abs().sum()) == 0.0
    assert "int_buffer.features.1.num_batches_tracked" in trainer.state_dict()["tensors"]


def test_state_dict_round_trip_in_process_continues_identically() -> None:
    config = TrainerConfig(dtype="float32", lr=0.1, batch_size=8, device="cpu", optimizer="momentum")
    straight = logreg_trainer(config)
    straight.run_steps(20)
    first = logreg_trainer(config)
    first.run_steps(10)
    state = {"tensors": {k: v.clone() for k, v in first.state_dict()["tensors"].items()},
             "meta": first.state_dict()["meta"]}
    resumed = logreg_trainer(config)
    params = resumed.flat_params
    resumed.load_state_dict(state)
    assert resumed.flat_params is params
    resumed.run_steps(10)
    assert torch.equal(resumed.flat_params, straight.flat_params)
    momentum = "momentum_buffer"
    assert torch.equal(resumed.optimizer_state[momentum], straight.optimizer_state[momentum])


def test_state_of_another_task_is_refused() -> None:
    state = logreg_trainer().state_dict()
    other = logreg_trainer(TrainerConfig(dtype="float64", optimizer="adamw", device="cpu"))
    with pytest.raises(HivemeshError, match="tensors"):
        other.load_state_dict(state)


def test_evaluate_reports_loss_accuracy_and_optimality_gap() -> None:
    metrics = logreg_trainer().evaluate()
    assert set(metrics) >= {"loss", "accuracy", "train_loss", "optimality_gap"}
    assert metrics["train_loss"] == pytest.approx(math.log(3))  # zero weights: uniform prediction
    assert metrics["optimality_gap"] > 0


def test_bad_shards_and_devices_are_user_errors() -> None:
    task = get_task("logreg", n_samples=200, n_features=5, n_classes=3)
    with pytest.raises(HivemeshError, match="non-empty"):
        Trainer(task, F64, np.array([], dtype=np.int64), seed=0, member_index=0)
    with pytest.raises(HivemeshError, match=r"\[0, 200\)"):
        Trainer(task, F64, np.array([0, 200]), seed=0, member_index=0)
    if not torch.cuda.is_available():
        with pytest.raises(HivemeshError, match="cuda"):
            Trainer(task, TrainerConfig(device="cuda"), np.arange(10), seed=0, member_index=0)


@pytest.mark.parametrize(("data", "needle"), [
    ({"lr": -1}, "lr"), ({"optimizer": "lion"}, "optimizer"),
    ({"lr_decay": "cosine", "warmup_steps": 5, "total_steps": 3}, "total_steps"),
    ({"batch_size": -2}, "batch_size"), ({"dtype": "float16"}, "dtype"), ({"grad_clip": -1.0}, "grad_clip"),
])
def test_config_validation_names_the_key(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load(TrainerConfig, data, source="peer.toml")

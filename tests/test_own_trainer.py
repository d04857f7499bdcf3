"""peer/train/own.py: the user's model as a member's trainer (library mode, issue 29 item 1).

What the daemon relies on: the model's parameters are views of the vector gossip mixes; a
checkpoint written and read through peer/train/checkpoint.py (safetensors and JSON) brings back
the model, a torch optimizer and a scheduler exactly; the turn between the daemon's ``run_steps``
and the user's ``user_step`` is handed over, never shared; what cannot be checkpointed is said at
join, in one line.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from peer.train import checkpoint
from peer.train.own import OwnTrainer
from peer.train.trainer import StepsStopped
from protocols.errors import HivemeshError

STEPS, TOTAL = 6, 12


def setup(device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=TOTAL)
    return model, optimizer, scheduler


def train(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, first: int, last: int) -> None:
    """Steps ``first`` to ``last - 1`` of a loop whose data is a function of the step."""
    device = next(model.parameters()).device
    for step in range(first, last):
        generator = torch.Generator().manual_seed(step)
        x, y = torch.randn(32, 8, generator=generator), torch.randint(3, (32,), generator=generator)
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def test_the_parameters_are_views_of_what_gossip_mixes() -> None:
    model, optimizer, scheduler = setup()
    trainer = OwnTrainer(model, optimizer=optimizer, scheduler=scheduler)
    assert trainer.mixed.numel() == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        trainer.mixed.zero_()    # what a mix does, in place
    assert all(float(p.detach().abs().sum()) == 0.0 for p in model.parameters())
    train(model, optimizer, scheduler, 0, 1)    # the optimizer still holds the same Parameters
    assert float(trainer.mixed.abs().sum()) > 0.0


def test_a_checkpoint_brings_back_model_optimizer_and_scheduler_exactly(tmp_path: Path) -> None:
    model, optimizer, scheduler = setup()
    trainer = OwnTrainer(model, optimizer=optimizer, scheduler=scheduler)
    train(model, optimizer, scheduler, 0, STEPS)
    for _ in range(STEPS):    # the loop's m.step() after each of them
        trainer._step += 1
    checkpoint.save(tmp_path, trainer.state_dict(), step=STEPS)
    train(model, optimizer, scheduler, STEPS, TOTAL)
    uninterrupted = trainer.mixed.clone()

    model, optimizer, scheduler = setup()   # a fresh process: the same code, nothing trained
    restored = OwnTrainer(model, optimizer=optimizer, scheduler=scheduler)
    found = checkpoint.load_latest(tmp_path)
    assert found is not None
    restored.load_state_dict(found.trainer_state)
    assert restored.step == STEPS
    assert restored.last_lr == pytest.approx(scheduler.get_last_lr()[0])   # the status's "lr" (main's)
    assert scheduler.last_epoch == STEPS and isinstance(optimizer.param_groups[0]["betas"], tuple)
    train(model, optimizer, scheduler, STEPS, TOTAL)
    assert torch.equal(restored.mixed, uninterrupted)   # bit for bit: the optimizer's moments came back


def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    model, optimizer, _ = setup()
    checkpoint.save(tmp_path, OwnTrainer(model, optimizer=optimizer).state_dict(), step=0)
    found = checkpoint.load_latest(tmp_path)
    assert found is not None
    other = OwnTrainer(nn.Linear(8, 3), optimizer=None)
    with pytest.raises(HivemeshError, match="the checkpoint is for optimizer AdamW"):
        other.load_state_dict(found.trainer_state)


def test_a_forward_jump_moves_the_scheduler_with_it() -> None:
    model, optimizer, scheduler = setup()
    trainer = OwnTrainer(model, optimizer=optimizer, scheduler=scheduler)
    trainer.step = 5     # a state sync: the network is at step 5
    assert scheduler.last_epoch == 5
    trainer.step = TOTAL + 3   # past the schedule's end (OneCycleLR raises there): as far as it goes
    assert scheduler.last_epoch >= TOTAL and trainer.step == TOTAL + 3


def test_the_turn_is_handed_over_between_the_daemon_and_the_loop() -> None:
    model, optimizer, _ = setup()
    trainer = OwnTrainer(model, optimizer=optimizer)
    events: list[str] = []
    loss: list[float] = []

    def daemon() -> None:
        for round_index in range(2):
            loss.append(trainer.run_steps(3))
            events.append(f"round {round_index} done")   # the loop waits while this runs (a mix)
        trainer.end()

    thread = threading.Thread(target=daemon)
    thread.start()
    trainer.wait_turn()
    for step in range(6):
        events.append(f"step {step}")
        trainer.user_step(float(step))
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert events == ["step 0", "step 1", "step 2", "round 0 done", "step 3", "step 4", "step 5",
                      "round 1 done"]
    assert loss == [1.0, 4.0] and trainer.step == 6
    trainer.user_step(None)      # over: a step is not counted, and does not wait
    assert trainer.step == 6 and trainer.ended
    with pytest.raises(StepsStopped):
        trainer.run_steps(2)


def test_an_end_releases_a_round_still_waiting_for_steps_as_not_done() -> None:
    trainer = OwnTrainer(nn.Linear(2, 2))
    result: list[object] = []

    def daemon() -> None:
        try:
            result.append(trainer.run_steps(5))
        except StepsStopped as stopped:   # the daemon feeds no WorkDone: the round is trained again
            result.append(stopped)

    thread = threading.Thread(target=daemon)
    thread.start()
    trainer.wait_turn()
    trainer.user_step(2.0)
    trainer.end()        # close() mid-round
    thread.join(timeout=30)
    assert len(result) == 1 and isinstance(result[0], StepsStopped) and trainer.step == 1


class Opaque(torch.optim.lr_scheduler.LRScheduler):
    """A scheduler whose state JSON cannot hold."""

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"kept": {1, 2}}


def test_state_that_cannot_be_checkpointed_is_said_at_join() -> None:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(HivemeshError, match="state cannot be checkpointed: Object of type set"):
        OwnTrainer(model, optimizer=optimizer, scheduler=Opaque(optimizer))


def test_a_model_on_two_dtypes_is_refused() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).to(torch.float64))
    with pytest.raises(HivemeshError, match="share one device and dtype"):
        OwnTrainer(model)


@pytest.mark.gpu
def test_a_cuda_model_is_mixed_on_the_device_and_sent_from_pinned_memory() -> None:
    model, optimizer, scheduler = setup("cuda")
    trainer = OwnTrainer(model, optimizer=optimizer, scheduler=scheduler)
    train(model, optimizer, scheduler, 0, 2)
    assert trainer.mixed.is_cuda
    host = trainer.host_mixed()
    assert not host.is_cuda and host.is_pinned() and torch.equal(host, trainer.mixed.cpu())

"""The daemon's step bookkeeping: it sets the trainer's step when the machine (or a state sync) says
so, and checkpoints a step that moved on without training (pure: no processes)."""

from __future__ import annotations

from types import SimpleNamespace

from peer.runtime.daemon import PeerDaemon
from protocols.events import SetTrainerStep
from protocols.node.checkpoints import CheckpointConfig, CheckpointSchedule


def _fake(step: int) -> SimpleNamespace:
    saves: list[bool] = []
    schedule = CheckpointSchedule(CheckpointConfig(), start_step=step)

    def checkpoint(*, final: bool) -> None:
        saves.append(final)
        schedule.saved(fake.trainer.step, 0.0)

    fake = SimpleNamespace(trainer=SimpleNamespace(step=step), counters=SimpleNamespace(trainer_steps_set=[]),
                           gateway_work=None, saves=saves, schedule=schedule, _checkpoint=checkpoint)
    return fake


def test_set_trainer_step_moves_the_trainers_step_and_checkpoints_the_jump() -> None:
    fake = _fake(40)
    PeerDaemon._carry_out(fake, [SetTrainerStep(70)])  # type: ignore[arg-type]
    assert fake.trainer.step == 70     # three rounds of 10 skipped: the lr schedule follows
    assert fake.counters.trainer_steps_set == [70]     # and status shows it (trainer_steps_set)
    assert fake.saves == [False]       # at once, not final: a kill now loses no jump (issue 16)
    assert not fake.schedule.jumped    # and written: the next periodic save counts from it


def test_a_step_set_back_or_kept_writes_no_checkpoint() -> None:
    fake = _fake(40)
    PeerDaemon._carry_out(fake, [SetTrainerStep(40), SetTrainerStep(30)])  # type: ignore[arg-type]
    assert fake.trainer.step == 30 and fake.counters.trainer_steps_set == [40, 30]
    assert fake.saves == []

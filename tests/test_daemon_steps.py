"""The daemon's step bookkeeping when the machine skips rounds to catch up (pure: no processes)."""

from __future__ import annotations

from types import SimpleNamespace

from peer.daemon import PeerDaemon


def follow(trainer_step: int, steps_done: int) -> int:
    fake = SimpleNamespace(machine=SimpleNamespace(steps_done=steps_done),
                           trainer=SimpleNamespace(step=trainer_step))
    PeerDaemon._follow_schedule(fake)  # type: ignore[arg-type]
    return int(fake.trainer.step)


def test_skipped_steps_advance_the_trainer_to_the_machines_position() -> None:
    assert follow(trainer_step=40, steps_done=70) == 70     # three rounds of 10 skipped


def test_a_round_in_progress_keeps_the_trainer_ahead() -> None:
    assert follow(trainer_step=45, steps_done=40) == 45     # local steps of the open round are not undone


def test_a_machine_without_a_schedule_position_leaves_the_trainer_alone() -> None:
    fake = SimpleNamespace(machine=SimpleNamespace(), trainer=SimpleNamespace(step=7))
    PeerDaemon._follow_schedule(fake)  # type: ignore[arg-type]
    assert fake.trainer.step == 7

"""The daemon's step bookkeeping: it sets the trainer's step when the machine (or a state sync) says
so, and decides nothing itself (pure: no processes)."""

from __future__ import annotations

from types import SimpleNamespace

from peer.runtime.daemon import PeerDaemon
from protocols.events import SetTrainerStep


def test_set_trainer_step_moves_the_trainers_step_and_nothing_else() -> None:
    fake = SimpleNamespace(trainer=SimpleNamespace(step=40), counters=SimpleNamespace(trainer_steps_set=[]),
                           gateway_work=None)
    PeerDaemon._carry_out(fake, [SetTrainerStep(70)])  # type: ignore[arg-type]
    assert fake.trainer.step == 70     # three rounds of 10 skipped: the lr schedule follows
    assert fake.counters.trainer_steps_set == [70]     # and status shows it (trainer_steps_set)

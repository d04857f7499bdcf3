"""The daemon's step bookkeeping: it sets the trainer's step when the machine (or a state sync) says
so, and its member checkpoints a step that moved on without training at once (pure: no processes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from peer.runtime.daemon_port import DaemonPort
from protocols.events import SetTrainerStep
from protocols.node.checkpoints import CheckpointConfig
from protocols.node.host import Host
from protocols.node.member import Checkpoint, Member, MemberConfig


class Recorded:
    """What the member decides, from the Node's step settings: checkpoints and the step actions."""

    def __init__(self, step: int) -> None:
        self.actions: list[Any] = []
        config = MemberConfig(ahead_steps=0.0, checkpoint=CheckpointConfig(), checkpoint_jumps_at_once=True)
        self.member: Member[Any] = Member(SimpleNamespace(name="p00", neighbourhood=SimpleNamespace(
            names=lambda: ())), config)  # type: ignore[arg-type]  # _pass reads nothing more of the Node
        self.member.step = step
        self.member.saves.saved(step, 0.0)

    def set(self, *steps: int) -> list[Any]:
        return self.member._pass(0.0, [SetTrainerStep(s) for s in steps])


def test_set_trainer_step_moves_the_trainers_step_and_counts_it() -> None:
    daemon: Any = SimpleNamespace(trainer=SimpleNamespace(step=40), gateway=None,
                                  counters=SimpleNamespace(trainer_steps_set=[]))
    host = Host(lambda now, event: [], DaemonPort(daemon), work_at_once=False)
    host.carry_out([SetTrainerStep(70)])
    assert daemon.trainer.step == 70     # three rounds of 10 skipped: the lr schedule follows
    assert daemon.counters.trainer_steps_set == [70]     # and status shows it (trainer_steps_set)


def test_a_jump_is_checkpointed_at_once() -> None:
    recorded = Recorded(40)
    actions = recorded.set(70)
    assert actions == [SetTrainerStep(70), Checkpoint(False)]   # at once, not final: a kill loses no jump
    assert not recorded.member.saves.jumped    # and written: the next periodic save counts from it


def test_a_step_set_back_or_kept_writes_no_checkpoint() -> None:
    recorded = Recorded(40)
    assert recorded.set(40, 30) == [SetTrainerStep(40), SetTrainerStep(30)]
    assert recorded.member.step == 30

"""One withheld round must not give a liar the reach it lost in issue 14 (protocols/gossip/rounds.py,
catchup.py): until a round closes complete, the reach runs at our compute rate, taken from rounds a
deadline closed. A round that closed short of one neighbour's message while another's arrived is
not what that rate is for (a member started beyond the buffer window hears no message for its
round at all); taken from it, a neighbour that withheld one message then moved us to the end of
the run with one claim, 1 ms of compute a step being 2000 steps of reach a second."""

from __future__ import annotations

import torch

from protocols.events import Received, SetTimer, Start, TimerFired, WorkDone
from protocols.gossip import GossipConfig, RoundMachine, make_machine
from protocols.messages import ParamPush
from topology import build


def _push(round_index: int) -> ParamPush:
    return ParamPush(round=round_index, tensors={"x": torch.zeros(2, dtype=torch.float64)}, meta={})


def test_a_neighbour_that_withholds_one_round_cannot_then_move_us_to_the_end() -> None:
    # Prepare: p00 on a ring of 4, a 1 ms step (a small model on a CPU), deadline 1 s
    config = GossipConfig(total_steps=1000, max_rounds_ahead=2, deadline_s=1.0)
    machine = make_machine(config, name="p00", topology=build("ring:4"),
                           params=torch.zeros(2, dtype=torch.float64))
    assert isinstance(machine, RoundMachine)
    timers: dict[str, float] = {}

    def feed(event: object, now: float) -> None:
        for action in machine.handle(event, now):  # type: ignore[arg-type]
            if isinstance(action, SetTimer):
                timers[action.key] = action.at

    feed(Start(), 0.0)
    feed(Received("p03", _push(0)), 0.0005)     # the honest neighbour, in step
    feed(WorkDone(1, 0.0), 0.001)
    feed(TimerFired("gossip-deadline:0"), timers["gossip-deadline:0"])    # p01 withheld its message
    # Execute: p01 claims the last round
    feed(Received("p01", _push(machine.last_round)), 1.5)
    # Assert: not followed (p03 does not confirm it), and the wait for p01 is worth nothing yet: no
    # rate was measured
    assert machine.catch_up == 0 and machine.counters["catch_up_unconfirmed"] == 1

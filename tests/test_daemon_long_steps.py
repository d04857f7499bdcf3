"""A peer whose training step outlasts the neighbour timeout still heartbeats through it (issue 29).

Before, the daemon's one thread ran the trainer's steps and did nothing else meanwhile: with an
85M-parameter model on a loaded CPU a step took longer than the neighbour timeout (5 s), so its
neighbour took it for dead (``neighbour_down``), closed the round without it, and a neighbour's
send to it, unread for the round deadline, was abandoned. The steps now run on a worker thread
while the loop heartbeats and reads. Here p00's steps take 4 s (a ``pace`` hook, the test's slower
machine) against a 1.5 s neighbour timeout; p01 is fast and must never see p00 go silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon_support import CEILING_S, describe, make_network, peers, status

from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.processes]

STEP_S = 4.0
NEIGHBOUR_TIMEOUT_S = 1.5
STEPS = 3


def test_a_step_longer_than_the_neighbour_timeout_is_no_silence(tmp_path: Path) -> None:
    # Prepare: two peers (a ring of two), p00 four times slower per step than the neighbour timeout
    files = make_network(tmp_path / "net", peers=2, steps=STEPS,
                         peer_options={"neighbour_timeout_s": NEIGHBOUR_TIMEOUT_S})
    # Execute
    with peers(files) as processes:
        processes.start("p00", [Hook(at_step=0, action="pace", seconds=STEP_S)])
        processes.start("p01")
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    # Assert: the slow peer was never taken for dead, and every round mixed both messages
    for name in files.configs:
        found = status(files, name)
        assert found["step"] == STEPS
        assert found["work_s"] >= (STEPS * STEP_S if name == "p00" else 0.0)
        assert found["neighbour_down"] == {}, f"{name}: {found['neighbour_down']}\n{describe(files)}"
        assert found["metrics"].get("missed_deadline", 0) == 0, f"{name}: {found['metrics']}"
        assert found["metrics"].get("rounds_alone", 0) == 0, f"{name}: {found['metrics']}"

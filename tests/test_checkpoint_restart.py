"""Real processes: a peer killed with SIGKILL right after it adopted a neighbour's state resumes
from a checkpoint of that state, not from the one before the jump (issue 16: 1,100-1,300 steps
lost with a checkpoint every step).

Three peers on a ring (each the other two's neighbour), a checkpoint every ``EVERY`` steps:

1. p02 kills itself at step ``FIRST_KILL``; p00 and p01 find it silent (5 s), train on
   without it to ``HELD`` and are held there (they still answer state syncs);
2. p02 restarts from its checkpoint, syncs from a neighbour (round ``HELD``, far ahead of it)
   and is killed the moment it would train: nothing periodic was written since the jump;
3. p02 restarts again: the step it resumes from is at most ``EVERY`` behind the one it had
   reached (it is the adopted one: the adoption was checkpointed at once).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from _daemon_support import CEILING_S, describe, hold_at, make_network, peers, wait_for_files, wait_for_log

from peer.files.statefiles import read_status
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.processes, pytest.mark.slow]

EVERY, FIRST_KILL, HELD, STEPS = 10, 25, 100, 200


def test_a_peer_killed_after_a_state_sync_resumes_within_the_interval(tmp_path: Path) -> None:
    # p00 and p01 find p02 dead after 5 s (nothing else goes silent: held peers still heartbeat)
    files = make_network(tmp_path / "net", peers=3, steps=STEPS, gossip={"deadline_s": 30.0},
                         sections={"checkpoint": {"every_steps": EVERY, "keep": 1}},
                         peer_options={"neighbour_timeout_s": 5.0})
    marks, gate = tmp_path / "marks", tmp_path / "gate-end"
    marks.mkdir()
    local_steps = load_peer_config(files.configs["p02"]).gossip.local_steps
    data = files.out / "data" / "p02"
    with peers(files) as processes:
        for name in ("p00", "p01"):
            processes.start(name, [hold_at(HELD, gate, marks, name)])
        processes.start("p02", [Hook(at_step=FIRST_KILL, action="kill", mark=str(marks / "killed-1"))])
        assert processes.wait(CEILING_S, ["p02"]), describe(files)
        assert processes.exitcodes()["p02"] == -signal.SIGKILL
        wait_for_files(marks / f"{name}-held-{HELD}" for name in ("p00", "p01"))

        # second life: resumes, adopts round HELD, killed before it trains a step
        processes.start("p02", [Hook(at_step=HELD, action="kill", mark=str(marks / "killed-2"))])
        assert processes.wait(CEILING_S, ["p02"]), describe(files)
        assert processes.exitcodes()["p02"] == -signal.SIGKILL and (marks / "killed-2").exists()
        second_life = wait_for_log(files, "p02", "synced from")
        adopted = re.findall(r"synced from p0[01]: round (\d+), step (\d+)", second_life)
        assert adopted, second_life
        reached = int(adopted[-1][1])   # its trainer's step when the hook killed it (no step since)
        assert reached >= HELD and int(adopted[-1][0]) * local_steps >= reached

        # third life: where does it resume?
        processes.start("p02")
        deadline = time.monotonic() + CEILING_S
        found = read_status(data)
        while (found is None or found.get("epoch") != 2) and time.monotonic() < deadline:
            time.sleep(0.05)    # its first status is written once it has restored (before any message)
            found = read_status(data)
        assert found is not None and found.get("epoch") == 2, describe(files)
        resumed = found["checkpoint_step"]
        gate.touch()
    lives = re.findall(r"resumed from checkpoint at step (\d+)", (data / "peer.log").read_text())
    assert len(lives) == 2 and int(lives[1]) == resumed, lives
    assert FIRST_KILL - int(lives[0]) <= EVERY      # the first kill: the interval from its start
    assert 0 <= reached - resumed <= EVERY, f"resumed at {resumed}, had reached {reached}"

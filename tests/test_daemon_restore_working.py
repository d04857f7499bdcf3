"""Real processes: a peer restarted from a checkpoint written with its round's work asked for but
not done, whose neighbours cannot hand it their state, trains on (protocols/gossip asks for that
work again at ``Start``; before, the machine resent its message and waited forever for a
``WorkDone`` nobody would send: a restarted peer got past it only by adopting a neighbour's state).

Three peers on a ring (each the other two's neighbour):

1. p00 and p02 are held at their work point of round ``STOP - 1`` (its message sent, so p01 can
   close that round); p01 reaches its work point of round ``STOP`` and stops itself there
   (SIGTERM: its checkpoint holds the machine in that round's work, the trainer before it);
2. p01 restarts: its neighbours answer its state sync from a round behind it, so it keeps its
   own state, and must train round ``STOP``'s steps while they are still held;
3. the hold is released and every peer finishes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _daemon_support import CEILING_S, describe, hold_at, make_network, peers, wait_for_files, wait_for_step

from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.processes, pytest.mark.slow]

STOP, STEPS = 20, 40    # in rounds (dpsgd: one local step each, checked below)


def test_a_peer_restored_mid_work_that_keeps_its_own_state_trains_on(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=3, steps=STEPS, gossip={"deadline_s": 30.0})
    assert load_peer_config(files.configs["p01"]).gossip.local_steps == 1
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    with peers(files) as processes:
        for name in ("p00", "p02"):
            processes.start(name, [hold_at(STOP - 1, gate, marks, name)])
        processes.start("p01", [Hook(at_step=STOP, action="stop", mark=str(marks / "stopped"))])
        assert processes.wait(CEILING_S, ["p01"]), describe(files)
        assert processes.exitcodes()["p01"] == 0 and (marks / "stopped").exists()
        wait_for_files(marks / f"{name}-held-{STOP - 1}" for name in ("p00", "p02"))

        processes.start("p01")
        wait_for_step(files, ["p01"], STOP + 1)     # its round's work, trained while the others hold
        gate.touch()
        assert processes.wait(CEILING_S), describe(files)
        assert set(processes.exitcodes().values()) == {0}, describe(files)
    log = (files.out / "data" / "p01" / "peer.log").read_text()
    assert re.findall(r"resumed from checkpoint at step (\d+)", log) == [str(STOP)], log
    assert "kept our state" in log and "synced from" not in log, log

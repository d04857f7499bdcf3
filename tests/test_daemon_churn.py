"""Acceptance (d) of the daemon: a peer killed with SIGKILL mid-training, and a peer that starts late.

One network run: 8 peers on a ring, D-PSGD, digits-mlp, Dirichlet(0.5). Every
fault is placed on the peers' progress by test hooks (peer.testhooks), never
on the wall clock, so the run is the same on an idle and on a loaded machine:

1. the seven first peers are held before their first step until all of them
   train (p04 and p06 first wait ``start_timeout_s`` for the absent p05: the
   others must not race ahead meanwhile, or those two would join by state
   sync instead), then train to step 60 and are held there;
2. p05 starts late, sees the network already running and joins by state sync
   (at round 60); then the hold is released;
3. p03 kills itself (SIGKILL) right after step 110; its last checkpoint is the
   one of step 100. The others carry on without it to step 200 and are held;
4. p03 is started again: it resumes from its checkpoint, then syncs from a
   neighbour (round 200); the hold is released and everyone finishes.

The timeouts that drop the dead p03 from its neighbours' rounds (a 3 s
neighbour timeout, a 2 s round deadline) are the protocol under test here;
every wait of the test itself is a ceiling a healthy run never reaches.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from _daemon_support import (
    CEILING_S,
    consensus_distance,
    describe,
    final_params,
    hold_at,
    make_network,
    peers,
    status,
    wait_for_files,
    wait_for_log,
)

from peer.testhooks import Hook

pytestmark = [pytest.mark.processes, pytest.mark.slow]

JOIN_STEP, KILL_STEP, REJOIN_STEP, STEPS = 60, 110, 200, 300


def test_killed_peer_resumes_and_late_peer_joins_by_state_sync(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", steps=STEPS, gossip={"deadline_s": 2.0},
                         peer_options={"start_timeout_s": 5.0, "neighbour_timeout_s": 3.0},
                         sections={"checkpoint": {"every_steps": 50}})
    late = files.configs["p05"]
    late.write_text(late.read_text().replace("[peer]\n", "[peer]\nlate_join = true\n", 1))
    marks = tmp_path / "marks"
    marks.mkdir()
    started, joined, rejoined = (tmp_path / f"gate-{what}" for what in ("started", "joined", "rejoined"))
    others = [name for name in files.configs if name != "p05"]
    hooks = {name: [hold_at(0, started, marks, name), hold_at(JOIN_STEP, joined, marks, name),
                    hold_at(REJOIN_STEP, rejoined, marks, name)] for name in others}
    hooks["p03"] = [*hooks["p03"][:2], Hook(at_step=KILL_STEP, action="kill", mark=str(marks / "p03-killed"))]
    with peers(files) as processes:
        for name in others:
            processes.start(name, hooks[name])
        wait_for_files(marks / f"{name}-held-0" for name in others)
        started.touch()
        wait_for_files(marks / f"{name}-held-{JOIN_STEP}" for name in others)
        processes.start("p05", [hold_at(REJOIN_STEP, rejoined, marks, "p05")])
        late_log = wait_for_log(files, "p05", "synced from")
        joined.touch()

        assert processes.wait(CEILING_S, ["p03"]), describe(files)
        assert processes.exitcodes()["p03"] == -signal.SIGKILL and (marks / "p03-killed").exists()
        # the others train on while p03 is dead: every one of them reaches the rejoin step without it
        wait_for_files(marks / f"{name}-held-{REJOIN_STEP}" for name in files.configs if name != "p03")
        processes.start("p03")
        restarted_log = wait_for_log(files, "p03", "synced from")
        rejoined.touch()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"

    statuses = {name: status(files, name) for name in files.configs}
    for name, found in statuses.items():
        # every peer ran all rounds; one that fell behind may have skipped a few rounds' steps
        # to stay in step with the others (the machine's catch-up, which moves the trainer's step
        # and lr schedule along with it), never more than a handful
        skipped = found["metrics"].get("steps_skipped", 0)
        assert found["state"] == "finished" and found["metrics"]["round"] == STEPS, describe(files)
        assert found["step"] == found["steps_done"] == STEPS and skipped <= 30, describe(files)
        assert found["accuracy"] >= 0.90, f"{name}: accuracy {found['accuracy']}"
    assert consensus_distance(final_params(files)) < 1e-2
    # p03 restarted in a new epoch from its last checkpoint before the kill, then caught up by state sync
    assert statuses["p03"]["epoch"] == 1
    resumed = re.search(r"resumed from checkpoint at step (\d+)", restarted_log)
    synced = re.search(r"synced from p0[24]: round (\d+)", restarted_log)
    assert resumed and synced, restarted_log
    assert 50 <= int(resumed.group(1)) <= KILL_STEP <= REJOIN_STEP <= int(synced.group(1))
    # p05 never trained alone from scratch: it adopted a neighbour's round (the held one) first
    joined_at = re.search(r"synced from p0[46]: round (\d+)", late_log)
    assert joined_at and JOIN_STEP <= int(joined_at.group(1)) < KILL_STEP, late_log
    assert statuses["p05"]["epoch"] == 0

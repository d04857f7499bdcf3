"""Acceptance (d) of the daemon: a peer killed with SIGKILL mid-training, and a peer that starts late.

One network run: 8 peers on a ring, D-PSGD, digits-mlp, Dirichlet(0.5). Every
fault is placed on the peers' progress by test hooks (peer.runtime.testhooks), never
on the wall clock, so the run is the same on an idle and on a loaded machine:

1. the seven first peers are held before their first step until all of them
   train (p04 and p06, started once the others hold their data directories,
   first wait a 5 s ``start_timeout_s`` for the absent p05; the others wait
   for their neighbours with no timeout a healthy start reaches, and must not
   race ahead meanwhile, or those two would join by state sync instead), then
   train to step 60 and are held there;
2. p05 starts late, sees the network already running and joins by state sync
   (at round 60), and is held there too; then the hold is released for all
   eight at once (a joiner that trained on while its neighbours were still
   held would miss its round deadlines, stop waiting for them and run ahead:
   the whole ring would then skip rounds to catch up with it);
3. p03 kills itself (SIGKILL) right after step 110; its last checkpoint is the
   one of step 100. The others carry on without it to step 200 and are held;
4. p03 is started again: it resumes from its checkpoint, then syncs from a
   neighbour (round 200) and is held there; the hold is released and everyone
   finishes.

The one timeout that must fire is the protocol under test: a 5 s neighbour
timeout drops the dead p03 from its neighbours' rounds. The round deadline
(30 s) and every wait of the test itself are ceilings a healthy run never
reaches, and the test asserts that none was: no round missed a message, no
step was skipped to catch up, no neighbour went silent but the dead p03, and
none was absent at the start but p05 (and, for p05 and the restarted p03,
at most one neighbour not reached yet when they started: held, they lose
nothing by it). A joiner and a restarted peer
lose nothing because their neighbours resend the round on hearing them
(before that, p05 waited out its round's deadline for messages sent before
it started, and the ring stalled behind it).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from _daemon_support import (
    CEILING_S,
    consensus_max_relative,
    describe,
    final_params,
    hold_at,
    make_network,
    peers,
    set_peer_option,
    status,
    wait_for_files,
    wait_for_locks,
    wait_for_log,
)

from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.processes, pytest.mark.slow]


JOIN_STEP, KILL_STEP, REJOIN_STEP, STEPS = 60, 110, 200, 300


def test_killed_peer_resumes_and_late_peer_joins_by_state_sync(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", steps=STEPS, gossip={"deadline_s": 30.0},
                         sections={"checkpoint": {"every_steps": 50}})
    set_peer_option(files.configs["p05"], "late_join", "true")
    for name in ("p04", "p06"):     # they start without the absent p05
        set_peer_option(files.configs[name], "start_timeout_s", "5.0")
    for name in ("p02", "p04"):     # they find p03 dead; everyone else waits a ceiling (30 s)
        set_peer_option(files.configs[name], "neighbour_timeout_s", "5.0")
    marks = tmp_path / "marks"
    marks.mkdir()
    started, joined, rejoined = (tmp_path / f"gate-{what}" for what in ("started", "joined", "rejoined"))
    others = [name for name in files.configs if name != "p05"]
    hooks = {name: [hold_at(0, started, marks, name), hold_at(JOIN_STEP, joined, marks, name),
                    hold_at(REJOIN_STEP, rejoined, marks, name)] for name in others}
    hooks["p03"] = [*hooks["p03"][:2], Hook(at_step=KILL_STEP, action="kill", mark=str(marks / "p03-killed"))]
    with peers(files) as processes:
        # p04 and p06 last, once the others run: they wait 5 s for p05 only, never for a slow start
        for name in others:
            if name not in ("p04", "p06"):
                processes.start(name, hooks[name])
        wait_for_locks(files, processes, [name for name in others if name not in ("p04", "p06")])
        for name in ("p04", "p06"):
            processes.start(name, hooks[name])
        wait_for_files(marks / f"{name}-held-0" for name in others)
        started.touch()
        wait_for_files(marks / f"{name}-held-{JOIN_STEP}" for name in others)
        processes.start("p05", [hold_at(JOIN_STEP, joined, marks, "p05"),
                                hold_at(REJOIN_STEP, rejoined, marks, "p05")])
        wait_for_files([marks / f"p05-held-{JOIN_STEP}"])
        joined.touch()

        assert processes.wait(CEILING_S, ["p03"]), describe(files)
        assert processes.exitcodes()["p03"] == -signal.SIGKILL and (marks / "p03-killed").exists()
        # the others train on while p03 is dead: every one of them reaches the rejoin step without it
        wait_for_files(marks / f"{name}-held-{REJOIN_STEP}" for name in files.configs if name != "p03")
        processes.start("p03", [hold_at(REJOIN_STEP, rejoined, marks, "p03")])
        wait_for_files([marks / f"p03-held-{REJOIN_STEP}"])
        rejoined.touch()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"

    late_log, restarted_log = (wait_for_log(files, name, "synced from") for name in ("p05", "p03"))
    statuses = {name: status(files, name) for name in files.configs}
    # p03's death is the one silence; p05 is absent when p04 and p06 start. The joiner, and p03
    # restarted, may start before they have heard (and reached) their second neighbour: that one is
    # left out of their rounds until it is, which costs nothing here (they are held until released)
    silent = {"p02": {"p03": 1}, "p04": {"p03": 1}}
    absent = {"p04": {"p05": 1}, "p06": {"p05": 1}}
    rejoiners = {"p05": {"p04", "p06"}, "p03": {"p02", "p04"}}    # the joiner, and p03 restarted
    for name, found in statuses.items():
        # every peer ran every round and every step: none waited out a deadline or fell behind
        assert found["state"] == "finished" and found["metrics"]["round"] == STEPS, describe(files)
        assert found["step"] == found["steps_done"] == STEPS, describe(files)
        assert "missed_deadline" not in found["metrics"] and "steps_skipped" not in found["metrics"], \
            f"{name}: {found['metrics']}\n{describe(files)}"
        assert found["neighbour_down"] == silent.get(name, {}), f"{name}: {found['neighbour_down']}"
        if name in rejoiners:
            assert set(found["absent_at_start"]) <= rejoiners[name] and len(found["absent_at_start"]) <= 1, \
                f"{name}: {found['absent_at_start']}"
        else:
            assert found["absent_at_start"] == absent.get(name, {}), f"{name}: {found['absent_at_start']}"
        assert found["accuracy"] >= 0.90, f"{name}: accuracy {found['accuracy']}"
    assert consensus_max_relative(final_params(files)) < 1e-2
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

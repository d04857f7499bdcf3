"""Acceptance (e) with real processes: a ring gains a member and loses another while it runs.

The running peers pick the new roster file up (peer/runtime/rosterwatch.py) and apply it at its
effective round, with no restart and no new run id; the joiner starts with the new roster and
state-syncs. Faults are placed on progress (test hooks): the ring is held at a step before the
effective round until every peer has said it learnt the new version.
"""

from __future__ import annotations

import dataclasses
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
    status,
    wait_for_files,
    wait_for_log,
)

from peer.files import roster_file

pytestmark = [pytest.mark.processes]

OLD = ("p00", "p01", "p02", "p03")     # version 1: a ring of four
NEW = ("p00", "p01", "p03", "p04")     # version 2: p04 joins, p02 leaves
EFFECTIVE_ROUND = 30


def test_a_running_ring_gains_a_member_and_loses_another_without_a_restart(tmp_path: Path) -> None:
    # Prepare: keys and configs for five; the roster of version 1 lists four of them
    steps, hold_step, join_step = 80, 10, 50
    files = make_network(tmp_path / "net", peers=5, steps=steps,
                         gossip={"deadline_s": 1.0, "final_gossip_rounds": 10})
    everyone = roster_file.read(files.roster)
    roster_file.write(files.roster, everyone.remove("p04"))
    marks = tmp_path / "marks"
    marks.mkdir()
    release, joined = tmp_path / "gate-release", tmp_path / "gate-joined"
    with peers(files) as processes:
        for name in OLD:
            processes.start(name, [hold_at(hold_step, release, marks, name),
                                   hold_at(join_step, joined, marks, name)])
        wait_for_files(marks / f"{name}-held-{hold_step}" for name in OLD)
        # Execute: version 2 (adds p04, removes p02) from round 30 is written while the ring runs
        roster_file.write(files.roster, dataclasses.replace(everyone.remove("p02"), version=2,
                                                            effective_round=EFFECTIVE_ROUND))
        learnt = f"roster version 2 (adds p04; removes p02) takes effect at round {EFFECTIVE_ROUND}"
        for name in OLD:
            wait_for_log(files, name, learnt)
        release.touch()
        # the joiner starts with the new roster once the ring is past the round (held there so it
        # is not over before the joiner is up), and state-syncs
        wait_for_files(marks / f"{name}-held-{join_step}" for name in NEW if name != "p04")
        processes.start("p04")
        wait_for_log(files, "p04", "synced from")
        joined.touch()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    logs = {name: (files.out / "data" / name / "peer.log").read_text() for name in (*OLD, "p04")}
    # Assert: the leaver left at the round; the others switched neighbours at it, without a restart
    assert f"removed from the roster at version 2 (round {EFFECTIVE_ROUND})" in logs["p02"]
    for name in ("p00", "p01", "p03"):
        assert f"roster version 2 in effect from round {EFFECTIVE_ROUND}" in logs[name], describe(files)
        found = status(files, name)
        assert found["epoch"] == 0, name                                   # never restarted
    assert sorted(status(files, "p01")["neighbours"]) == ["p00", "p03"]
    assert sorted(status(files, "p04")["neighbours"]) == ["p00", "p03"]
    assert "synced from" in logs["p04"], logs["p04"]
    # Assert: one run id throughout (nothing refused as config_mismatch), no version refused, and
    # the new ring mixed: p04 heard from its neighbours and the four end in consensus
    for name in NEW:
        rejections = status(files, name)["rejections"]
        assert rejections.get("config_mismatch", 0) == 0 and rejections.get("roster_version_mismatch", 0) == 0
    assert {"p00", "p03"} <= set(status(files, "p04")["bytes_received_from"])
    params = final_params(files)
    assert consensus_max_relative({name: params[name] for name in NEW}) < 1e-3, describe(files)

"""Acceptance (d) and (f) with real processes: a member cut off from its neighbours keeps its place;
a member with nobody left to train with stops, saying why, instead of training alone.

Rings of three peers (digits-mlp), short neighbour timeouts (these tests are about silence),
faults placed on progress by test hooks (peer/runtime/testhooks.py). The one wall-clock
duration is the fault itself: a 15 s cut of one peer's messages, both ways (the ``cut`` hook,
which the daemon honours in its send and receive paths, counting what it drops). A timeout whose
count is asserted is longer than a loaded machine's stalls (3 s seen: ``TEST_PEER_OPTIONS``), so
that only the fault makes a neighbour go down.
"""

from __future__ import annotations

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
    wait_for_log,
)

from peer.runtime.testhooks import Hook
from protocols.node import NodeConfig
from protocols.node.member import EXIT_STRANDED

pytestmark = [pytest.mark.processes, pytest.mark.slow]

NEIGHBOUR_TIMEOUT_S = 2.0     # the restarted peer's, whose exit it bounds
CUT_TIMEOUT_S = 5.0           # the cut peer's: longer than a stall, a third of the cut
CUT_S = 15.0


def test_a_peer_cut_off_for_15_s_keeps_its_place_and_mixes_again(tmp_path: Path) -> None:
    # Prepare: p02 is cut off from both neighbours at step 30 for 15 s; p00 and p01 train on without
    # it. All three are held at step 100 until released together (so the run is not over when p02
    # comes back): p02 can only get there by catching up with them once the cut has healed.
    steps, cut_step, hold_step = 150, 30, 100
    files = make_network(tmp_path / "net", peers=3, steps=steps,
                         gossip={"deadline_s": 1.0, "final_gossip_rounds": 10},
                         peer_options={"neighbour_timeout_s": CUT_TIMEOUT_S})
    marks = tmp_path / "marks"
    marks.mkdir()
    healed, release = marks / "p02-healed", tmp_path / "gate-release"
    cut = Hook(at_step=cut_step, action="cut", seconds=CUT_S, mark=str(marks / "p02-cut"), healed=str(healed))
    with peers(files) as processes:
        processes.start("p02", [cut, hold_at(hold_step, release, marks, "p02")])
        for name in ("p00", "p01"):
            processes.start(name, [hold_at(hold_step, release, marks, name)])
        # Execute: wait until all three hold at step 100, then release them.
        wait_for_files(marks / f"{name}-held-{hold_step}" for name in files.configs)
        # Assert: p02 got there only after the cut healed (before the fix it raced there alone)
        assert healed.exists(), f"p02 reached step {hold_step} during its cut\n{describe(files)}"
        assert (marks / f"p02-held-{hold_step}").stat().st_mtime >= healed.stat().st_mtime
        release.touch()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    # Assert: p02 finished with every step counted, having waited out rounds alone (both neighbours
    # down), dropped what the cut blocked, both ways, and caught up by a jump.
    found = status(files, "p02")
    assert found["state"] == "finished" and found["step"] == found["steps_done"] == steps, describe(files)
    assert found["metrics"].get("rounds_alone", 0) > 0, found["metrics"]
    assert found["metrics"].get("rounds_skipped", 0) > 0, found["metrics"]
    assert found["neighbour_down"] == {"p00": 1, "p01": 1}, found["neighbour_down"]
    assert found["test_cut_dropped"].get("sent", 0) > 0 and found["test_cut_dropped"].get("received", 0) > 0
    # It mixed again after the heal: the three end in consensus.
    assert consensus_max_relative(final_params(files)) < 1e-3, describe(files)


def test_a_peer_whose_neighbours_finished_stops_and_a_restart_exits_within_the_bound(tmp_path: Path) -> None:
    # Prepare: p02 is held at step 40 for good (its gate never opens), so p00 and p01 finish without
    # it and exit; heartbeats go on while it is held. Its first life waits the tests' ceiling for a
    # silent neighbour (a stall is no finish); the restart, NEIGHBOUR_TIMEOUT_S.
    files = make_network(tmp_path / "net", peers=3, steps=100, gossip={"deadline_s": 1.0})
    marks = tmp_path / "marks"
    marks.mkdir()
    with peers(files) as processes:
        processes.start("p02", [hold_at(40, tmp_path / "never", marks, "p02")])
        for name in ("p00", "p01"):
            processes.start(name)
        # Execute (1): the neighbours finish, say so, and exit; p02 is left with nobody.
        assert processes.wait(CEILING_S), describe(files)
        first = processes.exitcodes()
        stranded_log = wait_for_log(files, "p02", "no live neighbour left")
        first_status = status(files, "p02")
        # Execute (2): p02 is started again from the checkpoint it wrote; nobody is there.
        set_peer_option(files.configs["p02"], "neighbour_timeout_s", str(NEIGHBOUR_TIMEOUT_S))
        processes.start("p02")
        assert processes.wait(CEILING_S, ["p02"]), describe(files)
        second = processes.exitcodes()["p02"]
    # Assert (1): p00 and p01 finished (0); p02 recorded them as finished, not down, and stopped
    # with one line naming them and the documented status.
    assert first == {"p00": 0, "p01": 0, "p02": EXIT_STRANDED}, f"{first}\n{describe(files)}"
    assert first_status["state"] == "stranded", first_status["state"]
    assert first_status["neighbour_finished"] == {"p00": 1, "p01": 1}, first_status["neighbour_finished"]
    assert first_status["neighbour_down"] == {}, first_status["neighbour_down"]
    stranded_line = next(x for x in stranded_log.splitlines() if "no live neighbour left" in x)
    assert "p00, p01 finished" in stranded_line, stranded_line
    assert f"(status {EXIT_STRANDED})" in stranded_line, stranded_line
    # Assert (2): the restarted p02 exits with the same status, within the neighbour timeout plus one
    # state-sync attempt of its start (plus a little for a loaded machine), naming its neighbours.
    assert second == EXIT_STRANDED, describe(files)
    found = status(files, "p02")
    assert found["state"] == "stranded" and found["epoch"] == 1, found["state"]
    waited_s = found["timeline"]["stranded"] - found["timeline"]["assembled"]
    assert waited_s <= NEIGHBOUR_TIMEOUT_S + NodeConfig().sync_timeout_s + 5.0, waited_s
    restart_log = wait_for_log(files, "p02", "no neighbour running").split(stranded_line, 1)[1]
    line = next(x for x in restart_log.splitlines() if "no neighbour running" in x)
    assert "p00, p01 never heard" in line, line
    assert "training on" not in restart_log
    # (6b) while it waited it said whom for, once (on change only: nothing changed)
    assert restart_log.count("waiting for") == 1 and "p02: waiting for p00, p01 (0/2 up)" in restart_log

"""Acceptance (d) of the daemon: a peer killed with SIGKILL mid-training, and a peer that starts late.

One network run: 8 peers on a ring, D-PSGD, digits-mlp, Dirichlet(0.5). p05
starts only when the others are at step 60 and joins by state sync; p03 is
killed with SIGKILL after its checkpoint at step 100 and started again. The
others must carry on without it, and both must end within the bar.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from _daemon_support import consensus_distance, describe, final_params, make_network, status, wait_for_step

from peer.launch import PeerProcesses

pytestmark = [pytest.mark.processes, pytest.mark.slow]


def test_killed_peer_resumes_and_late_peer_joins_by_state_sync(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", steps=300, gossip={"deadline_s": 2.0},
                         peer_options={"start_timeout_s": 10.0}, sections={"checkpoint": {"every_steps": 50}})
    late = files.configs["p05"]
    late.write_text(late.read_text().replace("[peer]\n", "[peer]\nlate_join = true\n", 1))
    others = [name for name in files.configs if name != "p05"]
    with PeerProcesses(files.configs) as processes:
        for name in others:
            processes.start(name)
        wait_for_step(files, others, 60)
        processes.start("p05")
        wait_for_step(files, ["p03"], 110)
        steps_before_kill = {name: status(files, name)["step"] for name in others}
        processes.kill("p03")
        time.sleep(1.0)
        processes.start("p03")
        finished = processes.wait(240)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"

    statuses = {name: status(files, name) for name in files.configs}
    for name, found in statuses.items():
        # every peer ran all 300 rounds; one that fell behind may have skipped a few rounds' steps
        # to stay in step with the others (the machine's catch-up, which moves the trainer's step
        # and lr schedule along with it), never more than a handful
        skipped = found["metrics"].get("steps_skipped", 0)
        assert found["state"] == "finished" and found["metrics"]["round"] == 300, describe(files)
        assert found["step"] == found["steps_done"] == 300 and skipped <= 30, describe(files)
        assert found["accuracy"] >= 0.90, f"{name}: accuracy {found['accuracy']}"
    assert consensus_distance(final_params(files)) < 1e-2
    # the others carried on past the crash (they were already beyond it, and all finished)
    assert all(statuses[n]["step"] > steps_before_kill[n] for n in others)
    # p03 restarted in a new epoch, from its checkpoint, then caught up by state sync
    assert statuses["p03"]["epoch"] == 1
    restarted_log = (files.out / "data" / "p03" / "peer.log").read_text()
    resumed = re.search(r"resumed from checkpoint at step (\d+)", restarted_log)
    synced = re.search(r"synced from p0[24]: round (\d+)", restarted_log)
    assert resumed and synced, restarted_log
    assert 50 <= int(resumed.group(1)) <= int(synced.group(1))
    # p05 never trained alone from scratch: it adopted a neighbour's round first
    late_log = (files.out / "data" / "p05" / "peer.log").read_text()
    assert "synced from p04" in late_log or "synced from p06" in late_log
    assert statuses["p05"]["epoch"] == 0

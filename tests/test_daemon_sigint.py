"""SIGINT (Ctrl-C) on a real peer mid-training: it writes a checkpoint, says at which step, exits 0,
and a restart resumes from that step. Every wait is on an event the peer reports (its status or its
log), under a generous ceiling; nothing is ordered by sleeping."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _daemon_support import describe, log_tail, make_network, peers, status

from peer.files.statefiles import CHECKPOINT_DIR, read_status
from peer.runtime.export import latest_params
from peer.runtime.netinit import NetworkFiles
from peer.runtime.peerconfig import load_peer_config
from peer.train.checkpoint import list_checkpoints

pytestmark = pytest.mark.processes

CEILING_S = 120.0  # what a healthy run never comes near, even on a loaded 2-core machine
STOPPED = re.compile(r"p00: SIGINT: checkpoint written at step (\d+); exiting")


def _wait_until(condition: Callable[[], bool], what: str, files: NetworkFiles) -> None:
    deadline = time.monotonic() + CEILING_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {CEILING_S:g} s: {what}\n{describe(files)}")
        time.sleep(0.05)    # polling the files the peer writes, not ordering events


def _training(files: NetworkFiles, name: str, *, epoch: int, past_step: int) -> bool:
    found = read_status(files.out / "data" / name)
    return (found is not None and found.get("epoch") == epoch and found.get("state") == "training"
            and found.get("step", 0) > past_step)


def _log(files: NetworkFiles, name: str) -> str:
    path = files.out / "data" / name / "peer.log"
    return path.read_text() if path.exists() else ""


def test_sigint_mid_training_checkpoints_exits_0_and_a_restart_resumes_from_that_step(tmp_path: Path) -> None:
    # every_steps = 0: the only checkpoint is the one SIGINT writes; steps: far more than the test runs
    files = make_network(tmp_path / "net", peers=2, topology="complete", steps=100_000,
                         peer_options={"status_interval_s": 0.2}, sections={"checkpoint": {"every_steps": 0}})
    p00 = load_peer_config(files.configs["p00"])
    with peers(files) as processes:
        processes.start_all()
        _wait_until(lambda: _training(files, "p00", epoch=0, past_step=5), "p00 training past step 5", files)
        processes.interrupt("p00")
        assert processes.wait(CEILING_S, ["p00"]), describe(files)
        assert processes.exitcodes()["p00"] == 0, log_tail(files, "p00")

        said = STOPPED.findall(_log(files, "p00"))
        assert len(said) == 1, log_tail(files, "p00")
        stopped_at = int(said[0])
        _, step = latest_params(p00)
        assert step == stopped_at > 5
        assert [s for s, _ in list_checkpoints(p00.data_dir / CHECKPOINT_DIR)] == [stopped_at]
        found = status(files, "p00")
        assert found["state"] == "stopped" and found["step"] == stopped_at
        assert "Traceback" not in _log(files, "p00")

        processes.start("p00")      # resumes from its checkpoint, then state-syncs with p01
        resumed = f"p00: resumed from checkpoint at step {stopped_at} (epoch 1)"
        _wait_until(lambda: resumed in _log(files, "p00"), resumed, files)
        _wait_until(lambda: _training(files, "p00", epoch=1, past_step=stopped_at),
                    "p00 training again after the restart", files)
        for name in files.configs:
            processes.interrupt(name)
        assert processes.wait(CEILING_S), describe(files)
        assert processes.exitcodes() == {"p00": 0, "p01": 0}, describe(files)

    assert "p01: SIGINT: checkpoint written at step" in _log(files, "p01")
    assert latest_params(p00)[1] > stopped_at
    # the real daemon fills in the status's consensus estimate (its maths: test_status_consensus.py)
    estimate = status(files, "p01")["consensus_max_relative"]
    assert isinstance(estimate, float) and math.isfinite(estimate) and estimate >= 0

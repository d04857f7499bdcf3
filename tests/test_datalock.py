"""One running peer per data directory (peer/runtime/datalock.py).

A second peer on a running peer's data directory used to bump its epoch file
before it failed on the port. Now it is refused first, naming the PID that
holds the directory, and changes nothing there. (A SIGKILLed holder leaves no
stale lock: the churn test restarts a killed peer on its own directory.)
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _daemon_support import CEILING_S, make_network, peers, wait_for_files, wait_for_locks

from peer.runtime import datalock
from peer.runtime.datalock import DataDirLock
from protocols.errors import HivemeshError


def test_a_second_lock_on_a_held_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    held = DataDirLock(tmp_path / "data")
    with pytest.raises(HivemeshError, match=rf"in use by another peer \(pid {os.getpid()}\)"):
        DataDirLock(tmp_path / "data")
    held.release()
    DataDirLock(tmp_path / "data").release()     # free again once released


def test_a_reload_probing_the_lock_as_a_peer_starts_does_not_refuse_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: hivemesh roster reload's probe (a shared lock, held for microseconds) holds the directory
    # the instant a peer starts on it; the probe lets go while the peer waits to ask again
    data = tmp_path / "data"
    DataDirLock(data).release()                   # the lock file exists, as after an earlier run
    probe = (data / "lock").open("r")
    fcntl.flock(probe.fileno(), fcntl.LOCK_SH)
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        probe.close()                             # the probe is over

    monkeypatch.setattr(datalock.time, "sleep", wait)
    # Execute
    lock = DataDirLock(data)
    # Assert: the peer asked again (once) and holds it; a real holder is still refused after the grace
    assert len(waits) == 1
    monkeypatch.undo()
    with pytest.raises(HivemeshError, match="in use by another peer"):
        DataDirLock(data)
    lock.release()


def _hivemesh() -> list[str]:
    script = Path(sys.executable).parent / "hivemesh"
    return [str(script)] if script.exists() else [sys.executable, "-m", "peer"]


@pytest.mark.processes
def test_a_second_peer_on_a_running_peers_directory_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=2, steps=20)
    data = files.out / "data" / "p00"
    with peers(files, ["p00"]) as processes:
        processes.start("p00")      # alone, it waits for p01 (start_timeout_s): it holds its directory
        pid = processes.processes["p00"].pid
        wait_for_locks(files, processes, ["p00"])
        wait_for_files([data / "epoch"])   # written just after the lock is taken
        epoch_before = (data / "epoch").read_text()
        second = subprocess.run([*_hivemesh(), "peer", "--config", str(files.configs["p00"])],
                                capture_output=True, text=True, timeout=CEILING_S)
        assert processes.processes["p00"].is_alive()
    assert second.returncode == 2, second
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"in use by another peer (pid {pid})" in lines[0], second.stderr
    assert (data / "epoch").read_text() == epoch_before == "0\n"

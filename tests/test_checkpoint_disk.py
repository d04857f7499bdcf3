"""A full disk costs checkpoints, not the peer (issue 16: ``ENOSPC`` escaped as a traceback, a failed
save left its temporary directory behind, and a restart on the still-full disk crashed).

The writer's failure is injected in-process (the manifest's write raises ``ENOSPC``) for the
store and for a real daemon's pieces (its transport a recorder, as in test_daemon_limits.py);
one test puts a peer's data folder on a real, small tmpfs (we run as root), fills it, and
restarts the peer on it.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from peer.files import statefiles
from peer.files.statefiles import CheckpointStore
from peer.runtime.daemon import PeerDaemon
from peer.runtime.netinit import NetworkFiles
from peer.runtime.peerconfig import load_peer_config
from peer.train import checkpoint
from tests import _disk
from tests._daemon_support import make_network
from tests.test_daemon_limits import RecordingTransport

torch.set_num_threads(1)

FULL = "ENOSPC: No space left on device"


def state(step: int) -> dict[str, Any]:
    return {"tensors": {"weight": torch.full((32, 32), float(step))}, "meta": {"step": step}}


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every manifest write fails as on a full disk (the tensors were written: a temporary to clean)."""
    real = checkpoint._write_synced

    def write(path: Path, data: bytes) -> None:
        if path.name == checkpoint.MANIFEST_FILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(checkpoint, "_write_synced", write)
    yield
    monkeypatch.setattr(checkpoint, "_write_synced", real)


def test_a_failed_save_cleans_up_is_counted_and_keeps_the_older_ones(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    assert store.save(state(4), None, {}) == ""
    real = checkpoint._write_synced
    monkeypatch.setattr(checkpoint, "_write_synced", lambda path, data: (
        (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        if path.name == checkpoint.MANIFEST_FILE else real(path, data)))
    for step in (8, 12):
        assert store.save(state(step), None, {}) == FULL
    assert store.failures == {"ENOSPC": 2} and store.error == FULL and store.step == 4
    assert sorted(p.name for p in store.directory.iterdir()) == ["ckpt-000000000004"]  # no temporary
    loaded = store.load_latest()
    assert loaded is not None and loaded[0]["meta"]["step"] == 4
    monkeypatch.setattr(checkpoint, "_write_synced", real)     # space again
    assert store.save(state(16), None, {}) == ""
    assert store.error == "" and store.written == 2 and store.step == 16


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> NetworkFiles:
    return make_network(tmp_path_factory.mktemp("disk"), peers=4, steps=40,
                        sections={"checkpoint": {"every_steps": 5, "keep": 1}})


def daemon(network: NetworkFiles) -> PeerDaemon:
    found = PeerDaemon(load_peer_config(network.configs["p00"]))
    found.transport = RecordingTransport()  # type: ignore[assignment]
    return found


def test_the_daemon_trains_on_and_reports_when_it_cannot_checkpoint(
        network: NetworkFiles, full_disk: None, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    peer = daemon(network)
    try:
        peer.trainer.run_steps(5)
        with caplog.at_level(logging.WARNING):
            assert not peer._checkpoint(final=False)
            assert not peer._checkpoint(final=False)      # said once, counted twice
        said = [r.getMessage() for r in caplog.records if "cannot checkpoint" in r.getMessage()]
        assert said == [f"p00: warning: cannot checkpoint: {FULL}"]
        snapshot = peer._snapshot()
        assert snapshot["checkpoint_failures"] == {"ENOSPC": 2} and snapshot["checkpoint_error"] == FULL
        assert snapshot["checkpoints_written"] == 0
        # status.json on the same full disk: a line lost, counted, not a crash
        monkeypatch.setattr(statefiles, "write_json_atomic", lambda path, data: (
            (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))))
        peer._write_status(force=True)
        assert peer._snapshot()["status_write_failures"] == {"ENOSPC": 1}
        assert not [p for p in (peer.config.data_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    finally:
        peer.parts.lock.release()


@pytest.fixture
def small_disk(network: NetworkFiles) -> Iterator[Path]:
    """p00's data folder on its own 2 MiB tmpfs (unmounted at the end, whatever happens)."""
    with _disk.small_disk(load_peer_config(network.configs["p00"]).data_dir, "2m") as folder:
        yield folder


def test_a_real_full_disk_then_a_restart_on_it(small_disk: Path, network: NetworkFiles) -> None:
    peer = daemon(network)
    try:
        peer.trainer.run_steps(5)
        assert peer._checkpoint(final=False)
        filler = _disk.fill(small_disk)
        peer.trainer.run_steps(5)
        assert not peer._checkpoint(final=False)
        assert peer.store.failures == {"ENOSPC": 1} and peer.store.step == 5
        peer._write_status(force=True)      # the status can't be written either: counted, not raised
        peer.status.metric_line(peer._snapshot())     # nor a metrics line (a gateway's rounds.jsonl alike)
        assert peer._snapshot()["status_write_failures"] == {"ENOSPC": 2}
    finally:
        peer.parts.lock.release()
    # a restart on the still-full disk starts, from the last good checkpoint
    again = daemon(network)
    try:
        assert again._restore() and again.trainer.step == 5
        filler.unlink()     # space again: the next save clears the error
        again.trainer.run_steps(5)
        assert again._checkpoint(final=False) and again.store.error == ""
        assert [s for s, _ in checkpoint.list_checkpoints(small_disk / "checkpoints")] == [10]
    finally:
        again.parts.lock.release()


def test_tensorboard_scalars_on_a_full_disk_are_lost_and_counted_not_the_peer(
        small_disk: Path, network: NetworkFiles) -> None:
    # Prepare: p00 with [peer] tensorboard (its writer thread fails on the full disk; the failure
    # surfaced at the next write or flush, in the daemon's loop)
    from peer.runtime.tensorboard import ScalarLog

    peer = daemon(network)
    try:
        peer.scalars = ScalarLog(peer.config.data_dir, key="[peer] tensorboard")
        peer.trainer.run_steps(1)
        peer._evaluate()
        filler = _disk.fill(small_disk)
        # Execute: evaluations on the full disk
        for _ in range(3):
            peer.trainer.run_steps(1)
            peer._evaluate()
        # Assert: counted with the other lost lines (ENOSPC), the peer goes on
        assert peer._snapshot()["status_write_failures"].get("ENOSPC", 0) >= 1
        # Execute: space again; the next evaluation writes scalars again, and the log closes cleanly
        filler.unlink()
        failed = peer.status.failures["ENOSPC"]
        peer.trainer.run_steps(1)
        peer._evaluate()
        peer.scalars.close()
        assert peer.status.failures["ENOSPC"] == failed
    finally:
        peer.parts.lock.release()

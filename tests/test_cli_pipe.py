"""`hivemesh status | head`: a reader that goes away is not an error (issue 17)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from peer.files.statefiles import write_json_atomic


def _status_into_a_closed_pipe(folder: Path) -> subprocess.CompletedProcess[bytes]:
    read_end, write_end = os.pipe()
    os.close(read_end)      # the reader is gone before the first line is written: EPIPE, every time
    try:
        return subprocess.run([sys.executable, "-m", "peer", "status", "--data-dir", str(folder)],
                              stdout=write_end, stderr=subprocess.PIPE, timeout=120, check=False)
    finally:
        os.close(write_end)


def test_status_into_a_pipe_whose_reader_left_exits_0_without_a_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    write_json_atomic(folder / "status.json", {"name": "p00", "state": "training", "step": 7, "pid": -1,
                                               "updated_at": 0.0})
    done = _status_into_a_closed_pipe(folder)
    assert done.returncode == 0, done.stderr.decode()
    assert b"Traceback" not in done.stderr and b"BrokenPipeError" not in done.stderr, done.stderr.decode()

"""One running peer per data directory: an exclusive lock taken before anything in it is touched.

A second ``hivemesh peer`` started on the data directory of a running one
would bump its epoch file (so the running peer's next messages look replayed
from an old epoch), then write over its checkpoints and status before it
failed on the port. So the peer takes ``DATA_DIR/lock`` first, with
``flock`` (released by the kernel when the process dies, however it dies: a
SIGKILLed peer leaves no stale lock), and writes its PID into it for the
message the second one prints.

The same PID is how ``hivemesh roster reload`` finds the running peer to send
SIGHUP to (:func:`holder`): a lock still held names a live process, which a
stale PID file could not promise.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from protocols.errors import HivemeshError

LOCK_FILE = "lock"
PROBE_GRACE_S = 0.2   # how long a held lock is asked again before it counts as another peer's


class DataDirLock:
    """The held lock of one data directory; ``release()`` (or process exit) lets it go."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / LOCK_FILE
        handle: IO[str] = self.path.open("a+")
        if not _take(handle):
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise HivemeshError(f"data directory {data_dir} is in use by another peer (pid {holder}): "
                                "stop that one first, or give this one its own data_dir")
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()     # closing the descriptor drops the flock
            self._handle = None


def _take(handle: IO[str]) -> bool:
    """Take the exclusive lock of ``handle``, or say it is held. A held lock is asked again a few times
    over :data:`PROBE_GRACE_S`: :func:`holder` probes it for microseconds (``hivemesh roster reload``),
    and a peer starting at that instant would otherwise be refused as if another peer held it."""
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(PROBE_GRACE_S / 10)


def holder(data_dir: Path) -> int | None:
    """The PID of the process that holds ``data_dir``'s lock now; None when nobody holds it.

    The lock is probed, not trusted as a PID file: a free lock (the peer stopped, however) means no
    process to signal, even if a PID is still written there. The probe holds the lock for
    microseconds; a peer starting at that instant asks again (:func:`_take`)."""
    path = data_dir / LOCK_FILE
    try:
        handle = path.open("r")
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            written = handle.read().strip()
            if not written.isdigit():
                raise HivemeshError(f"{path} is held but names no PID yet (a peer starting?): "
                                    "try again") from None
            return int(written)
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return None

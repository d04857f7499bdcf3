"""A small real disk for the full-disk tests (issue 16): a tmpfs mounted on a folder (we run as root),
and a file that fills it."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` on its own tmpfs of ``size`` (``mount`` syntax: "2m"), unmounted at the end whatever
    happens (lazily: a process still writing there does not keep it mounted)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk is full (large chunks, then small ones); its path."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as handle:
        for chunk in (1 << 16, 1 << 12):
            try:
                while True:
                    handle.write(b"\0" * chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
    return filler

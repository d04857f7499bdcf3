"""Optional TensorBoard scalars of a peer: ``[peer] tensorboard = true`` (the ``tensorboard`` extra).

At each test-set evaluation the daemon hands the snapshot it appends to
``metrics.jsonl`` here too, so both hold the same numbers: every number of it
becomes a scalar at the peer's step, tagged by its path (``loss``,
``rejections/bad_signature``, ``metrics/round``). The event files go to
``data_dir/tensorboard``; ``tensorboard --logdir DIR/data`` shows each peer as a run.

A full disk costs scalars, not the peer: the writer's own thread fails, and the
``OSError`` surfaces at the next write or flush; :meth:`ScalarLog.write` then
drops that writer and raises (the daemon counts it with the status lines it
lost), and the next write opens a new event file.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from protocols.errors import HivemeshError

FOLDER = "tensorboard"
NOT_SCALARS = ("name", "state", "stranded", "waiting_for", "warnings", "neighbours", "timeline", "time",
               "pid", "updated_at")     # texts, per-neighbour detail, and wall-clock stamps


def scalars(snapshot: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) for every finite number of ``snapshot``, nested mappings as ``outer/inner``."""
    for key, value in sorted(snapshot.items()):
        if not prefix and key in NOT_SCALARS:
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from scalars(value, f"{tag}/")
        elif isinstance(value, bool | int | float) and math.isfinite(float(value)):
            yield tag, float(value)


class ScalarLog:
    """A SummaryWriter under ``data_dir/tensorboard``; ``key`` names the setting in errors."""

    def __init__(self, data_dir: Path, *, key: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise HivemeshError(f"{key} = true needs the tensorboard package: "
                                "pip install 'hivemesh[tensorboard]'") from None
        self.folder = data_dir / FOLDER
        self._open = lambda: SummaryWriter(log_dir=str(self.folder))
        self._writer: Any = self._open()

    def write(self, snapshot: Mapping[str, Any]) -> None:
        """The snapshot's scalars at its step; an ``OSError`` (a full disk) drops the writer and is
        raised, and the next write opens a new one."""
        if self._writer is None:
            self._writer = self._open()
        step = int(snapshot["step"])
        try:
            for tag, value in scalars(snapshot):
                self._writer.add_scalar(tag, value, global_step=step)
            self._writer.flush()    # an evaluation is rare; a reader sees it at once
        except OSError:
            writer, self._writer = self._writer, None
            with contextlib.suppress(OSError):   # its thread died of it: it raises it again here
                writer.close()
            raise

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

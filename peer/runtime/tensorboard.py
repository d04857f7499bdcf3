"""Optional TensorBoard scalars of a peer: ``[peer] tensorboard = true`` (the ``tensorboard`` extra).

At each test-set evaluation the daemon hands the snapshot it appends to
``metrics.jsonl`` here too, so both hold the same numbers: every number of it
becomes a scalar at the peer's step, tagged by its path (``loss``,
``rejections/bad_signature``, ``metrics/round``). The event files go to
``data_dir/tensorboard``; ``tensorboard --logdir DIR/data`` shows each peer as a run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from topology.errors import HivemeshError

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
        self._writer = SummaryWriter(log_dir=str(self.folder))

    def write(self, snapshot: Mapping[str, Any]) -> None:
        step = int(snapshot["step"])
        for tag, value in scalars(snapshot):
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()    # an evaluation is rare; a reader sees it at once

    def close(self) -> None:
        self._writer.close()

"""What a running peer leaves on disk: status.json, metrics.jsonl, checkpoints, final.safetensors.

``status.json`` is rewritten atomically every ``status_interval_s``; it is the
status endpoint that ``hivemesh status`` reads (a file rather than a socket:
it needs no extra port, works across a firewall for whoever can read the data
folder, and still tells what a crashed peer last did). ``metrics.jsonl`` gets
one JSON object per evaluation. Checkpoints go through :mod:`peer.train.checkpoint`.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peer.files.console import Progress, Reading

STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"


def json_safe(value: Any) -> Any:
    """JSON without NaN/Infinity (strict readers refuse them): non-finite floats become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(json_safe(data), indent=1, sort_keys=True))
    temporary.replace(path)


def read_status(data_dir: str | Path) -> dict[str, Any] | None:
    path = Path(data_dir) / STATUS_FILE
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False  # kill(0 or -n, 0) asks about a process group, not a process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StatusWriter:
    """status.json, metrics.jsonl and the console progress display of one peer."""

    def __init__(self, data_dir: Path, *, name: str, progress: bool, total_steps: int = 0) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.progress = progress
        self.total_steps = total_steps
        self.display: Progress | None = None    # made at the first status: a bar only if there is one
        self.next_due = 0.0

    def write(self, snapshot: dict[str, Any], *, now: float, interval_s: float) -> None:
        self.next_due = now + interval_s
        record = dict(snapshot, pid=os.getpid(), updated_at=time.time())
        write_json_atomic(self.data_dir / STATUS_FILE, record)
        if self.progress:
            if self.display is None:
                from peer.files.console import Progress

                self.display = Progress(self.name, self.total_steps)
            self.display.update(peer_reading(record))

    def close(self) -> None:
        """The display's final state, once."""
        if self.display is not None:
            self.display.close()

    def metric_line(self, snapshot: dict[str, Any]) -> None:
        record = {"time": time.time(), **{k: v for k, v in snapshot.items() if k != "neighbours"}}
        with (self.data_dir / METRICS_FILE).open("a") as handle:
            handle.write(json.dumps(json_safe(record), sort_keys=True) + "\n")

    def say(self, text: str) -> None:
        from peer.files.console import LOGGER

        LOGGER.info(text)

    def warn(self, text: str) -> None:
        from peer.files.console import LOGGER

        LOGGER.warning(text)


def format_number(value: Any, spec: str, unit: str = "") -> str:
    """``value`` formatted with ``spec`` and ``unit``; "-" for a missing or non-finite number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec) + unit


def peer_reading(status: dict[str, Any]) -> Reading:
    """What the progress display shows of one peer's status: its state when it is not training
    (``waiting for p01, p03 (1/3 up)``, ``syncing``, ``finished``, ...)."""
    from peer.files.console import Reading

    neighbours = status.get("neighbours", {})
    up = sum(1 for n in neighbours.values() if n.get("up"))
    accuracy = status.get("accuracy")
    state = str(status.get("waiting_for") or status.get("state", ""))
    return Reading(done=status.get("step", 0),
                   accuracy=accuracy if isinstance(accuracy, float) and math.isfinite(accuracy) else None,
                   bytes_sent=status.get("bytes_sent", 0), bytes_received=status.get("bytes_received", 0),
                   rejected=sum(status.get("rejections", {}).values()),
                   members=f"neighbours {up}/{len(neighbours)}", note="" if state == "training" else state)


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


class CheckpointStore:
    """A peer's checkpoints (trainer + protocol state + driver extras), through peer.train.checkpoint."""

    def __init__(self, data_dir: Path, *, keep: int) -> None:
        self.directory = data_dir / CHECKPOINT_DIR
        self.keep = keep

    def save(self, trainer_state: dict[str, Any], protocol_state: Any, extra: dict[str, Any]) -> None:
        from peer.train.checkpoint import save

        save(self.directory, trainer_state, protocol_state, extra=extra, keep=self.keep)

    def load_latest(self) -> tuple[dict[str, Any], Any, dict[str, Any]] | None:
        from peer.train.checkpoint import load_latest

        if not self.directory.exists():
            return None
        loaded = load_latest(self.directory)
        if loaded is None:
            return None
        return loaded.trainer_state, loaded.protocol_state, dict(loaded.extra)

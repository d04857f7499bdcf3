"""What a running peer leaves on disk: status.json, metrics.jsonl, checkpoints, final.safetensors.

``status.json`` is rewritten atomically every ``status_interval_s``; it is the
status endpoint that ``hivemesh status`` reads (a file rather than a socket:
it needs no extra port, works across a firewall for whoever can read the data
folder, and still tells what a crashed peer last did). ``metrics.jsonl`` gets
one JSON object per evaluation. Checkpoints go through :mod:`peer.train.checkpoint`.

A full disk costs lines, not the peer: a status, metrics or checkpoint write that
fails with an ``OSError`` leaves no half-written file, is counted by errno and said
once (``cannot write status.json: ENOSPC: ...``, ``cannot checkpoint: ...``), and the
peer goes on; the next write that fits clears it. What a member's input can put in them
cannot raise either: a status or metrics value strict JSON has no word for is written as
null or text and counted by reason (:func:`json_safe`); a checkpoint's non-finite numbers
are kept (peer/train/checkpoint.py).
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.files.console import LOGGER, Progress, Reading

if TYPE_CHECKING:
    from peer.train.checkpoint import SavePoint

STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"


def json_safe(value: Any, replaced: Counter[str] | None = None) -> Any:
    """``value`` as strict JSON can hold it, whatever it holds: NaN (unknown) becomes null; an
    infinity (an overflow) null too, counted ``infinite`` in ``replaced``; another type's number
    (numpy's) a float or int; anything else JSON has no word for (a tensor, bytes) its ``str``,
    counted ``not_json_<type>``. Keys become strings. Never raises."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if replaced is not None and not math.isnan(value):
            replaced["infinite"] += 1
        return None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, replaced) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v, replaced) for v in value]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return json_safe(float(value), replaced)
    if replaced is not None:
        replaced[f"not_json_{type(value).__name__}"] += 1
    return str(value)


def write_json_atomic(path: Path, data: Any) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(json_safe(data), indent=1, sort_keys=True))
        temporary.replace(path)
    except OSError:
        temporary.unlink(missing_ok=True)     # a full disk keeps no half-written file
        raise


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

    def __init__(self, data_dir: Path, *, name: str, progress: bool, total_steps: int = 0,
                 unit: str = "steps") -> None:
        """``total_steps`` in ``unit``: a peer's steps, a gateway's FedAvg rounds."""
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.progress = progress
        self.total_steps = total_steps
        self.unit = unit
        self.display: Progress | None = None    # made at the first status: a bar only if there is one
        self.next_due = 0.0
        self.failures: Counter[str] = Counter()    # status or metrics lines not written, by errno name
        self.replaced: Counter[str] = Counter()    # values written as null or text, by reason (json_safe)
        self._failing = ""
        self._warned: set[str] = set()

    def write(self, snapshot: dict[str, Any], *, now: float, interval_s: float) -> None:
        self.next_due = now + interval_s
        record = json_safe(dict(snapshot, pid=os.getpid(), updated_at=time.time()), self.replaced)
        self.guarded(STATUS_FILE, lambda: write_json_atomic(self.data_dir / STATUS_FILE, record))
        if self.progress:
            if self.display is None:
                self.display = Progress(self.name, self.total_steps, unit=self.unit)
            self.display.update(peer_reading(record))

    def close(self) -> None:
        """The display's final state, once."""
        if self.display is not None:
            self.display.close()

    def metric_line(self, snapshot: dict[str, Any]) -> None:
        record = {"time": time.time(), **{k: v for k, v in snapshot.items() if k != "neighbours"}}
        self.append_line(METRICS_FILE, record)

    def append_line(self, file_name: str, record: dict[str, Any]) -> None:
        """One JSON line at the end of ``file_name`` in the data folder (lost, and counted, on a
        full disk)."""
        def append() -> None:
            with (self.data_dir / file_name).open("a") as handle:
                handle.write(json.dumps(json_safe(record, self.replaced), sort_keys=True) + "\n")

        self.guarded(file_name, append)

    def guarded(self, what: str, write: Callable[[], None]) -> None:
        """A full disk loses a status or metrics line (or TensorBoard's scalars), not the peer: counted,
        said when it starts."""
        try:
            write()
        except OSError as error:
            reason = os_error_reason(error)
            self.failures[reason.partition(":")[0] or "OSError"] += 1
            if reason != self._failing:
                self._failing = reason
                self.warn(f"{self.name}: warning: cannot write {what}: {reason}")
            return
        self._failing = ""

    def say(self, text: str) -> None:
        LOGGER.info(text)

    def warn(self, text: str) -> None:
        LOGGER.warning(text)

    def warn_once(self, text: str) -> None:
        """:meth:`warn`, unless ``text`` was said already (a lasting condition, seen again each turn)."""
        if text not in self._warned:
            self._warned.add(text)
            self.warn(text)


def peer_reading(status: dict[str, Any]) -> Reading:
    """What the progress display shows of one peer's status: its steps (a gateway's: its FedAvg rounds
    closed), and its state when it is not training (``waiting for p01, p03 (1/3 up)``, ``syncing``,
    ``finished``, ...)."""
    neighbours = status.get("neighbours", {})
    up = sum(1 for n in neighbours.values() if n.get("up"))
    accuracy = status.get("accuracy")
    state = str(status.get("waiting_for") or status.get("state", ""))
    return Reading(done=_progress(status),
                   accuracy=accuracy if isinstance(accuracy, float) and math.isfinite(accuracy) else None,
                   bytes_sent=status.get("bytes_sent", 0), bytes_received=status.get("bytes_received", 0),
                   rejected=sum(status.get("rejections", {}).values()),
                   members=f"neighbours {up}/{len(neighbours)}", note="" if state == "training" else state)


def _progress(status: dict[str, Any]) -> int:
    """A peer's steps; a gateway's FedAvg rounds closed; an edge client's federation round as it last
    heard it (-1 before any: 0)."""
    federation = status.get("federation") or {}
    if "round" in federation:
        return int(federation["round"])
    if status.get("role") == "edge":
        return max(int(status.get("round", 0)), 0)
    return int(status.get("step", 0))


def os_error_reason(error: OSError) -> str:
    """An OSError in a few words: ``ENOSPC: No space left on device``."""
    code = errno.errorcode.get(error.errno, "") if error.errno is not None else ""
    words = error.strerror or str(error)
    return f"{code}: {words}" if code else words


class CheckpointStore:
    """A peer's checkpoints (trainer + protocol state + driver extras), through peer.train.checkpoint.

    A save that fails for want of disk (any ``OSError``) does not stop the peer: the writer has
    removed its temporary directory, the checkpoints before it stay, and the failure is counted
    by errno (``failures``) and kept as ``error`` until a save succeeds; so is metadata JSON cannot
    hold (``not_json``). A non-finite number in the metadata is written (and read back) as it was,
    and counted by its path (``nonfinite``). :meth:`recover`, first at start-up, clears what a
    dead writer left (peer/train/checkpoint.py ``recover``).
    """

    def __init__(self, data_dir: Path, *, keep: int, at_point: SavePoint | None = None) -> None:
        self.directory = data_dir / CHECKPOINT_DIR
        self.keep = keep
        self.at_point = at_point        # a test hook (peer/runtime/testhooks.py)
        self.step = -1                  # of the newest checkpoint written or loaded (-1: none)
        self.written = 0
        self.failures: Counter[str] = Counter()    # failed saves, by errno name (or not_json)
        self.error = ""                 # why the last save failed; "" once one succeeded
        self.nonfinite: Counter[str] = Counter()   # non-finite numbers written, by metadata path

    def recover(self) -> list[str]:
        """Temporaries of a dead writer: a complete one put into place, the rest removed (what was
        done, one line each; a failure to clean is one of them, never an exception)."""
        from peer.train.checkpoint import recover

        try:
            return recover(self.directory)
        except OSError as error:
            return [f"cannot clean up {self.directory}: {os_error_reason(error)}"]

    def save(self, trainer_state: dict[str, Any], protocol_state: Any, extra: dict[str, Any], *,
             step: int | None = None) -> str:
        """Write one checkpoint (``step``: its name; None: the trainer's step); "" when written, else
        why not (the peer trains on)."""
        from peer.train.checkpoint import MetadataError, save

        try:
            path = save(self.directory, trainer_state, protocol_state, extra=extra, keep=self.keep,
                        at_point=self.at_point, step=step, nonfinite=self.nonfinite)
        except OSError as error:
            return self._failed(os_error_reason(error))
        except MetadataError as error:
            return self._failed(f"not_json: {error}")
        self.step = int(path.name.rpartition("-")[2])
        self.written += 1
        self.error = ""
        return ""

    def _failed(self, reason: str) -> str:
        self.failures[reason.partition(":")[0] or "OSError"] += 1
        self.error = reason
        return reason

    def load_latest(self) -> tuple[dict[str, Any], Any, dict[str, Any]] | None:
        from peer.train.checkpoint import load_latest

        if not self.directory.exists():
            return None
        loaded = load_latest(self.directory)
        if loaded is None:
            return None
        self.step = loaded.step
        return loaded.trainer_state, loaded.protocol_state, dict(loaded.extra)

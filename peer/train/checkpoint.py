"""Checkpoints: trainer state, an opaque protocol slot and driver extras, written atomically.

Layout of one checkpoint, a directory ``ckpt-<step, 12 digits>/`` under the checkpoint dir::

    trainer.safetensors    the trainer's tensors (model, buffers, optimizer)
    protocol.safetensors   the protocol slot's tensors
    manifest.json          step, the JSON metadata of both slots, ``extra``, and the
                           size and BLAKE3 digest of every file; plus a digest of itself

Written into a hidden temporary directory, fsynced (the manifest last), then
renamed into place; a re-save of the same step takes two renames. Invariant: at
every instant the newest step (or, during its first write, the previous one) is
loadable, whatever ``keep`` is. :func:`load_latest` verifies sizes and digests
before parsing and falls back to the newest checkpoint that verifies (a complete
temporary is a candidate too); :func:`recover`, at start-up, puts the best
complete temporary in place and removes the rest.

Metadata is strict JSON: a non-finite number is written as null, listed under the
manifest's ``nonfinite`` and read back as it was; what JSON cannot hold raises
:class:`MetadataError` before anything is written. A failed write (``ENOSPC``)
removes its temporary and leaves older checkpoints as they were. ``at_point``
stops the writer at one of :data:`SAVE_POINTS` for tests. Nothing is unpickled.
The write sequence in full: docs/design/training.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import blake3
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from protocols.errors import HivemeshError

log = logging.getLogger(__name__)

FORMAT = 1  # manifest format version
PREFIX = "ckpt-"
TEMP_PREFIX = ".tmp-ckpt-"
_NAME = re.compile(r"^ckpt-(\d{12})$")
_TEMP_NAME = re.compile(r"^\.tmp-ckpt-(old-)?(\d{12})-(\d+)$")   # (old copy?, step, writer's pid)
TRAINER_FILE = "trainer.safetensors"
PROTOCOL_FILE = "protocol.safetensors"
MANIFEST_FILE = "manifest.json"

# the instants of a write a test can stop the writer at, in order: the tensors written but no
# manifest (torn); the new copy complete, nothing renamed; a same-step save's old copy moved aside;
# the new copy in place, the old one not yet removed
SAVE_POINTS = ("temp_data", "temp_complete", "old_moved", "new_placed")
SavePoint = Callable[[str, int], None]      # (one of SAVE_POINTS, the step being saved)


class CheckpointError(HivemeshError):
    """No usable checkpoint: every candidate failed verification (the message lists why)."""


class MetadataError(TypeError):
    """Checkpoint metadata that JSON cannot hold (a tensor, a set, ...): nothing was written."""


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """When to write checkpoints and how many to keep."""

    every_steps: int = 100  # often enough that a crash loses seconds of small-task work; 0 = off
    every_s: float = 0.0  # a wall-clock interval as well, for slow steps; 0 = off
    keep: int = 2  # the newest few, so a torn newest one still leaves a good one

    def __post_init__(self) -> None:
        if self.every_steps < 0:
            raise ValueError(f"every_steps must be >= 0 (0 = off), not {self.every_steps}")
        if self.every_s < 0 or not math.isfinite(self.every_s):
            raise ValueError(f"every_s must be a finite number >= 0 (0 = off), not {self.every_s}")
        if self.keep < 1:
            raise ValueError(f"keep must be at least 1, not {self.keep}")


class CheckpointSchedule:
    """Says when a checkpoint is due: ``every_steps`` steps or ``every_s`` seconds after the last.

    Steps count from the last checkpoint on disk: step ``start_step`` (0 for a fresh run;
    a resumed run calls :meth:`saved` with the step it loaded). So a step that jumps
    (a state sync adopted, rounds skipped to catch up) makes the very next call due, and
    work lost to a kill is at most ``every_steps`` behind the step the process had
    reached. Seconds count from the first call (a start-up wait is not work). Call
    :meth:`saved` after each attempt, failed or not: a full disk is retried one interval
    later, not at every turn of the loop.
    """

    def __init__(self, config: CheckpointConfig, *, start_step: int = 0) -> None:
        self.config = config
        self._last_step = start_step
        self._last_s: float | None = None
        self.jumped = False     # the step jumped since the last save: one is due at once

    def step_set(self, old: int, new: int) -> None:
        """The trainer's step was set from ``old`` to ``new`` (``SetTrainerStep``). Forward (a state
        sync adopted, rounds skipped to catch up) the next :meth:`should_save` is due whatever the
        interval: a kill before the next periodic one would lose the jump, not an interval's work.
        The daemon asks at once, the simulator at its next work point."""
        self.jumped = self.jumped or new > old

    def should_save(self, step: int, now: float) -> bool:
        if self._last_s is None:
            self._last_s = now
        by_steps = self.config.every_steps > 0 and step - self._last_step >= self.config.every_steps
        by_time = self.config.every_s > 0 and now - self._last_s >= self.config.every_s
        return self.jumped or by_steps or by_time

    def saved(self, step: int, now: float) -> None:
        self._last_step, self._last_s = step, now
        self.jumped = False


@dataclass(frozen=True)
class Checkpoint:
    """One verified checkpoint, as :func:`load_latest` returns it."""

    step: int
    path: Path
    trainer_state: dict[str, Any]  # {"tensors": {...}, "meta": {...}}, as Trainer.load_state_dict takes
    protocol_state: Any  # the form it was saved in: (tensors, meta) or {"tensors", "meta"}
    extra: Mapping[str, Any]
    skipped: tuple[tuple[Path, str], ...] = field(default=())  # newer ones that failed, and why


# ---------------------------------------------------------------- writing


def _split_state(state: Any, what: str) -> tuple[dict[str, torch.Tensor], dict[str, Any], str]:
    if state is None:
        return {}, {}, "none"
    if isinstance(state, tuple) and len(state) == 2:
        return dict(state[0]), dict(state[1]), "tuple"
    if isinstance(state, Mapping) and set(state) <= {"tensors", "meta"}:
        return dict(state.get("tensors", {})), dict(state.get("meta", {})), "mapping"
    raise TypeError(f"{what} must be (tensors, meta) or {{'tensors': ..., 'meta': ...}}, "
                    f"not {type(state).__name__}")


def _serialise(tensors: Mapping[str, torch.Tensor]) -> bytes:
    ready: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in storages and tensor.numel():  # safetensors refuses tensors sharing memory
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        ready[name] = tensor
    return save_tensors(ready)


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _digest(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def _manifest_digest(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_blake3"}
    return _digest(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def save(directory: str | Path, trainer_state: Mapping[str, Any], protocol_state: Any = None, *,
         extra: Mapping[str, Any] | None = None, step: int | None = None, keep: int = 2,
         at_point: SavePoint | None = None, nonfinite: Counter[str] | None = None) -> Path:
    """Write a checkpoint atomically and keep only the newest ``keep``; returns its path.

    ``trainer_state`` is :meth:`Trainer.state_dict`; ``protocol_state`` is a machine's
    ``export_state()`` ((tensors, meta)) or None; ``extra`` is JSON-able driver state.
    ``step`` defaults to the trainer's step; saving a step again replaces that checkpoint.
    ``at_point``: called at each of :data:`SAVE_POINTS` (a test hook). ``nonfinite``: counts, by
    dotted path, the non-finite numbers of the metadata (written as null, read back as they were).
    An ``OSError`` (a full disk) is raised after the temporary directory is removed; earlier
    checkpoints are untouched; :class:`MetadataError` before anything is written.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, not {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    trainer_tensors, trainer_meta, _ = _split_state(trainer_state, "trainer_state")
    protocol_tensors, protocol_meta, protocol_form = _split_state(protocol_state, "protocol_state")
    step = int(trainer_meta.get("step", 0)) if step is None else step
    if step < 0:
        raise ValueError(f"step must be >= 0, not {step}")
    blobs = {TRAINER_FILE: _serialise(trainer_tensors), PROTOCOL_FILE: _serialise(protocol_tensors)}
    manifest: dict[str, Any] = {
        "format": FORMAT, "step": step, "trainer_meta": trainer_meta, "protocol_meta": protocol_meta,
        "protocol_form": protocol_form, "extra": dict(extra or {}),
        "files": {name: {"bytes": len(data), "blake3": _digest(data)} for name, data in blobs.items()},
    }
    found: list[list[Any]] = []
    manifest = _without_nonfinite(manifest, [], found)
    if found:
        manifest["nonfinite"] = found
        if nonfinite is not None:
            nonfinite.update(".".join(str(key) for key in entry[:-1]) for entry in found)
    try:
        manifest["manifest_blake3"] = _manifest_digest(manifest)
        manifest_bytes = json.dumps(manifest, sort_keys=True, indent=1, allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise MetadataError(f"checkpoint metadata must be JSON-able (numbers, str, lists, dicts): "
                            f"{error}") from None

    final = directory / f"{PREFIX}{step:012d}"
    temp = directory / f"{TEMP_PREFIX}{step:012d}-{os.getpid()}"
    point: SavePoint = at_point or (lambda name, at: None)
    if temp.exists():
        shutil.rmtree(temp)
    try:
        temp.mkdir()
        for name, data in blobs.items():
            _write_synced(temp / name, data)
        point("temp_data", step)
        _write_synced(temp / MANIFEST_FILE, manifest_bytes)    # last: it says the copy is complete
        _fsync_dir(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)    # a full disk keeps no half-written copy
        raise
    point("temp_complete", step)
    if final.exists():  # the same step again (e.g. a final save right after a periodic one)
        old = directory / f"{TEMP_PREFIX}old-{step:012d}-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
        point("old_moved", step)    # both copies complete, in temporaries: load_latest finds them
        try:
            temp.rename(final)
        except BaseException:
            old.rename(final)
            shutil.rmtree(temp, ignore_errors=True)
            raise
        _fsync_dir(directory)
        point("new_placed", step)
        shutil.rmtree(old)
    else:
        temp.rename(final)
    _fsync_dir(directory)
    _prune(directory, keep)
    return final


def _without_nonfinite(value: Any, path: list[Any], found: list[list[Any]]) -> Any:
    """``value`` with each non-finite float replaced by None, its path and repr appended to ``found``
    (``[key, ..., "inf"]``), so strict JSON holds it and :func:`_with_nonfinite` puts it back."""
    if isinstance(value, float) and not math.isfinite(value):
        found.append([*path, repr(value)])
        return None
    if isinstance(value, Mapping):
        written = {}
        for key, item in value.items():
            name = _json_key(key)
            written[name] = _without_nonfinite(item, [*path, name], found)
        return written
    if isinstance(value, list | tuple):
        return [_without_nonfinite(item, [*path, index], found) for index, item in enumerate(value)]
    return value


def _json_key(key: Any) -> Any:
    """A mapping key as JSON writes it (``3`` -> ``"3"``), so a path to a value is the one read back."""
    return json.dumps(key) if isinstance(key, bool | int | float) or key is None else key


def _with_nonfinite(manifest: dict[str, Any]) -> None:
    """Put back the numbers :func:`_without_nonfinite` took out of a verified manifest."""
    for entry in manifest.get("nonfinite", []):
        *path, last, number = entry
        holder: Any = manifest
        try:
            for key in path:
                holder = holder[key]
            if holder[last] is not None or number not in ("inf", "-inf", "nan"):
                raise ValueError(f"{number!r} at a value that is not null")
            holder[last] = float(number)
        except (LookupError, TypeError, ValueError) as error:
            raise _Invalid(f"manifest.json: nonfinite entry {entry!r} does not fit: {error}") from None


def _prune(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints, and every temporary: this runs after a save,
    so none is still being written (one process writes a data folder: it holds its lock)."""
    for _, _, stale in _temporaries(directory):
        shutil.rmtree(stale, ignore_errors=True)
    for _, old in list_checkpoints(directory)[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def recover(directory: str | Path) -> list[str]:
    """Put the best complete temporary of each step without a checkpoint into place; remove every
    other temporary. What it did, one line each. Only for the process that owns ``directory`` (a
    peer holding its data folder's lock): any temporary there is a dead writer's."""
    directory = Path(directory)
    done: list[str] = []
    named = {step for step, _ in list_checkpoints(directory)}
    for step, _, path in _temporaries(directory):    # per step, the new copy before the old
        if step not in named:
            try:
                _read(path)
            except _Invalid as error:
                log.debug("temporary %s is incomplete (%s)", path, error)
            else:
                path.rename(directory / f"{PREFIX}{step:012d}")
                named.add(step)
                done.append(f"recovered the complete checkpoint of step {step} from {path.name}")
                continue
        shutil.rmtree(path, ignore_errors=True)
        done.append(f"removed {path.name}")
    if done:
        _fsync_dir(directory)
    return done


def _temporaries(directory: Path) -> list[tuple[int, int, Path]]:
    """(step, 1 for a new copy or 0 for an old one, path) of every temporary, newest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _TEMP_NAME.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(2)), 0 if match.group(1) else 1, entry))
    return sorted(found, reverse=True)


# ---------------------------------------------------------------- reading


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint directory, newest first (unverified)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


class _Invalid(Exception):
    """One checkpoint failed verification."""


def _read_verified(path: Path, expected: Mapping[str, Any]) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise _Invalid(f"{path.name}: cannot read: {error.strerror}") from None
    if len(data) != expected.get("bytes"):
        raise _Invalid(f"{path.name}: {len(data)} bytes, the manifest says {expected.get('bytes')} "
                       "(truncated?)")
    if _digest(data) != expected.get("blake3"):
        raise _Invalid(f"{path.name}: BLAKE3 digest mismatch (corrupted)")
    return data


def _read(path: Path) -> Checkpoint:
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_bytes())
    except FileNotFoundError:
        raise _Invalid("no manifest.json (incomplete)") from None
    except (OSError, ValueError) as error:
        raise _Invalid(f"manifest.json unreadable: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("manifest_blake3") != _manifest_digest(manifest):
        raise _Invalid("manifest.json digest mismatch (corrupted)")
    if manifest.get("format") != FORMAT:
        raise _Invalid(f"unknown checkpoint format {manifest.get('format')!r}")
    _with_nonfinite(manifest)
    files = manifest["files"]
    if set(files) != {TRAINER_FILE, PROTOCOL_FILE}:
        raise _Invalid(f"manifest lists files {sorted(files)}")
    loaded: dict[str, dict[str, torch.Tensor]] = {}
    for name in (TRAINER_FILE, PROTOCOL_FILE):
        data = _read_verified(path / name, files[name])
        try:
            loaded[name] = load_tensors(data)
        except (SafetensorError, ValueError) as error:
            raise _Invalid(f"{name}: not valid safetensors: {error}") from None
    protocol_tensors, protocol_meta = loaded[PROTOCOL_FILE], manifest["protocol_meta"]
    form = manifest["protocol_form"]
    protocol_state: Any = (None if form == "none" else (protocol_tensors, protocol_meta) if form == "tuple"
                           else {"tensors": protocol_tensors, "meta": protocol_meta})
    return Checkpoint(step=int(manifest["step"]), path=path,
                      trainer_state={"tensors": loaded[TRAINER_FILE], "meta": manifest["trainer_meta"]},
                      protocol_state=protocol_state, extra=manifest["extra"])


def load_latest(directory: str | Path) -> Checkpoint | None:
    """The newest checkpoint that verifies; None when there is none at all.

    Complete temporaries count (see the module docstring); torn ones are passed over. Newer
    checkpoints that fail verification are skipped (logged, and listed in ``skipped``);
    if every one fails, raises CheckpointError listing the reasons rather than
    silently starting from scratch.
    """
    skipped: list[tuple[Path, str]] = []
    named = [(step, 2, path) for step, path in list_checkpoints(directory)]
    for _, rank, path in sorted(named + _temporaries(Path(directory)), reverse=True):
        try:
            checkpoint = _read(path)
        except _Invalid as error:
            if rank < 2:    # a write cut short: expected, not a loss
                log.debug("temporary %s is incomplete (%s)", path, error)
                continue
            log.warning("checkpoint %s is unusable (%s); trying the previous one", path, error)
            skipped.append((path, str(error)))
            continue
        if rank < 2:
            log.info("checkpoint of step %d found in the temporary %s (a write cut short)",
                     checkpoint.step, path.name)
        return replace(checkpoint, skipped=tuple(skipped))
    if skipped:
        reasons = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise CheckpointError(f"no usable checkpoint in {directory}: {reasons}")
    return None

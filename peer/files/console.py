"""What hivemesh says on the console: the live progress display and the ``hivemesh`` logger.

One display for ``hivemesh peer``, ``hivemesh demo`` and ``hivemesh sim``: step/total, rate,
ETA, accuracy, bytes, rejections and what the run waits for. On a terminal it is a ``rich``
progress bar redrawn in place; anywhere else (a log file, a pipe, CI) it is plain lines with an
ISO timestamp, one when what it shows changes and at most one per ``interval_s`` otherwise, so
a stall is said once and a log stays readable. The rate and ETA are rich's estimate in both
modes (one implementation).

Logging: the daemon's notes and warnings go through the ``hivemesh`` logger; ``hivemesh
--log-level`` and ``--log-file`` configure it (:func:`configure_logging`). Peer processes that
nobody configured (forked by peer.runtime.launch) get the default: INFO and up on stderr.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, TextColumn
from rich.progress import Progress as RichProgress

from peer.files.units import format_number, human_bytes
from protocols.errors import HivemeshError

LOGGER = logging.getLogger("hivemesh")
# the rejection reasons that mean a member is set up differently from us, not a transient fault:
# each is said once per (reason, sender) on the console, since it will not heal by waiting (a revoked
# key: an old member still running, or someone holding its key; a version: a member to upgrade)
MISMATCH_REASONS = frozenset({"config_mismatch", "unknown_sender", "wrong_role", "revoked_key",
                              "version_unsupported"})


def iso_now() -> str:
    """Local time with its UTC offset, to the millisecond (``2026-12-01T05:31:07.412+00:00``)."""
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


class _IsoFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time, so a live display that redirects it
    (rich does, to print lines above its bar) receives log lines instead of being torn by them."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


def configure_logging(level: str = "INFO", file: str | None = None) -> None:
    """The ``hivemesh`` logger: ``level`` and up on stderr (``TIME message``) and, given ``file``,
    also appended there (``TIME LEVEL name message``). Replaces an earlier configuration."""
    console = _CurrentStderr()
    console.setFormatter(_IsoFormatter("%(asctime)s %(message)s"))
    handlers: list[logging.Handler] = [console]
    if file:
        try:
            to_file = logging.FileHandler(file, encoding="utf-8")
        except OSError as error:
            raise HivemeshError(f"--log-file {file}: {error.strerror or error}") from None
        to_file.setFormatter(_IsoFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        handlers.append(to_file)
    for old in list(LOGGER.handlers):
        LOGGER.removeHandler(old)
        old.close()
    for handler in handlers:
        LOGGER.addHandler(handler)
    LOGGER.setLevel(level.upper())
    LOGGER.propagate = False


def ensure_logging() -> None:
    """The default configuration, unless the command line configured one already."""
    if not LOGGER.handlers:
        configure_logging()


def mismatch_notice(receiver: str, reason: str, sender: str, detail: str) -> str:
    """``p02 refused messages from p05: config_mismatch (their run id ... != ours ...)``."""
    return f"{receiver} refused messages from {sender or 'an unknown sender'}: {reason}" + (
        f" ({detail})" if detail else "")


# ------------------------------------------------------------------ the progress display


@dataclass(frozen=True)
class Reading:
    """What one update of the display shows; None: not known (yet)."""

    done: float                       # steps, or simulated seconds
    accuracy: float | None = None
    bytes_sent: int | None = None
    bytes_received: int | None = None
    rejected: int | None = None
    members: str = ""                 # "neighbours 2/3", "peers 8/8"
    note: str = ""                    # what it waits for, or its state when not plain progress


def _clock_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class Progress:
    """The live display of one run (``label``) towards ``total`` (in ``unit``).

    ``update`` as often as convenient; ``close`` once at the end (it shows the final state,
    once). ``stream`` defaults to stdout; ``interactive`` to whether it is a terminal.
    ``clock`` (seconds, monotonic) drives the rate, ETA and the line interval.
    """

    def __init__(self, label: str, total: float, *, unit: str = "steps", rate_unit: str = "",
                 stream: IO[str] | None = None, interactive: bool | None = None, interval_s: float = 10.0,
                 clock: Callable[[], float] | None = None) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.rate_unit = rate_unit or f"{unit}/s"
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.interval_s = interval_s
        self._clock = clock or time.monotonic
        self._whole = float(total).is_integer() and unit in ("steps", "rounds")
        console = Console(file=self.stream, force_terminal=self.interactive or None,
                          force_interactive=self.interactive or None, highlight=False)
        # the rich task estimates the rate in both modes; it draws only on a terminal
        self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(bar_width=20),
                                  TextColumn("{task.fields[text]}"), console=console,
                                  auto_refresh=False, disable=not self.interactive,
                                  get_time=self._clock)
        self._task = self._rich.add_task(label, total=total, text="")
        self._last: Reading | None = None
        self._said: tuple[Reading, float] | None = None   # the last plain line: what and when
        self._closed = False
        if self.interactive:
            self._rich.start()

    def update(self, reading: Reading) -> None:
        self._last = reading
        done = min(reading.done, self.total)
        delta = done - self._rich.tasks[0].completed
        if reading.note and done < self.total:
            # waiting, syncing, held: no rate; it starts afresh when the run moves on
            self._rich.reset(self._task)
            self._rich.tasks[0].completed = done     # reset's own `completed` is typed int (sim: seconds)
            self._rich.advance(self._task, 0)         # the rate's time origin: the last moment waited
        elif delta >= 0:    # a sample even when nothing moved: a stall slows the rate and the ETA
            self._rich.advance(self._task, delta)
        else:               # moved back (adopted an older state): no sample, the rate is not negative
            self._rich.update(self._task, completed=done)
        self._rich.update(self._task, text=self.text(reading))
        if self.interactive:
            self._rich.refresh()
        elif self._due(reading):
            self._say(reading)

    def close(self) -> None:
        """The final state, once: the bar is left as it is drawn; a plain line only if it adds to the last."""
        if self._closed:
            return
        self._closed = True
        if self.interactive:
            self._rich.refresh()
            self._rich.stop()
        elif self._last is not None and self._news(self._last):
            self._say(self._last)

    def text(self, reading: Reading) -> str:
        """All but the label and the bar: ``120/300 steps  [note]  12.3 steps/s  ETA 0:00:15  acc ...``."""
        task = self._rich.tasks[0]
        over = reading.done >= self.total
        rate = task.finished_speed if over else task.speed     # at the end: the speed it finished at
        eta = 0.0 if over else (self.total - reading.done) / rate if rate else None
        done, *rest = self._shown(reading)
        note = [reading.note] if reading.note else []   # early: a narrow terminal cuts the line's end
        return "  ".join([done, *note, f"{format_number(rate, '.1f')} {self.rate_unit}",
                          f"ETA {_clock_time(eta)}", *rest])

    def _shown(self, reading: Reading) -> list[str]:
        """The fields as shown, but for the note, rate and ETA: what a new plain line must change."""
        spec = ".0f" if self._whole else ".1f"
        parts = [f"{reading.done:{spec}}/{self.total:{spec}} {self.unit}",
                 f"acc {format_number(reading.accuracy, '.3f')}"]
        if reading.members:
            parts.append(reading.members)
        if reading.bytes_sent is not None:
            parts.append(f"sent {human_bytes(reading.bytes_sent)}")
        if reading.bytes_received is not None:
            parts.append(f"recv {human_bytes(reading.bytes_received)}")
        if reading.rejected is not None:
            parts.append(f"rejected {reading.rejected}")
        return parts

    def _news(self, reading: Reading) -> bool:
        """Whether ``reading`` shows something the last plain line did not (a change too small to
        show, like a heartbeat's bytes, is none)."""
        if self._said is None:
            return True
        said = self._said[0]
        return reading.note != said.note or self._shown(reading) != self._shown(said)

    def _due(self, reading: Reading) -> bool:
        if self._said is None:
            return True
        said, at = self._said
        if reading.note != said.note:
            return True     # a change of what it waits for is said at once
        return self._news(reading) and self._clock() - at >= self.interval_s

    def _say(self, reading: Reading) -> None:
        self._said = (reading, self._clock())
        print(f"{iso_now()} {self.label} {self.text(reading)}", file=self.stream, flush=True)


class MismatchNotices:
    """Says each (reason, sender) of :data:`MISMATCH_REASONS` once. Senders not on the roster can
    be made up by anyone, so at most ``per_reason`` senders are named per reason (memory and
    console stay bounded); the rest are still counted in the status, like every refusal."""

    def __init__(self, receiver: str, per_reason: int = 8) -> None:
        self.receiver = receiver
        self.per_reason = per_reason
        self._said: dict[str, set[str]] = {}

    def first(self, reason: str, sender: str, detail: str) -> str | None:
        """The line to say for this refusal, or None (not a mismatch, or already said)."""
        if reason not in MISMATCH_REASONS:
            return None
        said = self._said.setdefault(reason, set())
        if sender in said or len(said) > self.per_reason:
            return None
        said.add(sender)
        if len(said) > self.per_reason:
            return (f"{self.receiver} refused messages from more than {self.per_reason} senders: {reason} "
                    "(no more are named; the status counts them)")
        return mismatch_notice(self.receiver, reason, sender, detail)

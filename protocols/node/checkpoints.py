"""When a member's checkpoint is due: every so many steps or seconds, and at once after a jump.

Pure: the step and ``now`` are handed in. What a checkpoint holds and how it
is written stay with the host (peer/train/checkpoint.py writes files; the
simulator keeps copies); this module only decides *when*, for the member
lifecycle (protocols/node/member.py) and every host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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

"""Faults that fire on a peer's own progress, for process tests: no wall-clock sleeps.

A process test needs its faults at known points of a run: a peer killed right
after step 110, every peer held at step 60 until a late joiner has synced. A
sleep in the test cannot give that (on a loaded machine 300 steps take 2 s or
20 s), so the daemon honours hooks instead. Each hook names a trainer step and
what happens when the peer reaches it, before it trains further:

- ``hold``: stop training (messages, heartbeats, state-sync answers and
  status go on) until the file ``gate`` exists;
- ``kill``: SIGKILL itself (a crash: no checkpoint, no goodbye);
- ``stop``: SIGTERM itself (the clean path: checkpoint, exit 0);
- ``cut``: drop every message it sends or receives (heartbeats included), counted,
  for ``seconds`` of its clock, as a cut link would; it creates the file
  ``healed`` (if given) when the cut ends.

When a hook fires, the peer first creates the file ``mark`` (if given), so a
test waits on files, not on time. Hooks come from the environment variable
``HIVEMESH_TEST_HOOKS``, a JSON list of objects with these keys; nothing sets
it in normal use, and a malformed value is a configuration error.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from topology.errors import HivemeshError

ENVIRONMENT_VARIABLE = "HIVEMESH_TEST_HOOKS"
ACTIONS = ("hold", "kill", "stop", "cut")


@dataclass(frozen=True, kw_only=True)
class Hook:
    at_step: int                          # fires once the trainer's step is at least this
    action: Literal["hold", "kill", "stop", "cut"]
    gate: str = ""                        # hold: training resumes once this file exists
    mark: str = ""                        # created when the hook fires (what a test waits for)
    seconds: float = 0.0                  # cut: how long
    healed: str = ""                      # cut: created when the cut ends

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")
        if self.action == "hold" and not self.gate:
            raise ValueError("a hold hook needs a gate file")
        if self.at_step < 0:
            raise ValueError(f"at_step must be >= 0, got {self.at_step}")
        if self.action == "cut" and not self.seconds > 0:
            raise ValueError(f"a cut hook needs seconds > 0, got {self.seconds}")


def parse_hooks(text: str) -> tuple[Hook, ...]:
    """Hooks from their JSON form (a list of objects); a HivemeshError names what is wrong."""
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise TypeError("expected a JSON list of hooks")
        return tuple(Hook(**item) for item in items)
    except (ValueError, TypeError) as error:
        raise HivemeshError(f"{ENVIRONMENT_VARIABLE}: {error}") from None


def hooks_json(hooks: Sequence[Hook]) -> str:
    """The environment variable's value for ``hooks``."""
    return json.dumps([{"at_step": h.at_step, "action": h.action, "gate": h.gate, "mark": h.mark,
                        "seconds": h.seconds, "healed": h.healed} for h in hooks])


def hooks_from_environment() -> tuple[Hook, ...]:
    text = os.environ.get(ENVIRONMENT_VARIABLE, "")
    return parse_hooks(text) if text else ()


class Hooks:
    """The hooks of one run; ``holding(step)`` is asked before each piece of training."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self._pending = sorted(hooks, key=lambda h: h.at_step)
        self._holding: Hook | None = None
        self._cut: tuple[float, str] | None = None     # (until, healed file) of a cut in force

    def cutting(self, now: float) -> bool:
        """Whether a cut is in force at ``now`` (seconds of the peer's clock); when it has just
        ended, its ``healed`` file is created."""
        if self._cut is None:
            return False
        until, healed = self._cut
        if now < until:
            return True
        self._cut = None
        if healed:
            Path(healed).touch()
        return False

    def holding(self, step: int, now: float = 0.0) -> bool:
        """Fire every hook due at ``step`` (``now``: the peer's clock, which a cut is timed on);
        True while a hold's gate is still closed."""
        while self._holding is None and self._pending and self._pending[0].at_step <= step:
            hook = self._pending.pop(0)
            if hook.mark:
                Path(hook.mark).touch()
            match hook.action:
                case "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                case "stop":
                    os.kill(os.getpid(), signal.SIGTERM)
                case "hold":
                    self._holding = hook
                case "cut":
                    self._cut = (now + hook.seconds, hook.healed)
        if self._holding is not None and Path(self._holding.gate).exists():
            self._holding = None
            return self.holding(step, now)     # a later hook may be due at the same step
        return self._holding is not None

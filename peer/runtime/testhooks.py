"""Faults that fire on a peer's own progress, for process tests: no wall-clock sleeps.

``HIVEMESH_TEST_HOOKS`` (a JSON list; nothing sets it in normal use, and a
malformed value is a configuration error) names a trainer step (a gateway: a
round) and what happens when the peer reaches it, before it trains further:
``hold`` until the file ``gate`` exists; ``kill`` (SIGKILL) or ``stop`` (SIGTERM)
itself; ``cut`` every message for ``seconds``, then create ``healed``; and for an
edge client ``signflip`` or ``attack`` (a peer/train/attack.py spec) from then on,
or ``pace``: at least ``seconds`` per training step (a peer honours it too). When
a hook fires, the peer first creates the file ``mark``, so a test waits on files.

``HIVEMESH_TEST_CHECKPOINT_HOOK`` (:class:`SaveHook`): at one of
peer/train/checkpoint.py's ``SAVE_POINTS`` of the first save of at least step
``at_step``, the writer creates ``mark``, then kills itself or holds until ``gate``.

``HIVEMESH_TEST_PARAMS_TRACE`` (:class:`ParamsTrace`): every ``every_steps``
steps, at the work point, the flat parameters, step and wall clock go to
``folder/NAME/STEP.pt`` (:func:`read_params_trace`).

``HIVEMESH_TEST_SCHEDULE``: a fault schedule keyed by rounds
(protocols/node/schedule.py, which the simulator honours too) with a shared
``progress`` folder: each peer writes its latest work point's round
(``DIR/NAME``) and the faults it fired (``DIR/NAME.fired``). :class:`ScheduleFiles`
is that file side; the daemon does what :class:`MemberFaults` fires. Why: docs/design/testhooks.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from peer.train.attack import Attack, parse_attack
from peer.train.checkpoint import SAVE_POINTS, SavePoint
from protocols.errors import HivemeshError
from protocols.node.schedule import MemberFaults, Schedule, from_plain, to_plain

ENVIRONMENT_VARIABLE = "HIVEMESH_TEST_HOOKS"
PROTOCOL_VARIABLE = "HIVEMESH_TEST_PROTOCOL_VERSION"   # a member not yet upgraded: speaks at most this
SCHEDULE_VARIABLE = "HIVEMESH_TEST_SCHEDULE"
SAVE_VARIABLE = "HIVEMESH_TEST_CHECKPOINT_HOOK"
ACTIONS = ("hold", "kill", "stop", "cut", "signflip", "attack", "pace")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Hook:
    at_step: int                          # fires once the trainer's step is at least this
    action: Literal["hold", "kill", "stop", "cut", "signflip", "attack", "pace"]
    gate: str = ""                        # hold: training resumes once this file exists
    mark: str = ""                        # created when the hook fires (what a test waits for)
    seconds: float = 0.0                  # cut: how long; pace: a training step's least time
    healed: str = ""                      # cut: created when the cut ends
    scale: float = 0.0                    # signflip: the attack's scale
    spec: str = ""                        # attack: a peer/train/attack.py spec ("signflip:3,claim:1e9")

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")
        if self.action == "hold" and not self.gate:
            raise ValueError("a hold hook needs a gate file")
        if self.at_step < 0:
            raise ValueError(f"at_step must be >= 0, got {self.at_step}")
        if self.action == "cut" and not self.seconds > 0:
            raise ValueError(f"a cut hook needs seconds > 0, got {self.seconds}")
        if self.action == "signflip" and not 0 < self.scale < math.inf:
            raise ValueError(f"a signflip hook needs 0 < scale < inf, got {self.scale}")
        if self.action == "attack":
            parse_attack(self.spec)
        if self.action == "pace" and not 0 < self.seconds < math.inf:
            raise ValueError(f"a pace hook needs 0 < seconds < inf, got {self.seconds}")


def _parsed(variable: str, text: str, build: Callable[[Any], T]) -> T:
    """``build`` of the JSON value ``text`` of the test variable ``variable``. Every reader below goes
    through here, so a malformed value (not JSON, a wrong shape, a bad or missing field) is one kind of
    error: a HivemeshError that names the variable."""
    try:
        value = json.loads(text)
    except ValueError:
        raise HivemeshError(f"{variable}: not JSON: {text!r}") from None
    try:
        return build(value)
    except KeyError as error:
        raise HivemeshError(f"{variable}: key {error} missing or unknown") from None
    except (ValueError, TypeError) as error:
        raise HivemeshError(f"{variable}: {error}") from None


def _from_environment(variable: str, build: Callable[[Any], T]) -> T | None:
    """:func:`_parsed` of ``variable``'s value; None when it is unset or empty (normal use)."""
    text = os.environ.get(variable, "")
    return _parsed(variable, text, build) if text else None


def _hook_list(items: Any) -> tuple[Hook, ...]:
    if not isinstance(items, list):
        raise TypeError("expected a JSON list of hooks")
    return tuple(Hook(**item) for item in items)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


def parse_hooks(text: str) -> tuple[Hook, ...]:
    """Hooks from their JSON form (a list of objects); a HivemeshError names what is wrong."""
    return _parsed(ENVIRONMENT_VARIABLE, text, _hook_list)


def hooks_json(hooks: Sequence[Hook]) -> str:
    """The environment variable's value for ``hooks``."""
    return json.dumps([dataclasses.asdict(h) for h in hooks])     # every field: none dropped on the way


def hooks_from_environment() -> tuple[Hook, ...]:
    return _from_environment(ENVIRONMENT_VARIABLE, _hook_list) or ()


def protocol_version_from_environment() -> int | None:
    """The highest protocol version this peer may accept and speak (``HIVEMESH_TEST_PROTOCOL_VERSION``),
    so a test runs a member one version behind beside current ones; None: all this code speaks."""
    return _from_environment(PROTOCOL_VARIABLE, _integer)


class Hooks:
    """The hooks of one run; ``holds(step)`` is asked before each piece of training."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self._pending = sorted(hooks, key=lambda h: h.at_step)
        self._holding: Hook | None = None
        self._cut: tuple[float, str] | None = None     # (until, healed file) of a cut in force
        self.attack = Attack()      # what a signflip or attack hook made this edge, once it fired
        self.step_pace_s = 0.0      # a pace hook's seconds once it fired: a training step's least time

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

    def holds(self, step: int, now: float = 0.0) -> bool:
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
                case "signflip":
                    self.attack = Attack(flip_scale=hook.scale)
                case "attack":
                    self.attack = parse_attack(hook.spec)
                case "pace":
                    self.step_pace_s = hook.seconds
        if self._holding is not None and Path(self._holding.gate).exists():
            self._holding = None
            return self.holds(step, now)     # a later hook may be due at the same step
        return self._holding is not None


# ------------------------------------------------------------ a checkpoint write stopped halfway


@dataclass(frozen=True, kw_only=True)
class SaveHook:
    point: str                            # one of SAVE_POINTS
    action: Literal["kill", "hold"]
    at_step: int = 0                      # the first save of at least this step
    mark: str = ""                        # created when it fires
    gate: str = ""                        # hold: the write goes on once this file exists

    def __post_init__(self) -> None:
        if self.point not in SAVE_POINTS:
            raise ValueError(f"point must be one of {SAVE_POINTS}, got {self.point!r}")
        if self.action not in ("kill", "hold"):
            raise ValueError(f"action must be kill or hold, got {self.action!r}")
        if self.action == "hold" and not self.gate:
            raise ValueError("a hold needs a gate file")


def save_hook_json(hook: SaveHook) -> str:
    """The value of ``HIVEMESH_TEST_CHECKPOINT_HOOK`` for ``hook``."""
    return json.dumps({"point": hook.point, "action": hook.action, "at_step": hook.at_step,
                       "mark": hook.mark, "gate": hook.gate})


def save_point(hook: SaveHook) -> SavePoint:
    """What the checkpoint writer calls at each of its points (``at_point``): fires ``hook`` once."""
    fired = False

    def at_point(point: str, step: int) -> None:
        nonlocal fired
        if fired or point != hook.point or step < hook.at_step:
            return
        fired = True
        if hook.mark:
            Path(hook.mark).touch()
        if hook.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while not Path(hook.gate).exists():
            time.sleep(0.01)    # a test's gate file: the writer's one thread has nothing else to do

    return at_point


def save_point_from_environment() -> SavePoint | None:
    return _from_environment(SAVE_VARIABLE, lambda plain: save_point(SaveHook(**plain)))


# ------------------------------------------------------------ a fault schedule keyed by rounds


def schedule_json(schedule: Schedule, progress: Path) -> str:
    """The value of ``HIVEMESH_TEST_SCHEDULE`` for ``schedule``, peers sharing the folder ``progress``."""
    return json.dumps({"progress": str(progress), "faults": to_plain(schedule)})


def read_round(progress: Path, name: str) -> int:
    """The round of ``name``'s latest work point, as it wrote it in ``progress`` (-1: none yet)."""
    try:
        return int((progress / name).read_text())
    except (FileNotFoundError, ValueError):
        return -1


def _write(path: Path, text: str) -> None:
    """Whole or not at all: another process reads it at any moment."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(temporary, path)


class ScheduleFiles:
    """One peer's side of a schedule, on the files its peers share (see the module docstring)."""

    def __init__(self, schedule: Schedule, name: str, progress: Path) -> None:
        self.progress = progress
        self.name = name
        fired_file = progress / f"{name}.fired"
        fired = set(json.loads(fired_file.read_text())) if fired_file.exists() else set()
        self.faults = MemberFaults(schedule, name, reached=lambda member: read_round(progress, member),
                                   fired=fired)
        self._recorded = set(fired)

    def reached(self, round_index: int) -> None:
        """Say how far we are: at a work point of ``round_index`` (first, before heals and faults)."""
        if read_round(self.progress, self.name) < round_index:
            _write(self.progress / self.name, str(round_index))

    def work_point(self, round_index: int) -> list[Any]:
        """What fires (recorded, for a restarted life)."""
        fired = self.faults.work_point(round_index)
        self.record(self.faults.fired)
        return fired

    def record(self, fired: set[int]) -> None:
        """The faults fired so far (the member's: a restarted life fires none of them again)."""
        if fired != self._recorded:
            self._recorded = set(fired)
            _write(self.progress / f"{self.name}.fired", json.dumps(sorted(fired)))


def schedule_from_environment(name: str) -> ScheduleFiles | None:
    return _from_environment(SCHEDULE_VARIABLE, lambda plain: ScheduleFiles(from_plain(plain["faults"]), name,
                                                                            Path(plain["progress"])))


# ------------------------------------------------------------ the parameters over time, for a test


PARAMS_VARIABLE = "HIVEMESH_TEST_PARAMS_TRACE"


@dataclass(frozen=True, kw_only=True)
class ParamsTrace:
    """Every ``every_steps`` trainer steps, at the work point (the round's messages sent, its steps
    not yet trained, as the simulator's trace sees members), a peer writes its flat parameters, its
    step and the wall clock to ``folder/NAME/STEP.pt``. A multi-host test computes the consensus
    distance over time from these (issue 16): status.json holds no parameters, and polling
    checkpoints would race the writer. ``time.time()`` is one clock for every host of one machine."""

    folder: str
    every_steps: int

    def __post_init__(self) -> None:
        if not self.folder:
            raise ValueError("a params trace needs a folder")
        if self.every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {self.every_steps}")


def params_trace_json(trace: ParamsTrace) -> str:
    """The value of ``HIVEMESH_TEST_PARAMS_TRACE`` for ``trace``."""
    return json.dumps({"folder": trace.folder, "every_steps": trace.every_steps})


class ParamsWriter:
    """One peer's side of a :class:`ParamsTrace`."""

    def __init__(self, trace: ParamsTrace, name: str) -> None:
        self.folder = Path(trace.folder) / name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.every_steps = trace.every_steps
        self._written = -1

    def at_work_point(self, step: int, params: torch.Tensor) -> None:
        """Write ``params`` if ``step`` is due (once per step: a held round comes back to it)."""
        if step % self.every_steps or step == self._written:
            return
        self._written = step
        flat = params.detach().to("cpu", torch.float32).clone()
        record = {"step": step, "time_s": time.time(), "params": flat}
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".params.")
        with os.fdopen(handle, "wb") as out:
            torch.save(record, out)
        os.replace(temporary, self.folder / f"{step}.pt")   # whole or not at all: the test reads any time


def read_params_trace(folder: Path, name: str) -> dict[int, tuple[float, torch.Tensor]]:
    """What ``name`` wrote under ``folder``: step -> (wall-clock seconds, flat parameters)."""
    found: dict[int, tuple[float, torch.Tensor]] = {}
    for path in sorted((folder / name).glob("*.pt")):
        record = torch.load(path, weights_only=True)
        found[int(record["step"])] = (float(record["time_s"]), record["params"])
    return found


def params_writer_from_environment(name: str) -> ParamsWriter | None:
    return _from_environment(PARAMS_VARIABLE, lambda plain: ParamsWriter(ParamsTrace(**plain), name))

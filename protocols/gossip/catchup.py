"""How far a round machine may jump ahead on its in-neighbours' word (catching up), pure.

A member far behind catches up by a jump to a round its in-neighbours are in
(protocols/gossip/rounds.py). A round number is only a claim, so a jump is
bounded by two rules; the farther one wins:

* **Time.** One in-neighbour moves us only as far as it could have trained
  since we last believed it, at ``speedup`` (2) times our own step rate: the
  median time per step of our last ``ROUNDS_TIMED`` rounds that closed
  complete (exchange included), or, before any did, the rate of our local work
  in rounds a deadline closed with no message. A claim within reach is believed
  and becomes the sender's reference; one beyond is credited only to the reach.
  No rate measured yet: no reach beyond the reference.
* **Evidence.** Where the in-degree ``d >= 2f + 1`` (``f``:
  ``byzantine_neighbours``, by default 1 where ``d >= 3``, else 0), claims from
  ``f + 1`` distinct in-neighbours take the jump to the ``(f + 1)``-th highest
  claimed round, which at least one honest in-neighbour is in.

References are times on this life's clock and are not checkpointed. The step
rate is a duration: ``export``/``restore`` keep it in a checkpoint and a new
life (``Start``, also after a state-sync adoption) starts with it. Limit: a
neighbour silent for a while may claim as far as it could have trained in that
silence. Why, with the attack that made this necessary: docs/design/gossip-rounds.md.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SPEEDUP = 2.0  # how much faster than us an in-neighbour may have trained (heterogeneous hardware)
ROUNDS_TIMED = 15  # our own rounds the step rate is the median of (odd: a middle one)


def confirmations(in_degree: int, byzantine_neighbours: int) -> int:
    """How many distinct in-neighbours' claims lift the time bound: ``f + 1``, or 0 when no number
    of them does (``f = 0``, or too few in-neighbours: ``d < 2f + 1``).

    ``byzantine_neighbours`` < 0 chooses ``f``: 1 where the in-degree is 3 or more, else 0.
    """
    f = byzantine_neighbours if byzantine_neighbours >= 0 else (1 if in_degree >= 3 else 0)
    if f < 1 or in_degree < 2 * f + 1:
        return 0
    return f + 1


def confirmed_round(claims: Mapping[str, int], needed: int) -> int | None:
    """The ``needed``-th highest of the senders' claimed rounds (one claim per sender), or None
    when fewer senders claim anything or ``needed`` is 0."""
    if needed < 1 or len(claims) < needed:
        return None
    return sorted(claims.values(), reverse=True)[needed - 1]


@dataclass(frozen=True)
class Reference:
    """Where a sender was believed to be (``steps``: its schedule position) at ``at_s``."""

    steps: float
    at_s: float


class Reach:
    """Per in-neighbour: the farthest schedule position it could have reached by now (the time rule)."""

    def __init__(self, *, speedup: float = SPEEDUP) -> None:
        self.speedup = speedup
        self.timed: deque[float] = deque(maxlen=ROUNDS_TIMED)  # seconds per step of our last rounds
        self.computed: deque[float] = deque(maxlen=ROUNDS_TIMED)  # seconds per step of our local work
        self.origin: Reference | None = None  # our own position at Start
        self.believed: dict[str, Reference] = {}

    def started(self, steps_done: int, now: float) -> None:
        """A life begins (``Start``): references of an earlier life are on another clock; our step
        rate (durations) is kept."""
        self.origin = Reference(float(steps_done), now)
        self.believed = {}

    def worked(self, steps: int, seconds: float) -> None:
        """Our own training round of ``steps`` local steps took ``seconds``, start to close."""
        if steps > 0 and seconds > 0 and math.isfinite(seconds):
            self.timed.append(seconds / steps)

    def worked_alone(self, steps: int, seconds: float) -> None:
        """Our local work of ``steps`` steps took ``seconds`` (``StartWork`` to ``WorkDone``) in a
        round its deadline closed short of a message: the rate until a round has closed complete."""
        if steps > 0 and seconds > 0 and math.isfinite(seconds):
            self.computed.append(seconds / steps)

    @property
    def step_s(self) -> float | None:
        """Our time per step: the median of the rounds timed, else of our local work alone (no round
        closed complete yet), None before either."""
        if self.timed:
            return statistics.median(self.timed)
        return statistics.median(self.computed) if self.computed else None

    def reach(self, sender: str, now: float) -> float:
        """The farthest position (steps) ``sender`` can be at ``now``."""
        ref = self.believed.get(sender, self.origin)
        if ref is None:
            return 0.0
        step_s = self.step_s
        if step_s is None:
            return ref.steps
        return ref.steps + self.speedup * max(0.0, now - ref.at_s) / step_s

    def credit(self, sender: str, steps: int, now: float) -> float:
        """What a claim that ``sender`` is at ``steps`` is credited: the claim if within reach (it
        becomes the sender's reference, unless older than the one held), else the reach."""
        reach = self.reach(sender, now)
        if steps > reach:
            return reach
        ref = self.believed.get(sender)
        if ref is None or steps >= ref.steps:
            self.believed[sender] = Reference(float(steps), now)
        return float(steps)

    def export(self) -> dict[str, list[float]]:
        """Our step rate's memory (seconds per step, oldest first), JSON-able: what a checkpoint keeps."""
        return {"timed": list(self.timed), "computed": list(self.computed)}

    def restore(self, saved: Mapping[str, Sequence[float]]) -> None:
        """The memory from :meth:`export` (a checkpoint without it: none, measured anew). Entries that
        are not positive and finite are dropped."""
        for memory, key in ((self.timed, "timed"), (self.computed, "computed")):
            memory.clear()
            memory.extend(float(v) for v in saved.get(key, ()) if float(v) > 0 and math.isfinite(float(v)))

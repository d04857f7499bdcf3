"""How far a round machine may jump ahead on its in-neighbours' word (catching up), pure.

A member far behind catches up by a jump to a round its in-neighbours are in
(protocols/gossip/rounds.py). A round number is only a claim, so a jump is
bounded by two rules; the farther one wins:

* **Evidence.** Claims from ``f + 1`` distinct in-neighbours (``f``:
  ``byzantine_neighbours``, by default 1) take the jump to the ``(f + 1)``-th
  highest claimed round, which at least one honest in-neighbour is in. A sender
  counts once, by its newest claim: repeating a claim adds nothing.
* **Pace.** Alone, an in-neighbour moves us only as far as we would be had we
  trained at our own pace since we last believed it: its believed position, plus
  the steps we have trained since (skipped ones are not trained), plus the
  seconds our rounds waited out a deadline since, at our step rate (the median
  time per step of our last ``ROUNDS_TIMED`` rounds that closed complete, or of
  our local work alone in rounds a deadline closed with no message; none yet:
  waits count nothing). A claim within is believed and becomes the sender's
  reference; one beyond is credited only that reach. A jump spends the credit,
  and a stall of our own (a busy machine) or a slow round earns none.

With fewer than ``f + 1`` in-neighbours (one, on a directed ring) only the pace
rule is left: a member behind its in-neighbour by more than the buffer window
regains the time it waited, never a downtime or a lead the neighbour built
while we trained. ``byzantine_neighbours = 0`` trusts one claim. References live
on this life's schedule; the step rate is a duration, kept by ``export``/``restore``
and across lives. Why, with the attacks: docs/design/gossip-rounds.md.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ROUNDS_TIMED = 15  # our own rounds the step rate is the median of (odd: a middle one)


def confirmations(in_degree: int, byzantine_neighbours: int) -> int:
    """How many distinct in-neighbours' claims make a jump: ``f + 1``, or 0 when there are fewer
    in-neighbours than that (only the pace rule is left).

    ``byzantine_neighbours`` < 0 chooses ``f = 1``. The ``(f + 1)``-th highest of ``f + 1`` distinct
    senders' claims is at most an honest one's whatever ``f`` of them say, so any in-degree of at
    least ``f + 1`` is safe; ``2f + 1`` also makes it live (``f + 1`` honest claimers).
    """
    f = byzantine_neighbours if byzantine_neighbours >= 0 else 1
    return f + 1 if in_degree >= f + 1 else 0


def confirmed_round(claims: Mapping[str, int], needed: int) -> int | None:
    """The ``needed``-th highest of the senders' claimed rounds (one claim per sender), or None
    when fewer senders claim anything or ``needed`` is 0."""
    if needed < 1 or len(claims) < needed:
        return None
    return sorted(claims.values(), reverse=True)[needed - 1]


@dataclass(frozen=True)
class Reference:
    """Where a sender was believed to be (``steps``: its schedule position), and how far we had come
    then: steps we had trained (``trained``) and seconds our rounds had waited (``waited_s``)."""

    steps: float
    trained: float
    waited_s: float


class Reach:
    """Per in-neighbour: the farthest schedule position its word alone may move us to (the pace rule)."""

    def __init__(self) -> None:
        self.timed: deque[float] = deque(maxlen=ROUNDS_TIMED)  # seconds per step of our last rounds
        self.computed: deque[float] = deque(maxlen=ROUNDS_TIMED)  # seconds per step of our local work
        self.trained = 0.0  # steps we trained in this life (never the skipped ones)
        self.waited_s = 0.0  # seconds our rounds of this life waited out a deadline
        self.origin: Reference | None = None  # our own position at Start
        self.believed: dict[str, Reference] = {}

    def started(self, steps_done: int) -> None:
        """A life begins (``Start``): references of an earlier life are forgotten; our step rate
        (durations) is kept."""
        self.trained, self.waited_s = 0.0, 0.0
        self.origin = Reference(float(steps_done), 0.0, 0.0)
        self.believed = {}

    def advanced(self, steps: int, waited_s: float) -> None:
        """A round of ours closed: ``steps`` local steps trained in it, and ``waited_s`` seconds spent
        waiting out its deadline (0: it closed complete, or for a jump)."""
        self.trained += max(0, steps)
        if waited_s > 0 and math.isfinite(waited_s):
            self.waited_s += waited_s

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

    def reach(self, sender: str) -> float:
        """The farthest position (steps) ``sender``'s word alone may move us to now."""
        ref = self.believed.get(sender, self.origin)
        if ref is None:
            return 0.0
        step_s = self.step_s
        waited = 0.0 if step_s is None else (self.waited_s - ref.waited_s) / step_s
        return ref.steps + (self.trained - ref.trained) + waited

    def credit(self, sender: str, steps: int) -> float:
        """What a claim that ``sender`` is at ``steps`` is credited: the claim if within reach (it
        becomes the sender's reference, unless older than the one held), else the reach."""
        reach = self.reach(sender)
        if steps > reach:
            return reach
        ref = self.believed.get(sender)
        if ref is None or steps >= ref.steps:
            self.believed[sender] = Reference(float(steps), self.trained, self.waited_s)
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

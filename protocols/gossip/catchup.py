"""How far a round machine may jump ahead on its in-neighbours' word (catching up), pure.

A member that fell far behind (a partition, a straggler) catches up by a
jump to a round its in-neighbours are in (protocols/gossip/rounds.py,
"Catching up"). A round number is only a claim, though: a member's signed
message for round ``last_round`` is as valid as an honest one, and followed
blindly it made each of its neighbours skip the rest of its training, their
neighbours then follow them, and one message stopped a 4-peer ring's training
(97% of it skipped). So a jump is bounded by two rules; the farther one wins:

* **Time.** One in-neighbour moves us only as far as it could have trained
  since we last believed it: from the round of its last believed message (or,
  not heard yet in this life, our own position at ``Start``), at ``speedup``
  (2) times our own step rate. The rate is how fast we really go through the
  schedule: the median time per step of our last ``ROUNDS_TIMED`` training
  rounds in this life, each from its start to its close on the driver's clock
  (``now``), exchange included; only rounds that closed complete, as the
  network's pace (a member cut off waits out a deadline per round: timed, it
  would never catch up at twice that). Not the work alone: where rounds wait
  on the network (1 ms of compute in 15 ms rounds), a neighbour heard every
  round would otherwise reach 30 rounds ahead at each message. The median, so
  that a held round, or one closed at once on buffered messages, does not set
  it. Until a round has closed complete, the rate is that of our local work
  alone (``StartWork`` to ``WorkDone``), taken in the rounds a deadline closed
  with no message for them at all (not before one: a liar's claim in round 0
  would move us as many steps as a network-bound round is long in steps of
  compute; not one with some message: a neighbour withholding one round would
  then set our reach by our compute alone). The rate is a duration, so the
  checkpoint keeps it and a new life starts with it. A
  member that starts more than the buffer window behind its neighbours (at
  round 0 on a stale heartbeat while they ran on) never closes a round
  complete, since every message it hears is far ahead; with no rate at all it
  refused every claim and trained alone at one round per deadline for the
  whole run. Its compute rate is the closest honest bound it has (nobody
  trains faster than twice it), and it serves only until a round closes
  complete.
  A claim within that reach is believed and becomes the sender's new
  reference; a claim beyond it is credited only to the reach (the reference is
  kept, so repeating the claim gains nothing but time). No round measured
  yet (none closed complete, none closed by its deadline): no reach beyond
  the reference. A ring's only help across a cut is its one neighbour there:
  the half behind catches up through this rule, at the rate of the reach.
* **Evidence.** Where the in-degree ``d`` allows (``d >= 2f + 1``, with ``f``
  the Byzantine in-neighbours tolerated, ``byzantine_neighbours``: by default
  1 where ``d >= 3``, else 0), claims from ``f + 1`` distinct in-neighbours
  lift the time bound: the jump goes to the ``(f + 1)``-th highest claimed
  round, which at least one honest in-neighbour is in. ``d >= 2f + 1`` keeps
  ``f + 1`` honest in-neighbours however the ``f`` others lie. With ``f = 0``
  no claims lift the bound.

What the time rule cannot tell: a neighbour whose round messages stopped
for a while (a cut, or the whole network held) may really be that far ahead,
so a claim within the time since is followed, whoever signed it. Heard every
round, a member gains about ``speedup`` rounds per message, within the buffer
window: nothing. (Heartbeats, which the Node sees and the machine does not,
are not consulted.)

References are times on this life's clock, so they are not checkpointed: a
restarted machine starts from its own position. Our step rate is a duration,
not a time: a checkpoint keeps it (``export``/``restore``) and a new life
(``Start``, also after a state-sync adoption) keeps it, to be replaced as the
new life's rounds close. Measured anew, it was missing exactly when it was
needed: a member restarted from a checkpoint and handed its neighbours' round
by a state sync has no round of its own timed yet, while the neighbours, which
took it for a laggard when it died, do not wait for it and run on past its
buffer window as it starts. It refused every claim (``catch_up_refused``, about
100 a second at 50 steps/s), waited out its first round's deadline for messages
sent to its dead life, and only then caught up at its compute rate, with
parameters a deadline's worth of the ring's training behind
(tests/test_catchup_rejoin.py). Its pace in its last life is an honest bound.
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

"""When an edge client is on, by a pattern named in the scenario (``[federation]``'s ``availability``).

- ``always``: on from the start to the end;
- ``random:<p_on>:<period_s>``: simulated time is cut into periods of ``period_s``;
  the client is on in period ``k`` with probability ``p_on``, by a counter-based
  draw keyed by (seed, client, k), so a rerun (and any order of evaluation) gives
  the same pattern;
- ``daily:<from_h>-<to_h>[:<day_s>]``: on between hour ``from_h`` and ``to_h`` of
  each simulated day of ``day_s`` seconds (86,400 unless given; a short day
  makes a window testable), e.g. ``daily:20-6`` for a device charging at night.

A client that goes off stops (its Node forgets what it held, training in
progress is lost); when it comes back on its Node starts again with its
FedAvg client as it was (a restart from its checkpoint), and registers again
when the gateway hears it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.network import uniform

DAY_S = 86_400.0


@dataclass(frozen=True)
class Availability:
    kind: str  # "always", "random" or "daily"
    p_on: float = 1.0
    period_s: float = math.inf
    from_h: float = 0.0
    to_h: float = 24.0
    day_s: float = DAY_S

    @staticmethod
    def parse(spec: str) -> Availability:
        """The pattern ``spec`` names; ValueError saying the forms when it names none."""
        kind, _, rest = spec.strip().partition(":")
        try:
            if kind == "always" and not rest:
                return Availability("always")
            if kind == "random":
                p_text, period_text = rest.split(":")
                pattern = Availability("random", p_on=float(p_text), period_s=float(period_text))
                if 0.0 <= pattern.p_on <= 1.0 and 0.0 < pattern.period_s < math.inf:
                    return pattern
            if kind == "daily":
                window, _, day_text = rest.partition(":")
                from_text, to_text = window.split("-")
                pattern = Availability("daily", from_h=float(from_text), to_h=float(to_text),
                                       day_s=float(day_text) if day_text else DAY_S)
                if 0 <= pattern.from_h <= 24 and 0 <= pattern.to_h <= 24 and 0 < pattern.day_s < math.inf:
                    return pattern
        except ValueError:
            pass
        raise ValueError(f"availability {spec!r}: expected 'always', 'random:<p_on>:<period_s>' "
                         "(p_on in [0, 1]) or 'daily:<from_h>-<to_h>[:<day_s>]'")

    def on(self, seed: int, client: str, time_s: float) -> bool:
        """Whether ``client`` is on at ``time_s``."""
        if self.kind == "random":
            period = int(time_s // self.period_s)
            return uniform(seed, client, period, "availability") < self.p_on
        if self.kind == "daily":
            hour = (time_s % self.day_s) / self.day_s * 24.0
            if self.from_h <= self.to_h:
                return self.from_h <= hour < self.to_h
            return hour >= self.from_h or hour < self.to_h  # a window across midnight
        return True

    def next_change_s(self, time_s: float) -> float:
        """The next time after ``time_s`` at which :meth:`on` may change (inf: never)."""
        if self.kind == "random":
            return (math.floor(time_s / self.period_s) + 1) * self.period_s
        if self.kind == "daily":
            day = math.floor(time_s / self.day_s)
            edges = sorted(e * self.day_s / 24.0 for e in (self.from_h, self.to_h))
            for d in (day, day + 1):
                for edge in edges:
                    at = d * self.day_s + edge
                    if at > time_s:
                        return at
        return math.inf

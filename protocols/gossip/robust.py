"""The insider filter: updates that are not finite, or far larger than usual, are not mixed.

Each candidate's norm (a neighbour's difference to us, or its compressed
update) is compared with ``multiple`` times a reference: the median of a
sample made of the recently accepted norms, this round's candidates and our
own step's norm, but never less than our own step's norm. Our own norm and an
honest majority of the round keep the reference honest from the first round
on, before any history exists; the history then keeps it stable; the floor
keeps a run of zero differences (peers that start equal) from making every
later update look infinitely large. Accepted norms enter the history,
rejected ones never do.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

HISTORY = 64  # accepted norms remembered: long enough to be stable, short enough to follow the run


class NormFilter:
    """Running-median screen over update norms; ``multiple = 0`` only rejects non-finite norms."""

    def __init__(self, multiple: float) -> None:
        self.multiple = multiple
        self.history: deque[float] = deque(maxlen=HISTORY)

    def screen(self, norms: Sequence[float], own_norm: float) -> list[bool]:
        """Which of ``norms`` to accept (same order); accepted norms are remembered."""
        finite = [math.isfinite(n) for n in norms]
        if self.multiple > 0:
            sample = [*self.history, *(n for n, ok in zip(norms, finite, strict=True) if ok)]
            if math.isfinite(own_norm):
                sample.append(own_norm)
            reference = statistics.median(sample) if sample else math.inf
            if math.isfinite(own_norm):
                reference = max(reference, own_norm)
            limit = self.multiple * reference
            verdict = [ok and n <= limit for n, ok in zip(norms, finite, strict=True)]
        else:
            verdict = finite
        self.history.extend(n for n, ok in zip(norms, verdict, strict=True) if ok)
        return verdict

    def export(self) -> list[float]:
        return list(self.history)

    def restore(self, history: Sequence[float]) -> None:
        self.history = deque((float(h) for h in history), maxlen=HISTORY)

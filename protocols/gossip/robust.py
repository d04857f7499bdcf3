"""The insider filter: updates that are not finite, or far larger than usual, are not mixed.

Each candidate's norm (a neighbour's difference to us, or its compressed
update) is compared with ``multiple`` times a reference built from evidence
the candidate does not control: the recently accepted norms, this round's
*other* candidates and our own step's norm (the median of those), but never
less than our own step's norm. A candidate never votes for its own reference:
with one candidate and no history (AD-PSGD's first exchange, a round machine
with one in-neighbour, or the only message in by the deadline), a median that
counted it would be half its own norm, and any finite update would pass.

When that evidence is silent (a reference of 0: no history, nothing else
arrived, no step taken yet, or only zero differences so far), the reference is
``scale``, the norm of our own parameters: a first update may move us at most
``multiple`` times as far as our parameters are from the origin, and honest
peers that start apart (different initialisations) are still heard.

Our own norm and an honest majority of the round keep the reference honest
from the first round on, before any history exists; the history then keeps it
stable; the own-norm floor keeps a run of zero differences (peers that start
equal) from making every later update look infinitely large. Accepted norms
enter the history, rejected ones never do.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence

HISTORY = 64  # accepted norms remembered: long enough to be stable, short enough to follow the run


class NormFilter:
    """Running-median screen over update norms; ``multiple = 0`` only rejects non-finite norms."""

    def __init__(self, multiple: float) -> None:
        self.multiple = multiple
        self.history: deque[float] = deque(maxlen=HISTORY)

    def screen(self, norms: Sequence[float], own_norm: float,
               scale: Callable[[], float] | None = None) -> list[bool]:
        """Which of ``norms`` to accept (same order); accepted norms are remembered.

        ``scale``: the norm of our own parameters, the reference when nothing else gives one
        (called only then: it is a pass over memory). Without it, that reference is 0: only a
        zero difference passes.
        """
        finite = [math.isfinite(n) for n in norms]
        if self.multiple > 0:
            verdict = [ok and n <= self.multiple * self._reference(norms, finite, i, own_norm, scale)
                       for i, (n, ok) in enumerate(zip(norms, finite, strict=True))]
        else:
            verdict = finite
        self.history.extend(n for n, ok in zip(norms, verdict, strict=True) if ok)
        return verdict

    def _reference(self, norms: Sequence[float], finite: Sequence[bool], i: int, own_norm: float,
                   scale: Callable[[], float] | None) -> float:
        """The reference for candidate ``i``: what the history, the others and our own step say."""
        own = own_norm if math.isfinite(own_norm) else 0.0
        others = (n for j, (n, ok) in enumerate(zip(norms, finite, strict=True)) if ok and j != i)
        sample = [*self.history, *others, own]
        reference = max(statistics.median(sample), own)
        if reference > 0 or scale is None:
            return reference
        fallback = scale()
        return fallback if math.isfinite(fallback) else 0.0

    def export(self) -> list[float]:
        return list(self.history)

    def restore(self, history: Sequence[float]) -> None:
        self.history = deque((float(h) for h in history), maxlen=HISTORY)

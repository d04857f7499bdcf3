"""The discrete-event engine: a heap of timestamped callbacks and a virtual clock.

Nothing here reads real time or draws random numbers. Events that fall at
the same simulated time run in the order they were scheduled (the heap key
is ``(time_s, seq)``), so a run is a pure function of its inputs whatever
``PYTHONHASHSEED`` is. Callers that iterate over collections must sort them
first; the engine only promises a total order on what it is given.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

Callback = Callable[[], None]
# (time_s, seq, callback): seq is unique, so a comparison never reaches the callback.
_Entry = tuple[float, int, Callback]

class Engine:
    """A virtual clock (``now_s``, seconds) and the queue of what happens next."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.events_run = 0
        self._heap: list[_Entry] = []
        self._seq = 0
        self._stopped = False

    def at(self, time_s: float, callback: Callback) -> None:
        """Run ``callback()`` at simulated time ``time_s`` (never earlier than now)."""
        if math.isnan(time_s) or time_s < self.now_s:
            raise ValueError(f"cannot schedule at {time_s} s: the clock is already at {self.now_s} s")
        heapq.heappush(self._heap, (time_s, self._seq, callback))
        self._seq += 1

    def after(self, delay_s: float, callback: Callback) -> None:
        """Run ``callback()`` ``delay_s`` seconds from now."""
        self.at(self.now_s + delay_s, callback)

    def stop(self) -> None:
        """Make :meth:`run` return after the event being processed."""
        self._stopped = True

    def run(self, until_s: float = math.inf) -> float:
        """Process events in time order up to and including ``until_s``; return the clock.

        The clock ends at ``until_s`` when events remain beyond it (so that a
        caller stepping in slices sees time advance), or at the last event's
        time when the queue runs dry first.
        """
        self._stopped = False
        while self._heap and not self._stopped:
            if self._heap[0][0] > until_s:
                self.now_s = until_s
                return self.now_s
            self.step()
        if not self._heap and not self._stopped and math.isfinite(until_s):
            self.now_s = max(self.now_s, until_s)
        return self.now_s

    def next_at(self) -> float | None:
        """When the next event is due (None: nothing scheduled)."""
        return self._heap[0][0] if self._heap else None

    def step(self) -> None:
        """Run the next event (the clock moves to its time)."""
        time_s, _, callback = heapq.heappop(self._heap)
        self.now_s = time_s
        self.events_run += 1
        callback()

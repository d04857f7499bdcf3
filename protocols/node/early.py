"""Messages heard before Start: held per neighbour, newest kept, bounded.

A member that is waiting (for its neighbours, or for a state-sync answer) keeps
hearing the running network. What it holds is fed to its machine after
``Start``, so it must be bounded per sender: one neighbour's flood must not
grow memory, nor crowd out another neighbour's messages. The newest are kept
because the machine buffers only ``max_rounds_ahead`` rounds past the one it
starts in, and treats anything older as stale: ``max_rounds_ahead + 1`` per
neighbour is all it could ever use. Non-neighbours are never held (the machine
would refuse them anyway). Every message not kept is counted by reason.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque

from protocols.messages import Message


class EarlyMessages:
    """What was heard before Start, per neighbour, in arrival order; ``release`` hands it over once."""

    def __init__(self, neighbours: frozenset[str] | set[str], *, per_neighbour: int) -> None:
        if per_neighbour < 1:
            raise ValueError(f"per_neighbour must be >= 1, not {per_neighbour}")
        self.neighbours = frozenset(neighbours)
        self.per_neighbour = per_neighbour
        self.rejected: Counter[str] = Counter()  # early_not_neighbour, early_overflow
        self.held_total = 0  # every neighbour's message held (released, or dropped as overflow)
        self._held: dict[str, deque[tuple[int, Message]]] = {}
        self._arrivals = itertools.count()  # one order across neighbours, for release

    def hold(self, sender: str, message: Message) -> None:
        """Keep ``message`` from ``sender`` for after Start (the oldest of a full neighbour goes)."""
        if sender not in self.neighbours:
            self.rejected["early_not_neighbour"] += 1
            return
        kept = self._held.setdefault(sender, deque(maxlen=self.per_neighbour))
        self.held_total += 1
        if len(kept) == kept.maxlen:
            self.rejected["early_overflow"] += 1
        kept.append((next(self._arrivals), message))

    def held(self, sender: str) -> list[Message]:
        """What is held from ``sender`` now, oldest first."""
        return [message for _, message in self._held.get(sender, ())]

    def release(self) -> list[tuple[str, Message]]:
        """Everything held, as (sender, message) in arrival order; the holder is then empty."""
        items = sorted((n, sender, message) for sender, kept in self._held.items() for n, message in kept)
        self._held.clear()
        return [(sender, message) for _, sender, message in items]

    def clear(self) -> None:
        """Forget what is held (the member stopped: it will hear the network again when it restarts)."""
        self._held.clear()

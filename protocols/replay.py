"""Replay protection: which (epoch, sequence number) pairs each sender has used.

A sender's epoch grows at every start (persisted by the daemon) and its
sequence number restarts at 0 in each epoch. A receiver remembers, per
sender, the newest epoch, the highest sequence number and a bitmap of the
``size`` before it, so messages may arrive somewhat out of order but never twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class ReplayWindows:
    """Per sender: the newest epoch, the highest sequence number, and a bitmap of recent ones.

    ``check`` only looks; ``accept`` advances, and is called for accepted
    messages only, so a forged or corrupt message never moves a window.
    """

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._state: dict[str, tuple[int, int, int]] = {}  # sender -> (epoch, highest seq, bitmap)

    def check(self, sender: str, epoch: int, seq: int) -> str | None:
        """None if (epoch, seq) is new for ``sender``, else the reason: old_epoch or replay."""
        state = self._state.get(sender)
        if state is None:
            return None
        current_epoch, highest, bitmap = state
        if epoch < current_epoch:
            return "old_epoch"
        if epoch > current_epoch or seq > highest:
            return None
        behind = highest - seq
        if behind >= self.size or bitmap >> behind & 1:
            return "replay"  # already seen, or too far behind to tell
        return None

    def accept(self, sender: str, epoch: int, seq: int) -> None:
        state = self._state.get(sender)
        if state is None or epoch > state[0]:
            self._state[sender] = (epoch, seq, 1)
            return
        current_epoch, highest, bitmap = state
        if seq > highest:
            shift = seq - highest
            bitmap = 1 if shift >= self.size else ((bitmap << shift) | 1) & ((1 << self.size) - 1)
            self._state[sender] = (current_epoch, seq, bitmap)
        else:
            self._state[sender] = (current_epoch, highest, bitmap | 1 << (highest - seq))

    def export_state(self) -> dict[str, list[int]]:
        return {sender: list(state) for sender, state in self._state.items()}

    def restore_state(self, state: Mapping[str, Sequence[int]]) -> None:
        self._state = {sender: (int(e), int(h), int(b)) for sender, (e, h, b) in state.items()}

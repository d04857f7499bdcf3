"""Replay protection: which (epoch, sequence number) pairs each sender has used.

A sender's epoch grows at every start (persisted by the daemon) and its
sequence number restarts at 0 in each epoch. A receiver remembers, per
sender, the newest epoch, the highest sequence number and a bitmap of the
``size`` before it, so messages may arrive somewhat out of order but never twice.

One accepted message must not silence its sender: a sequence number of 2**62,
once accepted, would make every real one after it look like a replay, and a
far epoch would do so for good. So, when the driver says what time it is
(``now_s``), a jump ahead is bounded by how long the sender has been silent:

* the sequence number may grow by ``seq_slack`` plus ``seq_per_s`` per second
  since the sender's last accepted message (one counter serves all of a
  sender's recipients, so a partition opens legitimate gaps), else ``seq_jump``;
* the epoch (one per process start) by ``epoch_slack`` plus one per second of
  silence, else ``epoch_jump``.

A window restored from a checkpoint has no time yet: its first message is not
bounded (the sender has been silent for as long as we were down).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class ReplayWindows:
    """Per sender: the newest epoch, the highest sequence number, and a bitmap of recent ones.

    ``check`` only looks; ``accept`` advances, and is called for accepted
    messages only, so a forged or corrupt message never moves a window.
    """

    def __init__(self, size: int = 1024, *, seq_slack: int = 1 << 16, seq_per_s: float = 100_000.0,
                 epoch_slack: int = 16) -> None:
        self.size = size
        self.seq_slack = seq_slack
        self.seq_per_s = seq_per_s
        self.epoch_slack = epoch_slack
        self._state: dict[str, tuple[int, int, int]] = {}  # sender -> (epoch, highest seq, bitmap)
        self._heard_s: dict[str, float] = {}  # sender -> when its last message was accepted

    def check(self, sender: str, epoch: int, seq: int, now_s: float | None = None) -> str | None:
        """None if (epoch, seq) is new for ``sender`` (and, given ``now_s``, no implausible jump),
        else the reason: old_epoch, replay, epoch_jump or seq_jump."""
        state = self._state.get(sender)
        if state is None:
            return None
        current_epoch, highest, bitmap = state
        if epoch < current_epoch:
            return "old_epoch"
        heard_s = self._heard_s.get(sender)
        silent_s = None if now_s is None or heard_s is None else max(0.0, now_s - heard_s)
        if epoch > current_epoch:
            if silent_s is not None and epoch - current_epoch > self.epoch_slack + silent_s:
                return "epoch_jump"
            return None
        if seq > highest:
            if silent_s is not None and seq - highest > self.seq_slack + self.seq_per_s * silent_s:
                return "seq_jump"
            return None
        behind = highest - seq
        if behind >= self.size or bitmap >> behind & 1:
            return "replay"  # already seen, or too far behind to tell
        return None

    def accept(self, sender: str, epoch: int, seq: int, now_s: float | None = None) -> None:
        if now_s is not None:
            self._heard_s[sender] = now_s
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
        self._heard_s = {}

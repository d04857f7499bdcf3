"""The status's memory gauges (peer/runtime/memory.py): the current resident memory follows what the
process holds, down as well as up, where the peak only rises."""

from __future__ import annotations

from peer.runtime.memory import peak_mib, resident_mib

HELD_MIB = 64


def test_resident_memory_follows_what_is_held_and_the_peak_only_rises() -> None:
    before = resident_mib()
    held = bytearray(HELD_MIB * 2 ** 20)          # zero-filled: every page touched
    held[::4096] = b"\x01" * len(held[::4096])
    during = resident_mib()
    peak_during = peak_mib()
    del held
    after = resident_mib()
    assert during - before >= 0.8 * HELD_MIB, (before, during)
    assert peak_during >= during - 1
    assert after < during - 0.5 * HELD_MIB, (during, after)     # given back: the current one falls
    assert peak_mib() >= peak_during                              # the peak does not

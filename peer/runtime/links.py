"""The daemon's bounds on its links: how long a stalled send may hold it, and a heartbeat's latency.

Pure functions of the config and the clocks handed in; why the stall timeout is
bounded by the round deadline is in docs/design/daemon.md.
"""

from __future__ import annotations

import dataclasses

from peer.net.transport_config import TransportConfig

MAX_LATENCY_MS = 3_600_000.0   # a heartbeat "older" than an hour says the sender's clock is wrong
CLOCK_SKEW_MS = 1000.0     # clocks of different hosts may disagree this much without being absurd


def transport_config(transport: TransportConfig, deadline_s: float) -> TransportConfig:
    """``[transport]`` with ``stall_timeout_s`` at most the round deadline (``[network.gossip]
    deadline_s``): how long the loop waits for its zero-copy sends to a neighbour whose connection
    moves no byte before it may change a tensor; a slow link that moves bytes is waited for up to
    ``send_timeout_s``."""
    return dataclasses.replace(transport, stall_timeout_s=min(transport.stall_timeout_s, deadline_s))


def heartbeat_latency_ms(sent_at_s: float, now_s: float) -> float | None:
    """One-way latency of a heartbeat stamped ``sent_at_s`` (wall clock), or None when the stamp is
    absurd: NaN, infinite, more than ``CLOCK_SKEW_MS`` in the future, or more than ``MAX_LATENCY_MS``
    ago (a peer sent it). Hosts' clocks differ a little, so a stamp slightly ahead reads as 0 ms."""
    try:
        latency_ms = (now_s - float(sent_at_s)) * 1000.0
    except OverflowError:       # an int stamp too large for a float
        return None
    if not -CLOCK_SKEW_MS <= latency_ms <= MAX_LATENCY_MS:    # also False for NaN
        return None
    return max(latency_ms, 0.0)

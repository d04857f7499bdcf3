"""What an edge client waits for, in words: its console line, its status and its log.

Why: "waiting for a round" for two minutes, then an exit, tells an operator nothing. The edge
says which of its waits it is in, most urgent first:

- ``no connection to gw0 at tcp://10.0.0.5:7001 for 30 s (refused)``: no completed handshake with
  its gateway, the reason from the socket's monitor (peer/net/reach.py). Said as a log warning
  once the outage has lasted one heartbeat interval, then each time its length doubles (at least
  every :data:`REPEAT_MAX_S`), and once more when the connection comes (how long it took);
- ``connected to gw0; waiting for its answer``: connected, nothing heard from the gateway yet
  (the gateway registers a client when it hears its heartbeat, and answers it);
- ``registered; not sampled since round 12 (fraction 0.2)``: heard, not asked into a round since
  the one it last trained (FedBuff: ``not asked since model version 12 (concurrency 10)``).

The duration in the first is the one last said in the log: the status and the console line
change when the log does, not every second (a plain console line is printed at each change).
"""

from __future__ import annotations

from protocols.federation.config import FederationConfig

REPEAT_MAX_S = 30.0     # a lasting outage is said again at least this often


def seconds(value_s: float) -> str:
    """A duration as the wait lines give it: ``0.5 s``, ``12 s``."""
    return f"{value_s:.1f} s" if value_s < 10 else f"{value_s:.0f} s"


class GatewayWait:
    """The words of one edge client's waits for its gateway, and when an outage is said again."""

    def __init__(self, *, gateway: str, address: str, federation: FederationConfig,
                 heartbeat_interval_s: float) -> None:
        self.gateway = gateway
        self.address = address
        self.federation = federation
        self.first_s = heartbeat_interval_s     # an outage is said once it lasted this long
        self.said_s: float | None = None        # the current outage's length when it was last said

    def outage(self, down_for_s: float, reason: str) -> str:
        return f"no connection to {self.gateway} at {self.address} for {seconds(down_for_s)} ({reason})"

    def outage_line(self, *, up: bool, down_for_s: float, reason: str) -> str | None:
        """The log line due now about the connection, if any: an outage that reached its next
        length to be said, or the end of one that was said (``down_for_s``: then, its length)."""
        if up:
            if self.said_s is None:
                return None
            self.said_s = None
            return f"connected to {self.gateway} at {self.address} after {seconds(down_for_s)} without"
        if down_for_s < self.next_line_s():
            return None
        self.said_s = down_for_s
        return self.outage(down_for_s, reason)

    def next_line_s(self) -> float:
        """The outage's length at which it is said next."""
        return self.first_s if self.said_s is None else min(2 * self.said_s, self.said_s + REPEAT_MAX_S)

    def note(self, *, up: bool, reason: str, heard: bool, last_round: int) -> str:
        """What the client waits for now (its status's ``waiting_for``, its console line's note)."""
        if not up:
            if self.said_s is None:
                return f"connecting to {self.gateway} at {self.address}"
            return self.outage(self.said_s, reason)
        if not heard:
            return f"connected to {self.gateway}; waiting for its answer"
        return self.unsampled(last_round)

    def unsampled(self, last_round: int) -> str:
        """``registered; not sampled since round 12 (fraction 0.2)``; ``last_round`` -1: never."""
        if self.federation.has_rounds:
            since = "yet" if last_round < 0 else f"since round {last_round}"
            return f"registered; not sampled {since} (fraction {self.federation.fraction:g})"
        since = "yet" if last_round < 0 else f"since model version {last_round}"
        return f"registered; not asked {since} (concurrency {self.federation.concurrency})"

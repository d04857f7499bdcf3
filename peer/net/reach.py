"""Whether a dialing socket has a connection, and if not, since when and why, from its monitor.

Why: an edge client that cannot reach its gateway must say so in words ("no connection to gw0 at
tcp://10.0.0.5:7001 for 30 s (refused)"), not wait in silence. libzmq retries a failed connect on
its own and never returns the errno, but its monitor tells each attempt's story, and that is
enough to tell the cases an operator acts on:

- ``refused``: an attempt (``CONNECT_DELAYED``) ended without a connection within
  :data:`SLOW_S` (a reset: nothing listens at the address, or a firewall rejects);
- ``no route``: ``connect()`` failed at once (``CONNECT_RETRIED`` with no attempt under way: no
  route to the network), or an attempt failed after :data:`SLOW_S` or more (an unreachable
  host's ARP or ICMP answer);
- ``no answer``: an attempt under way for :data:`SLOW_S` with no answer (a firewall that drops);
- ``no answer to the handshake``: TCP connected, no ZMTP/CurveZMQ handshake within :data:`SLOW_S`;
- ``handshake refused (...)``: the listener's admission refused our key (``auth``), or the
  handshake failed otherwise (``protocol``, ``no detail``: a wrong server key, or not ZeroMQ).

A completed handshake is the connection (:attr:`Reach.up`); losing it starts a new outage
(``connection lost``). Pure: events and times come in (monotonic seconds), words come out, so a
test drives it with made-up events.
"""

from __future__ import annotations

import zmq

SLOW_S = 1.0     # an attempt longer than this is not a reset: a round trip takes milliseconds
# the events Reach reads beyond those peer/net/handshakes.py watches anyway
DIAL_EVENTS = zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED
_HANDSHAKE_FAILED: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "handshake refused (our key is not admitted there)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake failed (protocol)",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed (no detail: a wrong server key, or not a hivemesh"
                                          " gateway)"}


class Reach:
    """One dialing socket's connection (and its replacements'), from monitor events."""

    def __init__(self, now_s: float) -> None:
        self.up = False
        self.down_since_s = now_s      # when the current outage began (the dial, or the connection's loss)
        self.last_outage_s = 0.0       # how long the outage before the current connection lasted
        self._reason = ""              # the last attempt's outcome ("" before any ended)
        self._attempt_s: float | None = None    # an attempt under way since (CONNECT_DELAYED)
        self._tcp_s: float | None = None        # TCP connected since, handshake not done

    def event(self, event: int, now_s: float) -> None:
        """One monitor event, at ``now_s``."""
        if event == zmq.EVENT_CONNECT_DELAYED:
            self._attempt_s = now_s
        elif event == zmq.EVENT_CONNECTED:
            self._attempt_s, self._tcp_s = None, now_s
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if not self.up:
                self.last_outage_s = now_s - self.down_since_s
            self.up, self._reason, self._tcp_s = True, "", None
        elif event in _HANDSHAKE_FAILED:
            self._reason, self._tcp_s = _HANDSHAKE_FAILED[event], None
        elif event == zmq.EVENT_DISCONNECTED:
            self._tcp_s = None
            if self.up:
                self.up, self.down_since_s, self._reason = False, now_s, "connection lost"
        elif event == zmq.EVENT_CONNECT_RETRIED:
            self._connect_failed(now_s)

    def _connect_failed(self, now_s: float) -> None:
        if self._reason.startswith("handshake") and self._attempt_s is None:
            return      # the retry after a failed handshake: that failure is the reason
        if self._attempt_s is None:
            self._reason = "no route"           # connect() itself failed
        else:
            self._reason = "refused" if now_s - self._attempt_s < SLOW_S else "no route"
        self._attempt_s = None

    def reason(self, now_s: float) -> str:
        """Why there is no connection, in words ("" while there is one)."""
        if self.up:
            return ""
        if self._attempt_s is not None and now_s - self._attempt_s >= SLOW_S:
            return "no answer"
        if self._tcp_s is not None and now_s - self._tcp_s >= SLOW_S:
            return "no answer to the handshake"
        return self._reason or "dialing"

    def down_for_s(self, now_s: float) -> float:
        """How long the current outage has lasted (0 while connected)."""
        return 0.0 if self.up else max(0.0, now_s - self.down_since_s)

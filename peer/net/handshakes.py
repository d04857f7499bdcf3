"""The handshakes of a socket that dials out, from its monitor: counted, and when a refusal is redialed.

Why: libzmq (4.3.5) never retries a connection whose CurveZMQ handshake failed: the refusal is a
protocol error, which ends the connection's session for good. The side that dialed must dial
afresh (a new socket) itself. Who refuses: the listener's ZAP did not admit our key yet (it had not
read the roster version that adds us, as when members apply a new version at different moments),
or no longer (we were revoked), or it shed us mid-handshake under a burst of strangers.

One :class:`HandshakeWatch` follows one dialing socket and those that replace it: an edge
client's DEALER (peer/net/dial.py) and each of a peer's outboxes (peer/net/transport.py). Each
refusal is counted by reason (``auth``: the listener's admission said no; ``protocol`` and
``no_detail``: the rest) and sets a redial time, ``reconnect_ms`` doubling with each refusal in a
row up to ``reconnect_max_ms`` (:func:`refusal_backoff_ms`): a removed member knocks at most once
per ``reconnect_max_ms``, a joiner admitted a moment later is in within one backoff step. A
completed handshake resets the doubling. The owner drains the watch, asks :meth:`redial_due`, and
makes the new socket (attached with :meth:`attach` before it connects, so no event is missed).
The old socket's monitor is stopped before our end of it is closed (:meth:`detach` says why: the
other order can block the context's I/O thread for good), and each monitor has an endpoint of its
own (:func:`monitor_endpoint`), never one named after a file descriptor that a new socket may reuse.
The watch also follows which descriptor carries the socket's connection (``fd``): libzmq allows
one monitor per socket, and peer/net/progress.py reads that connection's progress from it. A
socket closed mid-connect (an outbox redialed across a cut) emits ``EVENT_CLOSED``, so with these
events watched the order in :meth:`detach` is what keeps a redial across a cut from freezing the
context.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from peer.net.transport_config import TransportConfig

REFUSED: dict[int, str] = {zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",   # the listener's ZAP said no
                           zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
                           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "no_detail"}
# the connection's own events: which descriptor carries it now (peer/net/progress.py reads it)
CONNECTION = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | sum(REFUSED) | CONNECTION
_ENDPOINTS = itertools.count()    # each monitor's own inproc endpoint (see monitor_endpoint)


def monitor_endpoint(kind: str) -> str:
    """A fresh inproc endpoint for a socket monitor, never used before in this process.

    Why not pyzmq's default (``inproc://monitor.s-<the socket's FD>``): a closed socket's monitor
    endpoint is released asynchronously (by libzmq's reaper), and a new socket may already have
    that FD number: its monitor would then fail to bind (EADDRINUSE)."""
    return f"inproc://hivemesh-monitor-{kind}-{next(_ENDPOINTS)}"


def refusal_backoff_ms(config: TransportConfig, refusals_before: int) -> int:
    """How long after a refused handshake the socket is dialed again, given the refusals in a row
    before it: ``reconnect_ms`` doubling up to ``reconnect_max_ms`` (ZeroMQ's own backoff, which it
    skips for a refused handshake)."""
    return min(config.reconnect_ms * 2 ** min(refusals_before, 30), config.reconnect_max_ms)


class HandshakeWatch:
    """The monitor of one dialing socket (and of each that replaces it). Single-threaded."""

    def __init__(self, config: TransportConfig, refused: Counter[str], *,
                 observe: Callable[[int, float], None] | None = None, also: int = 0) -> None:
        """``refused``: where refusals are counted, by reason (a transport may share one among its
        sockets). ``observe(event, now_s)``: each event drained, ``also`` the events it needs
        beyond those watched here (an edge's peer/net/reach.py)."""
        self.config = config
        self.refused = refused
        self._observe = observe
        self._events = WATCHED | also
        self.handshakes = 0     # completed (a listener's restart makes a new one)
        self.monitor: zmq.Socket | None = None   # for the owner's poller: readable when an event came
        self._watched: zmq.Socket | None = None  # the socket the monitor watches
        self._refusals_in_row = 0
        self._redial_at_s: float | None = None   # a refused handshake: dial afresh then
        # the descriptor of the socket's current TCP connection (libzmq's; read, never used to
        # send): None before one is up and once it is gone
        self.fd: int | None = None

    def attach(self, sock: zmq.Socket) -> None:
        """Watch ``sock`` (a fresh one, not yet connected) in place of the socket before it."""
        self.detach()
        self.monitor = sock.get_monitor_socket(self._events, addr=monitor_endpoint("dial"))
        self._watched = sock
        self._redial_at_s = None
        self.fd = None

    def detach(self) -> None:
        """Stop monitoring, then close our end of the monitor (before its socket is closed).
        Idempotent.

        The order matters. libzmq sends each event on its own end of the monitor (a PAIR) with a
        blocking send, from the context's I/O thread. Were our end closed first, an event of the
        socket still alive (its own reconnect's handshake ending, as after a shed connection)
        would find no peer and block that I/O thread for good: no socket of the context would
        connect or handshake again (a redialing edge client stuck until its gateway timeout).
        Stopping the monitor first closes libzmq's end under the lock its events are sent under."""
        if self._watched is not None:
            if not self._watched.closed:
                with contextlib.suppress(zmq.ZMQError):     # (the context is going away)
                    self._watched.disable_monitor()
            self._watched = None
        if self.monitor is not None:
            self.monitor.close(linger=0)
            self.monitor = None
        self.fd = None

    def drain(self, now_s: float) -> None:
        """Take the events that came (a handshake makes one or two): count them, set the redial time."""
        while self.monitor is not None and self.monitor.poll(0):
            message = recv_monitor_message(self.monitor, flags=zmq.NOBLOCK)
            event, value = message["event"], message["value"]
            if self._observe is not None:
                self._observe(event, now_s)
            if event == zmq.EVENT_CONNECTED:
                self.fd = value
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                if value == self.fd:
                    self.fd = None
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshakes += 1
                self._refusals_in_row = 0
                self._redial_at_s = None
            elif event in REFUSED:
                self.refused[REFUSED[event]] += 1
                backoff_ms = refusal_backoff_ms(self.config, self._refusals_in_row)
                self._refusals_in_row += 1
                self._redial_at_s = now_s + backoff_ms / 1000

    @property
    def redial_at_s(self) -> float | None:
        """When a refused handshake is to be dialed afresh (monotonic seconds); None: no refusal."""
        return self._redial_at_s

    def redial_due(self, now_s: float) -> bool:
        return self._redial_at_s is not None and now_s >= self._redial_at_s

    def stale(self, now_s: float, dialed_s: float) -> bool:
        """Whether a socket that could not queue a message is to be dialed afresh (dialed at
        ``dialed_s``): it has had no connection for ``reconnect_max_ms``, the fallback where no
        refused handshake told us sooner. A socket with a connection whose queue is full has a
        slow receiver, not a stale dial: a redial would drop every message it holds, uncounted
        (small frames are copied, so no tracker shows them)."""
        self.drain(now_s)
        return self.fd is None and now_s - dialed_s >= self.config.reconnect_max_ms / 1000

"""ZeroMQ transport for an edge client: one DEALER dialled out to its gateway, nothing listening.

Why: an edge device sits behind NAT or a firewall, so it cannot be dialled.
It opens the one connection itself and its gateway answers on it
(peer/net/transport.py ``Transport.reply``, by the connection's ROUTER
routing id). ZeroMQ redials after the gateway restarts (``reconnect_ms``
doubling to ``reconnect_max_ms``); the gateway learns the new connection from
the client's next accepted message (its heartbeat), never from an unverified one.

A refused handshake is libzmq's sharp edge: it never retries a connection
whose CurveZMQ handshake failed (the gateway's ZAP refused our key: it had not
read the roster version that adds us yet, or we were removed; or it shed us
mid-handshake under a burst of strangers). So the socket's monitor
(peer/net/handshakes.py, shared with a peer's outboxes) is drained at each poll
and send: a failed handshake is counted by reason (``handshake_refused``) and
the socket is dialed afresh after a backoff of its own, ``reconnect_ms``
doubling with each refusal in a row up to ``reconnect_max_ms`` (a removed client
knocks at most once per ``reconnect_max_ms``; a joiner whose gateway admits it
a moment later is in within one backoff step, not after ZeroMQ's ceiling); a
completed handshake resets it. Without any handshake event (nothing answers at the address), a send
that finds no connection for ``reconnect_max_ms`` still dials afresh. The same events say whether
there is a connection, and if not since when and why (:attr:`DialTransport.reach`,
peer/net/reach.py: refused, no route, no answer).

The bounds are the peer transport's: single-frame wire messages (a
multipart arrival is hostile, counted and dropped), ``MAXMSGSIZE`` per frame,
``RCVHWM``/``SNDHWM`` per connection, a cap per poll; zero-copy sends are
tracked and :meth:`DialTransport.wait_sent` blocks until ZeroMQ released them.
:meth:`DialTransport.listening` says what this transport listens on: nothing
(a process test checks the same in ``/proc/net/tcp``).
"""

from __future__ import annotations

import time
from collections import Counter

import zmq

from peer.net.contexts import new_context, terminate
from peer.net.handshakes import HandshakeWatch
from peer.net.reach import DIAL_EVENTS, Reach
from peer.net.transport import POLL_BYTES, Arrival, Frames, TransportError, link_options
from peer.net.transport_config import TransportConfig

GATEWAY = b"gateway"  # the connection every arrival comes on (there is only one)


class DialTransport:
    """An edge client's one connection. Single-threaded, like :class:`peer.net.transport.Transport`."""

    def __init__(self, address: str, *, config: TransportConfig | None = None,
                 curve: tuple[bytes, bytes, bytes] | None = None) -> None:
        """``curve``: (our public key, our secret key, the gateway's public key), Z85, for CurveZMQ."""
        self.config = config or TransportConfig()
        self.address = address
        self._context = new_context()      # ours: terminated by close (or by __init__ failing)
        self._closed = False
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0
        self.dropped: Counter[str] = Counter()    # "unreachable" (no live connection) or "abandoned"
        self.hostile: Counter[str] = Counter()
        self._pending: list[zmq.MessageTracker] = []
        self._curve = curve
        self.redialed = 0      # sockets replaced: after a refused handshake, or no connection for a while
        self.handshake_refused: Counter[str] = Counter()   # by reason (peer/net/handshakes.py)
        self.reach = Reach(time.monotonic())   # whether it has a connection, and if not why, in words
        self._handshakes = HandshakeWatch(self.config, self.handshake_refused, observe=self.reach.event,
                                          also=DIAL_EVENTS)
        try:
            self._socket = self._dial()
        except BaseException:
            terminate(self._context)
            raise

    def _dial(self) -> zmq.Socket:
        self._dialed_s = time.monotonic()
        sock, cfg = self._context.socket(zmq.DEALER), self.config
        try:
            self._handshakes.attach(sock)   # before connect: no event is missed
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, cfg.reconnect_ms)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, cfg.reconnect_max_ms)
            for option, value in link_options(cfg).items():
                sock.setsockopt(option, value)
            sock.setsockopt(zmq.MAXMSGSIZE, cfg.max_frame_bytes)
            sock.setsockopt(zmq.RCVHWM, cfg.high_water_mark)
            sock.setsockopt(zmq.SNDHWM, cfg.high_water_mark)
            sock.setsockopt(zmq.IMMEDIATE, 1)    # no connection: a send fails now (counted), not queued
            if self._curve is not None:
                sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = self._curve
            try:
                sock.connect(self.address)
            except zmq.ZMQError as error:
                raise TransportError(f"bad gateway address {self.address!r}: {error.strerror}") from None
        except BaseException:
            self._close_socket(sock)
            raise
        return sock

    def _close_socket(self, sock: zmq.Socket) -> None:
        self._handshakes.detach()
        sock.close(linger=0)

    @property
    def handshakes(self) -> int:
        """Handshakes completed (a gateway restart makes a new one)."""
        return self._handshakes.handshakes

    def _watch(self) -> None:
        """Drain the socket's monitor, and dial afresh once a refused handshake's backoff is over."""
        self._handshakes.drain(time.monotonic())
        if self._handshakes.redial_due(time.monotonic()) and not self._pending:
            self._redial()

    def _redial(self) -> None:
        self._close_socket(self._socket)
        self._socket = self._dial()
        self.redialed += 1

    def listening(self) -> tuple[str, ...]:
        """The addresses this transport listens on: none (an edge client only dials out)."""
        return ()

    def send(self, frames: Frames) -> bool:
        """Queue ``frames`` to the gateway, each a single-frame message, in order, without copying;
        False when there is no live connection or the queue stays full until the send timeout."""
        parts = list(frames)
        if not parts:
            raise ValueError("a message needs at least one frame")
        self._watch()
        deadline = time.monotonic() + self.config.send_timeout_s
        for index, part in enumerate(parts):
            while True:
                try:
                    tracker = self._socket.send(part, flags=zmq.NOBLOCK, copy=False, track=True)
                    break
                except zmq.Again:
                    left_ms = int(1000 * (deadline - time.monotonic()))
                    if index > 0 and left_ms > 0 and self._socket.poll(left_ms, zmq.POLLOUT):
                        continue
                    # nothing of it queued (the first frame), or a message cut short: the gateway's
                    # assembly releases the part it got when the connection goes quiet
                    self.dropped["unreachable" if index == 0 else "abandoned"] += 1
                    if index == 0:
                        self._redial_if_stale()
                    return False
            if tracker is not None and not tracker.done:
                self._pending.append(tracker)
        self.bytes_sent += sum(memoryview(f).nbytes for f in parts)
        self.messages_sent += 1
        return True

    def _redial_if_stale(self) -> None:
        """Dial afresh after ``reconnect_max_ms`` without a connection (``HandshakeWatch.stale``), as
        peer/net/transport.py's outboxes do (see the module docstring)."""
        if self._pending or not self._handshakes.stale(time.monotonic(), self._dialed_s):
            return
        self._redial()

    def pending_sends(self) -> int:
        self._pending = [t for t in self._pending if not t.done]
        return len(self._pending)

    def wait_sent(self, timeout_s: float | None = None) -> None:
        """Block until ZeroMQ holds no frame of ours (at most ``timeout_s``, default the send timeout;
        then they are given up on and counted ``abandoned``: a frame changed later fails its digest
        at the gateway, it cannot hurt anybody else)."""
        deadline = time.monotonic() + (self.config.send_timeout_s if timeout_s is None else timeout_s)
        while self._pending:
            try:
                self._pending[-1].wait(max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                self.dropped["abandoned"] += len(self._pending)
                self._pending.clear()
                return
            self._pending.pop()

    def poll(self, timeout_s: float) -> list[Arrival]:
        """Wait up to ``timeout_s`` for frames from the gateway; at most ``max_messages_per_poll``
        frames or :data:`POLL_BYTES` bytes, each with the one connection's id."""
        received: list[Arrival] = []
        if not self._wait(timeout_s):
            return received
        drained = 0
        while len(received) < self.config.max_messages_per_poll and drained < POLL_BYTES:
            try:
                parts = self._socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            size = sum(len(f) for f in parts)
            self.bytes_received += size
            drained += size
            if len(parts) != 1:
                self.hostile["multipart"] += 1   # the wire is single-frame
                continue
            self.messages_received += 1
            received.append(Arrival(GATEWAY, parts[0]))
        return received

    def _wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a frame, watching the handshakes meanwhile (a refusal's redial
        is made when due, not at the next send); whether one is there."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._watch()
            left_s = deadline - time.monotonic()
            redial_at_s = self._handshakes.redial_at_s
            if redial_at_s is not None and not self._pending:    # wake for the redial
                left_s = min(left_s, redial_at_s - time.monotonic())
            poller = zmq.Poller()
            poller.register(self._socket, zmq.POLLIN)
            if self._handshakes.monitor is not None:
                poller.register(self._handshakes.monitor, zmq.POLLIN)
            ready = dict(poller.poll(max(0, int(left_s * 1000))))
            if self._socket in ready:
                return True
            if not ready and time.monotonic() >= deadline:
                self._watch()
                return False

    def close(self) -> None:
        """Close the socket without lingering and terminate this transport's context. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_socket(self._socket)
        terminate(self._context)

    def __enter__(self) -> DialTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

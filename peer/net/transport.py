"""ZeroMQ transport for one peer: a ROUTER to receive, a DEALER per neighbour to send.

One inbox anybody may reach (ROUTER, bound at the member's address) and one
outbox per neighbour (DEALER) whose bounded queue and reconnect state are that
neighbour's alone; ``IMMEDIATE`` makes a send with no live connection fail at once
(``unreachable``). Every ZeroMQ message on the wire is a single frame, bounded by
``MAXMSGSIZE``; a multipart arrival is counted and dropped; ``RCVHWM``/``SNDHWM``
and a cap per poll bound the rest. Which frames are accepted is the protocol's
business (protocols/assembly.py).

- Zero-copy sends are tracked (``wait_sent``); one pending past ``send_timeout_s``,
  or ``stall_timeout_s`` once the link acknowledges nothing (peer/net/progress.py),
  is abandoned by closing that neighbour's socket.
- While it waits it hands arrivals to ``while_waiting``, so two peers sending
  large models to each other never deadlock.
- Admission (peer/net/admission.py): ZAP admits the roster's transport keys
  (``allow``, ``punish``, ``connection_key``); refused handshakes are redialed
  after a backoff (peer/net/handshakes.py).
- :meth:`Transport.reply` answers on the caller's connection (peer/runtime/routes.py);
  ``reserve_listeners`` binds port 0 and keeps the socket (``listen_fd``).
- ``close`` ends everything; its context cannot hang (peer/net/contexts.py).

With admission.py, handshakes.py and dial.py, the only modules that touch
sockets; they know nothing of messages or algorithms. Why: docs/design/transport.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import zmq

from peer.net.admission import ConnectionMonitor, Gate, shut_down
from peer.net.contexts import new_context, terminate
from peer.net.handshakes import HandshakeWatch
from peer.net.progress import acked_bytes, peer_of
from peer.net.reach import DIAL_EVENTS, Reach
from peer.net.transport_config import WIRE_FRAME_LIMIT_BYTES, TransportConfig
from protocols.errors import HivemeshError

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

Frames = Sequence[bytes | bytearray | memoryview]

# a poll hands over at most about this many bytes (four of the largest frames): what the driver holds
# at once while it feeds them to the assembly stays small, however many are queued
POLL_BYTES = 4 * WIRE_FRAME_LIMIT_BYTES
# while a send is waited for, its connection's progress is looked at this often
PROGRESS_LOOK_S = 0.2
# and, with a while_waiting callback, the inbox this often (a frame released wakes the wait at once)
INBOX_LOOK_S = 0.005
# closed inbound connections kept for closed_connections between calls (a driver that never asks)
CLOSED_KEPT = 1024


@dataclass(frozen=True, kw_only=True)
class CurveKeys:
    """CurveZMQ transport encryption: our key pair, the neighbours' server keys, the allowlist.

    Keys are the Z85-encoded 40-byte strings ZeroMQ uses.
    """

    public_key: bytes
    secret_key: bytes
    server_keys: Mapping[str, bytes]                 # neighbour name -> its public key
    allowed_client_keys: frozenset[bytes] = field(default_factory=frozenset)  # the roster


@dataclass(frozen=True)
class Arrival:
    """One single-frame message off the inbox and the connection it came on (the ROUTER's
    routing id: frames of one connection arrive in the order they were sent)."""

    connection: bytes
    frame: zmq.Frame


# what takes the frames that arrive while the transport waits for its sends: False once it takes no more
WhileWaiting = Callable[[list[Arrival]], bool]


@dataclass
class _Outbox:
    address: str
    socket: zmq.Socket
    watch: HandshakeWatch      # the socket's handshakes, and those of each socket that replaces it
    reach: Reach               # whether it has a connection, and if not since when and why (fed by watch)
    pending: list[zmq.MessageTracker] = field(default_factory=list)
    dialed_s: float = field(default_factory=time.monotonic)   # when this socket was connected

    def acked_bytes(self) -> int | None:
        """Our bytes the kernel acknowledged on this socket's current connection (None: none up)."""
        self.watch.drain(time.monotonic())
        return acked_bytes(self.watch.fd, peer_of(self.address))


class _Progress:
    """How long one outbox's sends are waited for: until ``give_up_s``, and while the kernel
    acknowledged some of its bytes (or ZeroMQ released a frame) within ``stall_s``."""

    def __init__(self, outbox: _Outbox, *, give_up_s: float, stall_s: float) -> None:
        self.outbox, self.give_up_s, self.stall_s = outbox, give_up_s, stall_s
        self.moved_s = time.monotonic()
        self.acked = outbox.acked_bytes()

    def moved(self) -> None:
        self.moved_s = time.monotonic()

    def next_look_s(self) -> float:
        """Seconds to block before looking at the connection again."""
        now = time.monotonic()
        return max(0.0, min(self.give_up_s, self.moved_s + self.stall_s, now + PROGRESS_LOOK_S) - now)

    def stuck(self) -> bool:
        """True once the wait is over: past ``give_up_s``, or nothing moved for ``stall_s``. A
        reading from another connection than the last (a reconnect) is no progress: the new one's
        count starts afresh."""
        acked = self.outbox.acked_bytes()
        if acked is not None and self.acked is not None and acked > self.acked:
            self.moved()
        self.acked = acked
        now = time.monotonic()
        return now >= self.give_up_s or now >= self.moved_s + self.stall_s


class Transport:
    """A peer's sockets. Single-threaded: call every method from the driver's thread."""

    def __init__(self, *, listen: str, neighbours: Mapping[str, str],
                 config: TransportConfig | None = None, curve: CurveKeys | None = None,
                 context: zmq.Context | None = None, listen_fd: int | None = None,
                 while_waiting: WhileWaiting | None = None) -> None:
        """``listen_fd``: a TCP socket already bound to ``listen`` and listening (see
        ``reserve_listeners``); the transport owns that descriptor from then on (closed on failure
        too). ``context``: a context the caller owns and terminates; by default the transport makes
        its own (peer/net/contexts.py) and terminates it in :meth:`close`. ``while_waiting``: takes
        the frames that arrive while a send is waited for (the module docstring); without it they
        stay queued, and two such peers exchanging large messages wait for each other.

        A failure part way (an address in use, a neighbour without a key) closes whatever was
        opened, stops the threads started and terminates the transport's own context before it
        raises: nothing is left for the garbage collector."""
        self.config = config or TransportConfig()
        self._while_waiting = while_waiting
        self._wait_full = False     # while_waiting declined more frames during the current wait
        self._curve = curve
        self._server_keys: dict[str, bytes] = dict(curve.server_keys) if curve is not None else {}
        # the ZAP handler (its own thread) asks the gate; ``allow`` and ``punish`` change it
        self._gate = Gate(curve.allowed_client_keys if curve is not None else frozenset())
        self.bytes_sent = 0
        self.bytes_sent_to: Counter[str] = Counter()    # by neighbour; sums to bytes_sent
        self.bytes_received = 0
        self.bytes_replied = 0      # of bytes_sent: on inbound connections (reply), not to neighbours
        self.messages_sent: Counter[str] = Counter()
        self.messages_received = 0
        self.dropped: Counter[str] = Counter()      # by neighbour: unreachable or queue full
        self.abandoned: Counter[str] = Counter()    # by neighbour: send still pending after its timeout
        self.hostile: Counter[str] = Counter()      # arrivals the single-frame wire never sends, by kind
        self.redialed: Counter[str] = Counter()     # by neighbour: sockets replaced, refused or no connection
        self.handshake_refused: Counter[str] = Counter()   # our outboxes' refused handshakes, by reason
        port = listen.rsplit(":", 1)[-1]
        self._port = int(port) if port.isdigit() else None     # the local port of our connections
        self.replies_dropped: Counter[str] = Counter()  # replies not sent: "gone" (connection closed), "full"
        self._replies: list[zmq.MessageTracker] = []     # zero-copy reply frames still held by ZeroMQ
        self._seen_on: dict[int, list[bytes]] = {}       # descriptor -> connections seen on it, oldest first
        self._closing: set[bytes] = set()       # closed, and their last frames may still be queued
        self._gone: deque[bytes] = deque(maxlen=CLOSED_KEPT)    # closed, every frame read
        self._closed = False
        self._authenticator: ThreadAuthenticator | None = None
        self._listen_fd: int | None = None
        with contextlib.ExitStack() as undo:     # what to close if a step below fails, in reverse
            try:
                self._own_context = context is None
                self._context = context or new_context()
                if self._own_context:
                    undo.callback(terminate, self._context)     # last: once every socket is closed
                if curve is not None:
                    self._authenticator = _start_authenticator(self._context, self._gate)
                    undo.callback(self._authenticator.stop)
                # a rotation of our CURVE key binds the inbox afresh: a copy of a listening socket
                # handed to us is kept for that, since whoever handed it over may still hold the port
                if listen_fd is not None:
                    self._listen_fd = os.dup(listen_fd)
                    undo.callback(self._close_listen_fd)
            except BaseException:
                if listen_fd is not None:       # ours from the start; _open_inbox takes it from here
                    os.close(listen_fd)
                raise
            self._inbox, self._monitor = self._open_inbox(listen, listen_fd)
            undo.callback(self._inbox.close, 0)
            undo.callback(self._monitor.stop)
            self.listen = listen
            self._outboxes: dict[str, _Outbox] = {}
            for name, address in sorted(neighbours.items()):
                self._outboxes[name] = self._open_outbox(name, address)
                undo.callback(self._close_outbox, self._outboxes[name])
            undo.pop_all()      # all open: from now on close() closes them

    # ------------------------------------------------------------- sockets

    def _open_inbox(self, listen: str, listen_fd: int | None) -> tuple[zmq.Socket, ConnectionMonitor]:
        """The ROUTER every member sends to, bound at ``listen``, with its connection monitor."""
        try:
            inbox = self._context.socket(zmq.ROUTER)
        except BaseException:
            if listen_fd is not None:
                os.close(listen_fd)
            raise
        monitor: ConnectionMonitor | None = None
        try:
            self._configure(inbox)
            # a reply to a connection that closed fails at once (counted) instead of vanishing silently
            inbox.setsockopt(zmq.ROUTER_MANDATORY, 1)
            monitor = ConnectionMonitor(inbox, self._gate, local_port=self._port,
                                        curve=self._curve is not None,
                                        max_handshaking=self.config.max_handshaking_connections)
            inbox.setsockopt(zmq.MAXMSGSIZE, self.config.max_frame_bytes)
            inbox.setsockopt(zmq.RCVHWM, self.config.receive_high_water_mark)
            if self._curve is not None:
                inbox.curve_server = True
                inbox.curve_secretkey = self._curve.secret_key
                inbox.curve_publickey = self._curve.public_key
            if listen_fd is not None:
                inbox.setsockopt(zmq.USE_FD, listen_fd)
            try:
                inbox.bind(listen)
            except zmq.ZMQError as error:
                raise TransportError(f"cannot listen on {listen}: {error.strerror}") from None
        except BaseException:
            if monitor is not None:
                monitor.stop()
            inbox.close(linger=0)
            if listen_fd is not None:       # never bound: still ours
                os.close(listen_fd)
            raise
        return inbox, monitor

    def _configure(self, sock: zmq.Socket) -> None:
        """Lingering, reconnecting and the kernel's probing of the link (:func:`link_options`)."""
        cfg = self.config
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, cfg.reconnect_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, cfg.reconnect_max_ms)
        for option, value in link_options(cfg).items():
            sock.setsockopt(option, value)

    def _open_outbox(self, name: str, address: str) -> _Outbox:
        reach = Reach(time.monotonic())
        watch = HandshakeWatch(self.config, self.handshake_refused, observe=reach.event, also=DIAL_EVENTS)
        return _Outbox(address, self._connect(name, address, watch), watch, reach)

    @staticmethod
    def _close_outbox(outbox: _Outbox) -> None:
        outbox.watch.detach()      # the monitor first: it watches the socket
        outbox.socket.close(linger=0)

    def _connect(self, name: str, address: str, watch: HandshakeWatch) -> zmq.Socket:
        sock = self._context.socket(zmq.DEALER)
        self._configure(sock)
        sock.setsockopt(zmq.SNDHWM, self.config.high_water_mark)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        if self._curve is not None:
            server_key = self._server_keys.get(name)
            if server_key is None:
                sock.close(linger=0)
                raise TransportError(f"no CurveZMQ public key for neighbour {name!r}")
            sock.curve_publickey = self._curve.public_key
            sock.curve_secretkey = self._curve.secret_key
            sock.curve_serverkey = server_key
        try:
            watch.attach(sock)      # before connect: no event is missed
            sock.connect(address)
        except BaseException as error:
            watch.detach()
            sock.close(linger=0)
            if isinstance(error, zmq.ZMQError):
                raise TransportError(f"bad address {address!r} for {name!r}: {error.strerror}") from None
            raise
        return sock

    @property
    def neighbours(self) -> tuple[str, ...]:
        return tuple(self._outboxes)

    # ----------------------------------------------------- membership changes

    def add_neighbour(self, name: str, address: str, *, server_key: bytes | None = None) -> None:
        """Dial a new neighbour (the roster gained it); ``server_key``: its CURVE key, with CURVE on."""
        if name in self._outboxes:
            return
        if server_key is not None:
            self._server_keys[name] = server_key
        self._outboxes[name] = self._open_outbox(name, address)

    def drop_neighbour(self, name: str) -> None:
        """Stop sending to ``name`` (the roster lost it): what is queued for it is dropped."""
        outbox = self._outboxes.get(name)
        if outbox is None:
            return
        if outbox.pending:
            self.wait_sent()    # what is in flight goes first (or is abandoned after the send timeout)
        self._close_outbox(self._outboxes.pop(name))

    def set_server_key(self, name: str, server_key: bytes) -> None:
        """Dial ``name`` with this CURVE server key from now on (its key was rotated): a neighbour
        whose key changed is dialed afresh; what was queued for it is dropped."""
        outbox = self._outboxes.get(name)
        if self._curve is None or outbox is None or self._server_keys.get(name) == server_key:
            return
        self._server_keys[name] = server_key
        if outbox.pending:
            self.wait_sent()
        self._redial(name, outbox)

    @property
    def curve_public_key(self) -> bytes | None:
        """The CURVE key this transport serves and dials with (None without CURVE)."""
        return None if self._curve is None else self._curve.public_key

    def rekey(self, public_key: bytes, secret_key: bytes) -> None:
        """Serve and dial with a new CURVE key pair (our key was rotated): the inbox is bound afresh
        at the same address, since a listener keeps the key it was bound with, and every neighbour
        is dialed afresh; open connections end, and their members reconnect."""
        if self._curve is None:
            raise TransportError("rekey needs CurveZMQ on")
        if public_key == self._curve.public_key:
            return
        self.wait_sent()
        self._curve = dataclasses.replace(self._curve, public_key=public_key, secret_key=secret_key)
        self._monitor.stop()
        self._inbox.close(linger=0)
        if self._listen_fd is not None:
            self._inbox, self._monitor = self._open_inbox(self.listen, os.dup(self._listen_fd))
        else:   # libzmq lets the port go on its I/O thread: a moment after close returns
            for attempt in range(50):
                try:
                    self._inbox, self._monitor = self._open_inbox(self.listen, None)
                    break
                except TransportError:
                    if attempt == 49:
                        raise
                    time.sleep(0.02)
        for name, outbox in self._outboxes.items():
            self._redial(name, outbox)

    def allow(self, client_keys: frozenset[bytes]) -> None:
        """The CURVE allowlist from now on (the roster's keys): a joiner may connect, a leaver not,
        and the leaver's open connections are shut down (ZAP judges only new handshakes)."""
        for fd in self._gate.allow(frozenset(client_keys)):
            self._shut(fd, "removed_from_roster")

    def punish(self, client_key: bytes, reason: str = "multipart") -> None:
        """Disconnect ``client_key`` (a Z85 CURVE key) and refuse its handshakes for
        ``multipart_cooldown_s``, counting ``reason``: what a member that sent a multipart
        message gets."""
        for fd in self._gate.cool_down(client_key, self.config.multipart_cooldown_s):
            self._shut(fd, reason)
        with self._gate.lock:
            self._gate.closed[f"punished_{reason}"] += 1

    def _shut(self, fd: int, reason: str) -> None:
        if shut_down(fd, self._port):
            with self._gate.lock:
                self._gate.closed[reason] += 1

    def connection_key(self, frame: zmq.Frame) -> bytes | None:
        """The Z85 CURVE key the connection ``frame`` arrived on authenticated with; ``b""``
        without CURVE; None when that key is no longer admitted (it left the roster, or is cooling
        down): the message must be dropped, and its connection is shut down and counted."""
        if self._curve is None:
            return b""
        key = str(frame.get("User-Id")).encode()     # set by the ZAP handler: the client's Z85 key
        fd = int(frame.get(zmq.SRCFD))
        if not self._gate.admits(key):
            self._shut(fd, "not_admitted")
            return None
        for surplus in self._gate.learn(fd, key, keep=self.config.max_connections_per_member):
            self._shut(surplus, "surplus_connection")
        self._monitor.pin(fd)
        return key

    def closed_connections(self) -> list[bytes]:
        """The inbound connections (``Arrival.connection``) that closed since the last call, among
        those a frame came on, once every frame they sent was read: what they were assembling can
        be released at once. The most recent :data:`CLOSED_KEPT` are kept between calls.

        libzmq still hands over a closed connection's frames after its ``DISCONNECTED``, so one is
        given here only after a drain emptied the inbox. A descriptor names one connection at a
        time, and libzmq reuses its number only once the connection on it closed, so the oldest
        connection seen on a closed descriptor is the one that closed. The one case that errs: a
        connection that sent nothing closed, and the next one on its number sent a frame before
        the monitor reported the close (its pending message is then released too, refused as
        incomplete, as its idle timeout would have)."""
        self._take_closed()
        if self._closing and not self._inbox.poll(0, zmq.POLLIN):
            self._gone.extend(self._closing)
            self._closing.clear()
        gone = list(self._gone)
        self._gone.clear()
        return gone

    def _take_closed(self) -> None:
        """The descriptors the monitor saw close: their connections are closing (frames to come)."""
        with self._gate.lock:
            fds, self._monitor.closed[:] = list(self._monitor.closed), []
        for fd in fds:
            seen = self._seen_on.get(fd)
            if seen:
                self._closing.add(seen.pop(0))
                if not seen:
                    del self._seen_on[fd]

    @property
    def refused(self) -> Counter[str]:
        """Connections the inbox refused, by reason (peer/net/admission.py lists them): a copy."""
        with self._gate.lock:
            return Counter(self._gate.refused)

    @property
    def connections(self) -> Counter[str]:
        """The inbox's connections: ``accepted``, ``handshake_succeeded``, ``closed_after_handshake``
        and, by reason, those this transport shut down (``closed_<reason>``): a copy."""
        with self._gate.lock:
            return self._monitor.connections + Counter(
                {f"closed_{k}": v for k, v in self._gate.closed.items()})

    # --------------------------------------------------------------- send

    def send(self, name: str, frames: Frames) -> bool:
        """Queue ``frames`` to ``name``, each as a single-frame ZeroMQ message, in order and without
        copying; False if the first was dropped (nothing of it was queued then).

        The wire is single-frame (protocols/assembly.py: the receiver verifies a message's header
        before it accepts the frames the header announced), so no frame of ours is ever part of a
        multipart message. The frames' buffers must not change until :meth:`wait_sent` returns.
        """
        outbox = self._outboxes.get(name)
        if outbox is None:
            raise KeyError(f"{name!r} is not a neighbour of this peer")
        parts = list(frames)
        if not parts:
            raise ValueError("a message needs at least one frame")
        self._wait_full = False
        try:
            first = outbox.socket.send(parts[0], flags=zmq.NOBLOCK, copy=False, track=True)
        except zmq.Again:
            self.dropped[name] += 1
            self._redial_if_stale(name, outbox)
            return False
        # Each frame is tracked on its own: waiting on the last one's tracker says nothing of the others.
        outbox.pending.extend(t for t in [first] if t is not None and not t.done)
        progress = _Progress(outbox, give_up_s=time.monotonic() + self.config.send_timeout_s,
                             stall_s=self.config.stall_timeout_s)
        for part in parts[1:]:
            # The queue filled half way through: the rest waits for room (a multipart message never
            # had to, since ZeroMQ queues all of one or nothing), while the connection moves bytes
            if not self._send_one(name, outbox, part, progress):
                return False
        size = sum(memoryview(f).nbytes for f in frames)
        self.bytes_sent += size
        self.bytes_sent_to[name] += size
        self.messages_sent[name] += 1
        return True

    def _send_one(self, name: str, outbox: _Outbox, part: bytes | bytearray | memoryview,
                  progress: _Progress) -> bool:
        while True:
            try:
                tracker = outbox.socket.send(part, flags=zmq.NOBLOCK, copy=False, track=True)
            except zmq.Again:
                if self._wait_for_room(outbox, progress.next_look_s()) or not progress.stuck():
                    continue
                # a half-sent message: dropping the connection drops it whole (the receiver releases
                # what the header announced when the connection goes quiet)
                self.dropped[name] += 1
                self._abandon(name, outbox)
                return False
            if tracker is not None and not tracker.done:
                outbox.pending.append(tracker)
            progress.moved()
            return True

    def _wait_for_room(self, outbox: _Outbox, timeout_s: float) -> bool:
        """Up to ``timeout_s`` for room in ``outbox``'s queue, reading the inbox meanwhile; whether
        there is room."""
        end_s = time.monotonic() + timeout_s
        while True:
            wait_s = max(0.0, end_s - time.monotonic())
            if not self._reading():
                return bool(outbox.socket.poll(int(1000 * wait_s), zmq.POLLOUT))
            poller = zmq.Poller()
            poller.register(outbox.socket, zmq.POLLOUT)
            poller.register(self._inbox, zmq.POLLIN)
            ready = dict(poller.poll(int(1000 * wait_s)))
            if outbox.socket in ready:
                return True
            if self._inbox in ready:
                self._hand_over()
            elif time.monotonic() >= end_s:
                return False

    def _wait_released(self, tracker: zmq.MessageTracker, timeout_s: float) -> bool:
        """Up to ``timeout_s`` for ZeroMQ to release ``tracker``'s frame, reading the inbox
        meanwhile; whether it was released."""
        end_s = time.monotonic() + timeout_s
        while True:
            look_s = max(0.0, end_s - time.monotonic())
            if self._reading():
                self._hand_over()
                look_s = min(look_s, INBOX_LOOK_S)
            try:
                tracker.wait(look_s)
                return True
            except zmq.NotDone:
                if time.monotonic() >= end_s:
                    return False

    def _reading(self) -> bool:
        """Whether frames that arrive while we wait go to ``while_waiting`` now."""
        return self._while_waiting is not None and not self._wait_full

    def _hand_over(self) -> None:
        """What the inbox holds now, to ``while_waiting`` (it may decline more for this wait)."""
        assert self._while_waiting is not None
        arrivals = self._drain()
        if arrivals and not self._while_waiting(arrivals):
            self._wait_full = True

    def _redial(self, name: str, outbox: _Outbox) -> None:
        """A fresh socket to ``name`` (with the keys of now); the old one goes without lingering."""
        self._close_outbox(outbox)
        outbox.socket = self._connect(name, outbox.address, outbox.watch)
        outbox.dialed_s = time.monotonic()

    def _watch_outboxes(self) -> float | None:
        """Drain every outbox's handshake monitor and dial afresh those whose refused handshake's
        backoff is over (not one with frames still held: a redial would drop them); the earliest
        redial still to come (monotonic seconds), for :meth:`poll` to wake at."""
        wake_s: float | None = None
        for name, outbox in self._outboxes.items():
            outbox.watch.drain(time.monotonic())
            redial_at_s = outbox.watch.redial_at_s
            if redial_at_s is None:
                continue
            outbox.pending = [t for t in outbox.pending if not t.done]
            if outbox.pending:
                continue
            if time.monotonic() >= redial_at_s:
                self._redial(name, outbox)
                self.redialed[name] += 1
            else:
                wake_s = redial_at_s if wake_s is None else min(wake_s, redial_at_s)
        return wake_s

    def dial_down(self) -> dict[str, tuple[float, str]]:
        """The neighbours we have no connection to now: for how long (s) and why, in words
        (peer/net/reach.py: "no answer", "refused", "no answer to the handshake", ...)."""
        now_s = time.monotonic()
        down: dict[str, tuple[float, str]] = {}
        for name, outbox in self._outboxes.items():
            outbox.watch.drain(now_s)
            if not outbox.reach.up:
                down[name] = (outbox.reach.down_for_s(now_s), outbox.reach.reason(now_s))
        return down

    @property
    def handshakes(self) -> Counter[str]:
        """Handshakes our outboxes completed, by neighbour (its sockets since it became one)."""
        return Counter({name: o.watch.handshakes for name, o in self._outboxes.items() if o.watch.handshakes})

    def _redial_if_stale(self, name: str, outbox: _Outbox) -> None:
        """Dial ``name`` afresh when it has had no connection for the back-off's ceiling
        (``HandshakeWatch.stale``; see the module docstring). For a neighbour that is simply down
        this only restarts the back-off."""
        if outbox.pending or not outbox.watch.stale(time.monotonic(), outbox.dialed_s):
            return
        self._redial(name, outbox)
        self.redialed[name] += 1

    def reply(self, connection: bytes, frames: Frames) -> bool:
        """Queue ``frames`` on the inbound connection ``connection`` (an ``Arrival.connection``),
        each as a single-frame message, in order and without copying; False when that connection
        is gone or its queue is full (counted in ``replies_dropped``; what was queued of a message
        cut short is released by the receiver's assembly when its connection goes quiet).

        For members that dial us and do not listen (edge clients): the caller decides which
        connection is whose, from accepted messages only. The buffers must not change until
        :meth:`wait_sent` returns."""
        parts = list(frames)
        if not parts:
            raise ValueError("a message needs at least one frame")
        for part in parts:
            try:
                self._inbox.send(connection, flags=zmq.SNDMORE | zmq.NOBLOCK)
                tracker = self._inbox.send(part, flags=zmq.NOBLOCK, copy=False, track=True)
            except zmq.Again:
                self.replies_dropped["full"] += 1
                return False
            except zmq.ZMQError as error:
                if error.errno != zmq.EHOSTUNREACH:
                    raise
                self.replies_dropped["gone"] += 1
                return False
            if tracker is not None and not tracker.done:
                self._replies.append(tracker)
        size = sum(memoryview(f).nbytes for f in parts)
        self.bytes_sent += size
        self.bytes_replied += size
        return True

    def pending_sends(self) -> int:
        self._replies = [t for t in self._replies if not t.done]
        return sum(len(o.pending) for o in self._outboxes.values()) + len(self._replies)

    def wait_sent(self, timeout_s: float | None = None) -> None:
        """Block until ZeroMQ holds no frame of ours; abandon a neighbour's sends after the timeout
        (``send_timeout_s`` by default), or once its connection moved no byte for ``stall_timeout_s``
        (a cut: peer/net/progress.py), whichever comes first. Meanwhile what arrives goes to
        ``while_waiting``, if given: a neighbour waiting for its own sends to us is read."""
        deadline = time.monotonic() + (self.config.send_timeout_s if timeout_s is None else timeout_s)
        self._wait_full = False
        for name, outbox in self._outboxes.items():
            progress = _Progress(outbox, give_up_s=deadline, stall_s=self.config.stall_timeout_s)
            while outbox.pending:
                if not self._wait_released(outbox.pending[-1], progress.next_look_s()):
                    if progress.stuck():
                        self._abandon(name, outbox)
                        break
                    continue
                outbox.pending.pop()
                progress.moved()
        # a reply's connection is its dialler's (no probe here): waited for at most the stall timeout
        deadline = min(deadline, time.monotonic() + self.config.stall_timeout_s)
        while self._replies:
            if not self._wait_released(self._replies[-1], max(0.0, deadline - time.monotonic())):
                # a reply's connection is its dialler's: nothing to close and redial here. The
                # frames keep their buffers alive; one changed before it went out fails its digest
                # at that one receiver (counted there), so the rest are given up on, counted
                self.abandoned["replies"] += len(self._replies)
                self._replies.clear()
                break
            self._replies.pop()

    def _abandon(self, name: str, outbox: _Outbox) -> None:
        """Drop what is queued to ``name`` (a fresh socket) and count the sends of ours still in flight:
        those are the abandoned ones. A message cut short with nothing of ours in flight (small frames
        are copied) is counted once, in ``dropped``, and ``abandoned`` gets no zero entry."""
        trackers = [tracker for tracker in outbox.pending if not tracker.done]
        if trackers:
            self.abandoned[name] += len(trackers)
        self._redial(name, outbox)   # drops the queued messages and releases their frames
        outbox.pending = []
        end = time.monotonic() + 1.0
        for tracker in trackers:
            try:
                tracker.wait(max(0.0, end - time.monotonic()))
            except zmq.NotDone:
                # ZeroMQ's I/O thread still owns the frame; the caller must treat it as shared.
                raise TransportError(f"send to {name!r} could not be abandoned") from None

    # ------------------------------------------------------------ receive

    def poll(self, timeout_s: float) -> list[Arrival]:
        """Wait up to ``timeout_s`` for frames; return each with the connection it came on, in order.

        Draining stops after ``max_messages_per_poll`` frames or :data:`POLL_BYTES` bytes, so
        what one poll hands over stays small beside the model. A multipart message is never
        returned: the wire is single-frame, so one is hostile (counted in ``hostile``).
        """
        if not self._wait(timeout_s):
            return []
        return self._drain()

    def _drain(self) -> list[Arrival]:
        """What the inbox holds now, up to ``max_messages_per_poll`` frames or :data:`POLL_BYTES`."""
        received: list[Arrival] = []
        drained = 0
        self._take_closed()     # first: a descriptor's close is taken before a frame on its next connection
        while len(received) < self.config.max_messages_per_poll and drained < POLL_BYTES:
            try:
                parts = self._inbox.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._gone.extend(self._closing)      # the inbox is empty: all they sent was read
                self._closing.clear()
                break
            size = sum(len(f) for f in parts[1:])
            self.bytes_received += size
            drained += size
            if len(parts) != 2:
                self._multipart(parts)
                continue
            self.messages_received += 1
            arrival = Arrival(parts[0].bytes, parts[1])
            self._saw(arrival)
            received.append(arrival)
        return received

    def _saw(self, arrival: Arrival) -> None:
        """Note which descriptor ``arrival``'s connection is on (for :meth:`closed_connections`)."""
        if arrival.connection in self._closing:
            return
        seen = self._seen_on.setdefault(int(arrival.frame.get(zmq.SRCFD)), [])
        if not seen or seen[-1] != arrival.connection:
            seen.append(arrival.connection)

    def _wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the inbox, watching the outboxes' handshakes meanwhile (a
        refusal's redial is made when due, not at the next send); whether a frame is there."""
        deadline = time.monotonic() + timeout_s
        while True:
            left_s = deadline - time.monotonic()
            wake_s = self._watch_outboxes()
            if wake_s is not None:
                left_s = min(left_s, wake_s - time.monotonic())
            poller = zmq.Poller()
            poller.register(self._inbox, zmq.POLLIN)
            for outbox in self._outboxes.values():
                if outbox.watch.monitor is not None:
                    poller.register(outbox.watch.monitor, zmq.POLLIN)
            ready = dict(poller.poll(max(0, int(left_s * 1000))))
            if self._inbox in ready:
                return True
            if not ready and time.monotonic() >= deadline:
                self._watch_outboxes()
                return False

    def _multipart(self, parts: list[zmq.Frame]) -> None:
        """The one place a multipart arrival is handled: libzmq assembled all of it in memory before
        anybody could look, so its sender is hostile. Counted; its frames are dropped unread; with
        CURVE, the sender is disconnected and refused for ``multipart_cooldown_s`` (``punish``)."""
        self.hostile["multipart"] += 1
        key = self.connection_key(parts[-1])
        if key:
            self.punish(key, "multipart")

    # ------------------------------------------------------------- close

    def close(self) -> None:
        """Close every socket without lingering, stop the monitor and ZAP threads (joined), close the
        kept listening descriptor and terminate the transport's own context. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for outbox in self._outboxes.values():
            self._close_outbox(outbox)
        self._monitor.stop()
        self._inbox.close(linger=0)
        self._close_listen_fd()
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._own_context:
            terminate(self._context)

    def _close_listen_fd(self) -> None:
        if self._listen_fd is not None:
            os.close(self._listen_fd)
            self._listen_fd = None

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def link_options(config: TransportConfig) -> dict[int, int]:
    """The socket options that find a dead link: TCP keepalive probes every ``keepalive_s`` on an
    idle connection, and ``dead_link_s`` (``TCP_USER_TIMEOUT``, ZMQ_TCP_MAXRT) without an answer or
    an acknowledgement closes it. Every socket of ours, the inbox included.

    Never libzmq's ZMTP heartbeats (issue 32, item 7): libzmq 4.3.5, the one pyzmq bundles and the
    newest there is, aborts the process (``Assertion failed: !_io_error
    (src/stream_engine_base.cpp:310)``) when a connection that stopped reading because its receive
    queue was full (``RCVHWM``: its owner is busy) reports a hang-up or a reset, and a ping then goes
    out through ``out_event``: its own heartbeat timer's (the tick after the break), or the answer
    to a ping it had read ahead of the full queue, sent once the queue is read again. Kernel probes
    never pass through libzmq's engine: the broken connection waits, not polled, until its queue is
    read, and is then torn down (tests/test_transport_cuts.py). No honest member sends a ping;
    one that does (a foreign client, or an insider) and resets its own connection behind a full
    queue can still reach the assertion: libzmq's to fix (zeromq/libzmq#4841, unfixed there)."""
    return {zmq.TCP_KEEPALIVE: 1,
            zmq.TCP_KEEPALIVE_IDLE: config.keepalive_s,
            zmq.TCP_KEEPALIVE_INTVL: config.keepalive_s,
            zmq.TCP_KEEPALIVE_CNT: max(1, config.dead_link_s // config.keepalive_s),
            zmq.TCP_MAXRT: 1000 * config.dead_link_s}


class TransportError(HivemeshError):
    """A socket could not be set up (address in use, malformed address, missing key)."""


def _start_authenticator(context: zmq.Context, gate: Gate) -> ThreadAuthenticator:
    """A ZAP handler (its own thread, inside pyzmq) that asks ``gate`` about each CURVE key;
    stopped (its thread joined, its sockets closed) if it cannot be configured."""
    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(context)
    try:
        authenticator.start()   # (its thread may be up and its sockets open when this raises)
        authenticator.configure_curve_callback("*", credentials_provider=gate)
    except BaseException:
        authenticator.stop()
        raise
    return authenticator


def reserve_listeners(count: int, host: str = "127.0.0.1") -> list[socket.socket]:
    """``count`` TCP sockets bound to free ports of ``host`` (port 0) and listening.

    The caller keeps them for as long as the addresses are in use and hands each to the process
    that serves it (a Transport's ``listen_fd``; ``peer.runtime.launch.PeerProcesses`` passes them to its
    children). Connections that arrive while no process serves a port wait in its backlog.
    """
    listeners = []
    try:
        for _ in range(count):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(listener)
            listener.bind((host, 0))
            listener.listen(128)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    return listeners


def listener_address(listener: socket.socket) -> str:
    """The ``tcp://host:port`` address a listening socket is bound to."""
    host, port = listener.getsockname()[:2]
    return f"tcp://{host}:{port}"


def free_tcp_addresses(count: int, host: str = "127.0.0.1") -> list[str]:
    """``count`` distinct ``tcp://host:port`` addresses whose ports were free a moment ago.

    Only for addresses written down for later (``hivemesh init``): another process may take a port
    before a peer binds it. Whatever starts the peers at once uses ``reserve_listeners``.
    """
    holders = []
    try:
        for _ in range(count):
            holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holder.bind((host, 0))
            holders.append(holder)
        return [f"tcp://{host}:{h.getsockname()[1]}" for h in holders]
    finally:
        for holder in holders:
            holder.close()


"""Who may hold a connection to a peer's inbox, and a count of every connection refused.

Three parts, used by peer.net.transport:

- ``Gate``: the ZAP decision at each CURVE handshake. It admits exactly the
  roster's transport keys, minus keys cooling down after misbehaving
  (``punish``), remembers which connection (descriptor) carries which key, and
  shuts those connections down when their key stops being admitted.
- ``ConnectionMonitor``: drains the inbox's socket monitor on its own thread
  (a full monitor queue would block libzmq's I/O thread) and counts each
  connection's outcome by reason: ``not_on_roster``/``cooling_down``,
  ``handshake_<protocol error>``, ``handshake_no_detail``,
  ``closed_before_handshake`` (bytes that are not ZMTP), and, not a refusal,
  ``closed_after_handshake``. It keeps at most ``max_handshaking`` connections
  mid-handshake and shuts the oldest down beyond that (``shed_mid_handshake``); which
  connections are mid-handshake is peer/net/handshake_ledger.py's to say, with
  ``look`` (the kernel's count of what each side wrote) naming a success's connection.
- ``shut_down``: closes a connection libzmq owns by shutting its TCP socket down.

Invariant: each refused connection is counted exactly once, by its reason; only
the split between ``closed_before_handshake`` and ``closed_after_handshake`` can
err while handshakes overlap (never the total). What libzmq's monitor tells, the
memory a stranger can pin, and how events are matched to connections:
docs/design/transport.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import termios
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from peer.net.handshake_ledger import (
    NOTHING,
    Accepted,
    Disconnected,
    Failed,
    FirstMessage,
    HandshakeLedger,
    Look,
    Succeeded,
)
from peer.net.handshakes import monitor_endpoint
from peer.net.progress import BYTES_ACKED_OFFSET as _BYTES_ACKED_OFFSET
from peer.net.progress import TCP_INFO_BYTES as _TCP_INFO_BYTES

_BYTES_RECEIVED_OFFSET = _BYTES_ACKED_OFFSET + 8   # tcpi_bytes_received follows (Linux 4.1)

STOP_WAIT_S = 5.0     # how long stop() waits for the monitor thread (it ends in milliseconds)
# how long a success is looked for on the wire (our READY is written on libzmq's next I/O turn),
# and how often
READY_WAIT_S = 0.02
READY_LOOK_S = 0.001
# what our side of a connection has written once its handshake succeeded (the probe's threshold):
# the greeting (64 bytes), CURVE's WELCOME (170) and more than an ERROR (12) reach READY (67);
# with the NULL mechanism, more than the greeting
CURVE_READY_AFTER_BYTES = 64 + 170 + 12 + 1
NULL_READY_AFTER_BYTES = 64 + 1
_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}


class Gate:
    """The keys admitted now, the keys cooling down, and which connection carries which key.

    Shared by the driver's thread and the ZAP thread: every field is read and written under
    ``lock``. Keys are Z85 CURVE public keys (40 bytes), as ZeroMQ hands them to ZAP.
    """

    def __init__(self, allowed: frozenset[bytes], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.Lock()
        self._allowed = frozenset(allowed)
        self._cooling: dict[bytes, float] = {}        # key -> monotonic time its cool-down ends
        self._connections: dict[int, bytes] = {}      # file descriptor -> key it authenticated with
        self._clock = clock
        self.refused: Counter[str] = Counter()        # handshakes, by reason (shared with the monitor)
        self.closed: Counter[str] = Counter()         # admitted connections we shut down, by reason

    # ZAP (pyzmq's authenticator thread)
    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's CURVE credentials hook: True admits the handshake."""
        reason = self._refusal(key)
        if reason:
            with self.lock:
                self.refused[reason] += 1
        return not reason

    def _refusal(self, key: bytes) -> str:
        with self.lock:
            if key not in self._allowed:
                return "not_on_roster"
            until = self._cooling.get(key)
            if until is not None:
                if self._clock() < until:
                    return "cooling_down"
                del self._cooling[key]
        return ""

    # the driver's thread
    def admits(self, key: bytes) -> bool:
        return not self._refusal(key)

    def allow(self, keys: frozenset[bytes]) -> list[int]:
        """Admit exactly ``keys`` from now on; the descriptors of open connections whose key left."""
        with self.lock:
            self._allowed = frozenset(keys)
            return [fd for fd, key in self._connections.items() if key not in self._allowed]

    def cool_down(self, key: bytes, seconds: float) -> list[int]:
        """Refuse ``key`` for ``seconds``; the descriptors of its open connections."""
        with self.lock:
            self._cooling[key] = self._clock() + seconds
            return [fd for fd, held in self._connections.items() if held == key]

    def learn(self, fd: int, key: bytes, *, keep: int) -> list[int]:
        """A message arrived on ``fd`` from a connection authenticated as ``key``; the descriptors
        of ``key``'s oldest other connections beyond the newest ``keep`` (to shut down: libzmq reads
        ahead per connection, so a member's memory is bounded by how many it holds)."""
        with self.lock:
            if self._connections.get(fd) == key:
                return []
            self._connections.pop(fd, None)
            self._connections[fd] = key         # the newest last
            held = [held_fd for held_fd, held_key in self._connections.items() if held_key == key]
            return held[:-keep] if len(held) > keep else []

    def forget_locked(self, fd: int) -> None:
        """``fd`` was closed (by libzmq): its number may be reused by another connection.
        The caller holds ``lock`` (the monitor does, while it counts)."""
        self._connections.pop(fd, None)


class ConnectionMonitor:
    """Counts the inbox's connections by outcome, from ZeroMQ's socket monitor, on its own thread,
    and sheds those mid-handshake beyond ``max_handshaking`` (peer/net/handshake_ledger.py)."""

    def __init__(self, inbox: zmq.Socket, gate: Gate, *, max_handshaking: int,
                 local_port: int | None = None, curve: bool = True) -> None:
        self._inbox = inbox
        self._local_port = local_port
        self._gate = gate
        self.lock = gate.lock
        ready_after = CURVE_READY_AFTER_BYTES if curve else NULL_READY_AFTER_BYTES
        self._ledger = HandshakeLedger(
            max_handshaking=max_handshaking,
            look=lambda fd: look(fd, local_port, ready_after))
        events = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_MONITOR_STOPPED)
        # descriptors closed since the driver last took them (Transport.closed_connections), in order
        self.closed: list[int] = []
        self._socket = inbox.get_monitor_socket(events, addr=monitor_endpoint("inbox"))
        self._thread = threading.Thread(target=self._run, name="hivemesh-monitor", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            with contextlib.suppress(zmq.ZMQError):
                inbox.disable_monitor()
            self._socket.close(linger=0)
            raise

    @property
    def connections(self) -> Counter[str]:
        """``accepted``, ``handshake_succeeded``, ``closed_after_handshake``, ``shed_mid_handshake``
        (the caller holds ``lock``)."""
        return self._ledger.connections

    def _run(self) -> None:
        """Count each event as it comes; while a success is unmatched (libzmq says
        HANDSHAKE_SUCCEEDED before its I/O thread writes our READY, on its next turn), look for it
        again every ``READY_LOOK_S`` for up to ``READY_WAIT_S``, between events. Left unmatched
        after that (it closed meanwhile), it is matched by its DISCONNECTED."""
        look_until = 0.0
        try:
            while True:
                if time.monotonic() < look_until and not self._socket.poll(int(READY_LOOK_S * 1000)):
                    with self.lock:
                        if self._ledger.match():
                            look_until = 0.0
                    continue
                event = recv_monitor_message(self._socket)
                if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                    return
                with self.lock:
                    self._count(event["event"], event["value"])
                    if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED and self._ledger.unmatched:
                        look_until = time.monotonic() + READY_WAIT_S
        except zmq.ZMQError:
            return      # the context is going away
        finally:
            self._socket.close(linger=0)

    def _count(self, kind: int, value: int) -> None:
        if kind == zmq.EVENT_ACCEPTED:
            self._shed(self._ledger.handle(Accepted(value)))
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._ledger.handle(Succeeded())
        elif kind in _FAILED:
            if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self._gate.refused[f"handshake_{_protocol_error(value)}"] += 1
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self._gate.refused["handshake_no_detail"] += 1
            # (an AUTH failure was counted by the gate, with its reason)
            self._ledger.handle(Failed())
        elif kind == zmq.EVENT_DISCONNECTED:
            self._gate.forget_locked(value)
            self.closed.append(value)
            before = self._ledger.closed_before_handshake
            self._ledger.handle(Disconnected(value))
            self._gate.refused["closed_before_handshake"] += self._ledger.closed_before_handshake - before

    def _shed(self, fds: list[int]) -> None:
        """Shut connections mid-handshake down: libzmq reads a handshake command of up to MAXMSGSIZE
        into memory and waits HANDSHAKE_IVL for the rest of it, so each one can pin a frame's
        worth. Each is then counted by its own events (``HANDSHAKE_FAILED_NO_DETAIL``,
        ``DISCONNECTED``), as any connection, once."""
        for fd in fds:
            shut_down(fd, self._local_port)

    def pin(self, fd: int) -> None:
        """A message arrived on ``fd``: its handshake succeeded."""
        with self.lock:
            self._ledger.handle(FirstMessage(fd))

    def stop(self) -> None:
        """Stop monitoring: the thread sees MONITOR_STOPPED, closes its socket and ends; joined.
        Call it before the inbox closes (a closed inbox can no longer stop its monitor; its
        context's termination still ends the thread then). Idempotent."""
        with contextlib.suppress(zmq.ZMQError):
            self._inbox.disable_monitor()
        self._thread.join(timeout=STOP_WAIT_S)
        if self._thread.is_alive():
            # never seen; if it were, the context's termination wakes the thread (ETERM), which
            # then closes its socket: nothing hangs, but say so rather than hide a stuck thread
            warnings.warn(f"socket monitor thread still running {STOP_WAIT_S} s after stop",
                          ResourceWarning, stacklevel=2)


def _protocol_error(value: int) -> str:
    """``zmtp_mechanism_mismatch`` for ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, and so on."""
    try:
        name = zmq.Event(value).name or ""
    except ValueError:
        name = ""
    name = name.removeprefix("PROTOCOL_ERROR_").lower()
    return name if name and "|" not in name else f"protocol_{value:#x}"


def shut_down(fd: int, local_port: int | None = None) -> bool:
    """Shut down the TCP connection under libzmq's descriptor ``fd`` (libzmq then closes it);
    False when ``fd`` is no longer a connection of ours. A descriptor number is reused as soon as
    libzmq closes it, possibly before its event reaches us: a descriptor that is not a socket, or
    (``local_port`` given) not a connection to that port of ours, is left alone."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        conn = socket.socket(fileno=dup)
    except OSError:     # not a socket (any more): a file or pipe took the number
        os.close(dup)
        return False
    with conn:
        try:
            if local_port is not None and conn.getsockname()[1] != local_port:
                return False
            conn.shutdown(socket.SHUT_RDWR)
        except (OSError, IndexError, TypeError):
            return False
    return True


def look(fd: int, local_port: int | None, ready_after: int) -> Look:
    """What the kernel shows of the TCP connection on ``fd``: past its handshake once our side wrote
    ``ready_after`` bytes (acknowledged or still queued: the thresholds above), and the bytes it
    sent us. A descriptor that is not a connection of ours on ``local_port`` (closed, reused), or a
    platform without TCP_INFO: :data:`NOTHING`."""
    if not hasattr(socket, "TCP_INFO"):
        return NOTHING
    try:
        dup = os.dup(fd)
    except OSError:
        return NOTHING
    try:
        conn = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return NOTHING
    with conn:
        try:
            if conn.type != socket.SOCK_STREAM or (local_port is not None
                                                   and conn.getsockname()[1] != local_port):
                return NOTHING
            info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
            queued = struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        except (OSError, IndexError, TypeError):
            return NOTHING
    if len(info) < _BYTES_RECEIVED_OFFSET + 8:
        return NOTHING
    acked, received = struct.unpack_from("=QQ", info, _BYTES_ACKED_OFFSET)
    return Look(done=int(acked) + int(queued) >= ready_after, received_bytes=int(received))

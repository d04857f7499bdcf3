"""Who may hold a connection to a peer's inbox, and a count of every connection refused.

Three parts, used by peer.net.transport:

- ``Gate``: the ZAP decision (pyzmq's authenticator thread calls it at each
  CURVE handshake). It admits exactly the roster's transport keys, minus keys
  cooling down after misbehaving (``punish``). ZAP judges only new handshakes,
  so the gate also remembers which connection (file descriptor) carries which
  key, learned from received frames (``SRCFD`` and the ZAP ``User-Id``), and
  shuts those connections down when their key stops being admitted.
- ``ConnectionMonitor``: drains the inbox's ZeroMQ socket monitor and counts
  each connection's outcome by reason. It runs on its own small thread because
  libzmq's monitor blocks the I/O thread once its queue (1000 events) is full:
  drained only between training steps, a burst of junk connections would stall
  every socket of the peer (and a pending ``wait_sent`` with it).
- ``shut_down``: closes a connection libzmq owns, by shutting the TCP socket
  under it down; libzmq sees the end of the stream and drops the connection.

What libzmq 4.3.5's monitor tells (measured; see tests/test_transport_auth.py),
per accepted connection, exactly one of:

================================  =========================================================
``not_on_roster``/``cooling_down`` ZAP refused the CURVE key (counted by the gate; the monitor
                                   says ``HANDSHAKE_FAILED_AUTH``)
``handshake_<protocol error>``     ``HANDSHAKE_FAILED_PROTOCOL``: e.g. a client without CURVE
                                   (``handshake_zmtp_mechanism_mismatch``), a malformed or
                                   oversize handshake command (``handshake_zmtp_malformed_...``)
``handshake_no_detail``            ``HANDSHAKE_FAILED_NO_DETAIL``: closed or timed out mid-handshake
``closed_before_handshake``        no handshake event at all before ``DISCONNECTED``: bytes that are
                                   not ZMTP (an HTTP request, random bytes) or an oversize greeting
``closed_after_handshake``         (not a refusal) an admitted connection ended: its peer closed it,
                                   a ZMTP heartbeat timed out, or it sent a frame over
                                   ``MAXMSGSIZE``; libzmq emits the same bare ``DISCONNECTED`` for
                                   all three, so an oversize frame cannot be told apart here
================================  =========================================================

Strangers' memory: libzmq reads a handshake command of up to MAXMSGSIZE (16 MiB) into memory
and waits ZMQ_HANDSHAKE_IVL (30 s) for the rest of it, so each connection mid-handshake can pin
a frame's worth (10 held at once: ~160 MiB, measured). The monitor keeps at most
``max_handshaking`` connections mid-handshake and shuts the oldest down beyond that
(``shed_mid_handshake``; such a connection is then counted by its own events, as
``handshake_no_detail``). An honest handshake takes milliseconds, and its client dials again.

Only ``ACCEPTED`` and ``DISCONNECTED`` name the connection (its descriptor); the handshake
events name none. So a failed handshake is counted by its reason when it happens, and the next
``DISCONNECTED`` of a connection still mid-handshake is taken as its end. ``HANDSHAKE_SUCCEEDED``
is pinned to a descriptor when only one connection is mid-handshake, or when a message later
arrives on it; otherwise a bare ``DISCONNECTED`` is put in ``closed_after_handshake`` only while
unpinned successes outnumber the other connections mid-handshake. Each refused connection is
counted exactly once, by its reason; only the split between ``closed_before_handshake`` and
``closed_after_handshake`` can err, while handshakes overlap (never in the total).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from peer.net.handshakes import monitor_endpoint

STOP_WAIT_S = 5.0     # how long stop() waits for the monitor thread (it ends in milliseconds)
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

    def learn(self, fd: int, key: bytes) -> None:
        """A message arrived on ``fd`` from a connection authenticated as ``key``."""
        with self.lock:
            self._connections[fd] = key

    def forget_locked(self, fd: int) -> None:
        """``fd`` was closed (by libzmq): its number may be reused by another connection.
        The caller holds ``lock`` (the monitor does, while it counts)."""
        self._connections.pop(fd, None)


class ConnectionMonitor:
    """Counts the inbox's connections by outcome, from ZeroMQ's socket monitor, on its own thread."""

    def __init__(self, inbox: zmq.Socket, gate: Gate, *, max_handshaking: int,
                 local_port: int | None = None) -> None:
        self._inbox = inbox
        self._local_port = local_port
        self._max_handshaking = max_handshaking
        self._gate = gate
        self.lock = gate.lock
        self.connections: Counter[str] = Counter()    # accepted, handshake_succeeded, closed_after_handshake
        self._handshaking: dict[int, None] = {}        # accepted, outcome not known yet; oldest first
        self._shed: set[int] = set()                   # mid-handshake ones we shut down (events to come)
        self._admitted: set[int] = set()               # handshake succeeded, pinned to this descriptor
        self._unpinned = 0                             # successes not pinned to a descriptor yet
        self._early: set[int] = set()                  # a message came on it before its events here
        self._unclosed_failures = 0                    # failed handshakes whose DISCONNECTED is to come
        events = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_MONITOR_STOPPED)
        self._socket = inbox.get_monitor_socket(events, addr=monitor_endpoint("inbox"))
        self._thread = threading.Thread(target=self._run, name="hivemesh-monitor", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            with contextlib.suppress(zmq.ZMQError):
                inbox.disable_monitor()
            self._socket.close(linger=0)
            raise

    def _run(self) -> None:
        try:
            while True:
                event = recv_monitor_message(self._socket)
                if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                    return
                with self.lock:
                    self._count(event["event"], event["value"])
        except zmq.ZMQError:
            return      # the context is going away
        finally:
            self._socket.close(linger=0)

    def _count(self, kind: int, value: int) -> None:
        if kind == zmq.EVENT_ACCEPTED:
            self.connections["accepted"] += 1
            self._handshaking[value] = None
            # (a success not pinned to its descriptor yet is one of these, done with its handshake:
            # counted out, or a burst of honest clients dialing at once would be shed)
            if len(self._handshaking) - len(self._shed) - self._unpinned > self._max_handshaking:
                self._shed_oldest()
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connections["handshake_succeeded"] += 1
            early = self._early & self._handshaking.keys()
            if early or len(self._handshaking) == 1:
                fd = min(early) if early else next(iter(self._handshaking))
                self._early.discard(fd)
                self._handshaking.pop(fd, None)
                self._admitted.add(fd)
            else:
                self._unpinned += 1
        elif kind in _FAILED:
            if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self._gate.refused[f"handshake_{_protocol_error(value)}"] += 1
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self._gate.refused["handshake_no_detail"] += 1
            # (an AUTH failure was counted by the gate, with its reason)
            self._unclosed_failures += 1
        elif kind == zmq.EVENT_DISCONNECTED:
            self._gate.forget_locked(value)
            self._early.discard(value)
            self._closed(value)

    def _shed_oldest(self) -> None:
        """Too many connections mid-handshake: shut the oldest down. libzmq reads a handshake
        command of up to MAXMSGSIZE into memory and waits HANDSHAKE_IVL for the rest of it, so each
        one can pin a frame's worth; an honest handshake takes milliseconds, so it is seldom the
        oldest, and its client dials again (a dropped connection is retried).
        The connection stays mid-handshake here: its own events (``HANDSHAKE_FAILED_NO_DETAIL``,
        ``DISCONNECTED``) count it, as any connection, once."""
        fd = next(fd for fd in self._handshaking if fd not in self._shed)
        self._shed.add(fd)
        self.connections["shed_mid_handshake"] += 1
        shut_down(fd, self._local_port)

    def _closed(self, fd: int) -> None:
        self._shed.discard(fd)
        if fd in self._admitted:
            self._admitted.discard(fd)
            self.connections["closed_after_handshake"] += 1
        elif fd in self._handshaking:
            self._handshaking.pop(fd, None)
            if self._unclosed_failures > 0:              # a failure counted already
                self._unclosed_failures -= 1
            elif self._unpinned > len(self._handshaking):  # every other one still handshaking succeeded
                self._unpinned -= 1
                self.connections["closed_after_handshake"] += 1
            else:
                self._gate.refused["closed_before_handshake"] += 1

    def pin(self, fd: int) -> None:
        """A message arrived on ``fd``: its handshake succeeded (pins one unpinned success)."""
        with self.lock:
            if fd in self._handshaking and self._unpinned > 0:
                self._handshaking.pop(fd, None)
                self._unpinned -= 1
                self._admitted.add(fd)
            elif fd not in self._admitted:               # its events are still on their way here
                self._early.add(fd)

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

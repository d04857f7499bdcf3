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
  mid-handshake and shuts the oldest down beyond that (``shed_mid_handshake``).
- ``shut_down``: closes a connection libzmq owns by shutting its TCP socket down.

Invariant: each refused connection is counted exactly once, by its reason; only
the split between ``closed_before_handshake`` and ``closed_after_handshake`` can
err while handshakes overlap (never the total). What libzmq's monitor tells, the
memory a stranger can pin, and how events are matched to connections:
docs/design/transport.md.
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

"""Header-first assembly: messages that arrive one frame at a time, verified before they are read.

On the wire every ZeroMQ message is a single frame (libzmq assembles a multipart
message whole before anybody may look, and ``MAXMSGSIZE`` bounds a frame, not a
message), so a sealed message travels as (:func:`wire_messages`) the header
message (the 64-byte Ed25519 signature, then the header), then each payload frame
as a message of its own, in order, on the same connection.

An :class:`Assembler` keeps one state per connection (the driver's name for it):

* idle: the next frame must be a header (one too long is dropped unread,
  ``unannounced``), verified completely (``codec.verify_header``) before any
  payload byte is accepted; the bytes it announces are charged to its sender and
  refused past ``max_in_flight_bytes``;
* assembling: each frame must fit its announced tensor (``manifest_mismatch``,
  ``frame_too_large``; the frame dropped, ``size_mismatch``) and is hashed as it
  arrives and compared at once (``digest_mismatch``); the last completes the
  message (``codec.complete``);
* skipping: what a refused header still announced is dropped unread
  (``after_rejection``): one refusal, one count.

A connection silent for ``idle_timeout_s`` while it owes frames releases what it
holds (``incomplete``). Frames dropped unread are counted by :data:`FRAME_DROPS`.
Pure: time is the ``now_s`` the driver passes. Why: docs/design/wire.md.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from protocols.codec import (
    Announced,
    Decoded,
    Frame,
    Rejection,
    Verifier,
    allocate_flat,
    announced_frames,
    complete,
    copy_into,
    shared_flat,
    verify_header,
)
from protocols.identity import SIGNATURE_BYTES
from protocols.replay import ReplayWindows

__all__ = ["FRAME_DROPS", "Assembler", "AssemblyConfig", "header_message", "wire_messages"]

# Why a frame was dropped without being read (message refusals are codec.REASONS).
FRAME_DROPS = ("unannounced", "size_mismatch", "after_rejection")


def wire_messages(frames: Sequence[Frame]) -> list[Frame]:
    """Sealed frames ``[header, payload..., signature]`` as the wire's single-frame messages:
    ``[signature + header, payload...]`` (the payload frames unchanged: zero-copy)."""
    if len(frames) < 2:
        raise ValueError("sealed frames are a header, payload frames and a signature")
    return [header_message(frames[0], frames[-1]), *frames[1:-1]]


def header_message(header: Frame, signature: Frame) -> bytes:
    """The signature, then the header, in one frame (the signature has a fixed length)."""
    if _length(signature) != SIGNATURE_BYTES:
        raise ValueError(f"a signature is {SIGNATURE_BYTES} bytes, not {_length(signature)}")
    return bytes(signature) + bytes(header)


@dataclass(frozen=True, kw_only=True)
class AssemblyConfig:
    """How long and how much one sender may keep a receiver waiting."""

    # a connection owing frames and silent this long releases its buffers; a 4 MiB frame takes
    # 0.3 s at 100 Mbit/s, so this only ends a sender that stopped
    idle_timeout_s: float = 30.0
    # announced payload bytes one sender may have pending over all its connections; the daemon
    # sets it from the model's size (protocols.assembly.model_message_bytes)
    max_in_flight_bytes: int = 4 << 30

    def __post_init__(self) -> None:
        if not self.idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be positive, not {self.idle_timeout_s!r}")
        if self.max_in_flight_bytes < 1:
            raise ValueError(f"max_in_flight_bytes must be positive, not {self.max_in_flight_bytes!r}")


# The widest a codec in protocols/compress writes one parameter: a float64 value and an int64 index
# (a sparse codec at fraction 1 of a float64 model); everything else writes less.
MAX_BYTES_PER_PARAMETER = 16


def model_message_bytes(parameters: int, *, header_bytes: int) -> int:
    """The most payload one message may carry in a run whose model has ``parameters`` numbers:
    every parameter at the widest any codec writes it, plus ``header_bytes`` of slack (a
    header is at most that long, so a message's scalars and manifest never need more)."""
    if parameters < 0 or header_bytes < 0:
        raise ValueError("parameters and header_bytes are counts")
    return max(1, parameters * MAX_BYTES_PER_PARAMETER + header_bytes)


@dataclass
class _Pending:
    """A verified header whose frames are arriving."""

    announced: Announced
    last_s: float
    flats: list[torch.Tensor | None]
    header_bytes: int
    frame: int = 0          # the next frame's index in the message
    slot: int = 0           # the tensor it belongs to
    in_slot: int = 0        # its index among that tensor's frames
    offset: int = 0         # bytes of that tensor received


@dataclass
class _Skipping:
    remaining: int
    last_s: float


@dataclass
class Assembler:
    """Per-connection assembly for one receiver (see the module docstring)."""

    config: AssemblyConfig = field(default_factory=AssemblyConfig)
    frames_dropped: Counter[str] = field(default_factory=Counter)   # by FRAME_DROPS reason
    in_flight: Counter[str] = field(default_factory=Counter)        # sender -> announced bytes pending
    _states: dict[Hashable, _Pending | _Skipping] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        """Connections with a message in assembly."""
        return sum(isinstance(state, _Pending) for state in self._states.values())

    def receive(self, connection: Hashable, frame: Frame, now_s: float, verifier: Verifier,
                windows: ReplayWindows | None = None, *,
                connection_key: str | None = None) -> Decoded | Rejection | None:
        """Take one frame off ``connection``: a message completed (or refused), or None while
        one is in assembly or when the frame was dropped unread (counted).

        ``connection_key``: the transport key (CurveZMQ, Z85) the connection authenticated with,
        where the transport has one: a header signed by a member whose roster entry names another
        transport key is refused (``connection_key_mismatch``) before its payload is read and
        before the sender's replay window moves, so no member speaks through another's
        connection, nor spends another's sequence numbers by forwarding its messages first."""
        state = self._states.get(connection)
        if isinstance(state, _Skipping):
            self.frames_dropped["after_rejection"] += 1
            state.remaining -= 1
            state.last_s = now_s
            if state.remaining <= 0:
                del self._states[connection]
            return None
        if isinstance(state, _Pending):
            return self._payload(connection, state, frame, now_s, verifier, windows)
        return self._header(connection, frame, now_s, verifier, windows, connection_key)

    def expire(self, now_s: float) -> list[Rejection]:
        """Release the connections silent for ``idle_timeout_s`` while owing frames."""
        out: list[Rejection] = []
        for connection, state in list(self._states.items()):
            if now_s - state.last_s < self.config.idle_timeout_s:
                continue
            del self._states[connection]
            if isinstance(state, _Pending):
                self._release(state)
                sender = state.announced.sender.name
                out.append(Rejection("incomplete", f"from {sender}: {state.frame} of "
                                     f"{state.announced.frame_count} frames", sender))
        return out

    def forget(self, connection: Hashable) -> Rejection | None:
        """The connection closed: what it was assembling is released (refused as incomplete)."""
        state = self._states.pop(connection, None)
        if isinstance(state, _Pending):
            self._release(state)
            sender = state.announced.sender.name
            return Rejection("incomplete", f"from {sender}: the connection closed", sender)
        return None

    # ------------------------------------------------------------------ the states

    def _header(self, connection: Hashable, frame: Frame, now_s: float, verifier: Verifier,
                windows: ReplayWindows | None, connection_key: str | None) -> Decoded | Rejection | None:
        policy = verifier.policy
        length = _length(frame)
        if length > SIGNATURE_BYTES + policy.max_header_bytes:
            self.frames_dropped["unannounced"] += 1     # too long to be a header: nobody announced it
            return None
        if length < SIGNATURE_BYTES:
            return Rejection("malformed_header", f"a header message of {length} bytes")
        view = memoryview(frame).cast("B")
        signature, raw_header = view[:SIGNATURE_BYTES], view[SIGNATURE_BYTES:]
        announced = verify_header(raw_header, signature, verifier, windows, now_s)
        if isinstance(announced, Rejection):
            self._skip(connection, announced_frames(raw_header, policy), now_s)
            return announced
        sender = announced.sender.name
        if connection_key is not None and announced.sender.curve_key != connection_key:
            self._skip(connection, announced.frame_count, now_s)
            return Rejection("connection_key_mismatch", f"{sender}'s message on a connection of "
                             f"transport key {connection_key[:8]}...", sender)
        total = announced.total_bytes
        if self.in_flight[sender] + total > self.config.max_in_flight_bytes:
            self._skip(connection, announced.frame_count, now_s)
            return Rejection("in_flight_exceeded", f"from {sender}: {self.in_flight[sender]} + {total} "
                             f"bytes > {self.config.max_in_flight_bytes}", sender)
        flats: list[torch.Tensor | None] = [
            None if slot.nbytes else torch.empty(0, dtype=slot.dtype) for slot in announced.layout]
        pending = _Pending(announced, now_s, flats, length)
        if announced.frame_count == 0:
            return _sized(complete(announced, flats, verifier, windows, now_s), length)  # type: ignore[arg-type]
        self._advance(pending)
        self._states[connection] = pending
        self.in_flight[sender] += total
        return None

    def _payload(self, connection: Hashable, pending: _Pending, frame: Frame, now_s: float,
                 verifier: Verifier, windows: ReplayWindows | None) -> Decoded | Rejection | None:
        announced = pending.announced
        slot = announced.layout[pending.slot]
        length = _length(frame)
        room = slot.nbytes - pending.offset
        last_of_slot = pending.in_slot == slot.nframes - 1
        if length > verifier.policy.max_frame_bytes:
            self.frames_dropped["size_mismatch"] += 1
            return self._abort(connection, pending, now_s, Rejection(
                "frame_too_large", f"a frame of {length} bytes > {verifier.policy.max_frame_bytes}"))
        if length > room or (last_of_slot and length != room):
            self.frames_dropped["size_mismatch"] += 1
            return self._abort(connection, pending, now_s, Rejection(
                "manifest_mismatch", f"payload frame {pending.frame}: {length} bytes where tensor "
                f"{slot.name[:40]!r} has {room} left in {slot.nframes - pending.in_slot} frame(s)"))
        hashed = verifier.digest([frame])      # on the driver's threads while the frame is copied
        if slot.nframes == 1:
            pending.flats[pending.slot] = shared_flat(slot, frame)
        else:
            flat = pending.flats[pending.slot]
            if flat is None:
                flat = pending.flats[pending.slot] = allocate_flat(slot, verifier.allocate)
            copy_into(flat, pending.offset, frame)
        digests = hashed()
        if len(digests) != 1:
            raise RuntimeError(f"the digester gave {len(digests)} digests for one frame")
        if digests[0] != announced.digests[pending.frame]:
            return self._abort(connection, pending, now_s,
                               Rejection("digest_mismatch", f"payload frame {pending.frame}"))
        pending.last_s = now_s
        pending.frame += 1
        pending.offset += length
        pending.in_slot += 1
        if pending.frame < announced.frame_count:
            self._advance(pending)
            return None
        del self._states[connection]
        self._release(pending)
        done = complete(announced, pending.flats, verifier, windows, now_s)  # type: ignore[arg-type]
        return _sized(done, pending.header_bytes + announced.total_bytes)

    @staticmethod
    def _advance(pending: _Pending) -> None:
        """Move to the tensor the next frame belongs to (past tensors complete or empty)."""
        layout = pending.announced.layout
        while pending.in_slot >= layout[pending.slot].nframes:
            pending.slot += 1
            pending.in_slot = 0
            pending.offset = 0

    def _abort(self, connection: Hashable, pending: _Pending, now_s: float, rejection: Rejection,
               ) -> Rejection:
        """Refuse a message in assembly: its buffers go now, the frames it still owes are skipped."""
        del self._states[connection]
        self._release(pending)
        pending.flats.clear()
        self._skip(connection, pending.announced.frame_count - pending.frame - 1, now_s)
        return rejection

    def _release(self, pending: _Pending) -> None:
        sender = pending.announced.sender.name
        self.in_flight[sender] -= pending.announced.total_bytes
        if self.in_flight[sender] <= 0:
            del self.in_flight[sender]

    def _skip(self, connection: Hashable, frames: int, now_s: float) -> None:
        if frames > 0:
            self._states[connection] = _Skipping(frames, now_s)


def _sized(result: Decoded | Rejection, wire_bytes: int) -> Decoded | Rejection:
    return dataclasses.replace(result, wire_bytes=wire_bytes) if isinstance(result, Decoded) else result


def _length(frame: Frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)

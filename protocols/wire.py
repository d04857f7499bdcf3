"""One member's end of the wire: ``Endpoint.seal`` to send, ``Endpoint.open`` or ``receive`` to receive.

An Endpoint holds this member's identity, the roster, the run id, its own
epoch and sequence counter, a replay window per sender, and counters of
bytes and rejections. It does no I/O: drivers (the ZeroMQ daemon, the
simulator) move the frames it returns.

Two ways in, one set of checks: ``open`` takes a whole message's frames (the
simulator hands them over in one piece); ``receive`` takes one frame at a
time off a connection, as the ZeroMQ wire delivers them header first
(protocols/assembly.py: the header is verified before any payload byte is
accepted). Both refuse and accept exactly the same messages.

Versions: each accepted message tells the highest protocol version its sender
accepts (a version-3 sender tells nothing: then the version it spoke); the
endpoint speaks to a set of recipients the highest version all of them accept,
so members of two adjacent versions interoperate and a network upgrades one
member at a time. To a member not yet heard it speaks its own highest: an older
member refuses those first messages (counted, ``version_unsupported``) until the
newer one has heard it, which its first heartbeat does; guessing the oldest
instead would cost a current network its newest fields until every pair had met.

Keys: the endpoint holds every identity the driver gives it (a rotation brings
the new key before its round, :meth:`Endpoint.add_identity`) and signs with the
one its roster lists for this member; it receives what is addressed to any of them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

from protocols.assembly import Assembler, AssemblyConfig, wire_messages
from protocols.codec import (
    Decoded,
    DigestStarter,
    Frame,
    Policy,
    Rejection,
    Verifier,
    decode,
    encode,
    fresh_tensor,
    serial_digests,
)
from protocols.errors import HivemeshError
from protocols.identity import Identity
from protocols.messages import Message
from protocols.replay import ReplayWindows
from protocols.roster import Roster

__all__ = ["DigestStarter", "Endpoint", "Frame", "Opened", "Policy", "Rejection", "wire_messages",
           "wire_size"]


@dataclass(frozen=True)
class Opened:
    """An accepted message from roster member ``sender`` (a name)."""

    sender: str
    message: Message
    epoch: int
    seq: int
    wire_bytes: int = 0     # what the message took on the wire: header, payload and signature


def wire_size(frames: Sequence[Frame]) -> int:
    """Bytes these frames put on the wire (payload bytes; ZeroMQ adds a few per frame)."""
    return sum(frame.nbytes if isinstance(frame, memoryview) else len(frame) for frame in frames)


class Endpoint:
    """Seal and open messages for one roster member.

    ``epoch`` must grow at every start of this member (the daemon persists
    it), so receivers never readmit an old boot's messages. A tensor that
    arrives in one frame shares that frame's memory (treat it as read-only);
    one spread over several frames is gathered into ``allocate(dtype, numel)``,
    a fresh tensor unless the driver supplies reused buffers (fresh memory
    costs a page fault per 4 KiB: about 2x a digest pass for 100 MB here).
    ``digest`` hashes payload frames on seal and open (a :data:`DigestStarter`):
    serially unless the driver hands in one that hashes on threads (the
    daemon does: peer/net/digests.py); the bytes on the wire are the same.
    """

    def __init__(self, identity: Identity, roster: Roster, run_id: bytes, epoch: int,
                 policy: Policy = Policy(),  # noqa: B008 (Policy is frozen)
                 *, allocate: Callable[[torch.dtype, int], torch.Tensor] | None = None,
                 digest: DigestStarter | None = None) -> None:
        member = roster.by_public_key(identity.public_key)
        if member is None:
            raise HivemeshError(f"this key (public id {identity.public_id}) is not on the roster")
        if not isinstance(epoch, int) or not 0 <= epoch < 1 << 63:
            raise ValueError(f"epoch must be an integer in [0, 2**63), not {epoch!r}")
        self.identity = identity
        self.identities = {identity.public_key: identity}  # every key of this member we hold
        self.accepts: dict[str, int] = {}  # sender -> the highest protocol version it accepts (as last told)
        self.roster = roster
        self.run_id = bytes(run_id)
        self.epoch = epoch
        self.policy = policy
        self.name = member.name
        self.seq = 0  # sequence number of the next sealed message
        self.windows = ReplayWindows(policy.replay_window)
        self.rejections: Counter[str] = Counter()
        self.accepted = 0
        self.bytes_sent = 0  # sealed bytes times recipients: each recipient gets its own copy
        self.bytes_received = 0  # every frame handed to open, accepted or not
        self.allocate = allocate or fresh_tensor
        self.digest = digest or serial_digests
        self._verifier = self._make_verifier()
        self.assembler = Assembler()

    def seal(self, recipients: Sequence[str], message: Message) -> list[Frame]:
        """Signed frames of ``message`` for the roster members named in ``recipients``.

        Tensor frames share the tensors' memory: do not modify them until sent.
        """
        if isinstance(recipients, str):
            raise TypeError("recipients is a sequence of names, not one name")
        if not recipients:
            raise ValueError("a message needs at least one recipient")
        keys = [self.roster.member(name).public_key for name in recipients]
        frames = encode(message, identity=self.identity, recipients=keys, run_id=self.run_id,
                        epoch=self.epoch, seq=self.seq, max_frame_bytes=self.policy.max_frame_bytes,
                        digest=self.digest, version=self.version_for(recipients),
                        accepts=self.policy.accepted_versions[1])
        self.seq += 1
        self.bytes_sent += wire_size(frames) * len(recipients)
        return frames

    def open(self, frames: Sequence[Frame], *, now_s: float | None = None) -> Opened | Rejection:
        """The verified message, or a counted Rejection; never raises. ``now_s`` (the driver's
        clock, seconds): bounds how far one message may move its sender's replay window."""
        result = decode(frames, self._verifier, self.windows, now_s)
        self.bytes_received += sum(
            wire_size([frame]) for frame in frames if isinstance(frame, bytes | bytearray | memoryview))
        if isinstance(result, Rejection):
            self.rejections[result.reason] += 1
            return result
        self.accepted += 1
        self.accepts[result.sender.name] = result.accepts
        return _opened(result)

    def receive(self, connection: Hashable, frame: Frame, *, now_s: float,
                connection_key: str | None = None) -> Opened | Rejection | None:
        """Take one single-frame wire message off ``connection`` (protocols/assembly.py): the
        message it completes, a counted Rejection, or None (assembling, or a frame dropped unread
        and counted in ``assembler.frames_dropped``). ``connection_key``: the transport key the
        connection authenticated with, if any (a message must come on its sender's own). Never raises."""
        self.bytes_received += wire_size([frame])
        result = self.assembler.receive(connection, frame, now_s, self._verifier, self.windows,
                                        connection_key=connection_key)
        return None if result is None else self._count(result)

    def expire(self, now_s: float) -> list[Rejection]:
        """Release the connections that stopped half way through a message (counted ``incomplete``)."""
        released = self.assembler.expire(now_s)
        self.rejections.update(rejection.reason for rejection in released)
        return released

    def forget(self, connection: Hashable) -> Rejection | None:
        """``connection`` closed: what it was assembling is released now (counted ``incomplete``),
        not at its idle timeout."""
        released = self.assembler.forget(connection)
        if released is not None:
            self.rejections[released.reason] += 1
        return released

    def _count(self, result: Decoded | Rejection) -> Opened | Rejection:
        if isinstance(result, Rejection):
            self.rejections[result.reason] += 1
            return result
        self.accepted += 1
        self.accepts[result.sender.name] = result.accepts
        return _opened(result)

    def version_for(self, recipients: Sequence[str]) -> int:
        """The protocol version spoken to ``recipients``: the highest every one of them accepts."""
        low, high = self.policy.accepted_versions
        return max(low, min([high, *(self.accepts.get(name, high) for name in recipients)]))

    def add_identity(self, identity: Identity) -> None:
        """Hold another key of this member (a rotation's new one): addressed to it, a message is
        ours; the endpoint signs with it once the roster lists it for us (:meth:`set_roster`)."""
        self.identities[identity.public_key] = identity
        self._verifier = self._make_verifier()

    def set_roster(self, roster: Roster) -> None:
        """Switch to an edited roster (members joined or left, keys rotated); replay windows are kept.
        Signs from now on with the held identity the roster lists for this member (by name)."""
        listed = roster.get(self.name)
        identity = self.identities.get(listed.public_key) if listed is not None else None
        if identity is None and roster.by_public_key(self.identity.public_key) is not None:
            identity = self.identity   # still accepted (a rotation under way)
        if identity is None:
            raise HivemeshError(f"none of this member's keys (public id {self.identity.public_id}) is on the "
                                "new roster")
        self.identity = identity
        self.roster = roster
        self.name = roster.by_public_key(identity.public_key).name  # type: ignore[union-attr]
        self._verifier = self._make_verifier()

    def use(self, *, allocate: Callable[[torch.dtype, int], torch.Tensor] | None = None,
            digest: DigestStarter | None = None, policy: Policy | None = None,
            assembly: AssemblyConfig | None = None) -> None:
        """Switch the receive-buffer allocator, the digester, the policy and/or the assembly's
        bounds (a driver's choice, made at start: the daemon derives limits from its model)."""
        if allocate is not None:
            self.allocate = allocate
        if digest is not None:
            self.digest = digest
        if policy is not None:
            self.policy = policy
        if assembly is not None:
            self.assembler.config = assembly
        # the cache of verified signatures is kept: it depends on the keys, not on buffers or hashing
        self._verifier = dataclasses.replace(self._verifier, allocate=self.allocate, digest=self.digest,
                                             policy=self.policy)

    def _make_verifier(self) -> Verifier:
        return Verifier(self.roster, self.identity.public_key, self.run_id, self.policy, self.allocate,
                        self.digest, also_receiver=frozenset(self.identities))

    def export_state(self) -> dict[str, object]:
        """The replay windows, for a checkpoint. The epoch is the daemon's to persist and
        increment at every start; the sequence number restarts at 0 with each epoch."""
        return {"windows": self.windows.export_state()}

    def restore_state(self, state: Mapping[str, object]) -> None:
        windows = state.get("windows", {})
        if isinstance(windows, Mapping):
            self.windows.restore_state(windows)


def _opened(decoded: Decoded) -> Opened:
    return Opened(decoded.sender.name, decoded.message, decoded.epoch, decoded.seq, decoded.wire_bytes)

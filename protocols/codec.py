"""Messages to signed multipart frames and back: ``encode`` and ``decode``.

One message is ``[header, payload frames..., signature]``: the header is a
msgpack map (version, kind, sender's and recipients' Ed25519 public keys, run
id, epoch and sequence, the scalar fields and ``meta``, the tensor manifest
``[name, dtype, shape, byte length, frame count]`` and a BLAKE3 digest per
payload frame); the payload is each tensor's bytes, zero-copy, in frames of at
most ``max_frame_bytes`` (4 MiB); the signature is Ed25519 over a domain tag
and the header bytes, which bind the payload digests.

``decode`` checks, in this order and without raising: frame count, header size
and shape, version, kind, sender on the roster with a role allowed for the
kind, this receiver among the recipients, the signature, the run id, (epoch,
sequence) new for the sender, the manifest against the limits and the frames
(before anything is allocated), every frame digest, then the fields. Every
refusal is a :class:`Rejection` with a short reason code (a revoked key:
``revoked_key``; a version outside ``Policy.accepted_versions``, or not an int:
``version_unsupported``). For frames that come one at a time
(protocols/assembly.py), :func:`verify_header` does everything up to the
manifest, reading no payload, and :func:`complete` builds the message and moves
the replay window. ``encode`` writes the version it is told to speak and, as
``va``, the highest its sender accepts. Hashing is injectable (``digest=``, a
:data:`DigestStarter`) and always BLAKE3. Why: docs/design/wire.md.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import msgpack
import torch
from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocols.identity import SIGNATURE_BYTES, Identity, encode_public_id, verify_signature
from protocols.messages import (
    FIELD_SINCE,
    KINDS,
    MESSAGE_TYPES,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    Message,
    Scalar,
)
from protocols.replay import ReplayWindows
from protocols.roster import ROLES, Member, Roster

SIGNING_DOMAIN = b"hivemesh-message/1\x00"
DIGEST_BYTES = 32
MAX_FRAME_BYTES = 4 << 20  # what one connection can make a receiver hold per frame read ahead
KEY_BYTES = 32

Frame = bytes | bytearray | memoryview

# Starts hashing payload frames; the returned function gives their digests, in order, when called.
DigestStarter = Callable[[Sequence[Frame]], Callable[[], list[bytes]]]


def frame_digest(frame: Frame) -> bytes:
    """The digest of one payload frame, as the header carries it: BLAKE3, 32 bytes."""
    return blake3(frame).digest()


def serial_digests(frames: Sequence[Frame]) -> Callable[[], list[bytes]]:
    """The default :data:`DigestStarter`: hashes one frame after another, when the result is asked for."""
    held = list(frames)
    return lambda: [frame_digest(frame) for frame in held]


def fresh_tensor(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The default ``allocate``: a new 1-D tensor."""
    return torch.empty(numel, dtype=dtype)


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

# Every reason decode can give. internal_error is the catch-all that must stay at 0.
REASONS = (
    "version_unsupported", "malformed_header", "unknown_kind", "unknown_sender", "revoked_key", "wrong_role",
    "not_a_recipient", "bad_signature", "config_mismatch", "old_epoch", "replay", "epoch_jump", "seq_jump",
    "too_many_frames", "too_many_tensors", "frame_too_large", "message_too_large",
    "too_many_elements", "bad_dtype", "manifest_mismatch", "digest_mismatch", "bad_field",
    "in_flight_exceeded", "incomplete", "connection_key_mismatch", "internal_error",
)

_GOSSIP_KINDS = frozenset({
    "param_push", "param_pull", "state_sync_request", "state_sync_response", "heartbeat", "error",
    "client_update", "secagg",  # a peer may also train as a client of a gateway (secagg: securely)
    "settings_refusal",         # a neighbour's or a client's run id is not ours: here is why
})
# accepted whatever run id they carry (every other check still applies): messages.SettingsRefusal
RUN_FREE_KINDS = frozenset({"settings_refusal"})
DEFAULT_ALLOWED_KINDS: Mapping[str, frozenset[str]] = types.MappingProxyType({
    "peer": _GOSSIP_KINDS,
    "gateway": _GOSSIP_KINDS | {"round_start", "round_result"},
    # secagg: a client's side of secure aggregation (protocols/federation/secure.py)
    "edge": frozenset({"client_update", "secagg", "heartbeat", "state_sync_request", "error"}),
})


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What a receiver accepts, and how a sender cuts frames. Limits are per message."""

    max_header_bytes: int = 1 << 20  # a header is metadata only; 1 MiB holds ~30,000 frame digests
    max_frames: int = 4096  # payload frames; a 100 MB model needs 25
    max_frame_bytes: int = MAX_FRAME_BYTES  # larger frames page-fault on every message here (ANCHORS)
    max_message_bytes: int = 4 << 30  # 1 billion float32 parameters
    max_elements: int = 1 << 32  # all tensors together; bounds allocation before any frame is read
    max_tensors: int = 4096  # manifest entries (empty tensors carry no frames, so frames don't bound them)
    max_recipients: int = 1024  # a message for more goes out as several
    allowed_dtypes: frozenset[str] = frozenset(DTYPES)
    # role -> kinds it may send; edge clients send updates, never gossip
    allowed_kinds: Mapping[str, frozenset[str]] = field(default_factory=lambda: DEFAULT_ALLOWED_KINDS)
    replay_window: int = 1024  # sequence numbers remembered per sender (out-of-order tolerance)
    # protocol versions taken (and the highest spoken): all this code speaks, so members upgrade one at a time
    accepted_versions: tuple[int, int] = (MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)

    def __post_init__(self) -> None:
        low, high = self.accepted_versions
        if not MIN_PROTOCOL_VERSION <= low <= high <= PROTOCOL_VERSION:
            raise ValueError(f"accepted_versions must lie within {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}, "
                             f"not {self.accepted_versions!r}")
        for name in ("max_header_bytes", "max_frames", "max_frame_bytes", "max_message_bytes",
                     "max_elements", "max_tensors", "max_recipients", "replay_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        unknown = set(self.allowed_dtypes) - set(DTYPES)
        if unknown:
            raise ValueError(f"allowed_dtypes: unknown {sorted(unknown)}; known: {sorted(DTYPES)}")
        for role, kinds in self.allowed_kinds.items():
            if role not in ROLES:
                raise ValueError(f"allowed_kinds: unknown role {role!r}; roles: {', '.join(ROLES)}")
            bad = set(kinds) - set(KINDS)
            if bad:
                raise ValueError(f"allowed_kinds[{role!r}]: unknown kinds {sorted(bad)}")


@dataclass(frozen=True)
class Rejection:
    """A refused message: ``reason`` is one of REASONS, ``detail`` a short human note, ``sender``
    who sent it as far as the header tells (a roster name, or the public id of a key not on the
    roster; empty before the header is read that far)."""

    reason: str
    detail: str = ""
    sender: str = ""


@dataclass(frozen=True)
class Decoded:
    """An accepted message and its envelope."""

    sender: Member
    message: Message
    epoch: int
    seq: int
    accepts: int = MIN_PROTOCOL_VERSION  # the highest protocol version the sender accepts (its ``va``)
    wire_bytes: int = 0     # the message's frames together (header, payload, signature)


@dataclass(frozen=True)
class Verifier:
    """Who this receiver is, whom it trusts, and which run it belongs to."""

    roster: Roster
    receiver: bytes  # this member's raw Ed25519 public key
    run_id: bytes
    policy: Policy = field(default_factory=Policy)
    # Where a tensor spread over several frames is gathered: (dtype, numel) -> 1-D contiguous tensor.
    # Default torch.empty; a driver may hand out reused buffers (fresh memory page-faults: see the bench).
    allocate: Callable[[torch.dtype, int], torch.Tensor] = fresh_tensor
    # How payload frames are hashed: serially here by default; a driver may hash on threads
    digest: DigestStarter = field(default=serial_digests)
    verified: VerifiedCache = field(default_factory=lambda: VerifiedCache(), compare=False)
    # this member's other keys (a rotation under way: senders may address the old key or the new)
    also_receiver: frozenset[bytes] = frozenset()


class VerifiedCache:
    """The last few (sender, header, signature) triples that verified.

    The same bytes arriving again (a replay, a duplicate delivery) skip the
    Ed25519 verification (about 150 us here) and are refused by the replay
    window instead. Keys are digests, so a 1 MiB header costs 32 bytes here.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._keys: dict[bytes, None] = {}  # insertion order = age

    def check(self, public_key: Ed25519PublicKey, sender: bytes, signature: bytes, signed: bytes) -> bool:
        """True if ``signature`` is ``sender``'s over ``signed`` (remembered or verified now)."""
        key = blake3(sender + signature + signed).digest()
        if key in self._keys:
            return True
        if not verify_signature(public_key, signature, signed):
            return False
        self._keys[key] = None
        if len(self._keys) > self.size:
            del self._keys[next(iter(self._keys))]
        return True


class _Reject(Exception):
    def __init__(self, reason: str, detail: str = "", sender: str = "") -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail
        self.sender = sender


# ------------------------------------------------------------ encode


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A flat zero-copy byte view of a contiguous CPU tensor (bf16 included)."""
    flat = tensor.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    elif flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)  # numpy has no bfloat16; same bytes
    return memoryview(flat.numpy()).cast("B")  # type: ignore[arg-type]


def split_message(message: Message) -> tuple[dict[str, Any], dict[str, Scalar], Mapping[str, torch.Tensor]]:
    """(scalar fields, meta, tensors) of a message, as the header and payload carry them."""
    scalars: dict[str, Any] = {}
    meta: dict[str, Scalar] = {}
    tensors: Mapping[str, torch.Tensor] = {}
    for item in dataclasses.fields(message):
        value = getattr(message, item.name)
        if item.name == "tensors":
            tensors = value
        elif item.name == "meta":
            meta = dict(value)
        else:
            scalars[item.name] = value
    return scalars, meta, tensors


def encode(
    message: Message,
    *,
    identity: Identity,
    recipients: Sequence[bytes],
    run_id: bytes,
    epoch: int,
    seq: int,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    digest: DigestStarter = serial_digests,
    version: int = PROTOCOL_VERSION,
    accepts: int = PROTOCOL_VERSION,
) -> list[Frame]:
    """Sign ``message`` for ``recipients`` (raw public keys): ``[header, payload..., signature]``.

    Tensor frames are memoryviews of the tensors' own memory: do not modify a
    tensor until the frames have been sent. ``digest`` hashes the payload frames.
    ``version``: the protocol version spoken (fields introduced later are left out);
    ``accepts``: the highest version this sender takes, told to the receiver.
    """
    if type(message) not in MESSAGE_TYPES:
        raise TypeError(f"not a message: {type(message).__name__}")
    scalars, meta, tensors = split_message(message)
    scalars = {name: value for name, value in scalars.items()
               if FIELD_SINCE.get((message.KIND, name), 0) <= version}
    manifest: list[list[Any]] = []
    payload: list[Frame] = []
    for name, tensor in tensors.items():
        data = tensor.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        if not data.is_contiguous():
            data = data.contiguous()
        if data.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {data.dtype} cannot be sent; use one of "
                             f"{sorted(DTYPES)}")
        view = _byte_view(data)
        frames = [view[offset:offset + max_frame_bytes] for offset in range(0, view.nbytes, max_frame_bytes)]
        manifest.append([name, DTYPE_NAMES[data.dtype], list(data.shape), view.nbytes, len(frames)])
        payload.extend(frames)
    digests = digest(payload)() if payload else []
    if len(digests) != len(payload):
        raise RuntimeError(f"the digester gave {len(digests)} digests for {len(payload)} frames")
    header = msgpack.packb({
        "v": version, "va": accepts, "k": message.KIND, "s": identity.public_key, "r": list(recipients),
        "run": run_id, "e": epoch, "q": seq, "f": scalars, "m": meta, "t": manifest, "d": digests,
    }, use_bin_type=True)
    return [header, *payload, identity.sign(SIGNING_DOMAIN + header)]


# ------------------------------------------------------------ decode


def decode(
    frames: Sequence[Frame], verifier: Verifier, windows: ReplayWindows | None = None,
    now_s: float | None = None,
) -> Decoded | Rejection:
    """Verify and decode one message; never raises. On success the replay window advances.
    ``now_s``: the driver's clock, which bounds a jump of the sender's counters (protocols/replay.py)."""
    try:
        return _decode(frames, verifier, windows, now_s)
    except _Reject as reject:
        return Rejection(reject.reason, reject.detail, reject.sender)
    except Exception as error:  # a bug, never the sender's fault: counted as internal_error
        return Rejection("internal_error", f"{type(error).__name__}: {error}"[:200])


def _unpack_header(raw: bytes, policy: Policy) -> dict[str, Any]:
    limit = policy.max_frames + policy.max_tensors + policy.max_recipients + 64
    try:
        header = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=max(KEY_BYTES, DIGEST_BYTES, 64), max_str_len=4096, max_array_len=limit,
            max_map_len=limit, max_ext_len=0)
    except Exception as error:  # msgpack raises many types for bad input
        raise _Reject("malformed_header", f"not msgpack: {type(error).__name__}") from None
    if not isinstance(header, dict):
        raise _Reject("malformed_header", "header is not a map")
    return header


def _need(header: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = header.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Reject("malformed_header", f"field {key!r} missing or of the wrong type")
    return value


def _counter(header: Mapping[str, Any], key: str) -> int:
    value = _need(header, key, int)
    if not 0 <= value < 1 << 63:
        raise _Reject("malformed_header", f"field {key!r} out of range")
    return int(value)


def _decode(frames: Sequence[Frame], verifier: Verifier, windows: ReplayWindows | None,
            now_s: float | None = None) -> Decoded:
    policy = verifier.policy
    if len(frames) < 2:
        raise _Reject("malformed_header", f"{len(frames)} frame(s): need a header and a signature")
    if not all(isinstance(frame, bytes | bytearray | memoryview) for frame in frames):
        raise _Reject("malformed_header", "a frame is not bytes")
    if len(frames) - 2 > policy.max_frames:
        raise _Reject("too_many_frames", f"{len(frames) - 2} payload frames > {policy.max_frames}")
    announced = _verify_header(frames[0], frames[-1], verifier, windows, now_s)
    payload = frames[1:-1]
    _check_frames(announced.layout, payload, policy)
    computed = verifier.digest(payload) if payload else _no_digests
    # the copies into the tensors overlap the hashing when the digester works on threads
    flats = [_gather(entry, payload[entry.first_frame:entry.first_frame + entry.nframes], verifier.allocate)
             for entry in announced.layout]
    digests = computed()
    if len(digests) != len(payload):
        raise RuntimeError(f"the digester gave {len(digests)} digests for {len(payload)} frames")
    for index, (got, want) in enumerate(zip(digests, announced.digests, strict=True)):
        if got != want:
            raise _Reject("digest_mismatch", f"payload frame {index}")
    decoded = _finish(announced, flats, windows, now_s)
    return dataclasses.replace(decoded, wire_bytes=sum(_length(frame) for frame in frames))


@dataclass(frozen=True)
class Announced:
    """A header whose signature, sender, run id, sequence and manifest limits were verified: the
    payload it announces (``layout``, one digest per frame) is not read yet. ``frame_bytes`` bounds
    each frame: a receiver may commit ``total_bytes`` to this message and no more."""

    sender: Member
    kind: str
    header: Mapping[str, Any]
    epoch: int
    seq: int
    layout: tuple[Slot, ...]
    digests: tuple[bytes, ...]
    accepts: int = MIN_PROTOCOL_VERSION     # the highest protocol version the sender accepts

    @property
    def total_bytes(self) -> int:
        return sum(entry.nbytes for entry in self.layout)

    @property
    def frame_count(self) -> int:
        return len(self.digests)


def verify_header(raw_header: Frame, signature: Frame, verifier: Verifier,
                  windows: ReplayWindows | None = None, now_s: float | None = None) -> Announced | Rejection:
    """Check a header on its own (everything ``decode`` checks before it reads a payload byte);
    never raises. The replay window does not move: :func:`complete` moves it."""
    try:
        if not isinstance(raw_header, bytes | bytearray | memoryview) or not isinstance(
                signature, bytes | bytearray | memoryview):
            raise _Reject("malformed_header", "a frame is not bytes")
        return _verify_header(raw_header, signature, verifier, windows, now_s)
    except _Reject as reject:
        return Rejection(reject.reason, reject.detail, reject.sender)
    except Exception as error:  # a bug, never the sender's fault: counted as internal_error
        return Rejection("internal_error", f"{type(error).__name__}: {error}"[:200])


def complete(announced: Announced, flats: Sequence[torch.Tensor], verifier: Verifier,
             windows: ReplayWindows | None = None, now_s: float | None = None) -> Decoded | Rejection:
    """The message of a verified header from its payload, gathered into ``flats`` (one flat tensor
    per layout entry) whose frames' digests matched; never raises. On success the window advances."""
    try:
        if windows is not None:     # another message of the sender may have been accepted meanwhile
            stale = windows.check(announced.sender.name, announced.epoch, announced.seq, now_s)
            if stale is not None:
                raise _Reject(stale, f"from {announced.sender.name}: epoch {announced.epoch} "
                              f"seq {announced.seq}", announced.sender.name)
        return _finish(announced, flats, windows, now_s)
    except _Reject as reject:
        return Rejection(reject.reason, reject.detail, reject.sender)
    except Exception as error:
        return Rejection("internal_error", f"{type(error).__name__}: {error}"[:200])


def _verify_header(raw: Frame, signature: Frame, verifier: Verifier, windows: ReplayWindows | None,
                   now_s: float | None) -> Announced:
    policy = verifier.policy
    if _length(raw) > policy.max_header_bytes:
        raise _Reject("frame_too_large", f"header of {_length(raw)} bytes > {policy.max_header_bytes}")
    raw_header = bytes(raw)
    header = _unpack_header(raw_header, policy)

    version = header.get("v")
    low, high = policy.accepted_versions
    if type(version) is not int or not low <= version <= high:   # 1.0 == 1 and True == 1: refused
        raise _Reject("version_unsupported", f"version {version!r}, this peer speaks {low}..{high}")
    accepts = header.get("va")
    accepts = accepts if type(accepts) is int and accepts >= version else version
    kind = _need(header, "k", str)
    cls = KINDS.get(kind)
    if cls is None:
        raise _Reject("unknown_kind", f"kind {kind[:40]!r}")
    sender_key = _need(header, "s", bytes)
    sender = verifier.roster.by_public_key(sender_key)
    if sender is None:
        public_id = encode_public_id(sender_key) if len(sender_key) == KEY_BYTES else sender_key.hex()
        if verifier.roster.is_revoked(sender_key):
            raise _Reject("revoked_key", f"key {public_id} was revoked or rotated away", public_id)
        raise _Reject("unknown_sender", f"key {public_id} is not on our roster", public_id)
    if kind not in policy.allowed_kinds.get(sender.role, ()):
        raise _Reject("wrong_role", f"a {sender.role} may not send {kind}", sender.name)
    recipients = _need(header, "r", list)
    if len(recipients) > policy.max_recipients:
        raise _Reject("malformed_header", f"{len(recipients)} recipients > {policy.max_recipients}")
    if verifier.receiver not in recipients and not any(
            isinstance(key, bytes) and key in verifier.also_receiver for key in recipients):
        raise _Reject("not_a_recipient", f"from {sender.name}, not addressed to this member", sender.name)

    public_key = verifier.roster.verifier_for(sender_key)   # the key it signed with (a rotation: either)
    if _length(signature) != SIGNATURE_BYTES or not verifier.verified.check(
            public_key, sender_key, bytes(signature), SIGNING_DOMAIN + raw_header):
        raise _Reject("bad_signature", f"from {sender.name}", sender.name)

    run = _need(header, "run", bytes)
    if run != verifier.run_id and kind not in RUN_FREE_KINDS:
        # the run id digests the [network] table (not the member list, which changes by roster version)
        raise _Reject("config_mismatch",
                      f"their run id {run.hex()[:12]} != ours {verifier.run_id.hex()[:12]}: "
                      "the shared settings ([network], [federation]) differ", sender.name)
    epoch, seq = _counter(header, "e"), _counter(header, "q")
    if windows is not None:
        stale = windows.check(sender.name, epoch, seq, now_s)
        if stale is not None:
            raise _Reject(stale, f"from {sender.name}: epoch {epoch} seq {seq}", sender.name)
    layout, digests = _check_manifest(header, policy)
    return Announced(sender, kind, header, epoch, seq, tuple(layout), tuple(digests), accepts)


def _finish(announced: Announced, flats: Sequence[torch.Tensor], windows: ReplayWindows | None,
            now_s: float | None) -> Decoded:
    message = _build(KINDS[announced.kind], announced.kind, announced.header, announced.layout, flats)
    if windows is not None:
        windows.accept(announced.sender.name, announced.epoch, announced.seq, now_s)
    return Decoded(announced.sender, message, announced.epoch, announced.seq, announced.accepts)


def announced_frames(raw_header: Frame, policy: Policy) -> int:
    """How many payload frames a (possibly refused) header says follow it, so that a receiver can
    skip them unread; 0 where the header cannot tell. Never raises."""
    try:
        if _length(raw_header) > policy.max_header_bytes:
            return 0
        digests = _unpack_header(bytes(raw_header), policy).get("d")
    except Exception:
        return 0
    return len(digests) if isinstance(digests, list) and len(digests) <= policy.max_frames else 0


def _no_digests() -> list[bytes]:
    return []


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _length(frame: Frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


@dataclass(frozen=True)
class Slot:
    """Where one announced tensor goes: its frames are ``first_frame`` to ``first_frame + nframes``."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    numel: int
    nbytes: int
    first_frame: int
    nframes: int


def _check_manifest(header: Mapping[str, Any], policy: Policy) -> tuple[list[Slot], list[bytes]]:
    """Validate the manifest against the limits; reads no frame and allocates nothing.

    Returns the tensors' layout and the declared frame digests (checked for form, not yet compared).
    """
    manifest = _need(header, "t", list)
    digests = _need(header, "d", list)
    if len(manifest) > policy.max_tensors:
        raise _Reject("too_many_tensors", f"{len(manifest)} tensors > {policy.max_tensors}")
    entries: list[Slot] = []
    names: set[str] = set()
    total_elements = total_bytes = total_frames = 0
    for index, item in enumerate(manifest):
        if not (isinstance(item, list) and len(item) == 5 and isinstance(item[0], str)
                and isinstance(item[1], str) and isinstance(item[2], list)):
            raise _Reject("malformed_header",
                          f"manifest entry {index} is not [name, dtype, shape, bytes, frames]")
        name, dtype_name, shape, nbytes, nframes = item
        if dtype_name not in policy.allowed_dtypes:
            raise _Reject("bad_dtype", f"tensor {name[:40]!r}: dtype {dtype_name[:20]!r} not allowed")
        if len(shape) > 32 or not all(_is_count(dim) for dim in shape):
            raise _Reject("malformed_header", f"tensor {name[:40]!r}: bad shape")
        if any(dim > policy.max_elements for dim in shape):  # even beside a 0, torch can't shape it
            raise _Reject("too_many_elements", f"tensor {name[:40]!r}: a dimension > {policy.max_elements}")
        if not (_is_count(nbytes) and _is_count(nframes)):
            raise _Reject("malformed_header", f"tensor {name[:40]!r}: bad byte or frame count")
        if name in names:
            raise _Reject("manifest_mismatch", f"tensor {name[:40]!r} listed twice")
        names.add(name)
        numel = 1
        for dim in shape:
            numel *= dim
            if numel > policy.max_elements:  # stop before the product itself gets huge
                break
        total_elements += numel
        if total_elements > policy.max_elements:
            raise _Reject("too_many_elements", f"tensor {name[:40]!r}: over {policy.max_elements} elements")
        dtype = DTYPES[dtype_name]
        if nbytes != numel * dtype.itemsize:
            raise _Reject("manifest_mismatch",
                          f"tensor {name[:40]!r}: {nbytes} bytes for {numel} {dtype_name}")
        total_bytes += nbytes
        if total_bytes > policy.max_message_bytes:
            raise _Reject("message_too_large", f"over {policy.max_message_bytes} bytes")
        if nbytes > nframes * policy.max_frame_bytes:
            raise _Reject("frame_too_large", f"tensor {name[:40]!r}: {nbytes} bytes in {nframes} frame(s)")
        if total_frames + nframes > policy.max_frames:
            raise _Reject("too_many_frames", f"over {policy.max_frames} frames declared")
        if nframes > nbytes:
            raise _Reject("manifest_mismatch", f"tensor {name[:40]!r}: {nframes} frames for {nbytes} bytes")
        entries.append(Slot(name, dtype, tuple(shape), numel, nbytes, total_frames, nframes))
        total_frames += nframes
    if len(digests) != total_frames:
        raise _Reject("manifest_mismatch", f"{len(digests)} digests for {total_frames} frames")
    for index, digest in enumerate(digests):
        if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
            raise _Reject("malformed_header", f"digest {index} is not {DIGEST_BYTES} bytes")
    return entries, digests


def _check_frames(layout: Sequence[Slot], payload: Sequence[Frame], policy: Policy) -> None:
    """The frames that arrived match the verified layout: count, then each tensor's bytes."""
    total_frames = sum(entry.nframes for entry in layout)
    if total_frames != len(payload):
        raise _Reject("manifest_mismatch", f"manifest declares {total_frames} frames, {len(payload)} arrived")
    for entry in layout:
        received = 0
        for frame in payload[entry.first_frame:entry.first_frame + entry.nframes]:
            length = _length(frame)
            if length > policy.max_frame_bytes:
                raise _Reject("frame_too_large", f"a frame of {length} bytes > {policy.max_frame_bytes}")
            received += length
        if received != entry.nbytes:
            raise _Reject("manifest_mismatch",
                          f"tensor {entry.name[:40]!r}: {received} bytes, {entry.nbytes} declared")


def _gather(entry: Slot, frames: Sequence[Frame], allocate: Callable[[torch.dtype, int], torch.Tensor],
            ) -> torch.Tensor:
    """The flat tensor from its frames: zero-copy for one frame, one copy into an allocated tensor for
    several. Nothing is checked here: the digests are compared, and the values checked, afterwards."""
    if entry.nbytes == 0:
        return torch.empty(0, dtype=entry.dtype)
    if len(frames) == 1:
        return shared_flat(entry, frames[0])
    flat = allocate_flat(entry, allocate)
    offset = 0
    for frame in frames:
        copy_into(flat, offset, frame)
        offset += _length(frame)
    return flat


def shared_flat(entry: Slot, frame: Frame) -> torch.Tensor:
    """A tensor sent in one frame: it shares the frame's memory (read-only: treat it so)."""
    if entry.nbytes == 0:
        return torch.empty(0, dtype=entry.dtype)
    with warnings.catch_warnings():  # read-only frames: the tensor shares their memory
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(frame, dtype=entry.dtype)


def allocate_flat(entry: Slot, allocate: Callable[[torch.dtype, int], torch.Tensor]) -> torch.Tensor:
    """The buffer a tensor sent in several frames is gathered into, checked for its shape."""
    flat = allocate(entry.dtype, entry.numel)
    if flat.dtype != entry.dtype or flat.shape != (entry.numel,) or not flat.is_contiguous():
        raise TypeError(f"allocate gave {flat.dtype} {tuple(flat.shape)}, not {entry.dtype} ({entry.numel},)")
    return flat


def copy_into(flat: torch.Tensor, offset: int, frame: Frame) -> None:
    """Copy one frame's bytes into ``flat`` at byte ``offset`` (the caller checked that they fit)."""
    length = _length(frame)
    if length:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flat.view(torch.uint8)[offset:offset + length].copy_(torch.frombuffer(frame, dtype=torch.uint8))


def _tensor(entry: Slot, flat: torch.Tensor) -> torch.Tensor:
    """The verified flat tensor in its declared shape (the very allocated tensor when already 1-D)."""
    if entry.dtype == torch.bool and flat.numel() and bool(flat.view(torch.uint8).max() > 1):
        raise _Reject("bad_field", f"bool tensor {entry.name[:40]!r} holds bytes other than 0 and 1")
    return flat if flat.shape == entry.shape else flat.view(entry.shape)


# Per message class: scalar field -> (accepted python types, required).
_FIELD_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,)}


def _scalar_fields(cls: type) -> dict[str, tuple[tuple[type, ...], bool]]:
    hints = get_type_hints(cls)
    out: dict[str, tuple[tuple[type, ...], bool]] = {}
    for item in dataclasses.fields(cls):
        if item.name in ("tensors", "meta"):
            continue
        hint = hints[item.name]
        accepted = _FIELD_TYPES[hint.__name__]
        required = item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
        out[item.name] = (accepted, required)
    return out


_SCALAR_FIELDS = {cls: _scalar_fields(cls) for cls in MESSAGE_TYPES}
_HAS_TENSORS = {cls: any(f.name == "tensors" for f in dataclasses.fields(cls)) for cls in MESSAGE_TYPES}


def _build(
    cls: type[Message], kind: str, header: Mapping[str, Any], entries: Sequence[Slot],
    flats: Sequence[torch.Tensor],
) -> Message:
    scalars = _need(header, "f", dict)
    meta = _need(header, "m", dict)
    spec = _SCALAR_FIELDS[cls]
    kwargs: dict[str, Any] = {}
    for name, value in scalars.items():
        if name not in spec:
            raise _Reject("bad_field", f"{kind} has no field {name[:40]!r}")
        accepted, _ = spec[name]
        if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
            raise _Reject("bad_field", f"{kind}.{name}: {type(value).__name__}")
        kwargs[name] = float(value) if float in accepted else value  # type: ignore[arg-type]
    missing = [name for name, (_, required) in spec.items() if required and name not in kwargs]
    if missing:
        raise _Reject("bad_field", f"{kind} lacks {', '.join(missing)}")
    has_tensors = _HAS_TENSORS[cls]
    if not has_tensors and (entries or meta):
        raise _Reject("bad_field", f"{kind} carries no tensors or meta")
    if has_tensors:
        for key, value in meta.items():
            if not isinstance(key, str) or not isinstance(value, int | float | str | bool):
                raise _Reject("bad_field", f"meta {str(key)[:40]!r}: {type(value).__name__}")
        kwargs["meta"] = dict(meta)
        kwargs["tensors"] = {
            entry.name: _tensor(entry, flat) for entry, flat in zip(entries, flats, strict=True)}
    return cls(**kwargs)

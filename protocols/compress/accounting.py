"""Exact bytes on the wire for a message, without hashing or signing its payload.

``message_bytes`` rebuilds the header ``protocols.codec.encode`` would write
(same fields, same msgpack, placeholder digests of the real length) and adds
the payload frames and the signature, so its answer equals
``wire_size(endpoint.seal(recipients, message))`` byte for byte; a test
seals a message for every operator and compares. The simulator uses it to
charge links for messages it does not need to sign.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from protocols.codec import DIGEST_BYTES, DTYPE_NAMES, KEY_BYTES, MAX_FRAME_BYTES, split_message
from protocols.compress.base import Compressed
from protocols.identity import SIGNATURE_BYTES
from protocols.messages import PROTOCOL_VERSION, Message
from protocols.wire import Endpoint


def message_bytes(
    message: Message,
    *,
    recipients: int = 1,
    run_id_bytes: int = 32,
    epoch: int = 1,
    seq: int = 0,
    sender_key: bytes = b"\x00" * KEY_BYTES,
    max_frame_bytes: int = MAX_FRAME_BYTES,
) -> int:
    """Header + payload frames + signature of ``message`` as ``codec.encode`` lays it out.

    ``epoch`` and ``seq`` matter by their msgpack width only (1 byte below 128,
    then 3, 5, 9); the keys and run id by their length only.
    """
    scalars, meta, tensors = split_message(message)
    manifest: list[list[Any]] = []
    payload = frames = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        count = -(-nbytes // max_frame_bytes)
        manifest.append([name, DTYPE_NAMES[tensor.dtype], list(tensor.shape), nbytes, count])
        payload += nbytes
        frames += count
    header = msgpack.packb({
        "v": PROTOCOL_VERSION, "va": PROTOCOL_VERSION, "k": message.KIND, "s": sender_key,
        "r": [b"\x00" * KEY_BYTES] * recipients, "run": b"\x00" * run_id_bytes, "e": epoch, "q": seq,
        "f": scalars, "m": meta, "t": manifest, "d": [b"\x00" * DIGEST_BYTES] * frames,
    }, use_bin_type=True)
    return len(header) + payload + SIGNATURE_BYTES


def endpoint_message_bytes(endpoint: Endpoint, recipients: Sequence[str], message: Message) -> int:
    """What ``endpoint.seal(recipients, message)`` will put on the wire, sealing nothing."""
    return message_bytes(
        message,
        recipients=len(recipients),
        run_id_bytes=len(endpoint.run_id),
        epoch=endpoint.epoch,
        seq=endpoint.seq,
        sender_key=endpoint.identity.public_key,
        max_frame_bytes=endpoint.policy.max_frame_bytes,
    )


def payload_bytes(c: Compressed) -> int:
    """The raw frame bytes of one compressed vector (the header adds its manifest and params)."""
    return c.payload_bytes

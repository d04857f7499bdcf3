"""Member identities: an Ed25519 signing key plus a CurveZMQ (X25519) key pair.

The public id is the printable form of the 32-byte Ed25519 public key
(lowercase base32 without padding, 52 characters). The Curve key pair rides
along so that the daemon can switch on CurveZMQ transport encryption with the
roster as its allowlist; it is stored and shown in Z85, the encoding ZeroMQ
uses, and generated here with ``cryptography`` so this package never imports zmq.

Key files (reading, writing, their text format) are peer/files/keyfile.py's:
this module holds keys in memory only.

A key is rotated by signing, with the old signing key, a statement of the new
keys (:func:`rotation_statement`): the roster carries that signature
(protocols/roster.py), so a roster edit alone cannot hand a member's place to
someone who never held its key.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

PUBLIC_ID_CHARS = 52  # base32 of 32 bytes, padding dropped
SIGNATURE_BYTES = 64
ROTATION_DOMAIN = b"hivemesh-key-rotation/1\x00"


# ------------------------------------------------------------ encodings


def encode_public_id(public_key: bytes) -> str:
    """The printable id of a raw 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, not {len(public_key)}")
    return base64.b32encode(public_key).decode("ascii").rstrip("=").lower()


def decode_public_id(public_id: str) -> bytes:
    """The raw 32-byte key of a printable id; ValueError if it is not one."""
    if not isinstance(public_id, str) or len(public_id) != PUBLIC_ID_CHARS:
        raise ValueError(f"a public id has {PUBLIC_ID_CHARS} base32 characters")
    try:
        raw = base64.b32decode(public_id.upper() + "====", casefold=False)
    except (binascii.Error, ValueError):
        raise ValueError("a public id uses only the characters a-z and 2-7") from None
    if encode_public_id(raw) != public_id:
        raise ValueError("not a canonical public id (write it in lowercase)")
    return raw


_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {char: index for index, char in enumerate(_Z85)}


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Z85 (RFC 32) of ``data``, whose length is a multiple of 4."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte groups")
    out: list[str] = []
    for offset in range(0, len(data), 4):
        value = int.from_bytes(data[offset:offset + 4], "big")
        group = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            group.append(_Z85[digit])
        out.extend(reversed(group))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """Inverse of :func:`z85_encode`; ValueError on a bad length or character."""
    if len(text) % 5:
        raise ValueError("Z85 text comes in whole 5-character groups")
    out = bytearray()
    for offset in range(0, len(text), 5):
        value = 0
        for char in text[offset:offset + 5]:
            if char not in _Z85_INDEX:
                raise ValueError(f"{char!r} is not a Z85 character")
            value = value * 85 + _Z85_INDEX[char]
        if value >= 1 << 32:
            raise ValueError("Z85 group out of range")
        out += value.to_bytes(4, "big")
    return bytes(out)


def curve_public_from_secret(secret: bytes) -> bytes:
    """The X25519 (CurveZMQ) public key of a raw 32-byte secret key."""
    return X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()


def verify_signature(public_key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    """True if ``signature`` is ``public_key``'s Ed25519 signature of ``data``."""
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def rotation_statement(name: str, new_public_key: bytes, new_curve_key: str, at_round: int) -> bytes:
    """What a member's old key signs to hand its place to a new key pair from round ``at_round`` on.

    Unambiguous without a length prefix: names and Z85 hold no NUL, the key and the round have
    fixed widths."""
    if len(new_public_key) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, not {len(new_public_key)}")
    if not 0 <= at_round < 1 << 63:
        raise ValueError(f"round {at_round} out of range")
    return (ROTATION_DOMAIN + name.encode("utf-8") + b"\x00" + new_public_key
            + new_curve_key.encode("ascii") + b"\x00" + at_round.to_bytes(8, "big"))


def encode_signature(signature: bytes) -> str:
    """A signature as the roster prints it (base64)."""
    return base64.b64encode(signature).decode("ascii")


def decode_signature(text: str) -> bytes:
    """Inverse of :func:`encode_signature`; ValueError unless it is 64 bytes of base64."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise ValueError("a signature is base64") from None
    if len(raw) != SIGNATURE_BYTES:
        raise ValueError(f"a signature has {SIGNATURE_BYTES} bytes, not {len(raw)}")
    return raw


# ------------------------------------------------------------ the identity


@dataclass(frozen=True)
class Identity:
    """One member's secret keys. Never sent anywhere; only signatures and public keys are."""

    signing_key: Ed25519PrivateKey = field(repr=False)
    curve_secret: bytes = field(repr=False)  # raw 32-byte X25519 secret for CurveZMQ

    def __post_init__(self) -> None:
        if len(self.curve_secret) != 32:
            raise ValueError("a Curve secret key has 32 bytes")

    @classmethod
    def generate(cls) -> Identity:
        """A fresh identity from the operating system's randomness."""
        curve = X25519PrivateKey.generate().private_bytes_raw()
        return cls(Ed25519PrivateKey.generate(), curve)

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key (what the wire header carries)."""
        return self.signing_key.public_key().public_bytes_raw()

    @property
    def public_id(self) -> str:
        """The printable public id (what the roster lists)."""
        return encode_public_id(self.public_key)

    @property
    def curve_public_key(self) -> str:
        """The CurveZMQ public key in Z85 (40 characters), as the roster lists it."""
        return z85_encode(curve_public_from_secret(self.curve_secret))

    @property
    def curve_secret_key(self) -> str:
        """The CurveZMQ secret key in Z85, for ``socket.curve_secretkey``."""
        return z85_encode(self.curve_secret)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self.signing_key.sign(data)

    def sign_rotation(self, name: str, new: Identity, at_round: int) -> str:
        """This (old) key's signature handing ``name``'s place to ``new`` from ``at_round`` (base64)."""
        return encode_signature(self.sign(rotation_statement(name, new.public_key, new.curve_public_key,
                                                             at_round)))

    def __repr__(self) -> str:
        return f"Identity(public_id={self.public_id!r})"


def load_public_key(public_key: bytes) -> Ed25519PublicKey:
    """An Ed25519 verifier for a raw 32-byte public key; ValueError if it is not one."""
    return Ed25519PublicKey.from_public_bytes(public_key)

"""The cryptography SecAgg uses, each primitive from a maintained library, each key bound to its use.

* Key derivation: HKDF-SHA256 (``cryptography``). Every derived key names its purpose, the run id and
  the round in HKDF's ``info`` (length-prefixed fields, so no two tuples give the same bytes): a key
  or mask seed is never used in two rounds or two runs.
* A client's per-round secrets (its two X25519 keys and its self-mask seed) come from one 32-byte
  ``client_secret`` the driver injects (the daemon draws it from the operating system; the
  simulator derives it from its seed), so this package never draws randomness of its own except
  inside Shamir sharing (below).
* Key agreement: X25519. The *cipher* key pair encrypts shares; the *mask* key pair gives the
  pairwise mask seeds, and its private half is what gets Shamir-shared.
* Shares travel in ChaCha20-Poly1305, one key per (sender, recipient) direction, used for exactly one
  message (so the all-zero nonce is safe), associated data binding (run id, round, sender, recipient).
* Masks: the ChaCha20 keystream of a 32-byte key, read as little-endian uint32 ring elements.
* Shamir sharing: pycryptodome's ``Shamir`` over GF(2^128), on 16-byte chunks; a 32-byte secret is
  two chunks shared with the same indices. Its polynomial coefficients come from pycryptodome's own
  ``get_random_bytes`` (the OS): share bytes differ between runs, what they rebuild does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

DOMAIN = b"hivemesh-secagg/1"
KEY_BYTES = 32
SHARE_BYTES = 32  # one Shamir share of a 32-byte secret: two 16-byte chunk shares
SALT_BYTES = 16  # the secret salt of one share's commitment
_ZERO_NONCE = bytes(12)


def frame(*parts: bytes | str | int) -> bytes:
    """An unambiguous byte string of ``parts`` (each length-prefixed; ints as 8 bytes)."""
    out = bytearray()
    for part in parts:
        raw = (part.encode("utf-8") if isinstance(part, str)
               else part.to_bytes(8, "big", signed=True) if isinstance(part, int) else part)
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def derive(key_material: bytes, *info: bytes | str | int) -> bytes:
    """32 bytes of HKDF-SHA256 from ``key_material``, bound to ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                info=frame(DOMAIN, *info)).derive(key_material)


# ------------------------------------------------------------------ a client's round secrets


class RoundSecrets:
    """One client's secrets for one attempt at one round, all derived from its injected
    ``client_secret``. ``attempt`` counts the machines this client started for the round (a gateway
    restored from a checkpoint, or a hostile one, may ask the same round again): the client keeps
    it, so no key, mask or share is ever used in two attempts either."""

    def __init__(self, client_secret: bytes, run_id: str, round_index: int, member: str,
                 attempt: int = 0) -> None:
        if len(client_secret) != KEY_BYTES:
            raise ValueError(f"a client secret has {KEY_BYTES} bytes, not {len(client_secret)}")
        if attempt < 0:
            raise ValueError(f"an attempt is counted from 0, not {attempt}")
        self.cipher_key = X25519PrivateKey.from_private_bytes(
            derive(client_secret, "cipher-key", run_id, round_index, attempt, member))
        self.mask_key = X25519PrivateKey.from_private_bytes(
            derive(client_secret, "mask-key", run_id, round_index, attempt, member))
        self.self_seed = derive(client_secret, "self-seed", run_id, round_index, attempt, member)
        self._salt_key = derive(client_secret, "share-salt", run_id, round_index, attempt, member)

    def salt(self, holder: str, kind: str) -> bytes:
        """The secret salt of the commitment to the ``kind`` share this client gives ``holder``."""
        return derive(self._salt_key, "salt", holder, kind)[:SALT_BYTES]

    @property
    def cipher_public(self) -> bytes:
        return self.cipher_key.public_key().public_bytes_raw()

    @property
    def mask_public(self) -> bytes:
        return self.mask_key.public_key().public_bytes_raw()

    @property
    def mask_private(self) -> bytes:
        return self.mask_key.private_bytes_raw()


def load_public(raw: bytes) -> X25519PublicKey | None:
    """An X25519 public key, or None when ``raw`` is not one."""
    try:
        return X25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def x25519_public_of(private: bytes) -> bytes:
    """The raw public key of a raw X25519 private key (to check a rebuilt key against its advert)."""
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


# ------------------------------------------------------------------ statements that get signed


def advert_statement(run_id: str, round_index: int, sender: str, cipher_public: bytes,
                     mask_public: bytes, seed_commitment: bytes) -> bytes:
    """What a client signs with its roster identity to advertise its two round keys and the
    commitment to its self-mask seed (:func:`seed_commitment`)."""
    return frame("advertise", run_id, round_index, sender, cipher_public, mask_public, seed_commitment)


def seed_commitment(self_seed: bytes, *, run_id: str, round_index: int, member: str) -> bytes:
    """SHA-256 of a client's self-mask seed, bound to its round: what a seed rebuilt from shares
    must match (a seed is 32 secret random bytes, so the hash hides it)."""
    return hashlib.sha256(frame("seed-commitment", run_id, round_index, member, self_seed)).digest()


def share_commitment(kind: str, index: int, share: bytes, salt: bytes) -> bytes:
    """SHA-256 of one revealed share (``kind``: "mask_key" or "self_seed") with its secret salt."""
    return hashlib.sha256(frame("share-commitment", kind, index, share, salt)).digest()


def digest(data: bytes) -> bytes:
    """SHA-256 of ``data`` (a share bundle's ciphertext, as its signature binds it)."""
    return hashlib.sha256(data).digest()


def share_statement(run_id: str, round_index: int, sender: str, recipient: str, ciphertext_digest: bytes,
                    commitment: bytes) -> bytes:
    """What a client signs for each share bundle: the ciphertext (by :func:`digest`) and the
    commitments to its two shares (mask key's, then self seed's), so the bundle's recipient can prove
    what it got and anyone can check a revealed share against what its owner dealt."""
    return frame("share", run_id, round_index, sender, recipient, ciphertext_digest, commitment)


def survivors_statement(run_id: str, round_index: int, survivors: Iterable[str]) -> bytes:
    """What a client signs in the consistency check: the survivor set it was told (sorted)."""
    return frame("survivors", run_id, round_index, *sorted(survivors))


# ------------------------------------------------------------------ share encryption


def _share_cipher(own_cipher_key: X25519PrivateKey, peer_public: X25519PublicKey, run_id: str,
                  round_index: int, sender: str, recipient: str) -> ChaCha20Poly1305:
    shared = own_cipher_key.exchange(peer_public)
    return ChaCha20Poly1305(derive(shared, "share-key", run_id, round_index, sender, recipient))


def encrypt_share(own_cipher_key: X25519PrivateKey, recipient_public: X25519PublicKey, *, run_id: str,
                  round_index: int, sender: str, recipient: str, plaintext: bytes) -> bytes:
    """ChaCha20-Poly1305 of ``plaintext`` from ``sender`` to ``recipient`` (only they can open it)."""
    cipher = _share_cipher(own_cipher_key, recipient_public, run_id, round_index, sender, recipient)
    return cipher.encrypt(_ZERO_NONCE, plaintext, frame("share", run_id, round_index, sender, recipient))


def decrypt_share(own_cipher_key: X25519PrivateKey, sender_public: X25519PublicKey, *, run_id: str,
                  round_index: int, sender: str, recipient: str, ciphertext: bytes) -> bytes | None:
    """The plaintext, or None when the ciphertext was forged, altered or addressed elsewhere."""
    cipher = _share_cipher(own_cipher_key, sender_public, run_id, round_index, sender, recipient)
    try:
        return cipher.decrypt(_ZERO_NONCE, ciphertext,
                              frame("share", run_id, round_index, sender, recipient))
    except InvalidTag:
        return None


# ------------------------------------------------------------------ masks


def expand_mask(seed: bytes, numel: int) -> np.ndarray:
    """``numel`` ring elements (int64 in [0, 2^32)) of ChaCha20's keystream under ``seed``."""
    encryptor = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
    stream = encryptor.update(bytes(4 * numel))
    return np.frombuffer(stream, dtype="<u4").astype(np.int64)


def pair_seed(own_mask_key: X25519PrivateKey, peer_public: X25519PublicKey, *, run_id: str,
              round_index: int, a: str, b: str) -> bytes:
    """The pairwise mask seed of clients ``a`` and ``b`` (the same from either side)."""
    low, high = sorted((a, b))
    return derive(own_mask_key.exchange(peer_public), "pair-mask", run_id, round_index, low, high)


def pair_seed_from_private(mask_private: bytes, peer_public: X25519PublicKey, *, run_id: str,
                           round_index: int, a: str, b: str) -> bytes:
    """:func:`pair_seed` from a rebuilt private key (the gateway removing a dropped client's masks)."""
    return pair_seed(X25519PrivateKey.from_private_bytes(mask_private), peer_public,
                     run_id=run_id, round_index=round_index, a=a, b=b)


def self_mask_key(self_seed: bytes, *, run_id: str, round_index: int, member: str) -> bytes:
    """The ChaCha20 key of a client's self mask, from its (shared) self-mask seed."""
    return derive(self_seed, "self-mask", run_id, round_index, member)


# ------------------------------------------------------------------ Shamir sharing


def split_secret(secret: bytes, threshold: int, holders: int) -> list[tuple[int, bytes]]:
    """``holders`` shares (index 1.., 32 bytes each) of a 32-byte secret; any ``threshold`` rebuild it."""
    if len(secret) != 2 * 16:
        raise ValueError("SecAgg shares 32-byte secrets (two 16-byte chunks)")
    low = Shamir.split(threshold, holders, secret[:16])
    high = Shamir.split(threshold, holders, secret[16:])
    return [(index, a + b) for (index, a), (_, b) in zip(low, high, strict=True)]


def combine_secret(shares: Sequence[tuple[int, bytes]], threshold: int, holders: int) -> bytes | None:
    """The 32-byte secret from at least ``threshold`` shares (exactly ``threshold`` of them are used,
    as pycryptodome requires); None with fewer, or with a share that is not 32 bytes.

    ValueError when an index is not one :func:`split_secret` hands out for ``holders`` (1 to
    ``holders``), or two shares claim one index: pycryptodome's GF(2^128) arithmetic never returns
    on a negative index, and an index 0 or out of range rebuilds a wrong secret without a word."""
    by_index: dict[int, bytes] = {}
    for index, share in shares:
        if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= holders:
            raise ValueError(f"share index {index!r} is outside 1..{holders}")
        if index in by_index:
            raise ValueError(f"two shares claim index {index}")
        by_index[index] = share
    chosen = sorted(by_index.items())[:threshold]
    if len(chosen) < threshold or any(len(share) != SHARE_BYTES for _, share in chosen):
        return None
    low = Shamir.combine([(index, share[:16]) for index, share in chosen])
    high = Shamir.combine([(index, share[16:]) for index, share in chosen])
    return low + high

"""SecAgg's ten messages: frozen dataclasses of plain bytes, ints, strings and tuples of them.

``to_wire(message)`` gives a dict that msgpack encodes as is (``{"kind": ..., field: value}``; a
KeyRoster's adverts go as bare ``[sender, cipher key, mask key, signature]`` lists, n of them);
``from_wire(obj)`` gives the message back, or a :class:`Malformed` with the reason (untrusted
input is data, never an exception). Which member sent a message is the envelope's business (the
wire layer signs and checks it); only :class:`AdvertiseKeys` names its sender, because clients
verify it after the gateway forwards it.

Client -> gateway: AdvertiseKeys, ShareKeys, MaskedInput, ConsistencySignature, UnmaskShares.
Gateway -> client: KeyRoster, ForwardedShares, SurvivorSet, ConsistencyProof, RecoveryRequest.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class AdvertiseKeys:
    """Round 0: a client's two fresh X25519 public keys, signed with its roster identity."""

    run_id: str
    round_index: int
    sender: str
    cipher_public: bytes  # encrypts the shares sent to this client
    mask_public: bytes  # agrees the pairwise mask seeds
    seed_commitment: bytes  # crypto.seed_commitment: what its rebuilt self-mask seed must hash to
    signature: bytes  # Ed25519 over crypto.advert_statement


@dataclass(frozen=True)
class KeyRoster:
    """Round 0 -> 1: every advertisement the gateway took (U1), to every client in U1."""

    run_id: str
    round_index: int
    adverts: tuple[AdvertiseKeys, ...]


@dataclass(frozen=True)
class ShareKeys:
    """Round 1: one encrypted share bundle per masking neighbour, as (recipient, ciphertext,
    commitment, signature): the commitment is the two shares' (crypto.share_commitment, mask key's
    then self seed's, 64 bytes), the signature the sender's over crypto.share_statement."""

    run_id: str
    round_index: int
    ciphertexts: tuple[tuple[str, bytes, bytes, bytes], ...]


@dataclass(frozen=True)
class ForwardedShares:
    """Round 1 -> 2: the bundles addressed to one client, as (sender, ciphertext, commitment,
    signature), as their senders (U2) signed them."""

    run_id: str
    round_index: int
    ciphertexts: tuple[tuple[str, bytes, bytes, bytes], ...]


@dataclass(frozen=True)
class MaskedInput:
    """Round 2: the client's quantised update plus its masks, little-endian uint32. ``accused``: the
    neighbours whose bundle it could not open or check (it masked without them), and then
    ``cipher_private``, its round cipher key, the evidence (blame.py): it opens only the bundles
    sent to this client in this round."""

    run_id: str
    round_index: int
    masked: bytes
    accused: tuple[str, ...] = ()
    cipher_private: bytes = b""


@dataclass(frozen=True)
class SurvivorSet:
    """Round 2 -> 3: the clients whose masked input the gateway took (U3)."""

    run_id: str
    round_index: int
    survivors: tuple[str, ...]


@dataclass(frozen=True)
class ConsistencySignature:
    """Round 3: the client's Ed25519 signature over the survivor set it was told."""

    run_id: str
    round_index: int
    signature: bytes


@dataclass(frozen=True)
class ConsistencyProof:
    """Round 3 -> 4: every consistency signature the gateway took, as (signer, signature)."""

    run_id: str
    round_index: int
    signatures: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class UnmaskShares:
    """Round 4: shares of the survivors' self-mask seeds and of the dropped clients' mask keys,
    each (owner, share index, 32-byte share, its commitment's salt). Never both kinds for one owner,
    except a culprit's mask key after a RecoveryRequest proved it dealt a wrong self-mask seed."""

    run_id: str
    round_index: int
    self_seed_shares: tuple[tuple[str, int, bytes, bytes], ...]
    mask_key_shares: tuple[tuple[str, int, bytes, bytes], ...]


@dataclass(frozen=True)
class RecoveryRequest:
    """Round 4 -> 5: proof that survivors dealt shares of a wrong self-mask seed (blame.py), asking
    their holders for their mask-key shares, so the gateway can take them out of the sum. Each entry
    is one revealed share: (culprit, holder, index, share, salt, ciphertext digest, commitment,
    culprit's signature), at least t per culprit."""

    run_id: str
    round_index: int
    evidence: tuple[tuple[str, str, int, bytes, bytes, bytes, bytes, bytes], ...]


ClientMessage = AdvertiseKeys | ShareKeys | MaskedInput | ConsistencySignature | UnmaskShares
GatewayMessage = KeyRoster | ForwardedShares | SurvivorSet | ConsistencyProof | RecoveryRequest
Message = ClientMessage | GatewayMessage

KINDS: dict[str, type[Any]] = {cls.__name__: cls for cls in (
    AdvertiseKeys, KeyRoster, ShareKeys, ForwardedShares, MaskedInput, SurvivorSet,
    ConsistencySignature, ConsistencyProof, UnmaskShares, RecoveryRequest)}


@dataclass(frozen=True)
class Malformed:
    """What ``from_wire`` gives for bytes that are not a SecAgg message."""

    reason: str


def to_wire(message: Message) -> dict[str, Any]:
    """Plain msgpack-able data: tuples become lists, nested adverts become dicts."""
    out: dict[str, Any] = {"kind": type(message).__name__}
    for item in fields(message):
        value = getattr(message, item.name)
        if item.name == "adverts":  # n of them: as bare lists, the run and round said once
            value = [[a.sender, a.cipher_public, a.mask_public, a.seed_commitment, a.signature]
                     for a in value]
        elif isinstance(value, tuple):
            value = [list(entry) for entry in value] if value and isinstance(value[0], tuple) else list(value)
        out[item.name] = value
    return out


# what each field must hold on the wire: a scalar type, or a tuple of entries of these types
_SCALARS: dict[str, type] = {"run_id": str, "round_index": int, "sender": str, "cipher_public": bytes,
                             "mask_public": bytes, "seed_commitment": bytes, "signature": bytes,
                             "masked": bytes, "cipher_private": bytes}
_ENTRIES: dict[str, tuple[type, ...]] = {
    "ciphertexts": (str, bytes, bytes, bytes), "signatures": (str, bytes), "survivors": (str,),
    "self_seed_shares": (str, int, bytes, bytes), "mask_key_shares": (str, int, bytes, bytes),
    "accused": (str,), "evidence": (str, str, int, bytes, bytes, bytes, bytes, bytes)}


def from_wire(obj: object) -> Message | Malformed:
    """The message ``obj`` (as msgpack decoded it) encodes, or Malformed(reason)."""
    if not isinstance(obj, dict):
        return Malformed("not a map")
    kind = obj.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return Malformed("unknown kind")
    names = [item.name for item in fields(cls)]
    if set(obj) != {"kind", *names}:
        return Malformed(f"{cls.__name__}: wrong fields")
    values: dict[str, Any] = {}
    for name in names:
        value = obj[name]
        if name == "adverts":
            if not isinstance(value, list) or not all(
                    isinstance(entry, list) and [type(part) for part in entry] == [str, *[bytes] * 4]
                    for entry in value):
                return Malformed("adverts: not a list of [sender, cipher key, mask key, seed commitment, "
                                 "signature]")
            # run_id and round_index come first in the fields, so they are already checked
            values[name] = tuple(AdvertiseKeys(values["run_id"], values["round_index"], *entry)
                                 for entry in value)
        elif name in _SCALARS:
            if type(value) is not _SCALARS[name]:
                return Malformed(f"{name}: not {_SCALARS[name].__name__}")
            values[name] = value
        else:
            shape = _ENTRIES[name]
            if not isinstance(value, list):
                return Malformed(f"{name}: not a list")
            entries: list[Any] = []
            for entry in value:
                parts = [entry] if len(shape) == 1 else entry
                if not isinstance(parts, list) or len(parts) != len(shape) or not all(
                        type(part) is kind for part, kind in zip(parts, shape, strict=True)):
                    return Malformed(f"{name}: bad entry")
                entries.append(parts[0] if len(shape) == 1 else tuple(parts))
            values[name] = tuple(entries)
    message: Message = cls(**values)
    return message

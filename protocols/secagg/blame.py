"""Blame in a SecAgg round: the checks that turn a client's misbehaviour into evidence anyone can verify.

Each share bundle is signed by its dealer over its ciphertext's digest and the commitments to its
two shares (crypto.share_statement, crypto.share_commitment: salted, so they hide the shares), and
each client commits to its self-mask seed in its signed advert (crypto.seed_commitment); its mask
key's commitment is the advertised public key. So every offence below is proven by the offender's
own signatures, and the gateway and any client reach the same verdict (one definition, here):

* ``bad_shares``: a bundle its recipient cannot open (no decryption, wrong length or index, a share
  not matching its commitment). The recipient masks without that neighbour, accuses it in its
  MaskedInput and reveals its round cipher key as evidence, checked against its signed advert; the
  gateway opens the bundle itself (:func:`bundle_opens`). The key opens only the bundles sent to
  the accuser in this round: one share of each of its neighbours' two secrets, what one more
  colluding neighbour would hold.
* ``false_accusation``: the accused's bundle opens under the accuser's own key.
* ``bad_evidence``: an accusation of a client that dealt the accuser nothing, or a key that is not
  the accuser's advertised one.
* ``wrong_secret``: t revealed shares, each matching its dealer's signed commitment, rebuild a secret
  the dealer's own commitment refuses (:func:`dealt_wrong`).
* ``bad_reveal``: a revealed share that does not match its dealer's commitment (its holder's lie).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocols.secagg import crypto

Verify = Callable[[str, bytes, bytes], bool]
KINDS = ("mask_key", "self_seed")  # the order of the two commitments in a bundle's 64 bytes
COMMITMENT_BYTES = 64
PLAINTEXT_BYTES = 4 + 2 * crypto.SHARE_BYTES + 2 * crypto.SALT_BYTES
# one revealed share, as a RecoveryRequest carries it: (culprit, holder, index, share, salt,
# ciphertext digest, commitment, culprit's signature)
Evidence = tuple[str, str, int, bytes, bytes, bytes, bytes, bytes]


@dataclass(frozen=True)
class Bundle:
    """What one share bundle holds: its index, both shares and their salts."""

    index: int
    key_share: bytes
    seed_share: bytes
    key_salt: bytes
    seed_salt: bytes

    def plaintext(self) -> bytes:
        return (self.index.to_bytes(4, "big") + self.key_share + self.seed_share + self.key_salt
                + self.seed_salt)

    def commitment(self) -> bytes:
        return (crypto.share_commitment("mask_key", self.index, self.key_share, self.key_salt)
                + crypto.share_commitment("self_seed", self.index, self.seed_share, self.seed_salt))

    def reveal(self, kind: str) -> tuple[int, bytes, bytes]:
        """(index, share, salt) of the ``kind`` share."""
        if kind == "mask_key":
            return self.index, self.key_share, self.key_salt
        return self.index, self.seed_share, self.seed_salt


def open_bundle(plaintext: bytes | None, commitment: bytes, index: int) -> Bundle | None:
    """The bundle in ``plaintext`` when it carries ``index`` and matches ``commitment``; else None."""
    if plaintext is None or len(plaintext) != PLAINTEXT_BYTES:
        return None
    shares, salts = plaintext[4:4 + 2 * crypto.SHARE_BYTES], plaintext[4 + 2 * crypto.SHARE_BYTES:]
    bundle = Bundle(int.from_bytes(plaintext[:4], "big"), shares[:crypto.SHARE_BYTES],
                    shares[crypto.SHARE_BYTES:], salts[:crypto.SALT_BYTES], salts[crypto.SALT_BYTES:])
    if bundle.index != index or bundle.commitment() != commitment:
        return None
    return bundle


def reveal_matches(kind: str, index: int, share: bytes, salt: bytes, commitment: bytes) -> bool:
    """Whether a revealed ``kind`` share is the one its dealer committed to in ``commitment``."""
    if len(commitment) != COMMITMENT_BYTES or len(share) != crypto.SHARE_BYTES:
        return False
    half = commitment[:32] if kind == "mask_key" else commitment[32:]
    return crypto.share_commitment(kind, index, share, salt) == half


def bundle_opens(cipher_private: bytes, dealer_cipher_public: bytes, *, run_id: str, round_index: int,
                 dealer: str, recipient: str, ciphertext: bytes, commitment: bytes, index: int) -> bool:
    """Whether ``dealer``'s bundle to ``recipient`` opens under the recipient's revealed round cipher
    key (the gateway checks the key against the recipient's advert first)."""
    public = crypto.load_public(dealer_cipher_public)
    if public is None or len(cipher_private) != crypto.KEY_BYTES:
        return False
    own = X25519PrivateKey.from_private_bytes(cipher_private)
    plaintext = crypto.decrypt_share(own, public, run_id=run_id, round_index=round_index, sender=dealer,
                                     recipient=recipient, ciphertext=ciphertext)
    return open_bundle(plaintext, commitment, index) is not None


def key_is_advertised(cipher_private: bytes, cipher_public: bytes) -> bool:
    """Whether ``cipher_private`` is the X25519 key whose public half was advertised."""
    return (len(cipher_private) == crypto.KEY_BYTES
            and crypto.x25519_public_of(cipher_private) == cipher_public)


def dealt_wrong(evidence: Sequence[Evidence], *, culprit: str, seed_commitment: bytes,
                holders: frozenset[str], threshold: int, run_id: str, round_index: int, verify: Verify,
                share_index: Callable[[frozenset[str], str], int]) -> bool:
    """Whether ``evidence`` proves that ``culprit`` dealt shares of a wrong self-mask seed: at least
    ``threshold`` shares from distinct ``holders`` (its masking neighbours), each at the index it
    owes that holder, each under its signed commitment, rebuilding a seed its advert's
    ``seed_commitment`` refuses. False for anything short of that (the client then reveals nothing)."""
    shares: dict[int, bytes] = {}
    for owner, holder, index, share, salt, ciphertext_digest, commitment, signature in evidence:
        statement = crypto.share_statement(run_id, round_index, owner, holder, ciphertext_digest, commitment)
        if (owner != culprit or holder not in holders or index != share_index(holders, holder)
                or index in shares or not reveal_matches("self_seed", index, share, salt, commitment)
                or not verify(culprit, signature, statement)):
            return False
        shares[index] = share
    if len(shares) < threshold:
        return False
    try:
        seed = crypto.combine_secret(sorted(shares.items()), threshold, len(holders))
    except ValueError:
        return False
    return seed is not None and crypto.seed_commitment(seed, run_id=run_id, round_index=round_index,
                                                       member=culprit) != seed_commitment

"""One client's side of one SecAgg round, as a pure state machine (one instance per round).

The driver feeds it the gateway's messages (``receive``) and its quantised update
(``provide_input``, any time before or after the shares arrive) and sends what it
returns. A failed check *aborts* the round (counted in ``aborts`` by reason; nothing
more is sent); a message that does not belong here is *refused* (``refused``) and
changes nothing. No timers: the gateway's deadlines decide who is in.

- ADVERTISED, on KeyRoster: adverts from the cohort, once, signed (``bad_advert``);
  ours unaltered (``own_keys_altered``); at least our floor (``roster_below_floor``),
  at most max_clients (``roster_above_max``); t <= k < 2t (``threshold_unsafe``);
  sends ShareKeys.
- SHARED, on ForwardedShares: from our neighbours, each bundle signed by its sender
  (``bad_share``); one that does not open, or lacks the index it owes us or its
  commitments, is left out and its sender accused (blame.py); at least t that open
  (``too_few_neighbours``); sends MaskedInput.
- MASKED, on SurvivorSet: we are in it, within the senders of shares
  (``survivors_not_shared``), at least t neighbours in it (``too_few_survivors``);
  sends ConsistencySignature.
- SIGNED, on ConsistencyProof: every signature over *our* set
  (``survivor_sets_disagree``), at least t (``too_few_signatures``), no peer whose
  other share an earlier attempt revealed (``would_reveal_both``); sends UnmaskShares.
- DONE, on RecoveryRequest: proof that each culprit dealt a wrong self-mask seed
  (blame.dealt_wrong; ``false_recovery``); sends its mask-key shares.

For each neighbour v we reveal v's self-mask-seed share if v is in the survivor set
we signed, else its mask-key share, never both, across every attempt at a round
(``revealed``). Why, and the roster floor: docs/design/secagg.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from enum import Enum

import numpy as np

from protocols.secagg import blame, crypto
from protocols.secagg.config import SecAggConfig
from protocols.secagg.fixedpoint import ring_add, ring_sub, to_bytes
from protocols.secagg.graph import graph_seed, neighbours
from protocols.secagg.messages import (
    AdvertiseKeys,
    ClientMessage,
    ConsistencyProof,
    ConsistencySignature,
    ForwardedShares,
    GatewayMessage,
    KeyRoster,
    MaskedInput,
    RecoveryRequest,
    ShareKeys,
    SurvivorSet,
    UnmaskShares,
)


def share_index(holders: frozenset[str], holder: str) -> int:
    """The Shamir index a client gives ``holder`` among its ``holders`` (its masking neighbours):
    1 + its place in name order, as :func:`crypto.split_secret` numbers them. The gateway checks
    the index of every revealed share against it (server.py)."""
    return sorted(holders).index(holder) + 1


Sign = Callable[[bytes], bytes]  # this member's Ed25519 signature of the bytes
Verify = Callable[[str, bytes, bytes], bool]  # (member, signature, data) -> valid under its roster key


class ClientPhase(Enum):
    IDLE = "idle"
    ADVERTISED = "advertised"
    SHARED = "shared"
    MASKED = "masked"
    SIGNED = "signed"
    DONE = "done"
    ABORTED = "aborted"


# which message each phase waits for
_EXPECTS: dict[ClientPhase, type] = {
    ClientPhase.ADVERTISED: KeyRoster, ClientPhase.SHARED: ForwardedShares,
    ClientPhase.MASKED: SurvivorSet, ClientPhase.SIGNED: ConsistencyProof, ClientPhase.DONE: RecoveryRequest}


class SecAggClient:
    """A client's SecAgg round: advertise, share, mask, sign the survivors, reveal shares."""

    def __init__(self, config: SecAggConfig, *, name: str, run_id: str, round_index: int,
                 cohort: frozenset[str], client_secret: bytes, sign: Sign, verify: Verify,
                 attempt: int = 0, revealed: dict[str, str] | None = None) -> None:
        """``attempt``: how many machines this client started for this round before (it keeps the
        count; the gateway cannot reset it), so this one's secrets are fresh. ``revealed``: what
        those earlier attempts revealed, peer -> kind, shared and updated (the consistency rule
        holds across attempts)."""
        self.config = config
        self.name = name
        self.run_id = run_id
        self.round_index = round_index
        self.cohort = cohort  # the clients the gateway asked this round (from the federation's RoundStart)
        self.sign = sign
        self.verify = verify
        self.attempt = attempt
        self.secrets = crypto.RoundSecrets(client_secret, run_id, round_index, name, attempt)
        self.phase = ClientPhase.IDLE
        self.aborts: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        # peer -> "self_seed" | "mask_key", over every attempt at this round
        self.revealed: dict[str, str] = {} if revealed is None else revealed
        self.threshold = 0
        self.neighbours: frozenset[str] = frozenset()
        self._graph: dict[str, frozenset[str]] = {}
        self._adverts: dict[str, AdvertiseKeys] = {}
        self._held: dict[str, blame.Bundle] = {}  # sender -> the bundle it dealt us
        self.accused: tuple[str, ...] = ()  # neighbours whose bundle did not open: masked without
        self._recovered = False  # answered the round's RecoveryRequest
        self._input: np.ndarray | None = None
        self._survivors: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ driver interface

    def start(self, now_s: float) -> list[ClientMessage]:
        """Round 0: advertise this round's two public keys, signed."""
        if self.phase is not ClientPhase.IDLE:
            return []
        self.phase = ClientPhase.ADVERTISED
        commitment = crypto.seed_commitment(self.secrets.self_seed, run_id=self.run_id,
                                            round_index=self.round_index, member=self.name)
        statement = crypto.advert_statement(self.run_id, self.round_index, self.name,
                                            self.secrets.cipher_public, self.secrets.mask_public, commitment)
        return [AdvertiseKeys(self.run_id, self.round_index, self.name, self.secrets.cipher_public,
                              self.secrets.mask_public, commitment, self.sign(statement))]

    def provide_input(self, quantised: np.ndarray, now_s: float) -> list[ClientMessage]:
        """Hand over the update in the ring (fixedpoint.quantise); sent masked once shares are in."""
        if self._input is not None or self.phase in (ClientPhase.ABORTED, ClientPhase.DONE):
            return []
        self._input = np.asarray(quantised, dtype=np.int64).copy()
        return self._masked_input() if self.phase is ClientPhase.SHARED and self._held else []

    def receive(self, message: GatewayMessage, now_s: float) -> list[ClientMessage]:
        """One message from the gateway; what to send back (nothing when refused or aborted)."""
        if self.phase is ClientPhase.ABORTED:
            self.refused["after_abort"] += 1
            return []
        if message.run_id != self.run_id or message.round_index != self.round_index:
            self.refused["wrong_round"] += 1
            return []
        if _EXPECTS.get(self.phase) is not type(message):
            self.refused["wrong_phase"] += 1
            return []
        match message:
            case KeyRoster():
                return self._on_roster(message)
            case ForwardedShares():
                return self._on_shares(message)
            case SurvivorSet():
                return self._on_survivors(message)
            case ConsistencyProof():
                return self._on_proof(message)
            case RecoveryRequest():
                return self._on_recovery(message)
        return []  # pragma: no cover (the _EXPECTS table covers every kind)

    # ------------------------------------------------------------------ rounds

    def _abort(self, reason: str) -> list[ClientMessage]:
        self.phase = ClientPhase.ABORTED
        self.aborts[reason] += 1
        return []

    def _on_roster(self, message: KeyRoster) -> list[ClientMessage]:
        adverts: dict[str, AdvertiseKeys] = {}
        for advert in message.adverts:
            statement = crypto.advert_statement(self.run_id, self.round_index, advert.sender,
                                                advert.cipher_public, advert.mask_public,
                                                advert.seed_commitment)
            if (advert.sender not in self.cohort or advert.sender in adverts
                    or (advert.run_id, advert.round_index) != (self.run_id, self.round_index)
                    or crypto.load_public(advert.cipher_public) is None
                    or crypto.load_public(advert.mask_public) is None
                    or not self.verify(advert.sender, advert.signature, statement)):
                return self._abort("bad_advert")
            adverts[advert.sender] = advert
        mine = adverts.get(self.name)
        if mine is None or (mine.cipher_public, mine.mask_public) != (self.secrets.cipher_public,
                                                                       self.secrets.mask_public):
            return self._abort("own_keys_altered")
        n = len(adverts)
        if n < self.config.roster_floor():  # a gateway shrinking our neighbourhood (and t) for its colluders
            return self._abort("roster_below_floor")
        if n > self.config.max_clients:  # more than the ring holds (and k, with it, past the checked range)
            return self._abort("roster_above_max")
        if not self.config.runs_with(n):  # t > k, or 2t <= k: a lying gateway could get both secrets
            return self._abort("threshold_unsafe")
        self._adverts = adverts
        self.threshold = self.config.threshold_for(n)
        seed = graph_seed(self.run_id, self.round_index,
                          {name: (a.cipher_public, a.mask_public) for name, a in adverts.items()})
        self._graph = neighbours(seed, sorted(adverts), self.config.degree_for(n))
        self.neighbours = self._graph[self.name]
        holders = sorted(self.neighbours)
        key_shares = crypto.split_secret(self.secrets.mask_private, self.threshold, len(holders))
        seed_shares = crypto.split_secret(self.secrets.self_seed, self.threshold, len(holders))
        ciphertexts: list[tuple[str, bytes, bytes, bytes]] = []
        for holder, (index, key_share), (_, seed_share) in zip(holders, key_shares, seed_shares, strict=True):
            public = crypto.load_public(adverts[holder].cipher_public)
            assert public is not None  # checked above
            bundle = blame.Bundle(index, key_share, seed_share, self.secrets.salt(holder, "mask_key"),
                                  self.secrets.salt(holder, "self_seed"))
            ciphertext = crypto.encrypt_share(
                self.secrets.cipher_key, public, run_id=self.run_id, round_index=self.round_index,
                sender=self.name, recipient=holder, plaintext=bundle.plaintext())
            commitment = bundle.commitment()
            signature = self.sign(crypto.share_statement(self.run_id, self.round_index, self.name, holder,
                                                         crypto.digest(ciphertext), commitment))
            ciphertexts.append((holder, ciphertext, commitment, signature))
        self.phase = ClientPhase.SHARED
        return [ShareKeys(self.run_id, self.round_index, tuple(ciphertexts))]

    def _on_shares(self, message: ForwardedShares) -> list[ClientMessage]:
        if self._held:  # already in, waiting for our input
            self.refused["duplicate"] += 1
            return []
        held: dict[str, blame.Bundle] = {}
        accused: list[str] = []
        for sender, ciphertext, commitment, signature in message.ciphertexts:
            statement = crypto.share_statement(self.run_id, self.round_index, sender, self.name,
                                               crypto.digest(ciphertext), commitment)
            if sender not in self.neighbours or sender in held or sender in accused \
                    or not self.verify(sender, signature, statement):
                return self._abort("bad_share")  # the gateway misrouted or altered what the sender signed
            public = crypto.load_public(self._adverts[sender].cipher_public)
            assert public is not None
            plaintext = crypto.decrypt_share(self.secrets.cipher_key, public, run_id=self.run_id,
                                             round_index=self.round_index, sender=sender,
                                             recipient=self.name, ciphertext=ciphertext)
            # what we would reveal must rebuild: the index it owes us, the shares it committed to
            bundle = blame.open_bundle(plaintext, commitment, share_index(self._graph[sender], self.name))
            if bundle is None:  # signed by its sender and unusable: the sender's fault, which we prove
                accused.append(sender)
                continue
            held[sender] = bundle
        if len(held) < self.threshold:
            return self._abort("too_few_neighbours")
        self._held = held
        self.accused = tuple(sorted(accused))
        return self._masked_input() if self._input is not None else []

    def _masked_input(self) -> list[ClientMessage]:
        assert self._input is not None
        numel = self._input.size
        masked = self._input.copy()
        ring_add(masked, crypto.expand_mask(crypto.self_mask_key(
            self.secrets.self_seed, run_id=self.run_id, round_index=self.round_index, member=self.name),
            numel))
        for peer in sorted(self._held):
            public = crypto.load_public(self._adverts[peer].mask_public)
            assert public is not None
            mask = crypto.expand_mask(crypto.pair_seed(
                self.secrets.mask_key, public, run_id=self.run_id, round_index=self.round_index,
                a=self.name, b=peer), numel)
            (ring_add if self.name < peer else ring_sub)(masked, mask)
        self.phase = ClientPhase.MASKED
        evidence = self.secrets.cipher_key.private_bytes_raw() if self.accused else b""
        return [MaskedInput(self.run_id, self.round_index, to_bytes(masked), self.accused, evidence)]

    def _on_survivors(self, message: SurvivorSet) -> list[ClientMessage]:
        survivors = frozenset(message.survivors)
        if len(survivors) != len(message.survivors) or self.name not in survivors:
            return self._abort("bad_survivor_set")
        if not (survivors & self.neighbours) <= self._held.keys():
            return self._abort("survivors_not_shared")
        if len(survivors & self.neighbours) < self.threshold:
            return self._abort("too_few_survivors")
        self._survivors = survivors
        self.phase = ClientPhase.SIGNED
        statement = crypto.survivors_statement(self.run_id, self.round_index, survivors)
        return [ConsistencySignature(self.run_id, self.round_index, self.sign(statement))]

    def _on_proof(self, message: ConsistencyProof) -> list[ClientMessage]:
        statement = crypto.survivors_statement(self.run_id, self.round_index, self._survivors)
        signers: set[str] = set()
        for signer, signature in message.signatures:
            # a signer outside our set, or a signature over another set, is the gateway telling
            # two clients two different things: nothing may be revealed then
            if signer not in self._survivors or not self.verify(signer, signature, statement):
                return self._abort("survivor_sets_disagree")
            signers.add(signer)
        if len(signers & self.neighbours) < self.threshold:
            return self._abort("too_few_signatures")
        kinds = {peer: "self_seed" if peer in self._survivors else "mask_key" for peer in sorted(self._held)}
        if any(self.revealed.get(peer, kind) != kind for peer, kind in kinds.items()):
            # an earlier attempt at this round revealed the other kind for one of these peers
            return self._abort("would_reveal_both")
        self.revealed.update(kinds)
        self_seed_shares: list[tuple[str, int, bytes, bytes]] = []
        mask_key_shares: list[tuple[str, int, bytes, bytes]] = []
        for peer, kind in kinds.items():
            (self_seed_shares if kind == "self_seed" else mask_key_shares).append(
                (peer, *self._held[peer].reveal(kind)))
        self.phase = ClientPhase.DONE
        return [UnmaskShares(self.run_id, self.round_index, tuple(self_seed_shares), tuple(mask_key_shares))]

    def _on_recovery(self, message: RecoveryRequest) -> list[ClientMessage]:
        """Survivors proven to have dealt a wrong self-mask seed (blame.dealt_wrong, checked here on
        their own signatures): reveal our share of their mask key too, so the gateway can take their
        input out of the sum. They forfeited the consistency rule; an honest client is never proven
        so, and anything short of proof reveals nothing (``false_recovery``)."""
        if self._recovered:
            self.refused["duplicate"] += 1
            return []
        culprits = sorted({entry[0] for entry in message.evidence})
        for culprit in culprits:
            proven = culprit in self._held and culprit in self._survivors and blame.dealt_wrong(
                [entry for entry in message.evidence if entry[0] == culprit], culprit=culprit,
                seed_commitment=self._adverts[culprit].seed_commitment, holders=self._graph[culprit],
                threshold=self.threshold, run_id=self.run_id, round_index=self.round_index,
                verify=self.verify, share_index=share_index)
            if not proven:
                return self._abort("false_recovery")
        self._recovered = True
        for culprit in culprits:
            self.revealed[culprit] = "both"  # any later attempt at this round must reveal nothing of it
        shares = tuple((culprit, *self._held[culprit].reveal("mask_key")) for culprit in culprits)
        return [UnmaskShares(self.run_id, self.round_index, (), shares)]

"""The gateway's side of one SecAgg round, as a pure state machine (one instance per round).

The gateway relays and counts; it never holds a key that opens a share. Each of the five rounds
collects one kind of message from the clients still in and closes when all answered or at its
deadline (``tick(now_s)``, ``deadline_s``); then it sends the next round's message to each client
still in (``Deliver``). Its sets are Bonawitz et al.'s: U1 advertised, U2 shared, U3 sent masked
input (the survivors), U4 signed the survivor set, and those that answered the unmask round.

message                                             verdict
==================================================  =====================
of a kind only the gateway sends                    ``wrong_kind``
from a member outside this round's expected set     ``unknown_sender``
for another run or round (a replay)                 ``wrong_round``
for a round already closed                          ``late``
for a round not yet open                            ``early``
a second one from a member in this round            ``duplicate``
advert naming another sender, or bad signature      ``bad_signature``
advert with keys that are not X25519 keys           ``bad_keys``
shares not addressed exactly to its neighbours      ``bad_shares``
a share bundle its sender's signature refuses       ``unsigned_shares`` (sender blamed)
masked input of the wrong length                    ``bad_input``
masked input accusing a dealer (blame.py): the      ``false_accusation`` / ``bad_evidence``
bundle opens under the accuser's revealed key, or   (accuser blamed); else the accused are
the key or the accused do not fit                   blamed ``bad_shares`` and the input taken
consistency signature not over the announced set    ``bad_signature``
unmask shares of the wrong kind, owner, length, or  ``bad_unmask``
an index not the one the owner gave that sender
a revealed share its owner's commitment refuses     ``bad_reveal`` (holder blamed)
==================================================  =====================
=======
A client message is refused (counted in ``refused`` by reason; nothing else changes) as
``wrong_kind``, ``unknown_sender``, ``wrong_round`` (another run or round), ``late``, ``early``,
``duplicate``, ``bad_signature``, ``bad_keys``, ``bad_shares``, ``unsigned_shares``, ``bad_input``,
``false_accusation``, ``bad_evidence``, ``bad_unmask`` (a share of the wrong kind, owner or length,
or an index not the one its owner gave) or ``bad_reveal``; the table
of which message meets which verdict is in docs/design/secagg.md.

Blame (blame.py says what proves each offence): a blamed client is out of the round (at MASKED_INPUT
its input is dropped and its masks removed as a dropped client's; a pair it was accused over holds
no mask). At the close of unmasking, a survivor whose rebuilt self-mask seed its advert's commitment
refuses is blamed ``wrong_secret``, its input left out of the sum, and RECOVER asks its honest
neighbours, with the proof, for their shares of its mask key, so its pair masks come out too: the
round ends over the honest survivors (``unrecovered`` when its mask key was dealt wrong as well).
``blamed`` names the culprits, whatever the round's end.

At the close of unmasking, with at least ``t`` shares per secret, the gateway rebuilds each
survivor's self-mask seed and each dropped (U2 minus U3) client's mask key (checked against the
key it advertised), removes those masks, and holds the sum in ``result``. A round that cannot go
on ends ``FAILED`` with ``failure``. Share indices are checked on arrival (``bad_unmask``) and
again in ``crypto.combine_secret`` (``failed_bad_share_index``): a wrong one must never reach
pycryptodome, which loops forever on a negative index and rebuilds a wrong secret from one out
of range.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from protocols.secagg import blame, crypto
from protocols.secagg.client import share_index
from protocols.secagg.config import SecAggConfig
from protocols.secagg.fixedpoint import from_bytes, ring_add, ring_sub
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

Verify = Callable[[str, bytes, bytes], bool]


class ServerPhase(Enum):
    ADVERTISE = 0
    SHARE = 1
    MASKED_INPUT = 2
    CONSISTENCY = 3
    UNMASK = 4
    RECOVER = 5  # only when survivors dealt a wrong self-mask seed: their mask keys are asked for
    DONE = 6
    FAILED = 7


_PHASE_OF: dict[type, ServerPhase] = {
    AdvertiseKeys: ServerPhase.ADVERTISE, ShareKeys: ServerPhase.SHARE,
    MaskedInput: ServerPhase.MASKED_INPUT, ConsistencySignature: ServerPhase.CONSISTENCY,
    UnmaskShares: ServerPhase.UNMASK}


@dataclass(frozen=True)
class Deliver:
    """Send ``message`` to the client ``recipient``."""

    recipient: str
    message: GatewayMessage


@dataclass(frozen=True)
class SecAggResult:
    """The unmasked sum in the ring of the survivors' quantised updates."""

    ring_sum: np.ndarray  # int64 in [0, 2^32): fixedpoint.dequantise_sum decodes it
    survivors: tuple[str, ...]  # U3: whose inputs the sum holds
    dropped: tuple[str, ...]  # U2 minus U3: shared keys, then sent no input (their masks removed)


class SecAggServer:
    """A gateway's SecAgg round over ``cohort`` for vectors of ``numel`` ring elements."""

    def __init__(self, config: SecAggConfig, *, run_id: str, round_index: int, cohort: frozenset[str],
                 numel: int, verify: Verify, now_s: float) -> None:
        config.validate(len(cohort))
        self.config = config
        self.run_id = run_id
        self.round_index = round_index
        self.cohort = cohort
        self.numel = numel
        self.verify = verify
        self.phase = ServerPhase.ADVERTISE
        self.deadline_s = now_s + config.advertise_timeout_s
        self.refused: Counter[str] = Counter()
        self.counters: Counter[str] = Counter()
        self.failure = ""
        self.result: SecAggResult | None = None
        self.threshold = 0
        self.graph: dict[str, frozenset[str]] = {}
        self.adverts: dict[str, AdvertiseKeys] = {}  # U1 once closed
        self.shares: dict[str, ShareKeys] = {}  # U2
        self.inputs: dict[str, np.ndarray] = {}  # U3
        self.signatures: dict[str, bytes] = {}  # U4
        self.unmasks: dict[str, UnmaskShares] = {}  # U5
        self.survivors: frozenset[str] = frozenset()
        self.blamed: dict[str, str] = {}  # culprit -> offence (blame.py), in the order found
        self.accused_by: dict[str, frozenset[str]] = {}  # survivor -> neighbours it masked without
        # (dealer, holder) -> (ciphertext, commitment, signature) of each bundle taken
        self.bundles: dict[tuple[str, str], tuple[bytes, bytes, bytes]] = {}
        self.recovering: dict[str, UnmaskShares] = {}  # RECOVER: the holders' answers
        self._partial: np.ndarray | None = None  # RECOVER: the sum still holding the culprits' masks
        self._honest: frozenset[str] = frozenset()  # RECOVER: the survivors the sum will hold
        self.left: set[str] = set()  # members that said they leave: expected in no later phase

    # ------------------------------------------------------------------ driver interface

    def receive(self, sender: str, message: ClientMessage, now_s: float) -> list[Deliver]:
        """One client message (``sender`` as the envelope proved it); what to deliver now."""
        recovering = self.phase is ServerPhase.RECOVER and isinstance(message, UnmaskShares)
        phase = ServerPhase.RECOVER if recovering else _PHASE_OF.get(type(message))
        if phase is None:  # a gateway's kind, sent by a client
            return self._refuse("wrong_kind")
        if message.run_id != self.run_id or message.round_index != self.round_index:
            return self._refuse("wrong_round")
        if sender not in self._expected():
            return self._refuse("unknown_sender")
        if phase.value < self.phase.value:
            return self._refuse("late")
        if phase.value > self.phase.value:
            return self._refuse("early")
        if sender in self._collected():
            return self._refuse("duplicate")
        verdict = self._take(sender, message)
        if verdict:
            self._refuse(verdict)
        else:
            self.counters[f"taken_{type(message).__name__}"] += 1
        if self._collected().keys() >= self._expected():  # a blamed client is expected no more
            return self._close(now_s)
        return []

    def tick(self, now_s: float) -> list[Deliver]:
        """Close the open round if its deadline has passed."""
        if self.phase in (ServerPhase.DONE, ServerPhase.FAILED) or now_s < self.deadline_s:
            return []
        self.counters[f"deadline_{self.phase.name.lower()}"] += 1
        return self._close(now_s)

    def gone(self, name: str, now_s: float) -> list[Deliver]:
        """``name`` said it leaves: the open phase, and every later one, waits for it no more, so
        the phase closes now if the rest answered (a dropout, as at the deadline, only sooner)."""
        if self.finished or name not in self.cohort or name in self.left:
            return []
        self.left.add(name)
        self.counters["left"] += 1
        if self._collected().keys() >= self._expected():
            return self._close(now_s)
        return []

    @property
    def finished(self) -> bool:
        return self.phase in (ServerPhase.DONE, ServerPhase.FAILED)

    # ------------------------------------------------------------------ bookkeeping

    def _refuse(self, reason: str) -> list[Deliver]:
        self.refused[reason] += 1
        return []

    def _blame(self, culprit: str, offence: str) -> str:
        """Name ``culprit`` for ``offence`` (its first in this round counts); the refusal reason."""
        if culprit not in self.blamed:
            self.blamed[culprit] = offence
            self.counters[f"blamed_{offence}"] += 1
        if self.phase.value <= ServerPhase.MASKED_INPUT.value:
            self.inputs.pop(culprit, None)  # out of the round; later, only a recovery takes it out
        return offence

    def _expected(self) -> frozenset[str]:
        """Who may send in the open round: whoever completed the one before, and did not leave."""
        previous = {ServerPhase.ADVERTISE: self.cohort, ServerPhase.SHARE: self.adverts.keys(),
                    ServerPhase.MASKED_INPUT: self.shares.keys() - self.blamed.keys(),
                    ServerPhase.CONSISTENCY: self.survivors, ServerPhase.UNMASK: self.signatures.keys(),
                    ServerPhase.RECOVER: self._recovery_holders()}.get(self.phase, frozenset())
        return frozenset(previous) - self.left

    def _collected(self) -> dict[str, object]:
        return {ServerPhase.ADVERTISE: self.adverts, ServerPhase.SHARE: self.shares,
                ServerPhase.MASKED_INPUT: self.inputs, ServerPhase.CONSISTENCY: self.signatures,
                ServerPhase.UNMASK: self.unmasks,
                ServerPhase.RECOVER: self.recovering}.get(self.phase, {})  # type: ignore[return-value]

    def _fail(self, reason: str) -> list[Deliver]:
        self.phase = ServerPhase.FAILED
        self.failure = reason
        self.counters[f"failed_{reason}"] += 1
        return []

    def _open(self, phase: ServerPhase, now_s: float, timeout_s: float) -> None:
        self.phase = phase
        self.deadline_s = now_s + timeout_s

    # ------------------------------------------------------------------ taking one message

    def _take(self, sender: str, message: ClientMessage) -> str:
        """Store ``message`` and return "", or return the refusal reason."""
        match message:
            case AdvertiseKeys():
                statement = crypto.advert_statement(self.run_id, self.round_index, message.sender,
                                                    message.cipher_public, message.mask_public,
                                                    message.seed_commitment)
                if message.sender != sender or not self.verify(sender, message.signature, statement):
                    return "bad_signature"
                if crypto.load_public(message.cipher_public) is None or crypto.load_public(
                        message.mask_public) is None:
                    return "bad_keys"
                self.adverts[sender] = message
            case ShareKeys():
                recipients = [entry[0] for entry in message.ciphertexts]
                if len(set(recipients)) != len(recipients) or set(recipients) != self.graph[sender]:
                    return "bad_shares"
                for recipient, ciphertext, commitment, signature in message.ciphertexts:
                    statement = crypto.share_statement(self.run_id, self.round_index, sender, recipient,
                                                       crypto.digest(ciphertext), commitment)
                    if len(commitment) != blame.COMMITMENT_BYTES \
                            or not self.verify(sender, signature, statement):
                        return self._blame(sender, "unsigned_shares")
                self.shares[sender] = message
                self.bundles.update({(sender, entry[0]): entry[1:] for entry in message.ciphertexts})
            case MaskedInput():
                vector = from_bytes(message.masked, self.numel)
                if vector is None:
                    return "bad_input"
                verdict = self._accusations(sender, message)
                if verdict:
                    return verdict
                self.inputs[sender] = vector
                self.accused_by[sender] = frozenset(message.accused)
            case ConsistencySignature():
                statement = crypto.survivors_statement(self.run_id, self.round_index, self.survivors)
                if not self.verify(sender, message.signature, statement):
                    return "bad_signature"
                self.signatures[sender] = message.signature
            case UnmaskShares():
                verdict = self._unmask_verdict(sender, message)
                if verdict:
                    return verdict
                (self.recovering if self.phase is ServerPhase.RECOVER else self.unmasks)[sender] = message
        return ""

    def _accusations(self, sender: str, message: MaskedInput) -> str:
        """Judge the accusations a MaskedInput carries (blame.py); "" when it has none, or each holds
        (the accused are blamed); else the accuser is blamed, and the offence is the refusal."""
        if not message.accused:
            return "" if not message.cipher_private else self._blame(sender, "bad_evidence")
        if len(set(message.accused)) != len(message.accused) or not blame.key_is_advertised(
                message.cipher_private, self.adverts[sender].cipher_public):
            return self._blame(sender, "bad_evidence")
        for accused in message.accused:
            bundle = self.bundles.get((accused, sender))
            if bundle is None:  # it dealt the accuser nothing: nothing to accuse it of
                return self._blame(sender, "bad_evidence")
            ciphertext, commitment, _ = bundle
            if blame.bundle_opens(message.cipher_private, self.adverts[accused].cipher_public,
                                  run_id=self.run_id, round_index=self.round_index, dealer=accused,
                                  recipient=sender, ciphertext=ciphertext, commitment=commitment,
                                  index=share_index(self.graph[accused], sender)):
                return self._blame(sender, "false_accusation")
        for accused in message.accused:
            self._blame(accused, "bad_shares")
        return ""

    def _unmask_verdict(self, sender: str, message: UnmaskShares) -> str:
        """"" for a well-formed answer (UNMASK: one share of each owner it holds, of the kind the
        consistency rule says; RECOVER: mask-key shares of the culprits only), ``bad_unmask`` for
        one that is not, ``bad_reveal`` (blamed) for a share its owner did not deal."""
        Reveals = tuple[tuple[str, int, bytes, bytes], ...]
        kinds: tuple[tuple[Reveals, frozenset[str]], tuple[Reveals, frozenset[str]]]
        if self.phase is ServerPhase.RECOVER:  # self-seed shares then: none expected (owners: none)
            kinds = ((message.self_seed_shares, frozenset()),
                     (message.mask_key_shares, self.survivors - self._honest))
        else:
            dropped = frozenset(self.shares.keys() - self.survivors)
            kinds = ((message.self_seed_shares, self.survivors), (message.mask_key_shares, dropped))
        for (entries, owners), kind in zip(kinds, blame.KINDS[::-1], strict=True):
            for owner, index, share, salt in entries:
                if owner not in owners or sender not in self.graph[owner] or len(share) != crypto.SHARE_BYTES:
                    return "bad_unmask"
                if index != share_index(self.graph[owner], sender):  # the index its owner gave it
                    return "bad_unmask"
                if not blame.reveal_matches(kind, index, share, salt, self.bundles[(owner, sender)][1]):
                    return self._blame(sender, "bad_reveal")
        owners_named = [entry[0] for entry in message.self_seed_shares + message.mask_key_shares]
        return "" if len(owners_named) == len(set(owners_named)) else "bad_unmask"

    # ------------------------------------------------------------------ closing a round

    def _close(self, now_s: float) -> list[Deliver]:
        match self.phase:
            case ServerPhase.ADVERTISE:
                return self._close_advertise(now_s)
            case ServerPhase.SHARE:
                return self._close_share(now_s)
            case ServerPhase.MASKED_INPUT:
                return self._close_masked_input(now_s)
            case ServerPhase.CONSISTENCY:
                return self._close_consistency(now_s)
            case ServerPhase.UNMASK:
                return self._close_unmask(now_s)
            case ServerPhase.RECOVER:
                return self._close_recover()
        return []

    def _close_advertise(self, now_s: float) -> list[Deliver]:
        n = len(self.adverts)
        if not self.config.runs_with(n):
            return self._fail("too_few_advertised")
        self.threshold = self.config.threshold_for(n)
        seed = graph_seed(self.run_id, self.round_index,
                          {name: (a.cipher_public, a.mask_public) for name, a in self.adverts.items()})
        self.graph = neighbours(seed, sorted(self.adverts), self.config.degree_for(n))
        roster = KeyRoster(self.run_id, self.round_index,
                           tuple(self.adverts[name] for name in sorted(self.adverts)))
        self._open(ServerPhase.SHARE, now_s, self.config.share_timeout_s)
        return [Deliver(name, roster) for name in sorted(self.adverts)]

    def _close_share(self, now_s: float) -> list[Deliver]:
        if len(self.shares) < self.threshold + 1:
            return self._fail("too_few_shared")
        inbox: dict[str, list[tuple[str, bytes, bytes, bytes]]] = {name: [] for name in self.shares}
        for sender in sorted(self.shares):
            for recipient, *signed in self.shares[sender].ciphertexts:
                if recipient in inbox:
                    ciphertext, commitment, signature = signed
                    inbox[recipient].append((sender, ciphertext, commitment, signature))
        self._open(ServerPhase.MASKED_INPUT, now_s, self.config.masked_input_timeout_s)
        return [Deliver(name, ForwardedShares(self.run_id, self.round_index, tuple(inbox[name])))
                for name in sorted(inbox)]

    def _close_masked_input(self, now_s: float) -> list[Deliver]:
        if len(self.inputs) < self.threshold + 1:
            return self._fail("too_few_inputs")
        self.survivors = frozenset(self.inputs)
        announcement = SurvivorSet(self.run_id, self.round_index, tuple(sorted(self.survivors)))
        self._open(ServerPhase.CONSISTENCY, now_s, self.config.consistency_timeout_s)
        return [Deliver(name, announcement) for name in sorted(self.survivors)]

    def _close_consistency(self, now_s: float) -> list[Deliver]:
        if len(self.signatures) < self.threshold:
            return self._fail("too_few_signatures")
        self._open(ServerPhase.UNMASK, now_s, self.config.unmask_timeout_s)
        # each signer gets its neighbours' signatures: those are the ones its threshold counts
        return [Deliver(name, ConsistencyProof(self.run_id, self.round_index, tuple(
            (peer, self.signatures[peer]) for peer in sorted(self.signatures.keys() & self.graph[name]))))
            for name in sorted(self.signatures)]

    def _combine(self, owner: str, shares: list[tuple[int, bytes]]) -> bytes | str:
        """``owner``'s secret rebuilt from ``shares``, or why not: ``too_few_shares``, or
        ``bad_share_index`` (``_unmask_ok`` refuses those; this is the second line)."""
        try:
            secret = crypto.combine_secret(shares, self.threshold, len(self.graph[owner]))
        except ValueError:
            return "bad_share_index"
        return "too_few_shares" if secret is None else secret

    def _close_unmask(self, now_s: float) -> list[Deliver]:
        self_seed: dict[str, list[tuple[str, int, bytes]]] = {name: [] for name in self.survivors}
        dropped = self.shares.keys() - self.survivors
        mask_key: dict[str, list[tuple[str, int, bytes]]] = {name: [] for name in dropped}
        for holder in sorted(self.unmasks):
            reply = self.unmasks[holder]
            for owner, index, share, _ in reply.self_seed_shares:
                self_seed[owner].append((holder, index, share))
            for owner, index, share, _ in reply.mask_key_shares:
                mask_key[owner].append((holder, index, share))
        total = np.zeros(self.numel, dtype=np.int64)
        wrong: list[str] = []
        for name in sorted(self.survivors):
            seed = self._combine(name, [(index, share) for _, index, share in self_seed[name]])
            if isinstance(seed, str):
                return self._fail(seed)
            if crypto.seed_commitment(seed, run_id=self.run_id, round_index=self.round_index,
                                      member=name) != self.adverts[name].seed_commitment:
                wrong.append(name)  # every share matched its commitment: it dealt them so
                self._blame(name, "wrong_secret")
                continue
            ring_add(total, self.inputs[name])
            ring_sub(total, crypto.expand_mask(crypto.self_mask_key(
                seed, run_id=self.run_id, round_index=self.round_index, member=name), self.numel))
        self._honest = self.survivors - frozenset(wrong)
        for name in sorted(mask_key):
            if not self._masked_with(name):  # e.g. a dealer of garbage: every neighbour masked without it
                continue
            private = self._combine(name, [(index, share) for _, index, share in mask_key[name]])
            if isinstance(private, str):
                return self._fail(private)
            if crypto.x25519_public_of(private) != self.adverts[name].mask_public:
                self._blame(name, "wrong_secret")  # its masks stay in the sum: the round cannot end well
                return self._fail("bad_reconstruction")
            self._remove_pair_masks(total, name, private)
        if wrong:
            return self._ask_recovery(total, {name: self_seed[name] for name in wrong}, now_s)
        return self._done(total)

    def _remove_pair_masks(self, total: np.ndarray, name: str, private: bytes) -> None:
        """Take out of ``total`` the pair masks the honest survivors added with ``name`` (one not in
        the sum), from its rebuilt mask key; a survivor that accused it added none."""
        for peer in self._masked_with(name):
            public = crypto.load_public(self.adverts[peer].mask_public)
            assert public is not None  # checked when advertised
            mask = crypto.expand_mask(crypto.pair_seed_from_private(
                private, public, run_id=self.run_id, round_index=self.round_index, a=peer, b=name),
                self.numel)
            # the survivor added the pair's mask when its name sorts first, else subtracted it
            (ring_sub if peer < name else ring_add)(total, mask)

    def _masked_with(self, name: str) -> list[str]:
        """The honest survivors that added a pair mask with ``name``: its neighbours, but those that
        accused it."""
        return [peer for peer in sorted(self.graph[name] & self._honest)
                if name not in self.accused_by.get(peer, frozenset())]

    def _recovery_holders(self) -> frozenset[str]:
        """RECOVER: the honest survivors holding a share of a culprit's mask key."""
        culprits = self.survivors - self._honest
        return frozenset(name for name in self._honest if self.graph[name] & culprits)

    def _ask_recovery(self, total: np.ndarray, seed_shares: dict[str, list[tuple[str, int, bytes]]],
                      now_s: float) -> list[Deliver]:
        """Survivors dealt shares of a wrong self-mask seed: their inputs are out of ``total``; ask their
        neighbours among the honest survivors for their mask-key shares, with the proof (the t
        shares the seed was rebuilt from, under the culprit's signed commitments)."""
        evidence: list[blame.Evidence] = []
        for culprit, shares in sorted(seed_shares.items()):
            reveals = {holder: self.unmasks[holder] for holder, _, _ in shares}
            for holder, index, share in sorted(shares, key=lambda entry: entry[1])[:self.threshold]:
                salt = next(entry[3] for entry in reveals[holder].self_seed_shares if entry[0] == culprit)
                ciphertext, commitment, signature = self.bundles[(culprit, holder)]
                evidence.append((culprit, holder, index, share, salt, crypto.digest(ciphertext), commitment,
                                 signature))
        self._partial = total
        self._open(ServerPhase.RECOVER, now_s, self.config.unmask_timeout_s)
        request = RecoveryRequest(self.run_id, self.round_index, tuple(evidence))
        return [Deliver(name, request) for name in sorted(self._recovery_holders())]

    def _close_recover(self) -> list[Deliver]:
        total = self._partial
        assert total is not None
        for culprit in sorted(self.survivors - self._honest):
            shares = [(index, share) for reply in self.recovering.values()
                      for owner, index, share, _ in reply.mask_key_shares if owner == culprit]
            private = self._combine(culprit, shares)
            if isinstance(private, str) \
                    or crypto.x25519_public_of(private) != self.adverts[culprit].mask_public:
                return self._fail("unrecovered")  # its two secrets both dealt wrong: named, not removable
            self._remove_pair_masks(total, culprit, private)
        return self._done(total)

    def _done(self, total: np.ndarray) -> list[Deliver]:
        self.result = SecAggResult(total, tuple(sorted(self._honest)),
                                   tuple(sorted(self.shares.keys() - self._honest)))
        self.phase = ServerPhase.DONE
        return []

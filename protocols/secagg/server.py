"""The gateway's side of one SecAgg round, as a pure state machine (one instance per round).

The gateway relays and counts; it never holds a key that opens a share. Each of the five rounds
collects one kind of message from the clients still in and closes when all answered or at its
deadline (``tick(now_s)``, ``deadline_s``); then it sends the next round's message to each client
still in (``Deliver``). Its sets are Bonawitz et al.'s: U1 advertised, U2 shared, U3 sent masked
input (the survivors), U4 signed the survivor set, and those that answered the unmask round.

A client message is refused (counted in ``refused`` by reason; nothing else changes) as
``wrong_kind``, ``unknown_sender``, ``wrong_round`` (another run or round), ``late``, ``early``,
``duplicate``, ``bad_signature``, ``bad_keys``, ``bad_shares``, ``bad_input`` or ``bad_unmask``
(a share of the wrong kind, owner or length, or an index not the one its owner gave); the table
of which message meets which verdict is in docs/design/secagg.md.

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

from protocols.secagg import crypto
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
    DONE = 5
    FAILED = 6


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

    # ------------------------------------------------------------------ driver interface

    def receive(self, sender: str, message: ClientMessage, now_s: float) -> list[Deliver]:
        """One client message (``sender`` as the envelope proved it); what to deliver now."""
        phase = _PHASE_OF.get(type(message))
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
            return self._refuse(verdict)
        self.counters[f"taken_{type(message).__name__}"] += 1
        if self._collected().keys() >= self._expected():
            return self._close(now_s)
        return []

    def tick(self, now_s: float) -> list[Deliver]:
        """Close the open round if its deadline has passed."""
        if self.phase in (ServerPhase.DONE, ServerPhase.FAILED) or now_s < self.deadline_s:
            return []
        self.counters[f"deadline_{self.phase.name.lower()}"] += 1
        return self._close(now_s)

    @property
    def finished(self) -> bool:
        return self.phase in (ServerPhase.DONE, ServerPhase.FAILED)

    # ------------------------------------------------------------------ bookkeeping

    def _refuse(self, reason: str) -> list[Deliver]:
        self.refused[reason] += 1
        return []

    def _expected(self) -> frozenset[str]:
        """Who may send in the open round: whoever completed the one before."""
        previous = {ServerPhase.ADVERTISE: self.cohort, ServerPhase.SHARE: self.adverts.keys(),
                    ServerPhase.MASKED_INPUT: self.shares.keys(), ServerPhase.CONSISTENCY: self.survivors,
                    ServerPhase.UNMASK: self.signatures.keys()}.get(self.phase, frozenset())
        return frozenset(previous)

    def _collected(self) -> dict[str, object]:
        return {ServerPhase.ADVERTISE: self.adverts, ServerPhase.SHARE: self.shares,
                ServerPhase.MASKED_INPUT: self.inputs, ServerPhase.CONSISTENCY: self.signatures,
                ServerPhase.UNMASK: self.unmasks}.get(self.phase, {})  # type: ignore[return-value]

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
                                                    message.cipher_public, message.mask_public)
                if message.sender != sender or not self.verify(sender, message.signature, statement):
                    return "bad_signature"
                if crypto.load_public(message.cipher_public) is None or crypto.load_public(
                        message.mask_public) is None:
                    return "bad_keys"
                self.adverts[sender] = message
            case ShareKeys():
                recipients = [recipient for recipient, _ in message.ciphertexts]
                if len(set(recipients)) != len(recipients) or set(recipients) != self.graph[sender]:
                    return "bad_shares"
                self.shares[sender] = message
            case MaskedInput():
                vector = from_bytes(message.masked, self.numel)
                if vector is None:
                    return "bad_input"
                self.inputs[sender] = vector
            case ConsistencySignature():
                statement = crypto.survivors_statement(self.run_id, self.round_index, self.survivors)
                if not self.verify(sender, message.signature, statement):
                    return "bad_signature"
                self.signatures[sender] = message.signature
            case UnmaskShares():
                if not self._unmask_ok(sender, message):
                    return "bad_unmask"
                self.unmasks[sender] = message
        return ""

    def _unmask_ok(self, sender: str, message: UnmaskShares) -> bool:
        dropped = self.shares.keys() - self.survivors
        for entries, owners in ((message.self_seed_shares, self.survivors),
                                (message.mask_key_shares, dropped)):
            for owner, index, share in entries:
                if owner not in owners or sender not in self.graph[owner] or len(share) != crypto.SHARE_BYTES:
                    return False
                if index != share_index(self.graph[owner], sender):  # the index its owner gave it
                    return False
        owners_named = [owner for owner, _, _ in message.self_seed_shares + message.mask_key_shares]
        return len(owners_named) == len(set(owners_named))

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
                return self._close_unmask()
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
        inbox: dict[str, list[tuple[str, bytes]]] = {name: [] for name in self.shares}
        for sender in sorted(self.shares):
            for recipient, ciphertext in self.shares[sender].ciphertexts:
                if recipient in inbox:
                    inbox[recipient].append((sender, ciphertext))
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

    def _close_unmask(self) -> list[Deliver]:
        self_seed: dict[str, list[tuple[int, bytes]]] = {name: [] for name in self.survivors}
        dropped = self.shares.keys() - self.survivors
        mask_key: dict[str, list[tuple[int, bytes]]] = {name: [] for name in dropped}
        for reply in self.unmasks.values():
            for owner, index, share in reply.self_seed_shares:
                self_seed[owner].append((index, share))
            for owner, index, share in reply.mask_key_shares:
                mask_key[owner].append((index, share))
        total = np.zeros(self.numel, dtype=np.int64)
        for name in sorted(self.survivors):
            ring_add(total, self.inputs[name])
        for name in sorted(self_seed):
            seed = self._combine(name, self_seed[name])
            if isinstance(seed, str):
                return self._fail(seed)
            ring_sub(total, crypto.expand_mask(crypto.self_mask_key(
                seed, run_id=self.run_id, round_index=self.round_index, member=name), self.numel))
        for name in sorted(mask_key):
            private = self._combine(name, mask_key[name])
            if isinstance(private, str):
                return self._fail(private)
            if crypto.x25519_public_of(private) != self.adverts[name].mask_public:
                return self._fail("bad_reconstruction")
            for peer in sorted(self.graph[name] & self.survivors):
                public = crypto.load_public(self.adverts[peer].mask_public)
                assert public is not None  # checked when advertised
                mask = crypto.expand_mask(crypto.pair_seed_from_private(
                    private, public, run_id=self.run_id, round_index=self.round_index, a=peer, b=name),
                    self.numel)
                # the survivor added the pair's mask when its name sorts first, else subtracted it
                (ring_sub if peer < name else ring_add)(total, mask)
        self.result = SecAggResult(total, tuple(sorted(self.survivors)),
                                   tuple(sorted(self.shares.keys() - self.survivors)))
        self.phase = ServerPhase.DONE
        return []

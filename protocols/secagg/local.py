"""One SecAgg round run in-process: a gateway, its clients and a lossless instant link between them.

For tests and bench/bench_secagg.py, and a reference for the drivers that come later: it does what
a driver does (route messages, fire deadlines, drop clients) and nothing a machine decides. Clients
drop by schedule: ``drop_before[name] = r`` means the client sends nothing from round r on (0:
never advertises, 2: shares its keys then leaves before sending its input, 3: leaves right after
its masked input). ``tamper`` sees each batch of the gateway's deliveries and returns what is
really delivered (a dishonest gateway); when it keeps a whole batch, ``run`` returns and leaves
the round to the caller. Bytes are msgpack of ``messages.to_wire`` per message;
``clock`` (a CPU clock the caller injects; none is read here) attributes compute time to parties.

Identities are Ed25519 keys derived from ``seed`` and the member name, so a run is repeatable.
With a ``sample``, only the clients in it verify every signature themselves; the others share one
memo of verdicts (the same verdicts: n clients each verifying n adverts is n^2 signature checks,
which is most of a simulated 1,000-client round). Measure per-client CPU on the sample then.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from collections.abc import Callable, Mapping

import msgpack
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocols.identity import verify_signature
from protocols.secagg.config import SecAggConfig
from protocols.secagg.insider import client_class
from protocols.secagg.messages import (
    ClientMessage,
    ConsistencyProof,
    ForwardedShares,
    KeyRoster,
    Message,
    RecoveryRequest,
    SurvivorSet,
    to_wire,
)
from protocols.secagg.server import Deliver, SecAggResult, SecAggServer

GATEWAY = "gateway"
# the round a client's reply to each gateway message belongs to
_REPLY_ROUND: dict[type, int] = {KeyRoster: 1, ForwardedShares: 2, SurvivorSet: 3, ConsistencyProof: 4,
                                 RecoveryRequest: 5}


def wire_bytes(message: Message) -> int:
    """Bytes of ``message`` as msgpack carries it (without the envelope's header and signature)."""
    return len(msgpack.packb(to_wire(message), use_bin_type=True))


def holding(kind: type) -> tuple[list[Deliver], Callable[[list[Deliver]], list[Deliver]]]:
    """A ``tamper`` for :meth:`LocalRound.run` that keeps the first batch of deliveries holding a
    ``kind`` message (so the round stops there, for the caller to drive), and the list it keeps."""
    held: list[Deliver] = []

    def tamper(deliveries: list[Deliver]) -> list[Deliver]:
        if not held and any(isinstance(d.message, kind) for d in deliveries):
            held.extend(deliveries)
            return []
        return deliveries

    return held, tamper


class SeededKeyring:
    """Ed25519 identities for named members, derived from a seed; sign and verify by name."""

    def __init__(self, names: list[str], seed: int) -> None:
        self._keys = {name: Ed25519PrivateKey.from_private_bytes(
            hashlib.sha256(f"secagg-local\x00{seed}\x00{name}".encode()).digest()) for name in names}
        self._public: dict[str, Ed25519PublicKey] = {
            name: key.public_key() for name, key in self._keys.items()}

    def signer(self, name: str) -> Callable[[bytes], bytes]:
        return self._keys[name].sign

    def verify(self, name: str, signature: bytes, data: bytes) -> bool:
        public = self._public.get(name)
        return public is not None and verify_signature(public, signature, data)


class LocalRound:
    """A gateway and ``inputs``' clients (name -> quantised ring vector) for one round."""

    def __init__(self, config: SecAggConfig, inputs: Mapping[str, np.ndarray], *, run_id: str = "run",
                 round_index: int = 1, seed: int = 0, now_s: float = 0.0,
                 clock: Callable[[], float] | None = None, sample: frozenset[str] | None = None,
                 behaviours: Mapping[str, str] | None = None) -> None:
        """``behaviours``: name -> a dishonest client's behaviour (protocols/secagg/insider.py)."""
        names = sorted(inputs)
        self.inputs = dict(inputs)
        self.roster = SeededKeyring(names, seed)
        self.now_s = now_s
        self.clock = clock
        self.bytes_up: Counter[str] = Counter()  # client -> bytes it sent
        self.bytes_down: Counter[str] = Counter()  # client -> bytes the gateway sent it
        self.cpu_s: dict[str, float] = {}  # party (client name or GATEWAY) -> seconds of ``clock``
        self.sent: dict[str, list[ClientMessage]] = {name: [] for name in names}
        numel = len(next(iter(inputs.values())))
        started = self._start()
        self.server = SecAggServer(config, run_id=run_id, round_index=round_index, cohort=frozenset(names),
                                   numel=numel, verify=self.roster.verify, now_s=now_s)
        self._charge(GATEWAY, started)
        memo: dict[tuple[str, bytes, bytes], bool] = {}

        def remembered(member: str, signature: bytes, data: bytes) -> bool:
            key = (member, signature, data)
            if key not in memo:
                memo[key] = self.roster.verify(member, signature, data)
            return memo[key]

        self.clients = {name: client_class((behaviours or {}).get(name, ""))(
            config, name=name, run_id=run_id, round_index=round_index, cohort=frozenset(names),
            client_secret=hashlib.sha256(f"secagg-secret\x00{seed}\x00{name}".encode()).digest(),
            sign=self.roster.signer(name),
            verify=self.roster.verify if sample is None or name in sample else remembered) for name in names}

    def _start(self) -> float:
        return self.clock() if self.clock is not None else 0.0

    def _charge(self, party: str, started: float) -> None:
        if self.clock is not None:
            self.cpu_s[party] = self.cpu_s.get(party, 0.0) + self.clock() - started

    def run(self, drop_before: Mapping[str, int] | None = None,
            tamper: Callable[[list[Deliver]], list[Deliver]] | None = None,
            goodbye: bool = False) -> SecAggResult | None:
        """Run the round to its end (or until nothing moves); the gateway's result, if any.
        ``goodbye``: a client that drops says it leaves (``SecAggServer.gone``) instead of going
        silent, when it would first have answered."""
        drops = drop_before or {}
        alive = {name: drops.get(name, 6) for name in self.clients}  # first round it misses
        outbox: deque[tuple[str, ClientMessage]] = deque()
        pending: list[Deliver] = []  # what a goodbye made the gateway send

        def leave(name: str) -> None:
            if goodbye and name not in self.server.left:
                pending.extend(self.server.gone(name, self.now_s))

        for name, client in self.clients.items():
            if alive[name] > 0:
                started = self._start()
                outbox.extend((name, m) for m in client.start(self.now_s))
                client.provide_input(self.inputs[name], self.now_s)
                self._charge(name, started)
            else:
                leave(name)
        while not self.server.finished:
            deliveries, pending = pending, []
            while outbox:
                sender, message = outbox.popleft()
                self.sent[sender].append(message)
                self.bytes_up[sender] += wire_bytes(message)
                started = self._start()
                deliveries += self.server.receive(sender, message, self.now_s)
                self._charge(GATEWAY, started)
            if not deliveries and not self.server.finished:
                self.now_s = max(self.now_s, self.server.deadline_s)  # nobody else is coming: the deadline
                started = self._start()
                deliveries = self.server.tick(self.now_s)
                self._charge(GATEWAY, started)
            if tamper is not None:
                sent, deliveries = deliveries, tamper(deliveries)
                if sent and not deliveries and not outbox:
                    break  # the tamperer kept the whole batch: the caller drives the round from here
            for delivery in deliveries:
                self.bytes_down[delivery.recipient] += wire_bytes(delivery.message)
                if alive[delivery.recipient] <= _REPLY_ROUND[type(delivery.message)]:
                    leave(delivery.recipient)
                    continue  # gone before it could answer
                started = self._start()
                replies = self.clients[delivery.recipient].receive(delivery.message, self.now_s)
                self._charge(delivery.recipient, started)
                outbox.extend((delivery.recipient, reply) for reply in replies)
        return self.server.result

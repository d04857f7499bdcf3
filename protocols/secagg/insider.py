"""A dishonest SecAgg client, for tests and the simulator: the offences blame.py names, made on purpose.

One definition for every driver (protocols/secagg/local.py, the federation's SecureClient under a
test's hook, the simulator): :func:`client_class` gives the machine a client runs for one round.
Everything it forges is derived from its own secrets (no randomness of its own) and signed with its
own roster key, as a real insider holding its member's keys would:

- ``garbage_shares``: every share bundle it deals is replaced by bytes of the same length that open
  for no one, committed and signed as usual (its recipients accuse it: ``bad_shares``);
- ``wrong_secret``: it deals shares of another self-mask seed than the one it committed to and
  masks with (the gateway rebuilds a seed its commitment refuses: ``wrong_secret``);
- ``false_accusation``: it accuses one neighbour whose bundle opened fine, revealing its key as
  the protocol asks (the gateway opens the bundle: ``false_accusation``);
- ``extreme_input``: an honest machine, but the input it masks is :func:`extreme_input`'s, far
  outside what clipping allows (SecAgg cannot see it: grouped aggregation bounds its reach).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from protocols.secagg import crypto
from protocols.secagg.client import SecAggClient
from protocols.secagg.messages import ClientMessage, KeyRoster, ShareKeys

MACHINE_BEHAVIOURS = ("garbage_shares", "wrong_secret", "false_accusation")
BEHAVIOURS = (*MACHINE_BEHAVIOURS, "extreme_input")
EXTREME = 1 << 30  # what extreme_input puts in each coordinate: 2^14 clients' worth of 16-bit levels


class InsiderClient(SecAggClient):
    """A SecAggClient that commits ``behaviour`` (one of :data:`BEHAVIOURS`)."""

    def __init__(self, *args: Any, behaviour: str, **kwargs: Any) -> None:
        if behaviour not in MACHINE_BEHAVIOURS:
            raise ValueError(f"a SecAgg insider machine's behaviour is one of {MACHINE_BEHAVIOURS}, "
                             f"not {behaviour!r}")
        super().__init__(*args, **kwargs)
        self.behaviour = behaviour

    def _on_roster(self, message: KeyRoster) -> list[ClientMessage]:
        if self.behaviour == "wrong_secret":  # deal another seed than the committed one
            true = self.secrets.self_seed
            self.secrets.self_seed = crypto.derive(true, "insider-wrong-secret")
            try:
                return super()._on_roster(message)
            finally:
                self.secrets.self_seed = true
        sent = super()._on_roster(message)
        if self.behaviour != "garbage_shares":
            return sent
        return [self._garbage(m) if isinstance(m, ShareKeys) else m for m in sent]

    def _garbage(self, message: ShareKeys) -> ShareKeys:
        entries: list[tuple[str, bytes, bytes, bytes]] = []
        for holder, ciphertext, commitment, _ in message.ciphertexts:
            garbage = b"".join(crypto.derive(self.secrets.self_seed, "insider-garbage", holder, block)
                               for block in range(len(ciphertext) // crypto.KEY_BYTES + 1))[:len(ciphertext)]
            statement = crypto.share_statement(self.run_id, self.round_index, self.name, holder,
                                               crypto.digest(garbage), commitment)
            entries.append((holder, garbage, commitment, self.sign(statement)))
        return ShareKeys(message.run_id, message.round_index, tuple(entries))

    def _masked_input(self) -> list[ClientMessage]:
        if self.behaviour == "false_accusation" and not self.accused and len(self._held) > self.threshold:
            victim = sorted(self._held)[0]
            del self._held[victim]
            self.accused = (victim,)
        return super()._masked_input()


def client_class(behaviour: str) -> Callable[..., SecAggClient]:
    """What builds the machine of a client that behaves so ("": honest), from SecAggClient's arguments."""
    if not behaviour or behaviour == "extreme_input":
        return SecAggClient
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"a SecAgg insider's behaviour is one of {BEHAVIOURS}, not {behaviour!r}")
    return functools.partial(InsiderClient, behaviour=behaviour)


def extreme_input(quantised: np.ndarray) -> np.ndarray:
    """``quantised`` (a client's ring vector, its weight last) with every coordinate but the weight
    set to :data:`EXTREME`: a valid ring element no honest client can send."""
    out = np.asarray(quantised, dtype=np.int64).copy()
    out[:-1] = EXTREME
    return out

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
  the protocol asks (the gateway opens the bundle: ``false_accusation``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from protocols.secagg import crypto
from protocols.secagg.client import SecAggClient
from protocols.secagg.messages import ClientMessage, KeyRoster, ShareKeys

BEHAVIOURS = ("garbage_shares", "wrong_secret", "false_accusation")


class InsiderClient(SecAggClient):
    """A SecAggClient that commits ``behaviour`` (one of :data:`BEHAVIOURS`)."""

    def __init__(self, *args: Any, behaviour: str, **kwargs: Any) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"a SecAgg insider's behaviour is one of {BEHAVIOURS}, not {behaviour!r}")
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
    if not behaviour:
        return SecAggClient
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"a SecAgg insider's behaviour is one of {BEHAVIOURS}, not {behaviour!r}")
    return functools.partial(InsiderClient, behaviour=behaviour)

"""Shared set-up for the wire tests: a small roster and helpers to forge messages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from protocols.codec import SIGNING_DOMAIN, Frame, Policy
from protocols.identity import Identity
from protocols.roster import Roster, run_id
from protocols.wire import Endpoint


@dataclass
class Network:
    identities: dict[str, Identity]  # roster members by name, plus "mallory" who is not on it
    roster: Roster
    run_id: bytes

    def endpoint(self, name: str, epoch: int = 1, policy: Policy | None = None) -> Endpoint:
        return Endpoint(self.identities[name], self.roster, self.run_id, epoch, policy or Policy())


def make_network() -> Network:
    names_roles = {"alice": "peer", "bob": "peer", "gate": "gateway", "phone": "edge"}
    identities = {name: Identity.generate() for name in [*names_roles, "mallory"]}
    members = []
    for index, (name, role) in enumerate(names_roles.items()):
        entry = {"name": name, "public_id": identities[name].public_id, "role": role,
                 "curve_key": identities[name].curve_public_key}
        if role != "edge":
            entry["address"] = f"tcp://127.0.0.1:{7000 + index}"
        members.append(entry)
    roster = Roster.from_dict({"member": members})
    shared = {"roster": roster, "topology": "ring", "algorithm": "dpsgd", "task": "digits-mlp"}
    return Network(identities, roster, run_id(shared))


def resign(frames: list[Frame], signer: Identity, mutate: Callable[[dict[str, Any]], Any]) -> list[Frame]:
    """The same message with its header changed by ``mutate`` and signed again by ``signer``."""
    header = msgpack.unpackb(bytes(frames[0]), raw=False)
    mutate(header)
    raw = msgpack.packb(header, use_bin_type=True)
    return [raw, *frames[1:-1], signer.sign(SIGNING_DOMAIN + raw)]


def flip(frame: Frame, index: int, mask: int = 0x01) -> bytes:
    data = bytearray(bytes(frame))
    data[index] ^= mask
    return bytes(data)

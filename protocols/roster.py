"""The roster: the one source of membership (names, public ids, roles, addresses).

Pure data: ``Roster.from_dict`` validates a plain mapping (as read from the
roster TOML by ``peer.files.roster_file``) and names every bad entry; ``to_dict``
gives it back. ``run_id`` digests the network's shared configuration so that
peers configured differently refuse each other (``config_mismatch``); the
member list is not part of it (a roster carries a ``version`` and an
``effective_round`` instead, see :class:`Roster`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocols.identity import decode_public_id, load_public_key, z85_decode
from topology.errors import HivemeshError

ROLES = ("peer", "gateway", "edge")
ROLES_WITH_ADDRESS = ("peer", "gateway")
GOSSIP_ROLES = ("peer", "gateway")  # the members of the topology: a gateway gossips too
RUN_ID_BYTES = 32
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ADDRESS = re.compile(r"(tcp://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")


class RosterError(HivemeshError, ValueError):
    """A roster that names a member twice, has a bad key, role or address, ..."""


@dataclass(frozen=True, kw_only=True)
class Member:
    """One roster entry."""

    name: str
    public_id: str  # printable Ed25519 public key (protocols.identity.encode_public_id)
    role: str = "peer"  # peer | gateway | edge
    address: str = ""  # "tcp://host:port" where peers and gateways listen; edge clients dial out
    curve_key: str = ""  # CurveZMQ public key in Z85; empty = this member cannot use CURVE

    def __post_init__(self) -> None:
        problems = _member_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @functools.cached_property
    def public_key(self) -> bytes:  # cached: decoding per seal cost ~45 us a recipient in the simulator
        return decode_public_id(self.public_id)

    def to_dict(self) -> dict[str, str]:
        data = {"name": self.name, "public_id": self.public_id, "role": self.role}
        if self.address:
            data["address"] = self.address
        if self.curve_key:
            data["curve_key"] = self.curve_key
        return data


def _member_problems(member: Member) -> list[str]:
    problems = []
    if not isinstance(member.name, str) or not _NAME.fullmatch(member.name):
        problems.append("name must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    try:
        decode_public_id(member.public_id)
    except ValueError as error:
        problems.append(f"public_id: {error}")
    if member.role not in ROLES:
        problems.append(f"role must be one of {', '.join(ROLES)}, not {member.role!r}")
    if not isinstance(member.address, str):
        problems.append("address must be a string")
    elif member.address:
        match = _ADDRESS.fullmatch(member.address)
        if not match or not 1 <= int(match["port"]) <= 65535:
            problems.append(f"address {member.address!r} is not tcp://HOST:PORT")
    elif member.role in ROLES_WITH_ADDRESS:
        problems.append(f"a {member.role} needs an address (tcp://HOST:PORT)")
    if not isinstance(member.curve_key, str):
        problems.append("curve_key must be a string")
    elif member.curve_key:
        try:
            if len(z85_decode(member.curve_key)) != 32:
                raise ValueError("not 32 bytes")
        except ValueError as error:
            problems.append(f"curve_key is not a Z85 Curve public key ({error})")
    return problems


@dataclass(frozen=True)
class Roster:
    """Members sorted by name, with lookups by name and by public key.

    ``version`` counts the edits (``hivemesh roster add|remove`` bump it) and
    ``effective_round`` is the round from which every member applies this
    version: before it, the previous version's membership holds. Members whose
    versions differ for a round refuse each other's messages of that round
    (protocols/node/membership.py), naming both versions.
    """

    members: tuple[Member, ...] = ()
    version: int = 1
    effective_round: int = 0
    _by_name: dict[str, Member] = field(init=False, repr=False, compare=False)
    _by_key: dict[bytes, Member] = field(init=False, repr=False, compare=False)
    _verifiers: dict[str, Ed25519PublicKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        members = tuple(sorted(self.members, key=lambda m: m.name))
        problems = []
        if not _is_count(self.version) or self.version < 1:
            problems.append(f"version must be an integer >= 1, not {self.version!r}")
        if not _is_count(self.effective_round):
            problems.append(f"effective_round must be an integer >= 0, not {self.effective_round!r}")
        by_name: dict[str, Member] = {}
        by_key: dict[bytes, Member] = {}
        for member in members:
            if member.name in by_name:
                problems.append(f"member {member.name!r} is listed twice")
            key = member.public_key
            if key in by_key:
                problems.append(f"members {by_key[key].name!r} and {member.name!r} share a public_id")
            by_name[member.name] = member
            by_key[key] = member
        if problems:
            raise RosterError("roster: " + "; ".join(problems))
        verifiers = {}
        for member in members:
            try:
                verifiers[member.name] = load_public_key(member.public_key)
            except ValueError:
                raise RosterError(
                    f"roster: member {member.name!r}: public_id is not an Ed25519 key") from None
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_by_key", by_key)
        object.__setattr__(self, "_verifiers", verifiers)

    # ---------------------------------------------------------- lookups

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(member.name for member in self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[Member]:
        return iter(self.members)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str) -> Member | None:
        return self._by_name.get(name)

    def member(self, name: str) -> Member:
        """The member called ``name``; RosterError if there is none."""
        found = self._by_name.get(name)
        if found is None:
            raise RosterError(f"roster has no member {name!r}")
        return found

    def by_public_id(self, public_id: str) -> Member | None:
        try:
            return self._by_key.get(decode_public_id(public_id))
        except ValueError:
            return None

    def by_public_key(self, public_key: bytes) -> Member | None:
        """The member whose raw 32-byte Ed25519 key this is, or None."""
        return self._by_key.get(public_key)

    def verifier(self, name: str) -> Ed25519PublicKey:
        """The member's Ed25519 public key object (cached)."""
        return self._verifiers[name]

    def with_role(self, *roles: str) -> tuple[Member, ...]:
        return tuple(member for member in self.members if member.role in roles)

    def curve_allowlist(self) -> frozenset[str]:
        """Z85 Curve public keys of every member that has one: the CURVE (ZAP) allowlist."""
        return frozenset(member.curve_key for member in self.members if member.curve_key)

    # ---------------------------------------------------------- edits (new rosters)

    def add(self, member: Member) -> Roster:
        """This roster with ``member`` (same version: :meth:`revised` makes the edit a new version)."""
        return dataclasses.replace(self, members=(*self.members, member))

    def remove(self, name: str) -> Roster:
        """This roster without ``name`` (same version: see :meth:`revised`)."""
        self.member(name)
        kept = tuple(member for member in self.members if member.name != name)
        return dataclasses.replace(self, members=kept)

    def revised(self, effective_round: int) -> Roster:
        """The next version of this roster, applied by every member from ``effective_round`` on."""
        return dataclasses.replace(self, version=self.version + 1, effective_round=effective_round)

    # ---------------------------------------------------------- plain data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "roster") -> Roster:
        """Build from ``{"version": 1, "effective_round": 0, "member": [{name, public_id, role,
        address, curve_key}, ...]}`` (``version`` and ``effective_round`` optional: 1 and 0).

        RosterError names every bad entry (by name where it has one).
        """
        if not isinstance(data, Mapping):
            raise RosterError(f"{source}: expected a table with [[member]] entries")
        unknown = set(data) - {"member", "version", "effective_round"}
        if unknown:
            raise RosterError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        entries = data.get("member", [])
        if not isinstance(entries, Sequence) or isinstance(entries, str | bytes):
            raise RosterError(f"{source}: 'member' must be a list of tables ([[member]])")
        allowed = {f.name for f in dataclasses.fields(Member)}
        members, problems = [], []
        for index, entry in enumerate(entries):
            label = f"member #{index + 1}"
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                label = f"member {entry['name']!r}"
            if not isinstance(entry, Mapping):
                problems.append(f"{label}: expected a table")
                continue
            extra = set(entry) - allowed
            missing = {"name", "public_id"} - set(entry)
            if extra or missing:
                why = []
                if extra:
                    why.append("unknown key(s) " + ", ".join(sorted(map(str, extra))))
                if missing:
                    why.append("missing " + ", ".join(sorted(missing)))
                problems.append(f"{label}: {'; '.join(why)}")
                continue
            try:
                members.append(Member(**entry))
            except (ValueError, TypeError) as error:
                problems.append(f"{label}: {error}")
        version, effective_round = data.get("version", 1), data.get("effective_round", 0)
        if not _is_count(version) or version < 1:
            problems.append(f"'version' must be an integer >= 1, not {version!r}")
        if not _is_count(effective_round):
            problems.append(f"'effective_round' must be an integer >= 0, not {effective_round!r}")
        if problems:
            raise RosterError(f"{source}: " + "; ".join(problems))
        try:
            return cls(tuple(members), version=version, effective_round=effective_round)
        except RosterError as error:
            raise RosterError(f"{source}: {str(error).removeprefix('roster: ')}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "effective_round": self.effective_round,
                "member": [member.to_dict() for member in self.members]}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ------------------------------------------------------------ run id


def _canonical(value: Any, where: str) -> Any:
    if isinstance(value, Roster):
        return _canonical(value.to_dict(), where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _canonical(dataclasses.asdict(value), where)
    if isinstance(value, Mapping):
        out = {}
        for key in sorted(value, key=str):
            if not isinstance(key, str):
                raise TypeError(f"run_id: key {key!r} in {where or 'config'} is not a string")
            out[key] = _canonical(value[key], f"{where}.{key}" if where else key)
        return out
    if isinstance(value, list | tuple):
        return [_canonical(item, where) for item in value]
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    raise TypeError(f"run_id: {where or 'config'} holds a {type(value).__name__}, not plain data")


def run_id(shared: Mapping[str, Any]) -> bytes:
    """A 32-byte digest of the shared configuration (topology spec, algorithm, task, ...).

    Drivers give it the network settings, not the roster's member list: membership changes by
    roster version while a run goes on (a member with another version is refused by the Node,
    naming both versions), and a run id that hashed the members would split the network at
    every edit.

    Canonical: map keys are sorted, tuples count as lists, floats as float64,
    so equal configurations give equal ids on every machine.
    """
    packed = msgpack.packb(_canonical(shared, ""), use_bin_type=True, use_single_float=False)
    return hashlib.sha256(b"hivemesh-run-id/1\x00" + packed).digest()

"""The roster: the one source of membership (names, public ids, roles, addresses).

Pure data: ``Roster.from_dict`` validates a plain mapping (as read from the
roster TOML by ``peer.files.roster_file``) and names every bad entry; ``to_dict``
gives it back. ``run_id`` digests the network's shared configuration so that
peers configured differently refuse each other (``config_mismatch``); the
member list is not part of it (a roster carries a ``version`` and an
``effective_round`` instead, see :class:`Roster`).

Keys change by roster version too. A rotation gives a member a new key pair in
the next version: its entry names the key it replaces (``rotated_from``) and
carries that old key's signature over the new keys, the member's name and the
round of the change (``rotation_signature``, protocols/identity.py
``rotation_statement``), so only the holder of the old key can hand its place
on. The old key goes to the roster's ``revoked`` list, as does the key of a
member that is revoked outright (removed, its key refused for good).
protocols/node/membership.py decides which keys are accepted while a change is
under way (:meth:`Roster.also_accepting`); the codec refuses a revoked key as
``revoked_key``.
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

from protocols.errors import HivemeshError
from protocols.identity import (
    decode_public_id,
    decode_signature,
    load_public_key,
    rotation_statement,
    verify_signature,
    z85_decode,
)

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
    # a rotation: the key this one replaced, the round it took over, the old key's signature (base64)
    rotated_from: str = ""
    rotated_at_round: int = 0
    rotation_signature: str = ""
    # an edge client's gateway (its roster name): the one gateway that serves it, whatever the
    # gateways' configs list; empty: their configs decide (protocols/node/membership.py, Serving)
    gateway: str = ""

    def __post_init__(self) -> None:
        problems = _member_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @functools.cached_property
    def public_key(self) -> bytes:  # cached: decoding per seal cost ~45 us a recipient in the simulator
        return decode_public_id(self.public_id)

    def to_dict(self) -> dict[str, str | int]:
        data: dict[str, str | int] = {"name": self.name, "public_id": self.public_id, "role": self.role}
        if self.address:
            data["address"] = self.address
        if self.curve_key:
            data["curve_key"] = self.curve_key
        if self.rotated_from:
            data.update(rotated_from=self.rotated_from, rotated_at_round=self.rotated_at_round,
                        rotation_signature=self.rotation_signature)
        if self.gateway:
            data["gateway"] = self.gateway
        return data


def _member_problems(member: Member) -> list[str]:
    problems = _rotation_problems(member)
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
    if not isinstance(member.gateway, str):
        problems.append("gateway must be a string")
    elif member.gateway and member.role != "edge":
        problems.append(f"only an edge client names its gateway, not a {member.role}")
    if not isinstance(member.curve_key, str):
        problems.append("curve_key must be a string")
    elif member.curve_key:
        try:
            if len(z85_decode(member.curve_key)) != 32:
                raise ValueError("not 32 bytes")
        except ValueError as error:
            problems.append(f"curve_key is not a Z85 Curve public key ({error})")
    return problems


def _rotation_problems(member: Member) -> list[str]:
    """A rotation record is all there or absent, and its signature is the old key's."""
    if not (member.rotated_from or member.rotation_signature or member.rotated_at_round):
        return []
    if not _is_count(member.rotated_at_round):
        return [f"rotated_at_round must be an integer >= 0, not {member.rotated_at_round!r}"]
    try:
        old_key = load_public_key(decode_public_id(member.rotated_from))
        signature = decode_signature(member.rotation_signature)
        statement = rotation_statement(member.name, decode_public_id(member.public_id), member.curve_key,
                                       member.rotated_at_round)
    except (ValueError, TypeError) as error:
        return [f"rotation record: {error}"]
    if not verify_signature(old_key, signature, statement):
        return ["rotation_signature is not the old key's (rotated_from) signature of this entry's keys, "
                "name and rotated_at_round"]
    return []


@dataclass(frozen=True)
class Roster:
    """Members sorted by name, with lookups by name and by public key.

    ``version`` counts the edits (``hivemesh roster add|remove|rotate|revoke`` bump it) and
    ``effective_round`` is the round from which every member applies this
    version: before it, the previous version's membership holds. Members whose
    versions differ for a round refuse each other's messages of that round
    (protocols/node/membership.py), naming both versions.

    ``revoked``: public ids refused for good (``revoked_key``), a rotated member's old
    key and a revoked member's. ``also``: entries of members already listed whose
    other key is accepted too while a rotation is under way (never written to the
    file: protocols/node/membership.py derives them from two versions).
    """

    members: tuple[Member, ...] = ()
    version: int = 1
    effective_round: int = 0
    revoked: tuple[str, ...] = ()
    also: tuple[Member, ...] = ()
    _by_name: dict[str, Member] = field(init=False, repr=False, compare=False)
    _by_key: dict[bytes, Member] = field(init=False, repr=False, compare=False)
    _verifiers: dict[str, Ed25519PublicKey] = field(init=False, repr=False, compare=False)
    _by_any_key: dict[bytes, Member] = field(init=False, repr=False, compare=False)
    _key_verifiers: dict[bytes, Ed25519PublicKey] = field(init=False, repr=False, compare=False)
    _revoked_keys: frozenset[bytes] = field(init=False, repr=False, compare=False)

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
        for member in members:
            named = by_name.get(member.gateway) if member.gateway else None
            if member.gateway and (named is None or named.role != "gateway"):
                problems.append(f"member {member.name!r}: gateway {member.gateway!r} is not a gateway on the "
                                "roster")
        revoked_keys = set()
        for public_id in self.revoked:
            try:
                revoked_keys.add(decode_public_id(public_id))
            except ValueError as error:
                problems.append(f"revoked {public_id!r}: {error}")
        for key in revoked_keys & by_key.keys():
            problems.append(f"member {by_key[key].name!r}'s public_id is on the revoked list")
        by_any_key = dict(by_key)
        for extra in self.also:
            if extra.name not in by_name:
                problems.append(f"a second key for {extra.name!r}, who is not a member")
            elif extra.public_key in by_any_key:
                problems.append(f"the second key of {extra.name!r} is already listed")
            by_any_key[extra.public_key] = extra
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
        key_verifiers = {member.public_key: verifiers[member.name] for member in members}
        for extra in self.also:
            try:
                key_verifiers[extra.public_key] = load_public_key(extra.public_key)
            except ValueError:
                raise RosterError(f"roster: {extra.name!r}'s second key is not an Ed25519 key") from None
        object.__setattr__(self, "_by_any_key", by_any_key)
        object.__setattr__(self, "_key_verifiers", key_verifiers)
        object.__setattr__(self, "_revoked_keys", frozenset(revoked_keys))
        object.__setattr__(self, "revoked", tuple(sorted(set(self.revoked))))

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
        """The member whose raw 32-byte Ed25519 key this is (its listed key, or its other key while a
        rotation is under way: then the entry of that key), or None."""
        return self._by_any_key.get(public_key)

    def verifier(self, name: str) -> Ed25519PublicKey:
        """The member's Ed25519 public key object (cached)."""
        return self._verifiers[name]

    def verifier_for(self, public_key: bytes) -> Ed25519PublicKey:
        """The verifier of a key :meth:`by_public_key` knows (cached)."""
        return self._key_verifiers[public_key]

    def is_revoked(self, public_key: bytes) -> bool:
        """Whether this raw key is on the revoked list (a rotated-away or revoked member's key)."""
        return public_key in self._revoked_keys

    def with_role(self, *roles: str) -> tuple[Member, ...]:
        return tuple(member for member in self.members if member.role in roles)

    def curve_allowlist(self) -> frozenset[str]:
        """Z85 Curve public keys of every member that has one (both of a member's during a
        rotation): the CURVE (ZAP) allowlist."""
        return frozenset(member.curve_key for member in (*self.members, *self.also) if member.curve_key)

    # ---------------------------------------------------------- edits (new rosters)

    def add(self, member: Member) -> Roster:
        """This roster with ``member`` (same version: :meth:`revised` makes the edit a new version)."""
        return dataclasses.replace(self, members=(*self.members, member))

    def remove(self, name: str) -> Roster:
        """This roster without ``name`` (same version: see :meth:`revised`)."""
        self.member(name)
        kept = tuple(member for member in self.members if member.name != name)
        return dataclasses.replace(self, members=kept)

    def rotate(self, name: str, *, public_id: str, curve_key: str, at_round: int, signature: str) -> Roster:
        """This roster with ``name`` on a new key pair from ``at_round`` on, its old key revoked (same
        version: see :meth:`revised`). ``signature``: the old key's, over :func:`rotation_statement`."""
        old = self.member(name)
        new = dataclasses.replace(old, public_id=public_id, curve_key=curve_key, rotated_from=old.public_id,
                                  rotated_at_round=at_round, rotation_signature=signature)
        kept = tuple(member for member in self.members if member.name != name)
        return dataclasses.replace(self, members=(*kept, new), revoked=(*self.revoked, old.public_id))

    def revoke(self, name: str) -> Roster:
        """This roster without ``name``, whose key is refused for good (same version: see :meth:`revised`)."""
        old = self.member(name)
        return dataclasses.replace(self.remove(name), revoked=(*self.revoked, old.public_id))

    def also_accepting(self, entries: Sequence[Member]) -> Roster:
        """This roster, also accepting these other keys of its members (a rotation under way)."""
        return dataclasses.replace(self, also=tuple(entries))

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
        unknown = set(data) - {"member", "version", "effective_round", "revoked"}
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
        revoked = data.get("revoked", [])
        if not isinstance(revoked, list) or not all(isinstance(item, str) for item in revoked):
            problems.append("'revoked' must be a list of public ids")
            revoked = []
        if not _is_count(version) or version < 1:
            problems.append(f"'version' must be an integer >= 1, not {version!r}")
        if not _is_count(effective_round):
            problems.append(f"'effective_round' must be an integer >= 0, not {effective_round!r}")
        if problems:
            raise RosterError(f"{source}: " + "; ".join(problems))
        try:
            return cls(tuple(members), version=version, effective_round=effective_round,
                       revoked=tuple(revoked))
        except RosterError as error:
            raise RosterError(f"{source}: {str(error).removeprefix('roster: ')}") from None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": self.version, "effective_round": self.effective_round}
        if self.revoked:
            data["revoked"] = list(self.revoked)
        data["member"] = [member.to_dict() for member in self.members]
        return data


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

"""Membership that changes while the network runs: roster versions and the round each takes effect.

A roster carries a ``version`` and an ``effective_round`` (protocols/roster.py). A
member that learns a new version keeps the old membership for the rounds before
``effective_round`` and applies the new one from it on, like every other member:
all switch neighbour sets at the same round, without a restart or a new run id. Its tables:

- round-bearing messages (``ParamPush``, ``ParamPull``, ``StateSyncResponse``):
  a ``roster_version`` other than ours for the message's round is refused,
  counted ``roster_version_mismatch`` and said once per (sender, version); what
  the Node sends is stamped the same way (:meth:`Membership.stamp`);
- keys while two versions are in use (:meth:`Membership.either`): the same key
  is kept, a rotated member's old and new keys are both accepted until our round
  reaches the change, a revoked key is refused at once (``revoked_key``); a key
  changed without a rotation signed by the old key is no new version
  (:meth:`Membership.changed_to`);
- edge clients a gateway serves (:class:`Serving`): a roster entry naming its
  gateway decides; otherwise the gateway's configured client list, or every
  edge member for a gateway that lists none.

Pure: no files, no clocks. Not handled yet: a member that (re)starts with the new
roster before its effective round mixes by the new graph for those rounds. The
tables in full: docs/design/node.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from protocols.messages import Message, ParamPull, ParamPush, StateSyncResponse
from protocols.roster import Roster

ROUND_BEARING = (ParamPush, ParamPull, StateSyncResponse)  # the messages that carry a roster_version


class UnsignedKeyChange(ValueError):
    """A later roster that gives a member another key without its old key's signature: not taken."""


@dataclass(frozen=True)
class Membership:
    """The roster in force from ``current.effective_round`` on, and the one before it (if known)."""

    current: Roster
    previous: Roster | None = None

    def version_at(self, round_index: int) -> int:
        """The roster version this member applies to ``round_index``. A member that started with a
        roster not yet in force (a joiner, a restart) knows no previous version: it takes the one
        before its own (edits count up by one) for the rounds before ``effective_round``."""
        current = self.current
        if round_index >= current.effective_round:
            return current.version
        if self.previous is not None:
            return self.previous.version
        return max(current.version - 1, 1)

    def roster_at(self, round_index: int) -> Roster:
        if self.previous is not None and round_index < self.current.effective_round:
            return self.previous
        return self.current

    def changed_to(self, roster: Roster) -> Membership:
        """The membership once ``roster`` (a later version) is learnt."""
        if roster.version <= self.current.version:
            raise ValueError(f"roster version {roster.version} is not newer than {self.current.version}")
        for member in roster:
            before = self.current.get(member.name)
            if before is not None and before.public_id != member.public_id and \
                    member.rotated_from != before.public_id:
                raise UnsignedKeyChange(f"roster version {roster.version} gives {member.name} another key "
                                        "without a rotation signed by its old one (`hivemesh roster rotate`)")
        return Membership(current=roster, previous=self.current)

    def in_force(self, round_index: int) -> bool:
        """Whether the current version holds at ``round_index`` (the previous one is done with)."""
        return self.previous is None or round_index >= self.current.effective_round

    def settled(self) -> Membership:
        """The current version alone (once every round of the previous one is past)."""
        return Membership(current=self.current)

    def either(self) -> Roster:
        """Whom the endpoint accepts while both versions are in use (the table above): every member of
        the previous and the current version but one whose key the current revoked; the current's
        entry where a name is in both, but a rotated member's old entry with its new key beside."""
        if self.previous is None:
            return self.current
        current = self.current
        members = {member.name: member for member in self.previous
                   if not current.is_revoked(member.public_key) or member.name in current}
        rotated = []
        for member in current:
            before = members.get(member.name)
            if before is not None and before.public_key != member.public_key:
                rotated.append(member)
            else:
                members[member.name] = member
        kept = {member.public_id for member in members.values()}
        return dataclasses.replace(current, members=tuple(members.values()), also=tuple(rotated),
                                   revoked=tuple(pid for pid in current.revoked if pid not in kept))

    def describe(self) -> str:
        """``roster version 3 (adds p04, removes p02) takes effect at round 120``."""
        current = self.current
        if self.previous is None:
            return f"roster version {current.version} in effect from round {current.effective_round}"
        added = sorted(set(current.names) - set(self.previous.names))
        removed = sorted(set(self.previous.names) - set(current.names))
        changes = [f"adds {', '.join(added)}"] if added else []
        changes += [f"removes {', '.join(removed)}"] if removed else []
        what = f" ({'; '.join(changes)})" if changes else ""
        return f"roster version {current.version}{what} takes effect at round {current.effective_round}"

    # ------------------------------------------------------------ the wire

    def stamp(self, message: Message) -> Message:
        """``message`` with our roster version for its round (other kinds unchanged)."""
        if isinstance(message, ROUND_BEARING):
            version = self.version_at(message.round)
            if message.roster_version != version:
                return dataclasses.replace(message, roster_version=version)
        return message

    def mismatch(self, message: Message) -> tuple[int, int, int] | None:
        """(round, theirs, ours) when ``message``'s roster version is not ours for its round."""
        if not isinstance(message, ROUND_BEARING):
            return None
        ours = self.version_at(message.round)
        if message.roster_version == ours:
            return None
        return message.round, message.roster_version, ours


@dataclass(frozen=True)
class Connect:
    """For the driver: verify against ``roster`` from now on, and exchange with ``neighbours`` (dial
    who is new, drop who is gone). The Node decides when; the driver only carries it out."""

    roster: Roster
    neighbours: tuple[str, ...]


@dataclass(frozen=True)
class Serving:
    """Which edge clients gateway ``gateway`` serves under each roster version; ``configured``: the
    clients its config lists (``[peer] clients``; empty: none listed). One rule, the table in the
    module docstring, for the gateway at start-up (peer/runtime/assemble.py), at each roster version's
    round (the Node) and in the simulator."""

    gateway: str
    configured: tuple[str, ...] = ()

    def clients(self, roster: Roster) -> tuple[str, ...]:
        """The ``edge`` members of ``roster`` this gateway serves, in roster (name) order."""
        return tuple(member.name for member in roster.with_role("edge") if self.serves(member.name,
                                                                                    member.gateway))

    def serves(self, name: str, named_gateway: str) -> bool:
        if named_gateway:
            return named_gateway == self.gateway
        return not self.configured or name in self.configured

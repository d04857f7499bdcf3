"""Membership that changes while the network runs: roster versions and the round each takes effect.

A roster carries a ``version`` and an ``effective_round`` (protocols/roster.py).
A member that learns a new version (the daemon re-reads its roster file; the
simulator schedules it) keeps the old membership for the rounds before
``effective_round`` and applies the new one from it on, like every other
member, so all of them switch neighbour sets at the same round without a
restart and without a new run id.

The rule for each round-bearing message (``ParamPush``, ``ParamPull``,
``StateSyncResponse``), one table both drivers apply through the Node:

=====================================  =========================================
the message's ``roster_version``       the Node
=====================================  =========================================
equals ours for the message's round    routes it as usual
differs                                refuses it, counted ``roster_version_mismatch``,
                                       and says once per (sender, their version):
                                       ``p03 refused p02's param_push for round 121:
                                       roster version 1 (theirs) != 2 (ours)``
=====================================  =========================================

"Ours for round r" is the version in force at r: the current one from its
``effective_round`` on, the previous one before it. A member that has not yet
learnt the new version still speaks the old one for every round, so it is
refused only for the rounds from ``effective_round`` on, where the two would mix
with different neighbour sets. What the Node sends is stamped the same way
(:meth:`Membership.stamp`). Pure: no files, no clocks.

Not handled yet: a member that (re)starts with the new roster before its
effective round knows the previous version's number but not its members, so it
mixes by the new graph for those rounds (a joiner is unaffected: it
state-syncs to a round at or past the change before it mixes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from protocols.messages import Message, ParamPull, ParamPush, StateSyncResponse
from protocols.roster import Roster

ROUND_BEARING = (ParamPush, ParamPull, StateSyncResponse)  # the messages that carry a roster_version


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
        return Membership(current=roster, previous=self.current)

    def in_force(self, round_index: int) -> bool:
        """Whether the current version holds at ``round_index`` (the previous one is done with)."""
        return self.previous is None or round_index >= self.current.effective_round

    def settled(self) -> Membership:
        """The current version alone (once every round of the previous one is past)."""
        return Membership(current=self.current)

    def either(self) -> Roster:
        """Every member of the previous and the current version (the current's entry where a name is
        in both): whom the endpoint accepts while both versions are in use."""
        if self.previous is None:
            return self.current
        members = {member.name: member for member in self.previous}
        members.update({member.name: member for member in self.current})
        return dataclasses.replace(self.current, members=tuple(members.values()))

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

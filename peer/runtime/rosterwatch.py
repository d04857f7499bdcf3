"""The daemon's eye on its roster file: a new version is picked up while the peer runs.

``hivemesh roster add|remove|rotate|revoke --effective-round R`` rewrites the roster file
(atomically) with the next version. The daemon asks :meth:`RosterWatch.poll`
in its periodic pass; when the file's modification time changed it is read
again, and a later version is handed to the Node (protocols/node/membership.py),
which applies it from round R on like every other member. What cannot be used
(unreadable, an older version, the same version with other members) is said
once per change of the file, and the peer runs on with what it has; a later
version the peer could not apply (``held``: the Node refused it) is not taken
as read, so an operator may correct the file without a new version number.

``poll(now, force=True)`` reads the file at once, whatever its modification
time says: what the daemon does on SIGHUP (``hivemesh roster reload``), for an
operator who wants the edit taken now, or whose file system keeps coarse
times. The first poll always reads the file: an edit made while the peer was
starting (after it read its roster, before the watch began) is not missed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peer.files import roster_file
from protocols.errors import HivemeshError
from protocols.roster import Roster


@dataclass(frozen=True)
class NewVersion:
    roster: Roster


@dataclass(frozen=True)
class Unusable:
    reason: str   # one line for the operator


class RosterWatch:
    """Re-reads ``path`` when its modification time changes, at most every ``every_s`` seconds."""

    def __init__(self, path: str | Path, roster: Roster, *, every_s: float = 1.0) -> None:
        self.path = Path(path)
        self.roster = roster
        self.every_s = every_s
        self._stamp: int | None = None   # the first poll reads the file (see the module docstring)
        self._next_s = 0.0

    def held(self, roster: Roster) -> None:
        """The version in use after all: a later one that :meth:`poll` handed over was not applied
        (the Node refused it, or its graph cannot be built). Compared from now on against this one, so
        the status does not show the refused version, and a corrected file of the same version is new."""
        self.roster = roster

    def _modified(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def poll(self, now: float, *, force: bool = False) -> NewVersion | Unusable | None:
        """What changed since the last look (``now``: the daemon's clock, s); None: nothing.
        ``force``: read the file now, even if it seems unchanged (SIGHUP)."""
        if now < self._next_s and not force:
            return None
        self._next_s = now + self.every_s
        stamp = self._modified()
        if not force and (stamp is None or stamp == self._stamp):
            return None
        self._stamp = stamp
        try:
            roster = roster_file.read(self.path)
        except HivemeshError as error:
            return Unusable(f"roster file changed but cannot be used ({error}); running on with version "
                            f"{self.roster.version}")
        if roster.version > self.roster.version:
            self.roster = roster
            return NewVersion(roster)
        if roster == self.roster:
            return None     # rewritten unchanged
        return Unusable(f"roster file {self.path} changed but holds version {roster.version}, not later than "
                        f"ours ({self.roster.version}): ignored (an edit is a new version: `hivemesh roster "
                        "add|remove|rotate|revoke`)")


def reread(watch: RosterWatch, now: float, *, forced: bool, name: str, say: Callable[[str], None],
           warn: Callable[[str], None]) -> NewVersion | None:
    """The periodic look at the roster file: a new version to hand to the Node, if any. What cannot be
    used is warned about; ``forced`` (SIGHUP): read now, and say what was found."""
    found = watch.poll(now, force=forced)
    if forced:
        what = (f"version {found.roster.version} (effective from round {found.roster.effective_round})"
                if isinstance(found, NewVersion) else
                "cannot be used" if isinstance(found, Unusable) else
                f"nothing new (version {watch.roster.version})")
        say(f"{name}: SIGHUP: roster {watch.path} re-read: {what}")
    if isinstance(found, Unusable):
        warn(found.reason)
    return found if isinstance(found, NewVersion) else None

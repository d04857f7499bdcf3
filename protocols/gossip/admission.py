"""Which parameter message a round machine takes, as one table over (how far its round is, stage, kind).

A :class:`~protocols.gossip.rounds.RoundMachine` in round ``R`` hears a message for round ``r``.
What it does with it depends on three things only, so the rule is written as a table that
tests enumerate rather than as boolean algebra over flags:

* how far ``r`` is from ``R`` (:class:`Distance`, from :func:`distance_of`), measured against the
  buffer window ``max_rounds_ahead`` and the round the machine is about to jump to, if any;
* whether the machine may still jump ahead: its kind catches up (``CATCHES_UP``) and training is
  not over;
* how it treats late messages (:class:`Lateness`): never, within the window, or at any age
  (push-sum's weight shares are mass whenever they arrive).

A FINISHED machine takes nothing; that is decided before the table (``after_finish``).
Duplicates and resends are decided after it, per sender, for the admissions that keep a message.
"""

from __future__ import annotations

import enum


class Distance(enum.Enum):
    """Where a message's round ``r`` lies, seen from a machine in round ``R``."""

    BEHIND_FAR = "behind_far"          # r < R - max_rounds_ahead
    BEHIND = "behind"                  # R - max_rounds_ahead <= r < R
    CURRENT = "current"                # r == R
    AHEAD = "ahead"                    # R < r <= R + max_rounds_ahead: buffered until then
    BEYOND_TARGET = "beyond_target"    # r > R + max_rounds_ahead, and beyond the round we jump to
    AT_TARGET = "at_target"            # r > R + max_rounds_ahead, and the round we jump to
    SHORT_OF_TARGET = "short_of_target"  # r > R + max_rounds_ahead, short of the round we jump to


class Lateness(enum.Enum):
    """How a kind of machine treats a message for a round it has closed."""

    NEVER = "never"      # stale: counted and dropped
    RECENT = "recent"    # applied at the next mix, up to max_rounds_ahead old
    ANY_AGE = "any_age"  # applied at the next mix whatever its age


class Admission(enum.Enum):
    """What the machine does with the message."""

    BUFFER = "buffer"            # into the inbox of its round
    JUMP = "jump"                # buffer, and jump to its round at the next close (``rounds_skipped``)
    LATE = "late"                # applied at the next mix (``late_message``)
    STALE = "stale"              # dropped, counted ``stale_message``
    DROP_FUTURE = "drop_future"  # dropped, counted ``dropped_future``


def distance_of(r: int, *, round_now: int, max_rounds_ahead: int, catch_up: int) -> Distance:
    """Classify round ``r`` for a machine in ``round_now`` that will jump to ``catch_up`` (0: none)."""
    if r < round_now:
        return Distance.BEHIND if r >= round_now - max_rounds_ahead else Distance.BEHIND_FAR
    if r == round_now:
        return Distance.CURRENT
    if r <= round_now + max_rounds_ahead:
        return Distance.AHEAD
    if r > catch_up:
        return Distance.BEYOND_TARGET
    return Distance.AT_TARGET if r == catch_up else Distance.SHORT_OF_TARGET


B, J, L, S, F = Admission.BUFFER, Admission.JUMP, Admission.LATE, Admission.STALE, Admission.DROP_FUTURE

# (distance, may jump) -> admission for a machine whose lateness is (NEVER, RECENT, ANY_AGE).
# Reading it: only a round beyond the jump target starts a jump, and only while the machine may
# jump; a far round it will not jump to is kept only by machines that keep late messages of any
# age (there is no round it could be mixed in as such); the round already chosen as the target
# is buffered even once training is over, so the jump in progress completes.
TABLE: dict[tuple[Distance, bool], tuple[Admission, Admission, Admission]] = {
    (Distance.BEHIND_FAR, True): (S, S, L),
    (Distance.BEHIND_FAR, False): (S, S, L),
    (Distance.BEHIND, True): (S, L, L),
    (Distance.BEHIND, False): (S, L, L),
    (Distance.CURRENT, True): (B, B, B),
    (Distance.CURRENT, False): (B, B, B),
    (Distance.AHEAD, True): (B, B, B),
    (Distance.AHEAD, False): (B, B, B),
    (Distance.BEYOND_TARGET, True): (J, J, J),
    (Distance.BEYOND_TARGET, False): (F, F, L),
    (Distance.AT_TARGET, True): (B, B, B),
    (Distance.AT_TARGET, False): (B, B, B),
    (Distance.SHORT_OF_TARGET, True): (F, F, L),
    (Distance.SHORT_OF_TARGET, False): (F, F, L),
}
_COLUMN = {Lateness.NEVER: 0, Lateness.RECENT: 1, Lateness.ANY_AGE: 2}


def admission(distance: Distance, *, may_jump: bool, lateness: Lateness) -> Admission:
    return TABLE[distance, may_jump][_COLUMN[lateness]]

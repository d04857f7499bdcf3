"""Whether a member can go on, from what it knows of its neighbours: one table for both drivers.

Each neighbour is in one of four states (the Node's failure detector tracks
them from what it hears, heartbeats included, in both drivers):

* ``NEVER_HEARD``: nothing accepted from it since we started;
* ``UP``: heard within the neighbour timeout;
* ``DOWN``: silent past the timeout (crashed, stopped, or a cut link that may heal);
* ``FINISHED``: it said it had finished (``Heartbeat.finished``, sent during its
  finish grace), then went silent: it will never send again.

The verdict, first matching row (``verdict`` below; the tests enumerate it):

=====================================  =========================================
neighbours                             verdict
=====================================  =========================================
none in the topology                   go on (a lone member trains alone by design)
at least one UP                        go on
none UP, at least one FINISHED         stop: the run is over around us
none UP, none FINISHED, resumed, none  stop: a restarted member whose neighbours
  ever heard, start wait over            are gone (finished, most likely) waits no more
otherwise (DOWN, or still starting)    go on: a cut heals, a neighbour restarts;
                                         the rounds wait for it (gossip/rounds.py)
=====================================  =========================================

A member that stops says why in one line naming its neighbours (``reason``).

Before its first round a member waits for its neighbours (``start_wait``), first
matching row; ``waited_s`` counts from the start of the wait:

=====================================  =========================================
neighbours                             outcome
=====================================  =========================================
one's heartbeat is further on than the ``JOIN``: the network runs without us;
  machine can buffer (``ahead_steps``)   join by state sync, not at round 0
every one UP (and reachable)           ``START``
resumed, none ever heard, after        ``ALONE``: nobody to wait for (a restart
  ``neighbour_timeout_s``                after the others finished, most likely)
waited ``start_timeout_s``             ``TIMED_OUT``: start without the absent
otherwise                              ``WAIT``
=====================================  =========================================
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class Presence(Enum):
    NEVER_HEARD = "never heard"
    UP = "up"
    DOWN = "down"
    FINISHED = "finished"


class Wait(Enum):
    WAIT = "wait"
    START = "start"
    JOIN = "join"
    ALONE = "alone"
    TIMED_OUT = "timed out"


def start_wait(presence: Mapping[str, Presence], steps: Mapping[str, int], *, waited_s: float,
               resumed: bool, ahead_steps: int, all_reachable: bool, neighbour_timeout_s: float,
               start_timeout_s: float) -> Wait:
    """The start-wait table above. ``steps``: each neighbour's trainer step from its last heartbeat
    (-1: none yet); ``all_reachable``: the driver can reach every neighbour it heard."""
    states = set(presence.values())
    if any(step > ahead_steps for step in steps.values()):
        return Wait.JOIN
    if states <= {Presence.UP} and all_reachable:
        return Wait.START
    if resumed and waited_s >= neighbour_timeout_s and states == {Presence.NEVER_HEARD}:
        return Wait.ALONE
    if waited_s >= start_timeout_s:
        return Wait.TIMED_OUT
    return Wait.WAIT


class Verdict(Enum):
    GO_ON = "go on"
    NEIGHBOURS_FINISHED = "neighbours finished"
    NOBODY_RUNNING = "nobody running"


def verdict(presence: Mapping[str, Presence], *, resumed: bool, start_wait_over: bool) -> Verdict:
    """The table above. ``resumed``: the member restarted from a checkpoint; ``start_wait_over``:
    its wait for neighbours at start-up (and its last state-sync attempt) has ended."""
    states = set(presence.values())
    if not presence or Presence.UP in states:
        return Verdict.GO_ON
    if Presence.FINISHED in states:
        return Verdict.NEIGHBOURS_FINISHED
    if resumed and start_wait_over and states == {Presence.NEVER_HEARD}:
        return Verdict.NOBODY_RUNNING
    return Verdict.GO_ON


def reason(presence: Mapping[str, Presence], outcome: Verdict) -> str:
    """One line saying why the member stops, naming each neighbour by what became of it."""
    groups: dict[Presence, list[str]] = {}
    for name in sorted(presence):
        groups.setdefault(presence[name], []).append(name)
    parts = [f"{', '.join(names)} {state.value}" for state, names in sorted(groups.items(),
                                                                           key=lambda kv: kv[0].value)]
    match outcome:
        case Verdict.NEIGHBOURS_FINISHED:
            return f"no live neighbour left ({'; '.join(parts)}): the run is over around us"
        case Verdict.NOBODY_RUNNING:
            return (f"no neighbour running ({'; '.join(parts)}, and no state-sync answer): "
                    "they have finished or are down")
    return ""


def waiting_line(presence: Mapping[str, Presence]) -> str:
    """``waiting for p01, p03 (1/3 up)``: whom a member still waits for (empty when none)."""
    missing = sorted(name for name, state in presence.items() if state is not Presence.UP)
    if not missing:
        return ""
    return f"waiting for {', '.join(missing)} ({len(presence) - len(missing)}/{len(presence)} up)"

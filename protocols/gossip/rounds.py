"""Synchronous gossip rounds with deadlines: the skeleton D-PSGD, local SGD, CHOCO and push-sum share.

A round ``t`` (``mixing = "overlap"``, the default): send this round's message
to the out-neighbours of ``W_t``, built from the parameters before the local
steps; ask for ``H`` local steps (``StartWork``); on ``WorkDone`` wait for every
in-neighbour's round-``t`` message up to ``deadline_s`` (``SetTimer``); screen
and mix what arrived in sorted name order (a missing one's weight goes to the
self weight, ``missed_deadline``); start round ``t + 1``. With ``mixing =
"after"`` the message is built and sent after the local steps. Rules:

- a neighbour that missed a deadline is a *laggard*: mixed if there, not
  waited for, until heard at most one round behind;
- with no in-neighbour to wait for, a round waits for the first message or
  its deadline (``rounds_alone``): a cut-off member keeps its place;
- a neighbour that comes up (``NeighbourUp``) is sent this round's message again;
- later rounds are buffered up to ``max_rounds_ahead``; closed ones are
  ``stale_message``, or applied late by push-sum and CHOCO (``late_message``);
  a (sender, round) is never applied twice;
- a message more than ``max_rounds_ahead`` ahead makes the machine catch up by
  a jump protocols/gossip/catchup.py bounds, never past the final gossip rounds.

After ``total_steps`` (or ``duration_s``), ``final_gossip_rounds`` rounds without
work, then ``Finished``. Which message is buffered, jumped to, kept late or
dropped: protocols/gossip/admission.py. Why: docs/design/gossip-rounds.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from protocols.compress import BadParts
from protocols.events import (
    Action,
    CancelTimer,
    Event,
    Finished,
    Metric,
    NeighbourDown,
    NeighbourUp,
    ProtocolState,
    Received,
    Send,
    SetTimer,
    SetTrainerStep,
    Start,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.gossip.admission import Admission, Distance, Lateness, admission, distance_of
from protocols.gossip.base import MachineBase, Phase, export_messages, restore_messages
from protocols.gossip.catchup import Reach, confirmations, confirmed_round
from protocols.gossip.robust import Report, read_report, report_meta
from protocols.messages import ParamPush

Candidate = tuple[str, int, Any]  # (sender, round, decoded payload)


class RoundMachine(MachineBase):
    """The round/deadline/buffer state machine; subclasses supply the maths."""

    LATENESS = Lateness.NEVER  # a message for a closed round: dropped, or applied at the next mix
    CATCHES_UP = True  # False: never jumps to a round far ahead (see "Catching up")
    CLIPS_FAR = False  # True: can clip a far candidate the filter's reports let in (far_reports, robust.py)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.laggards: set[str] = set()  # missed a deadline: not waited for until they catch up
        self.caught_up: set[str] = set()  # laggards heard from at most one round behind us
        self.inbox: dict[int, dict[str, ParamPush]] = {}
        self.late: list[tuple[str, ParamPush]] = []
        self.last_sends: list[Send] = []  # this round's messages, resent after a restart
        self.seen: dict[str, set[int]] = {}  # rounds received per sender, within the late window
        self.catch_up = 0  # a round far ahead heard from an in-neighbour: jump there at the next close
        self.claims: dict[str, int] = {}  # per sender, its newest round beyond the buffer window (evidence)
        self.after = self.config.mixing == "after"  # send post-step values once the work is done
        self.anchor: torch.Tensor | None = None  # "after": the parameters at StartWork (insider filter)
        self.step_norm = 0.0  # "after": ||x_after - x_before|| of this round's local steps
        self.reach = Reach()  # how far each in-neighbour's word may move us (catchup.py)
        self.round_began_s: float | None = None  # when this training round began (our step rate)
        self.work_s: float | None = None  # how long this round's local steps took (StartWork to WorkDone)

    # ------------------------------------------------------------ maths hooks

    def _round_messages(self, t: int) -> list[Send]:
        """Snapshot what round ``t`` needs and return the Send actions."""
        raise NotImplementedError

    def _decode(self, sender: str, message: ParamPush) -> tuple[Any, float]:
        """(payload, norm for the insider filter); raises BadParts."""
        raise NotImplementedError

    def _own_norm(self) -> float:
        raise NotImplementedError

    def _clipped(self, payload: Any, factor: float) -> Any:
        """``payload`` with its difference to us (the norm the filter judged) scaled by ``factor``
        (0 < factor < 1): a far candidate the filter's reports let in (``CLIPS_FAR``)."""
        raise NotImplementedError

    def _mix(self, t: int, accepted: list[Candidate]) -> None:
        """Mix the accepted candidates (sorted by round, then sender) into the parameters."""
        raise NotImplementedError

    def _params_replaced(self) -> None:
        """The outer optimiser (or a state sync) overwrote the parameters between rounds."""

    def _joined(self) -> None:
        """Reset the algorithm's own state after ``join_at``."""
        self._params_replaced()

    def _export_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        pass

    def _restore_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        pass

    def _forget_exchanges(self) -> None:
        self.laggards, self.caught_up = set(), set()
        self.inbox, self.late, self.last_sends, self.seen = {}, [], [], {}
        self.catch_up, self.claims = 0, {}
        self.anchor, self.step_norm = None, 0.0

    # ------------------------------------------------------------ events

    def _dispatch(self, event: Event, now: float) -> list[Action]:
        match event:
            case Start():
                return self._on_start(now)
            case WorkDone():
                if self.phase is not Phase.WORKING:
                    self.counters["unexpected_event"] += 1
                    return []
                self.phase = Phase.WAITING
                if self.round_began_s is not None:
                    self.work_s = now - self.round_began_s
                return self._settle(now, self._after_work())
            case Received(sender=sender, message=ParamPush() as message):
                return self._on_message(sender, message, now)
            case Received():
                self.counters["unexpected_message"] += 1
                return []
            case TimerFired(key=key):
                if self.phase is Phase.WAITING and key == self._timer_key():
                    self.timer_set = False
                    return self._settle(now, self._close_round(now))
                return []
            case NeighbourDown(name=who):
                self.down.add(who)
                return self._settle(now, [])
            case NeighbourUp(name=who):
                self.down.discard(who)
                return self._resend_to(who)
        raise TypeError(f"not an event: {event!r}")

    def _on_start(self, now: float) -> list[Action]:
        self.reach.started(self.steps_done)  # a new life: references start from here
        self.round_began_s, self.work_s = None, None
        match self.phase:
            case Phase.IDLE:
                self.start_s = now
                return self._settle(now, self._begin_round(now))
            case Phase.FINISHED:
                return [Finished()]
            case Phase.WORKING:
                # restarted from a checkpoint taken with the round's work asked for but not done:
                # the trainer was restored to before it, so it is asked for again (a driver never
                # redoes work on its own); this round's message goes again (a duplicate for
                # neighbours that have it)
                self.counters["restarted"] += 1
                self.timer_set = False
                return self._settle(now, [*self.last_sends, *self._ask_work(now)])
            case _:
                # restarted from a checkpoint mid-round, the work done: resend this round's message
                # (neighbours that have it count a duplicate) and carry on waiting.
                self.counters["restarted"] += 1
                self.timer_set = False  # the old driver's timers died with it
                return self._settle(now, list(self.last_sends))

    def _resend_to(self, who: str) -> list[Action]:
        """This round's message again, to a neighbour that has just come up (a late joiner, a peer
        restarted, one back from a partition): what we sent while it was away was lost, and without
        it the round it joins would wait out its deadline (and its neighbours theirs, for it). A
        neighbour that had it counts a duplicate."""
        if self.phase not in (Phase.WORKING, Phase.WAITING):
            return []
        resent = [Send((who,), a.message) for a in self.last_sends if who in a.recipients]
        self._count("resent_on_neighbour_up", len(resent))
        return list(resent)

    def _begin_round(self, now: float) -> list[Action]:
        actions: list[Action] = []
        if self.catch_up > self.round and self._skip_rounds(now):
            # the skipped steps count as done: the trainer's step (its learning-rate schedule)
            # follows, before the next round's work is asked for
            actions.append(SetTrainerStep(self.steps_done))
        if not self._schedule_round(now):
            return [*actions, Finished()]
        if self.after and self.round_steps:
            self.last_sends = []  # sent on WorkDone, from the post-step parameters
        else:
            self.last_sends = self._with_report(self._round_messages(self.round))
        actions += self.last_sends
        if self.round_steps:
            actions += self._ask_work(now)
        else:
            self.phase = Phase.WAITING  # a gossip-only round: nothing to compute
        return actions

    def _ask_work(self, now: float) -> list[Action]:
        """This round's local steps, from the parameters as they are now (a round begun, or
        restored to before its work): the trainer has them until ``WorkDone``."""
        if self.after and self.config.norm_multiple > 0:
            self.anchor = self.params.detach().clone()
        self.phase = Phase.WORKING
        self.round_began_s = now
        return [StartWork(self.round_steps)]

    def _after_work(self) -> list[Action]:
        """``mixing = "after"``: the round's message, built from the parameters the local steps left."""
        if not (self.after and self.round_steps):
            return []
        if self.anchor is not None:
            self.step_norm = self._distance(self.params, self.anchor)
            self.anchor = None
        self.last_sends = self._with_report(self._round_messages(self.round))
        return list(self.last_sends)

    def _with_report(self, sends: list[Send]) -> list[Send]:
        """Our filter's far report (robust.py) in each round message's meta: what a neighbour's filter
        needs to hear a far half again after a split. Nothing is added while nobody is far."""
        far = self.CLIPS_FAR and self.config.far_reports and self.config.norm_multiple > 0
        report = self.filter.report() if far else {}
        if not report:
            return sends
        entries = report_meta(report)
        return [dataclasses.replace(a, message=dataclasses.replace(a.message, meta={**a.message.meta,
                                                                                    **entries}))
                if isinstance(a.message, ParamPush) else a for a in sends]

    def _drop_far_rounds(self, horizon: int) -> None:
        """Buffered rounds beyond ``horizon``: late messages (if the kind keeps them) or dropped."""
        for later in [k for k in self.inbox if k > horizon]:
            self._retire(self.inbox.pop(later), "dropped_future")

    def _retire(self, box: dict[str, ParamPush], counter: str) -> None:
        """A buffered round never mixed as such: late messages (if the kind keeps them), else counted."""
        if self.LATENESS is not Lateness.NEVER:
            self.late += sorted(box.items())
        else:
            self._count(counter, len(box))

    def _skip_rounds(self, now: float) -> int:
        """Jump from ``self.round`` to ``self.catch_up`` (see "Catching up" above); returns the
        steps skipped (counted as done).

        Arithmetic, not a loop over the skipped rounds: a jump may be long (a run bounded by
        ``duration_s`` may have a huge ``total_steps``), and only buffered rounds need visiting.
        """
        config = self.config
        gap = self.catch_up - self.round
        steps_left = max(config.total_steps - self.steps_done, 0)
        over = self.training_over or self._time_up(now)
        skipped = min(gap, 0 if over else -(-steps_left // config.local_steps))
        steps = min(skipped * config.local_steps, steps_left)
        for r in sorted(k for k in self.inbox if k < self.round + skipped):
            self._retire(self.inbox.pop(r), "stale_message")
        self.steps_done += steps
        self.round += skipped
        if skipped < gap:  # training ends on the way: the final gossip rounds are never skipped
            self.training_over = True
            self.catch_up = self.round
            self._drop_far_rounds(self.round + config.max_rounds_ahead)
        self._count("rounds_skipped", skipped)
        self._count("steps_skipped", steps)
        return steps

    def _settle(self, now: float, actions: list[Action]) -> list[Action]:
        """Close every round that is complete (a loop, not recursion: buffered rounds may
        follow one another) or that a catch-up leaves, then arm the deadline of the round left waiting."""
        while self.phase is Phase.WAITING:
            if not (self._complete() or self.catch_up > self.round):
                if not self.timer_set:
                    self.timer_set = True
                    actions.append(SetTimer(self._timer_key(), now + self.config.deadline_s))
                break
            actions += self._close_round(now)
        return actions

    def _timer_key(self) -> str:
        return f"gossip-deadline:{self.round}"

    def _live(self, t: int) -> list[str]:
        """In-neighbours of round ``t`` not known to be down."""
        return [j for j in self.topology.in_neighbours(self.name, t) if j not in self.down]

    def _expected(self, t: int) -> list[str]:
        """Whom round ``t`` waits for: live in-neighbours that are not laggards."""
        return [j for j in self._live(t) if j not in self.laggards]

    def _complete(self) -> bool:
        box = self.inbox.get(self.round, {})
        expected = self._expected(self.round)
        if expected:
            return all(j in box for j in expected)
        # Nobody left to wait for (every in-neighbour down or lagging). Closing at once would race
        # the member alone through its remaining steps, finishing before a cut heals (``all([])``
        # is true); the first arrival or the deadline closes the round instead, so it keeps its
        # place in the schedule. A member with no in-neighbour in the topology has nothing to wait for.
        return bool(box) or not self.topology.in_neighbours(self.name, self.round)

    def _on_message(self, sender: str, message: ParamPush, now: float) -> list[Action]:
        r = message.round
        if self.phase is Phase.FINISHED:
            self.counters["after_finish"] += 1    # (push-sum: its weight share leaves the network here)
            return []
        if not 0 <= r <= self.last_round:
            self.counters["bad_round"] += 1  # no member can be in that round (see MachineBase.last_round)
            return []
        if sender == self.name or sender not in self.topology.in_neighbours(self.name, r):
            self.counters["not_neighbour"] += 1
            return []
        if not all(not isinstance(v, float) or math.isfinite(v) for v in message.meta.values()):
            # no operator sends a non-finite scalar, and a buffered one would make the checkpoint
            # (strict JSON) fail: refused on arrival, as decoding would refuse it at the mix
            self._reject("nonfinite_meta")
            return []
        credited = self.reach.credit(sender, r * self.config.local_steps)  # before any verdict
        if sender in self.laggards and self.round - 1 <= r <= self.round + 1:
            self.caught_up.add(sender)  # waited for again from the next round on (one further ahead is not:
            # its message for our round is not coming)
        horizon = self.round + self.config.max_rounds_ahead
        distance = distance_of(r, round_now=self.round, max_rounds_ahead=self.config.max_rounds_ahead,
                               catch_up=self.catch_up)
        verdict = admission(distance, may_jump=self.CATCHES_UP and not self.training_over,
                            lateness=self.LATENESS)
        if verdict is Admission.DROP_FUTURE:
            self.counters["dropped_future"] += 1  # short of the round to jump to, or no jump now
            return []
        if verdict is Admission.STALE:
            self.counters["stale_message"] += 1
            return []
        seen = self.seen.setdefault(sender, set())
        if seen and r < self._newest(seen) - self.config.max_rounds_ahead:
            self.counters["stale_message"] += 1  # too old to tell from a duplicate
            return []
        if r in seen:  # a resend after a restart, or a duplicate: never applied twice
            self.counters["duplicate_message"] += 1
            return []
        if verdict is Admission.JUMP and not self._claim(sender, r, credited, horizon):
            # a claim not followed is evidence, not a message (push-sum too: taken as mass, it would
            # stand for its sender's real message of that round, which would then be a duplicate)
            return self._settle(now, []) if self.catch_up > self.round else []
        self._remember(sender, r)
        if verdict is Admission.LATE:
            self.late.append((sender, message))  # push-sum, CHOCO: the sums stay right at any mix
            self.counters["late_message"] += 1
            return []
        if distance is Distance.AT_TARGET:
            self.caught_up.add(sender)  # ahead, not lagging: waited for in the round we jump to
        self.inbox.setdefault(r, {})[sender] = message
        if r == self.round or self.catch_up > self.round:
            return self._settle(now, [])
        return []

    def _remember(self, sender: str, r: int) -> None:
        """``sender``'s round ``r`` is taken: never again (rounds kept within the late window)."""
        seen = self.seen.setdefault(sender, set())
        seen.add(r)
        newest = self._newest(seen)
        self.seen[sender] = {s for s in seen if s >= newest - self.config.max_rounds_ahead}

    def _newest(self, seen: set[int]) -> int:
        """The newest of a sender's rounds taken that is within our buffer window: a far round taken
        (push-sum's mass, the round we jump to) is a claim, not where the sender is; were it the
        newest, every real message after it would be too old to tell from a duplicate."""
        near = [s for s in seen if s <= self.round + self.config.max_rounds_ahead]
        return max(near) if near else min(seen)

    def _claim(self, sender: str, r: int, credited_steps: float, horizon: int) -> bool:
        """A message for round ``r``, beyond the buffer window and the round we jump to: how far it
        moves us (protocols/gossip/catchup.py: our own pace since its sender was believed, or the
        claims of enough distinct in-neighbours, one each), counted by reason when not to ``r``. True
        when the message is kept: as the round we jump to or one we will buffer after the jump. A
        claim is evidence, not a message: the round of one not kept stays open to its sender."""
        config = self.config
        needed = confirmations(len(self.topology.in_neighbours(self.name, self.round)),
                               config.byzantine_neighbours)
        target = min(r, math.floor(credited_steps / config.local_steps))
        claims = {sender: r}
        if needed:
            # its older claim is superseded; claims the window has reached are messages again
            self.claims = {j: k for j, k in self.claims.items() if k > horizon and j != sender}
            self.claims[sender] = r
            claims = dict(self.claims)
            target = max(target, confirmed_round(claims, needed) or 0)
        if target > max(horizon, self.catch_up):
            if target < r:
                self._count("catch_up_bounded")  # beyond our pace since its sender was believed
            self.catch_up = target
            for j, k in claims.items():
                if j == sender and k == target:
                    self.caught_up.add(j)  # ahead, not lagging: its message waits in the round we jump to
                elif k >= target:
                    # its message for the round we land in was sent while we were out of its reach
                    # (or was a claim, not kept), and is not coming
                    self.laggards.add(j)
                    self.caught_up.discard(j)
        elif needed:
            self._count("catch_up_unconfirmed")  # its claim counts once enough others confirm it
        else:
            self._count("catch_up_refused")  # beyond our pace, and nobody can confirm it
        return r <= self.catch_up + config.max_rounds_ahead

    def _close_round(self, now: float) -> list[Action]:
        t = self.round
        actions: list[Action] = []
        if self.timer_set:
            actions.append(CancelTimer(self._timer_key()))
            self.timer_set = False
        complete = self._complete()
        if self.round_began_s is not None and self.catch_up <= t and complete:
            # our pace in company: not a round its deadline closed (a member cut off waits out one
            # per deadline), nor one left for a jump
            self.reach.worked(self.round_steps, now - self.round_began_s)
        elif self.work_s is not None and self.catch_up <= t and not self.inbox.get(t):
            # closed by its deadline with no message for it at all: our compute rate, the reach until a
            # round closes complete (a member that started beyond the window behind never has one:
            # catchup.py). Not a round one neighbour's message was in: the one missing may be a liar's,
            # withheld to buy that reach (tests/test_catchup_withheld.py)
            self.reach.worked_alone(self.round_steps, self.work_s)
        self.reach.advanced(self.round_steps, 0.0 if complete or self.catch_up > t else self._waited(now))
        self.round_began_s, self.work_s = None, None
        box = self.inbox.pop(t, {})
        missing = {j for j in self._live(t) if j not in box}
        self._count("missed_deadline", len(missing))
        if not box and self.topology.in_neighbours(self.name, t):
            self._count("rounds_alone")  # no in-neighbour's message for this round: mixed with ourselves only
        # A round a jump closes ends at once, not at its deadline: who is missing from it is not
        # behind (it is most likely where we jump to). Made a laggard, it would not be waited for
        # in the round we land in, which would then mix or not mix its message by which of the
        # jump's messages came first (the one that triggered it is waited for; see _claim).
        jumped = self.catch_up > t
        self.laggards = (self.laggards | (set() if jumped else missing)) - self.caught_up
        self.caught_up = set()
        arrivals = [(j, t, box[j]) for j in sorted(box)]
        arrivals += sorted(((j, m.round, m) for j, m in self.late), key=lambda c: (c[1], c[0]))
        self.late = []
        decoded: list[Candidate] = []
        norms: list[float] = []
        reports: list[Report] = []
        for sender, r, message in arrivals:
            try:
                payload, norm = self._decode(sender, message)
            except BadParts as error:
                self._reject(error.reason)
                continue
            decoded.append((sender, r, payload))
            norms.append(norm)
            reports.append(read_report(message.meta))
        own_norm = self.step_norm if self.after and self.round_steps else self._own_norm()
        # each candidate against the other senders of this round (see robust.py); WAITING: the
        # parameters are ours, their norm is the warm-up reference
        verdict = self._screen(norms, [sender for sender, _, _ in decoded], own_norm, self.params,
                               reports if self.CLIPS_FAR and self.config.far_reports else None)
        factors = self.filter.factors
        self._mix(t, [c if factor == 1.0 else (c[0], c[1], self._clipped(c[2], factor))
                      for c, ok, factor in zip(decoded, verdict, factors, strict=True) if ok])
        self.steps_done += self.round_steps
        self.round += 1
        self.last_sends = []
        if self._outer_step():
            self._params_replaced()
        actions.append(Metric("round", float(self.round)))
        return actions + self._begin_round(now)  # _settle closes it too if it is already complete

    def _waited(self, now: float) -> float:
        """Seconds this round, closed by its deadline, waited after its work (0 when unknown: a round
        restored from a checkpoint)."""
        if self.round_began_s is None:
            return 0.0
        return max(0.0, now - self.round_began_s - (self.work_s or 0.0))

    # ------------------------------------------------------------ checkpoints

    def export_state(self) -> ProtocolState:
        """Everything needed to continue exactly: round, phase, buffers, and the algorithm's tensors."""
        tensors, meta = self._export_common()
        inbox = [(j, m) for r in sorted(self.inbox) for j, m in sorted(self.inbox[r].items())]
        meta.update({
            "laggards": sorted(self.laggards),
            "caught_up": sorted(self.caught_up),
            "seen": {j: sorted(rounds) for j, rounds in sorted(self.seen.items())},
            "catch_up": self.catch_up,
            "claims": dict(sorted(self.claims.items())),
            "step_norm": self.step_norm,
            "pace": self.reach.export(),  # our step rate, a duration: kept across lives (catchup.py)
            # the round being timed (on this clock: a Start forgets them; a restore without one, on
            # the same clock, times the round as if never stopped)
            "round_began_s": self.round_began_s,
            "work_s": self.work_s,
            "inbox": export_messages("inbox", inbox, tensors),
            "late": export_messages("late", self.late, tensors),
            "last_sends": [list(a.recipients) for a in self.last_sends],
            "last_send_messages": export_messages("sent", self._sent_messages(), tensors),
        })
        if self.anchor is not None:
            tensors["rounds/anchor"] = self.anchor.clone()
        self._export_extra(tensors, meta)
        return tensors, meta

    def _sent_messages(self) -> list[tuple[str, ParamPush]]:
        return [("", a.message) for a in self.last_sends if isinstance(a.message, ParamPush)]

    def restore_state(self, state: ProtocolState) -> None:
        tensors, meta = self._restore_common(state)
        self.laggards = set(meta["laggards"])
        self.caught_up = set(meta["caught_up"])
        self.seen = {str(j): {int(r) for r in rounds} for j, rounds in meta["seen"].items()}
        self.catch_up = int(meta.get("catch_up", 0))
        self.claims = {str(j): int(k) for j, k in meta.get("claims", {}).items()}
        self.step_norm = float(meta.get("step_norm", 0.0))
        self.reach.restore(meta.get("pace", {}))
        began, work = meta.get("round_began_s"), meta.get("work_s")
        self.round_began_s = None if began is None else float(began)
        self.work_s = None if work is None else float(work)
        self.anchor = self._own_copy(tensors.get("rounds/anchor"))
        self.inbox = {}
        for sender, message in restore_messages("inbox", meta["inbox"], tensors):
            self.inbox.setdefault(message.round, {})[sender] = message
        self.late = restore_messages("late", meta["late"], tensors)
        messages = restore_messages("sent", meta["last_send_messages"], tensors)
        self.last_sends = [Send(tuple(recipients), message)
                           for recipients, (_, message) in zip(meta["last_sends"], messages, strict=True)]
        self._restore_extra(tensors, meta)

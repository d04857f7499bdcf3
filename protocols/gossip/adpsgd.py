"""Asynchronous pairwise gossip, AD-PSGD style (Lian et al. 2018): no global barrier.

Iteration ``k`` of peer i: pick one neighbour j with the counter-based RNG
(keyed by seed, i, k), send it ``x_i`` asking for a reply (push-pull), run H
local steps, and when both the steps and j's reply are in, apply
``x_i += (x_j - x_i_sent) / 2``. Peer j answers a request the moment it
arrives, even in the middle of its own local steps, with its *public* value
(its parameters at the start of its work, plus the pairwise averages done
since), and applies its half ``(x_i - x_j_public) / 2`` to the public value at
once and to its parameters when its work is done. Each pairwise average is
thus atomic and conserves the pair's sum, and a slow peer never blocks the
others: only its own iterations are slow. A request whose update the insider
filter rejects is refused (``ErrorReply``), so the requester gives up at once.

Training stops after ``total_steps`` or ``duration_s`` (peers of different
speeds do different numbers of steps), then ``final_gossip_rounds``
iterations average without local work. After ``Finished`` a machine still
answers requests, so slower peers can finish their own iterations.

An iteration with no live neighbour to pick (every one down: a cut link) is
not skipped at once, which would race the member alone through its remaining
steps: it does its local work, then waits for a neighbour to come back
(``NeighbourUp``) or for its deadline, and counts ``rounds_alone``. So a
cut-off member keeps its pace and averages again once the link returns, as
the round machines do (protocols/gossip/rounds.py).
"""

from __future__ import annotations

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
    Start,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.gossip.base import MachineBase, Phase
from protocols.messages import ErrorReply, Message, ParamPush
from protocols.rng import derive_seed

REFUSED = "update_refused"  # ErrorReply code: the request's update was rejected, no average was done


def _int_or(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


class ADPSGD(MachineBase):
    SENDS_OWN_PARAMS = True  # a request or reply carries x_i (through the operator)
    ACCEPTS: frozenset[type[Message]] = frozenset({ParamPush, ErrorReply})  # ErrorReply: a refused exchange

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.topology.directed:
            raise ValueError("algorithm 'adpsgd' averages pairs both ways: it needs an undirected graph")
        self.public: torch.Tensor | None = None  # while WORKING: our value for pairwise averages
        self.correction: torch.Tensor | None = None  # while WORKING: averages to apply at WorkDone
        self.request: tuple[str, int] | None = None  # (partner, iteration) awaiting a reply
        self.sent: torch.Tensor | None = None  # what the outstanding request carried (decoded)
        self.own_step_norm = 0.0
        self.alone = False  # this iteration found no live neighbour: it waits (see the module docstring)

    def _forget_exchanges(self) -> None:
        self.public, self.correction, self.request, self.sent = None, None, None, None
        self.alone = False

    # ------------------------------------------------------------ events

    def _dispatch(self, event: Event, now: float) -> list[Action]:
        match event:
            case Start():
                if self.phase is Phase.IDLE:
                    self.start_s = now
                    return self._begin(now)
                if self.phase is Phase.FINISHED:
                    return [Finished()]
                # restarted mid-iteration: the partner may have averaged already, so
                # re-sending would average twice; give the exchange up instead. Restored with
                # the work asked for but not done (the trainer restored to before it): ask again.
                self.counters["restarted"] += 1
                if self.phase is Phase.WORKING:
                    return [*self._give_up(now), StartWork(self.round_steps)]
                return self._give_up(now)
            case WorkDone():
                if self.phase is not Phase.WORKING:
                    self.counters["unexpected_event"] += 1
                    return []
                return self._work_finished(now)
            case Received(sender=sender, message=ParamPush() as message):
                if not 0 <= message.round <= self.last_round:
                    self.counters["bad_round"] += 1  # no member can be in that iteration
                    return []
                if sender == self.name or sender not in self._neighbours(message.round, live_only=False):
                    self.counters["not_neighbour"] += 1
                    return []
                if message.want_reply:
                    return self._on_request(sender, message)
                return self._on_reply(sender, message, now)
            case Received(sender=sender, message=ErrorReply() as refusal) if refusal.code == REFUSED:
                if self.request is None or self.request != (sender, _int_or(refusal.detail, -1)):
                    self.counters["stale_message"] += 1
                    return []
                self.counters["refused_exchange"] += 1
                return self._close_request(now)
            case Received():
                self.counters["unexpected_message"] += 1
                return []
            case TimerFired(key=key):
                if self.phase is Phase.WAITING and key == self._timer_key():
                    self.timer_set = False
                    if not self.alone:  # (an iteration alone asked nobody: counted as rounds_alone)
                        self.counters["missed_deadline"] += 1
                    return self._close_request(now)
                return []
            case NeighbourDown(name=who):
                self.down.add(who)
                if self.request is not None and self.request[0] == who:
                    return self._give_up(now)
                return []
            case NeighbourUp(name=who):
                self.down.discard(who)
                if self.alone and self.phase is Phase.WAITING:
                    return self._close_request(now)  # a partner again: the next iteration picks it
                self.alone = False  # (still working: the iteration ends at WorkDone, without a wait)
                return []
        raise TypeError(f"not an event: {event!r}")

    def _give_up(self, now: float) -> list[Action]:
        if self.request is None:
            if self.alone and self.phase is Phase.WAITING:  # restarted while waiting alone: wait again
                self.timer_set = False
                return self._wait(now)
            return []
        self.counters["missed_deadline"] += 1
        return self._close_request(now)

    def _close_request(self, now: float) -> list[Action]:
        """The outstanding exchange is over (answered, refused or given up; alone: a neighbour came
        up or the deadline passed): the iteration ends now if the local work is done, else at WorkDone."""
        self.request, self.sent = None, None
        self.alone = False
        if self.phase is Phase.WAITING:
            return self._cancel_timer() + self._end_iteration(now)
        return []

    # ------------------------------------------------------------ iterations

    def _neighbours(self, k: int, *, live_only: bool = True) -> list[str]:
        names = {*self.topology.in_neighbours(self.name, k), *self.topology.out_neighbours(self.name, k)}
        return sorted(j for j in names if not (live_only and j in self.down))

    def _partner(self, k: int) -> str | None:
        candidates = self._neighbours(k)
        if not candidates:
            return None
        return candidates[derive_seed(self.seed, self.name, k, "adpsgd-partner") % len(candidates)]

    def _begin(self, now: float) -> list[Action]:
        partner = self._partner(self.round)
        # every neighbour down: wait for one (see the module docstring); none in the topology at
        # all: once training is over there is nobody to average with and no point going on
        self.alone = partner is None and bool(self._neighbours(self.round, live_only=False))
        if not self._schedule_round(now, can_gossip=partner is not None or self.alone):
            return [Finished()]
        if self.alone:
            self.counters["rounds_alone"] += 1
        actions: list[Action] = []
        if partner is not None and self._sendable(self.params):
            tensors, meta, self.sent = self.payload.encode(self.params, self.round)
            self.request = (partner, self.round)
            actions.append(Send((partner,), ParamPush(round=self.round, tensors=tensors, meta=meta,
                                                      want_reply=True)))
        if self.round_steps:
            self.phase = Phase.WORKING
            self.public = self.params.detach().clone()
            self.correction = torch.zeros_like(self.params)
            actions.append(StartWork(self.round_steps))
            return actions
        self.own_step_norm = 0.0
        return actions + self._work_finished(now)

    def _work_finished(self, now: float) -> list[Action]:
        if self.public is not None and self.correction is not None:
            start = self.public - self.correction  # our value when the work began
            self.own_step_norm = self._distance(self.params, start)
            self.params.add_(self.correction)
            self.public, self.correction = None, None
        self.phase = Phase.WAITING
        if self.request is None and not self.alone:
            return self._end_iteration(now)
        return self._wait(now)

    def _wait(self, now: float) -> list[Action]:
        """Wait for the reply (or, alone, for a neighbour to come up) until the deadline."""
        self.timer_set = True
        return [SetTimer(self._timer_key(), now + self.config.deadline_s)]

    def _end_iteration(self, now: float) -> list[Action]:
        self.steps_done += self.round_steps
        self.round += 1
        self._outer_step()
        return [Metric("round", float(self.round)), *self._begin(now)]

    def _timer_key(self) -> str:
        return f"adpsgd-reply:{self.round}"

    def _cancel_timer(self) -> list[Action]:
        if not self.timer_set:
            return []
        self.timer_set = False
        return [CancelTimer(self._timer_key())]

    # ------------------------------------------------------------ pairwise averages

    def _apply_half(self, theirs: torch.Tensor, mine: torch.Tensor) -> None:
        change = (theirs - mine).mul_(0.5)
        if self.phase is Phase.WORKING:
            assert self.public is not None and self.correction is not None
            self.public.add_(change)
            self.correction.add_(change)
        else:
            self.params.add_(change)

    def _screened(self, sender: str, message: ParamPush, mine: torch.Tensor) -> torch.Tensor | None:
        try:
            theirs = self.payload.decode(message.tensors, message.meta)
        except BadParts as error:
            self._reject(error.reason)
            return None
        norm = self._distance(theirs, mine)
        # judged against the other neighbours' latest norms (see robust.py); ``mine``'s norm is
        # the warm-up reference
        accepted = self._screen([norm], [sender], self.own_step_norm, mine)[0]
        return theirs if accepted else None

    def _on_request(self, sender: str, message: ParamPush) -> list[Action]:
        mine = self.public if self.phase is Phase.WORKING else self.params
        assert mine is not None
        theirs = self._screened(sender, message, mine) if self._sendable(mine) else None
        if theirs is None:
            # refuse rather than stay silent: the requester gives up at once instead of at its deadline
            return [Send((sender,), ErrorReply(code=REFUSED, detail=str(message.round)))]
        tensors, meta, mine_sent = self.payload.encode(mine, message.round)
        self._apply_half(theirs, mine_sent)
        self.counters["requests_served"] += 1
        return [Send((sender,), ParamPush(round=message.round, tensors=tensors, meta=meta))]

    def _on_reply(self, sender: str, message: ParamPush, now: float) -> list[Action]:
        if self.request != (sender, message.round) or self.sent is None:
            self.counters["stale_message"] += 1
            return []
        theirs = self._screened(sender, message, self.sent)
        if theirs is not None:
            self._apply_half(theirs, self.sent)
        return self._close_request(now)

    # ------------------------------------------------------------ checkpoints

    def export_state(self) -> ProtocolState:
        tensors, meta = self._export_common()
        for key, value in (("public", self.public), ("correction", self.correction), ("sent", self.sent)):
            if value is not None:
                tensors[f"adpsgd/{key}"] = value.clone()
        meta.update({
            "request": None if self.request is None else list(self.request),
            "own_step_norm": self.own_step_norm,
            "alone": self.alone,
        })
        return tensors, meta

    def restore_state(self, state: ProtocolState) -> None:
        tensors, meta = self._restore_common(state)
        self.public, self.correction, self.sent = (self._own_copy(tensors.get(f"adpsgd/{key}"))
                                                   for key in ("public", "correction", "sent"))
        request = meta["request"]
        self.request = None if request is None else (str(request[0]), int(request[1]))
        self.own_step_norm = float(meta["own_step_norm"])
        self.alone = bool(meta.get("alone", False))

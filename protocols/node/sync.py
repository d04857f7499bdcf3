"""State sync, both sides, in one order for both drivers.

Answering: only neighbours, only once we have started, each requester at most
once per ``sync_answer_interval_s`` (the answer is the whole model); every
refusal is counted by reason.

Asking: ``sync_attempts`` attempts of ``sync_timeout_s`` each (``begin_asking``,
then ``ask`` before each); a restarted member that heard no neighbour while it
started asks once. With every attempt unanswered it goes on from its own state
(``no_answer``).

Choosing: an attempt takes an answer once every asked neighbour that is up has
answered, or at its timeout with at least one usable answer. The one taken is
:func:`best_offer`'s: the highest round, then the most steps done, then the
lowest name, so the state adopted depends only on what the neighbours hold, not
on who answered first. A refusal (``ErrorReply`` with ``REFUSED_CODE``) counts
as an answer.

Adopting: an answer is checked first (protocols/node/check.py), then kept out if
it is behind us, or if the machine cannot take a neighbour's state
(``machine.joinable`` False: CHOCO); otherwise the parameters are copied into the
machine's vector, ``join_at`` rebases it, and ``SetTrainerStep`` makes the
learning-rate schedule follow the network. Why this order: docs/design/node.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from enum import Enum

import torch

from protocols.compress import BadParts
from protocols.events import Action, Machine, SetTrainerStep
from protocols.messages import StateSyncResponse
from protocols.node.check import SyncOffer, check_sync_response
from protocols.node.config import NodeConfig

# the code of the ErrorReply a refused neighbour's request gets: its sync need not wait for us
REFUSED_CODE = "sync_refused"


def best_offer(offers: Mapping[str, SyncOffer]) -> str:
    """The sender whose offer a sync takes: the highest round, then the most steps done, then the
    lowest name (a tie between equally advanced neighbours is broken the same way everywhere)."""
    if not offers:
        raise ValueError("no offer to choose from")
    return min(offers, key=lambda name: (-offers[name].round, -offers[name].steps_done, name))


class Adoption(Enum):
    ADOPTED = "adopted"
    KEPT = "kept"  # the answer was behind us
    REFUSED = "refused"  # the algorithm cannot join by state sync


class StateSync:
    """One member's state sync: whom it answers, and what it makes of an answer.

    ``rejected`` counts refusals by reason (a driver shows them with the wire's own);
    ``outcomes`` counts what became of this member's own syncs (adopted, kept, refused, no_answer);
    ``answers_sent`` counts the answers it gave.
    """

    def __init__(self, config: NodeConfig, neighbours: frozenset[str] | set[str]) -> None:
        self.config = config
        self.neighbours = frozenset(neighbours)
        self.rejected: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.answers_sent = 0
        self._answered_at: dict[str, float] = {}  # requester -> when we last sent it our state
        self.attempts = 0        # of this sync (begin_asking)
        self.attempts_made = 0

    # ------------------------------------------------------------ asking

    def begin_asking(self, *, resumed: bool, heard_anyone: bool) -> None:
        """A sync starts: ``sync_attempts`` attempts, or one for a restarted member that heard nobody."""
        self.attempts = 1 if resumed and not heard_anyone else self.config.sync_attempts
        self.attempts_made = 0

    def ask(self) -> bool:
        """Before each attempt: True to send a request now; False when every attempt has gone
        unanswered (counted ``no_answer``: the member goes on from its own state)."""
        if self.attempts_made >= self.attempts:
            self.outcomes["no_answer"] += 1
            return False
        self.attempts_made += 1
        return True

    # ------------------------------------------------------------ answering

    def may_answer(self, requester: str, now: float, *, started: bool) -> bool:
        """Whether to answer ``requester``'s request now (True: the answer is counted as sent)."""
        if requester not in self.neighbours:
            self.rejected["sync_request_not_neighbour"] += 1
            return False
        if not started:
            self.rejected["sync_request_not_started"] += 1
            return False
        last = self._answered_at.get(requester)
        if last is not None and now - last < self.config.sync_answer_interval_s:
            self.rejected["sync_request_too_often"] += 1
            return False
        self._answered_at[requester] = now
        self.answers_sent += 1
        return True

    @staticmethod
    def answer(machine: Machine, params: torch.Tensor, *, trainer_step: int) -> StateSyncResponse:
        """The answer: ``params`` (a copy of what the machine mixes, taken by the driver wherever the
        trainer keeps it) and where we are in the schedule."""
        round_index, steps_done = machine.position
        return StateSyncResponse(round=round_index, tensors={"params": params},
                                 meta={"round": round_index, "steps_done": steps_done,
                                       "trainer_step": trainer_step})

    # ------------------------------------------------------------ adopting

    def check(self, sender: str, message: StateSyncResponse, machine: Machine) -> SyncOffer | BadParts:
        """The usable offer in ``sender``'s answer, or why not (counted by reason; the wait goes on,
        for another neighbour or the next attempt)."""
        verdict = (check_sync_response(message, machine) if sender in self.neighbours
                   else BadParts("not_neighbour", "only neighbours were asked"))
        if isinstance(verdict, BadParts):
            self.rejected[f"sync_answer_{verdict.reason}"] += 1
        return verdict

    def adopt(self, offer: SyncOffer, machine: Machine) -> tuple[Adoption, list[Action]]:
        """Judge a checked offer (see the module docstring for the order) and carry it out on the
        machine; the actions are for the driver (the trainer's step)."""
        own_round, _ = machine.position
        actions: list[Action] = []
        if offer.round < own_round:
            outcome = Adoption.KEPT
        elif not machine.joinable:
            outcome = Adoption.REFUSED
        else:
            with torch.no_grad():
                machine.params.copy_(offer.params)
            machine.join_at(offer.round, offer.steps_done)
            outcome = Adoption.ADOPTED
            actions.append(SetTrainerStep(offer.steps_done))
        self.outcomes[outcome.value] += 1
        return outcome, actions

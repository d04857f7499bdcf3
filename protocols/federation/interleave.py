"""FedAvg rounds between gossip rounds on a gateway: one rule for the daemon and the simulator.

A gateway's Node holds a gossip machine (over the gateways' graph) and the
FedAvg server as a role, both on one flat vector. The gossip machine runs
with ``mixing = "after"``: each of its rounds is *work*, then an exchange and
a mix. On a gateway the work of every ``gossip_rounds``-th gossip round is one
FedAvg round (the server is resumed and the work is done when it closes); the
work of the others is nothing. So the sequence is a FedAvg round, then
``gossip_rounds`` exchanges, the last one's result being what the next FedAvg
round sends its clients. ``gossip_rounds = 0``: no gossip (each gateway is its
own graph, every round's work a FedAvg round).
"""

from __future__ import annotations

import math

from protocols.events import Action
from protocols.federation.fedbuff import BuffPhase, FedBuffServer
from protocols.federation.server import FedAvgServer, ServerPhase


def fedavg_round_due(gossip_round: int, gossip_rounds: int) -> bool:
    """Whether the work of gossip round ``gossip_round`` (0-based) is a FedAvg round."""
    if gossip_round < 0:
        raise ValueError(f"gossip_round must be >= 0, not {gossip_round}")
    return gossip_rounds <= 1 or gossip_round % gossip_rounds == 0


def gossip_total_rounds(fedavg_rounds: int, gossip_rounds: int, *, mode: str = "sync") -> int:
    """The gossip machine's rounds (its ``total_steps`` at one step per round): ``gossip_rounds``
    per FedAvg round (one when there is no gossip); under FedBuff one, whose work is the whole
    buffered run (see :class:`GatewayWork`). Both drivers' gateways ask here."""
    if mode == "fedbuff":
        return 1
    return fedavg_rounds * max(1, gossip_rounds)


class GossipedRounds:
    """Which closed FedAvg rounds have had the gossip after them: what a gateway records of a round (its
    global model's accuracy) is of the model it holds then, the one the next round sends and an
    export writes. Both drivers' gateways hold one.

    ``closed(index, gossip_round)`` when a round's report appears (``gossip_round``: the machine's
    round then, the one whose work the FedAvg round is); ``ready(gossip_round)`` gives, once each, the
    rounds whose ``gossip_rounds`` exchanges (one with no gossip) have mixed since; ``flush=True``
    all that wait (the end, or a stop). The ``last`` round, which finishes the server, waits for the
    end: the machine's final gossip rounds may mix after its exchanges, and the model it finishes
    with is the one exported. FedBuff gossips only at its end: each version at once."""

    def __init__(self, *, gossip_rounds: int, mode: str = "sync") -> None:
        self.after = 0 if mode == "fedbuff" else max(1, gossip_rounds)
        self.waiting: dict[int, float] = {}   # closed round -> the machine round its gossip ends at

    def closed(self, round_index: int, gossip_round: int, *, last: bool = False) -> None:
        self.waiting[round_index] = math.inf if last else gossip_round + self.after

    def ready(self, gossip_round: int, *, flush: bool = False) -> list[int]:
        done = sorted(i for i, until in self.waiting.items() if flush or gossip_round >= until)
        for index in done:
            del self.waiting[index]
        return done


class GatewayWork:
    """What a gateway's gossip machine's ``StartWork`` means, and when that work is done.

    Both drivers' gateways hold one (peer/runtime/daemon.py, sim/federation.py). ``begin`` at
    each ``StartWork``, with the machine's round: the server's actions (a resumed round's
    ``RoundStart``), to route through ``Node.role_actions("fedavg", ...)``, and whether the work is
    done at once (a gossip-only round: feed ``WorkDone`` now). After each of the gateway's turns,
    ``closed()`` is True once when the FedAvg round the work waits for has closed: feed
    ``WorkDone`` then. FedBuff has no rounds: the work its gateway's machine begins is the whole
    buffered run, done when the server finishes. A gateway restored from its checkpoint calls
    ``restarted``: its server opens the round it was at again at ``Start``, and the first work
    its machine asks for (the work it was restored in the middle of, asked again: protocols/gossip)
    is that round."""

    def __init__(self, server: FedAvgServer | FedBuffServer, *, gossip_rounds: int) -> None:
        if gossip_rounds < 0:
            raise ValueError(f"gossip_rounds must be >= 0, not {gossip_rounds}")
        self.server = server
        self.gossip_rounds = gossip_rounds
        self.awaiting = False       # the work in progress is the open FedAvg round
        self.reopening = False      # restored: the first work is the round the server opens again

    def begin(self, now: float, round_index: int) -> tuple[list[Action], bool]:
        """The work of the machine's gossip round ``round_index`` (0-based) begins."""
        if self.reopening or not isinstance(self.server, FedAvgServer):
            self.reopening = False
            self.awaiting = True
            return [], False
        if not fedavg_round_due(round_index, self.gossip_rounds):
            return [], True
        self.awaiting = True
        # round 0 opened at Start (or once enough clients registered)
        return (self.server.resume(now) if round_index > 0 else []), False

    def restarted(self) -> None:
        """Restored from a checkpoint: the restored server opens the round it was at again at
        ``Start``, and the first work the machine asks for waits for that round."""
        self.reopening = True
        self.awaiting = False

    def closed(self) -> bool:
        if self.awaiting and self.server.phase in (ServerPhase.PAUSED, ServerPhase.FINISHED,
                                                   BuffPhase.FINISHED):
            self.awaiting = False
            return True
        return False

    def rounds_done(self, machine_steps: int) -> int:
        """The gateway's work so far, in rounds (what its checkpoints count and are named by), from its
        machine's steps (one per gossip round): those, and under FedBuff, whose one gossip round is the
        whole buffered run, the server's model versions too (else a FedBuff gateway never reached a
        checkpoint before its end, and a kill lost the run)."""
        if isinstance(self.server, FedBuffServer):
            return machine_steps + self.server.version
        return machine_steps

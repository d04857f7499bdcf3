"""What only a gateway's daemon adds: its server in the checkpoint, its rounds on disk and in the status.

A gateway (a config with ``[federation]``) hosts the FedAvg (or FedBuff) server
as its Node's ``fedavg`` role; its gossip machine's work is a FedAvg round or
nothing (protocols/federation/interleave.py's ``GatewayWork``). Its checkpoint
holds the server's tensors under ``fedavg/`` and its meta under ``fedavg``,
taken at one moment with the machine's. A closed round is evaluated once and
written to ``rounds.jsonl`` when the gateway's gossip after it is over: the
accuracy recorded is of the model the gateway then holds, the one the next
round sends and ``hivemesh export`` writes (FedBuff, which gossips only at the
end, at once; a stop writes what is pending). Not yet on the member
lifecycle's checkpoint schedule: a gateway trains nothing, so its checkpoints
count its gossip rounds (``GatewayWork.rounds_done``), here; what it says and
shows counts FedAvg rounds (:func:`rounds_closed`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from protocols.events import Machine
from protocols.federation import report_row
from protocols.federation.fedbuff import FedBuffServer
from protocols.federation.interleave import GatewayWork, GossipedRounds
from protocols.federation.server_base import SERVER_ROLE
from protocols.node.checkpoints import CheckpointConfig, CheckpointSchedule
from topology.errors import HivemeshError

SERVER_PREFIX = f"{SERVER_ROLE}/"  # a gateway's checkpoint: its server's tensors beside the machine's
ROUNDS_FILE = "rounds.jsonl"  # one line per closed round: its report, the global accuracy and test loss

ProtocolState = tuple[dict[str, torch.Tensor], dict[str, Any]]


def protocol_state(machine: Machine, work: GatewayWork | None) -> ProtocolState:
    """The machine's state and, on a gateway, its server's: one checkpoint, taken at one moment,
    so the two agree after a restart."""
    tensors, meta = machine.export_state()
    if work is None:
        return tensors, meta
    server_tensors, server_meta = work.server.export_state()
    return ({**tensors, **{f"{SERVER_PREFIX}{k}": v for k, v in server_tensors.items()}},
            {**meta, SERVER_ROLE: server_meta})


def restore_server(work: GatewayWork | None, state: Any, data_dir: Path) -> Any:
    """A gateway's checkpoint: restore its server (a round open when it was written is asked again),
    hand back the machine's part."""
    tensors, meta = state
    if work is None:
        return state
    if SERVER_ROLE not in meta:
        raise HivemeshError(f"{data_dir}: the checkpoint is a plain peer's, not this "
                            "gateway's (no server state): use a new data_dir for a gateway")
    own = {k: v for k, v in tensors.items() if not k.startswith(SERVER_PREFIX)}
    served = {k[len(SERVER_PREFIX):]: v for k, v in tensors.items() if k.startswith(SERVER_PREFIX)}
    work.server.restore_state((served, meta[SERVER_ROLE]))
    work.server.forget_registrations()   # its clients register again as they are heard
    return own, {k: v for k, v in meta.items() if k != SERVER_ROLE}


def rounds_closed(work: GatewayWork) -> int:
    """The FedAvg rounds (FedBuff: model versions) this gateway's server has closed, restarts included:
    also the 0-based index of the round open now, or of the next one. A gateway's progress, in its
    console, status, metrics and checkpoint lines."""
    server = work.server
    return server.version if isinstance(server, FedBuffServer) else server.round


def round_words(work: GatewayWork) -> str:
    """``round 6/10``: the rounds closed, of the rounds the federation runs."""
    return f"round {rounds_closed(work)}/{work.server.config.rounds}"


class GatewayRounds:
    """A gateway's closed rounds: evaluated once each after the gossip that follows them, one line each
    in ``rounds.jsonl``, and its checkpoints due by gossip rounds (``every_steps`` of them) or seconds."""

    def __init__(self, work: GatewayWork, checkpoint: CheckpointConfig) -> None:
        self.work = work
        self.saves = CheckpointSchedule(checkpoint)
        self.evaluated = 0          # reports of this start seen (they are only added)
        self.gossiped = GossipedRounds(gossip_rounds=work.gossip_rounds, mode=work.server.MODE)

    def due(self, rounds_done: int, now: float) -> bool:
        """Whether a checkpoint is due (``rounds_done``: ``GatewayWork.rounds_done``)."""
        return self.saves.should_save(rounds_done, now)

    def trainer_step_set(self, old: int, new: int) -> None:
        """``SetTrainerStep``: a jump makes a checkpoint due at once."""
        self.saves.step_set(old, new)

    def closed_rounds(self, gossip_round: int, evaluate: Callable[[], dict[str, float]],
                      append_line: Callable[[str, dict[str, Any]], None], *,
                      flush: bool = False,
                      warn: Callable[[str], None] | None = None) -> dict[str, float] | None:
        """Rounds closed since the last call wait for the gossip after them (``gossip_round``: the
        machine's round now); those whose gossip is over (all of them when ``flush``: the end, or a
        stop) are evaluated, once, and written. The evaluation, or None when none was written."""
        server = self.work.server
        for index in sorted(server.reports)[self.evaluated:]:
            failed = failed_round_line(server.reports[index])
            if failed and warn is not None:     # said as it closes, not after its gossip
                warn(failed)
            self.gossiped.closed(index, gossip_round, last=server.finished and index == max(server.reports))
        self.evaluated = len(server.reports)
        ready = self.gossiped.ready(gossip_round, flush=flush)
        if not ready:
            return None
        found = evaluate()
        for index in ready:
            append_line(ROUNDS_FILE, {**report_row(server.reports[index]),
                                      "accuracy": found.get("accuracy", math.nan),
                                      "test_loss": found.get("loss", math.nan)})
        return found

    def federation_status(self, now: float, *, routes: dict[str, bytes], clients: Any,
                          counters: Any) -> dict[str, Any]:
        """The server's own view (its ``round``: :func:`rounds_closed`), its last closed rounds, its
        counters, and each client's presence, last contact and bytes each way."""
        server = self.work.server
        status = server.status()
        contact = status.pop("last_contact_s", {})
        reports = [report_row(server.reports[i]) for i in sorted(server.reports)[-3:]]
        closed = rounds_closed(self.work)
        return {**status, "round": closed, "rounds": server.config.rounds, "rounds_closed": closed,
                "last_rounds": reports, "counters": dict(sorted(server.counters.items())),
                "clients": {name: {"up": name in routes and clients.members[name].up,
                                   "presence": client_presence(name, server, routes, clients),
                                   "last_contact_s": (now - contact[name]) if name in contact else None,
                                   "bytes_sent": counters.client_bytes_sent[name],
                                   "bytes_received": counters.client_bytes_received[name],
                                   "unreachable": counters.client_unreachable[name]}
                            for name in clients.names()}}


def failed_round_line(report: Any) -> str:
    """One line for a round that closed without changing the model ("" for one that aggregated, and
    for a FedBuff version, which is only made of updates taken)."""
    if getattr(report, "aggregated", True):
        return ""
    missing = ", ".join(report.missing) or "none"
    return (f"round {report.round} failed ({report.closed_by.replace('_', ' ')}): {len(report.taken)} of "
            f"{len(report.asked)} asked taken, missing {missing}; the model did not change")


def client_presence(name: str, server: Any, routes: dict[str, bytes], clients: Any) -> str:
    """An edge client in words: ``finished`` once the final model was sent to it (it exits then),
    else ``up`` (registered: heard within the timeout on a known connection), ``left`` (it said so
    as it stopped), ``down`` or ``never heard``."""
    if name in server.final_sent_s:
        return "finished"
    member = clients.members[name]
    if name in routes and member.up:
        return "up"
    if member.finished:
        return "left"
    return "down" if name in routes or math.isfinite(member.last_seen) else "never heard"

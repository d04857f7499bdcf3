"""What only a gateway's daemon adds: its server in the checkpoint, its rounds on disk and in the status.

A gateway (a config with ``[federation]``) hosts the FedAvg (or FedBuff) server
as its Node's ``fedavg`` role; its gossip machine's work is a FedAvg round or
nothing (protocols/federation/interleave.py's ``GatewayWork``). Its checkpoint
holds the server's tensors under ``fedavg/`` and its meta under ``fedavg``,
taken at one moment with the machine's. After each of its turns a closed round
is evaluated once and written to ``rounds.jsonl``. Not yet on the member
lifecycle's checkpoint schedule: a gateway trains nothing, so its checkpoints
count its rounds (``GatewayWork.rounds_done``), here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from protocols.events import Machine
from protocols.federation import report_row
from protocols.federation.interleave import GatewayWork
from protocols.node.checkpoints import CheckpointConfig, CheckpointSchedule
from topology.errors import HivemeshError

SERVER_PREFIX = "fedavg/"     # a gateway's checkpoint: its server's tensors beside the machine's
ROUNDS_FILE = "rounds.jsonl"  # one line per closed round (its report and the global accuracy)

ProtocolState = tuple[dict[str, torch.Tensor], dict[str, Any]]


def protocol_state(machine: Machine, work: GatewayWork | None) -> ProtocolState:
    """The machine's state and, on a gateway, its server's: one checkpoint, taken at one moment,
    so the two agree after a restart."""
    tensors, meta = machine.export_state()
    if work is None:
        return tensors, meta
    server_tensors, server_meta = work.server.export_state()
    return ({**tensors, **{f"{SERVER_PREFIX}{k}": v for k, v in server_tensors.items()}},
            {**meta, "fedavg": server_meta})


def restore_server(work: GatewayWork | None, state: Any, data_dir: Path) -> Any:
    """A gateway's checkpoint: restore its server (a round open when it was written is asked again),
    hand back the machine's part."""
    tensors, meta = state
    if work is None:
        return state
    if "fedavg" not in meta:
        raise HivemeshError(f"{data_dir}: the checkpoint is a plain peer's, not this "
                            "gateway's (no server state): use a new data_dir for a gateway")
    own = {k: v for k, v in tensors.items() if not k.startswith(SERVER_PREFIX)}
    served = {k[len(SERVER_PREFIX):]: v for k, v in tensors.items() if k.startswith(SERVER_PREFIX)}
    work.server.restore_state((served, meta["fedavg"]))
    work.server.forget_registrations()   # its clients register again as they are heard
    return own, {k: v for k, v in meta.items() if k != "fedavg"}


class GatewayRounds:
    """A gateway's closed rounds: evaluated once each, one line each in ``rounds.jsonl``, and its
    checkpoints due by rounds (``every_steps`` of them) or seconds."""

    def __init__(self, work: GatewayWork, checkpoint: CheckpointConfig) -> None:
        self.work = work
        self.saves = CheckpointSchedule(checkpoint)
        self.evaluated = 0

    def due(self, rounds_done: int, now: float) -> bool:
        """Whether a checkpoint is due (``rounds_done``: ``GatewayWork.rounds_done``)."""
        return self.saves.should_save(rounds_done, now)

    def trainer_step_set(self, old: int, new: int) -> None:
        """``SetTrainerStep``: a jump makes a checkpoint due at once."""
        self.saves.step_set(old, new)

    def closed_rounds(self, evaluate: Callable[[], dict[str, float]],
                      append_line: Callable[[str, dict[str, Any]], None]) -> dict[str, float] | None:
        """The evaluation of the global model when rounds closed since the last call (None if none)."""
        server = self.work.server
        if len(server.reports) <= self.evaluated:
            return None
        found = evaluate()
        for index in sorted(server.reports)[self.evaluated:]:   # reports are only added
            append_line(ROUNDS_FILE, {**report_row(server.reports[index]),
                                      "accuracy": found.get("accuracy", math.nan)})
        self.evaluated = len(server.reports)
        return found

    def federation_status(self, now: float, *, routes: dict[str, bytes], clients: Any,
                          counters: Any) -> dict[str, Any]:
        """The server's own view, its last closed rounds, its counters, and each client's last contact
        and bytes each way."""
        server = self.work.server
        status = server.status()
        contact = status.pop("last_contact_s", {})
        reports = [report_row(server.reports[i]) for i in sorted(server.reports)[-3:]]
        return {**status, "rounds_closed": len(server.reports), "last_rounds": reports,
                "counters": dict(sorted(server.counters.items())),
                "clients": {name: {"up": name in routes and clients.members[name].up,
                                   "last_contact_s": (now - contact[name]) if name in contact else None,
                                   "bytes_sent": counters.client_bytes_sent[name],
                                   "bytes_received": counters.client_bytes_received[name],
                                   "unreachable": counters.client_unreachable[name]}
                            for name in clients.names()}}

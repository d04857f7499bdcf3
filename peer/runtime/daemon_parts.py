"""What the daemon's port and status read of it: its neighbours, its counters, and the daemon itself as
a protocol (peer/runtime/daemon.py's ``PeerDaemon`` is the one implementation), so neither module
imports the daemon back."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from peer.files.statefiles import CheckpointStore, StatusWriter
from peer.net.digests import BufferPool
from peer.net.transport import Transport
from peer.runtime.assemble import Parts
from peer.runtime.gateway import GatewayRounds
from peer.runtime.peerconfig import PeerConfig
from peer.runtime.rosterwatch import RosterWatch
from peer.runtime.testhooks import Hooks, ScheduleFiles
from protocols.events import Machine
from protocols.federation.interleave import GatewayWork
from protocols.node import Neighbour, Node
from protocols.node.host import Host
from protocols.node.member import Exit, Member
from protocols.node.membership import Connect
from protocols.wire import Endpoint


@dataclass
class NeighbourInfo(Neighbour):
    """What protocols/node/neighbours.py tracks, plus what only the daemon shows."""

    latency_ms: float = math.nan      # one-way, from the heartbeat's wall-clock stamp (same host: exact)
    params: torch.Tensor | None = None  # last full parameters heard (for the consensus estimate)
    reachable: bool = True            # the last message we sent it went out (its connection is up)


@dataclass
class Counters:
    """What the daemon counts beside the Host's send counters."""

    messages_accepted: int = 0
    wire_bytes_accepted_by_kind: Counter[str] = field(default_factory=Counter)
    unreachable: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)     # the driver's own refusals, by reason
    neighbour_down: Counter[str] = field(default_factory=Counter)   # times each went silent (timeout)
    neighbour_finished: Counter[str] = field(default_factory=Counter)  # went silent after saying it finished
    test_cut_dropped: Counter[str] = field(default_factory=Counter)  # "sent"/"received" by a cut test hook
    absent_at_start: Counter[str] = field(default_factory=Counter)  # not up when we started training
    bytes_received_from: Counter[str] = field(default_factory=Counter)  # accepted messages, by sender
    trainer_steps_set: list[int] = field(default_factory=list)  # each SetTrainerStep (catch-up, sync)
    client_bytes_sent: Counter[str] = field(default_factory=Counter)      # a gateway's, by edge client
    client_bytes_received: Counter[str] = field(default_factory=Counter)  # accepted, by edge client
    client_unreachable: Counter[str] = field(default_factory=Counter)     # no connection learnt yet / gone
    roster_reloads: int = 0            # SIGHUPs acted on (`hivemesh roster reload`)
    work_s: float = 0.0                # in the trainer's steps (the rest of train_s is the loop's)


class Daemon(Protocol):
    """The daemon as its port and its status see it."""

    name: str
    config: PeerConfig
    parts: Parts
    trainer: Any                      # peer.train.trainer.Trainer
    endpoint: Endpoint
    transport: Transport | None
    node: Node[NeighbourInfo]
    member: Member[NeighbourInfo]
    host: Host
    neighbours: dict[str, NeighbourInfo]
    routes: dict[str, bytes]
    counters: Counters
    hooks: Hooks
    faults: ScheduleFiles | None
    gateway: GatewayRounds | None
    gateway_work: GatewayWork | None
    recovered: list[str]
    store: CheckpointStore
    status: StatusWriter
    roster_watch: RosterWatch
    receive_buffers: BufferPool
    timeline: dict[str, float]
    config_warnings: list[str]
    state: str
    to_train: int | None
    exit: Exit | None
    last_loss: float
    last_eval: dict[str, float]
    last_eval_step: int
    train_start_s: float
    train_end_s: float

    @property
    def machine(self) -> Machine: ...

    def now(self) -> float: ...

    def _checkpoint(self, *, final: bool) -> bool: ...

    def _connect(self, connect: Connect) -> None: ...

    def _warn(self, text: str) -> None: ...

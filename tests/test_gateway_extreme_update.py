"""Nothing a member sends can end a gateway (issue 32, item 1): the crash found from outside, in a
real gateway daemon's pieces (its transport a recorder, as in test_checkpoint_disk.py).

A federation from ``hivemesh init``'s defaults (qsgd uplink, no norm bound, no sample cap): one edge
sends an update whose qsgd norms are multiplied by 1e30, still finite, so it is taken. The global
model's step that round is too large for float32 (its norm is inf): the gateway's gossip machine
records it as its ``step_norm``, and the next checkpoint's metadata held an infinite number, which
the writer refused with a TypeError that ended the process (exit 1; every edge then exit 3).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from peer.cli.init import default_network
from peer.cli.status import render
from peer.files.statefiles import STATUS_FILE
from peer.runtime.daemon import PeerDaemon
from peer.runtime.gateway import ROUNDS_FILE
from peer.runtime.netinit import create_federation
from peer.runtime.peerconfig import load_peer_config
from protocols.messages import ClientUpdate, Heartbeat
from protocols.node.member import Phase
from protocols.wire import Opened
from tests.test_daemon_limits import RecordingTransport

torch.set_num_threads(1)

EDGES = 6
HOSTILE_SCALE = 1e30


class ReplyingTransport(RecordingTransport):
    """The recorder, with the replies a gateway sends its edge clients on their connections."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[Any] = []

    def reply(self, connection: bytes, frames: Any) -> bool:
        self.replies.append(connection)
        return True


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[PeerDaemon]:
    network = default_network(topology="ring", task="digits-mlp", algorithm="dpsgd", compression="identity",
                              steps=10, seed=0, partition="iid", alpha=0.5)
    files = create_federation(tmp_path, gateways=1, edges=EDGES, network=network,
                              # the influence bounds off (an operator's choice): with them on, the
                              # overflow never reaches the checkpoint this file is about
                              federation={"rounds": 3, "fraction": 0.5, "min_clients": 2,
                                          "samples_multiple": 0, "norm_multiple": 0})
    daemon = PeerDaemon(load_peer_config(files.network.configs["gw0"]))
    daemon.transport = ReplyingTransport()  # type: ignore[assignment]
    try:
        yield daemon
    finally:
        daemon.parts.lock.release()


def deliver(daemon: PeerDaemon, sender: str, message: Any) -> None:
    """An accepted message, as the endpoint hands it over (its connection the sender's name)."""
    daemon._opened(Opened(sender=sender, message=message, epoch=1, seq=0), sender.encode())


def run_round(daemon: PeerDaemon, *, hostile: bool) -> str:
    """One FedAvg round: the asked edges answer with a small delta; with ``hostile``, the first of
    them scales its update's qsgd norms by HOSTILE_SCALE (its name is returned)."""
    while daemon.host.work:
        daemon._work_point(daemon.host.work.popleft())
    assert daemon.gateway_work is not None
    server = daemon.gateway_work.server
    round_index, asked = server.round, server.asked
    assert asked and server.phase.value == "open"
    for name in asked:
        tensors, meta, _ = server.uplink.encode(torch.full_like(server.params, 1e-3), round_index)
        if hostile and name == asked[0]:
            tensors = {k: v * HOSTILE_SCALE if k.endswith("norms") else v for k, v in tensors.items()}
        deliver(daemon, name, ClientUpdate(round=round_index, num_samples=10, tensors=tensors, meta=meta))
    return asked[0]


def test_a_taken_update_scaled_by_1e30_does_not_end_the_gateway(gateway: PeerDaemon) -> None:
    # Prepare: the gateway trains (its gossip machine asks for its first round's work); every edge heard
    edges = sorted(gateway.node.clients.names())
    gateway.launch(resumed=False)     # no gossip neighbour to wait for: it trains at once
    assert gateway.member.phase is Phase.TRAINING
    for name in edges:
        deliver(gateway, name, Heartbeat(step=0, loss=0.0))
    # Execute: round 0 with one hostile edge, then the checkpoint and status that follow it
    hostile = run_round(gateway, hostile=True)
    assert gateway.gateway_work is not None
    server = gateway.gateway_work.server
    assert server.reports[0].aggregated and hostile in server.reports[0].taken
    saved = gateway._checkpoint(final=False)
    gateway._write_status(force=True)
    # Assert: the checkpoint was written, the overflow in it kept and counted; the status and
    # rounds.jsonl are strict JSON
    assert saved and gateway.store.error == ""
    loaded = gateway.store.load_latest()
    assert loaded is not None and loaded[1][1]["step_norm"] == math.inf
    status = strict_json((gateway.config.data_dir / STATUS_FILE).read_text())
    rounds = [strict_json(line) for line in (gateway.config.data_dir / ROUNDS_FILE).read_text().splitlines()]
    assert rounds and rounds[0]["round"] == 0 and hostile in rounds[0]["taken"]
    assert rounds[0]["update_norm"] is None     # the overflow, written as null and counted
    assert status["status_values_replaced"]["infinite"] >= 1
    assert status["federation"]["rounds_closed"] == 1
    assert status["checkpoint_nonfinite"] == {"protocol_meta.step_norm": 1}
    assert "federation (sync): round 1" in render(status)    # what `hivemesh status` prints of it
    # and the next round runs
    run_round(gateway, hostile=False)
    assert server.reports[1].aggregated


def test_the_gateway_restarts_from_a_checkpoint_an_overflow_reached(gateway: PeerDaemon) -> None:
    # Prepare: round 0 taken with the hostile update, checkpointed
    gateway.launch(resumed=False)
    for name in sorted(gateway.node.clients.names()):
        deliver(gateway, name, Heartbeat(step=0, loss=0.0))
    run_round(gateway, hostile=True)
    assert gateway._checkpoint(final=False)
    gateway.parts.lock.release()
    # Execute: a new process on the same data folder resumes
    again = PeerDaemon(gateway.config)
    try:
        resumed = again._restore()
        # Assert: where the first one was, the infinite step norm included
        assert resumed and again._work_done() == gateway._work_done()
        assert again.machine.export_state()[1]["step_norm"] == math.inf
    finally:
        again.parts.lock.release()


def strict_json(text: str) -> Any:
    """``text`` parsed as a strict reader would: NaN and Infinity refused."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)

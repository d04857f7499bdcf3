"""The crash found from outside (issue 32, item 1), in real processes: a roster member answers its
round with an update whose qsgd norms are multiplied by 1e30 (finite, so taken: no norm bound by
default). The global model's step overflowed float32 (the gateway machine's ``step_norm`` inf), its
next checkpoint's metadata raised a TypeError and the gateway exited 1; every honest edge then gave
up (exit 3). Here the gateway writes that checkpoint, finishes the federation and exits 0, and so
do the honest edges.

The attacker is this test, with the key of roster member e002 (never started): it registers with
a heartbeat, receives round 0's model as any edge does, and sends its scaled update.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch
from _federation_support import (
    CEILING_S,
    GATEWAY,
    closed_rounds,
    describe,
    make_federation,
    processes,
    status,
    wait_until,
)

from peer.files.keyfile import load_identity
from peer.net.dial import DialTransport
from peer.runtime.edgeconfig import load_edge_config
from peer.runtime.netinit import FederationFiles, load_roster
from peer.train.checkpoint import load_latest
from protocols.assembly import wire_messages
from protocols.federation.common import payload
from protocols.messages import ClientUpdate, Heartbeat, Message, RoundStart
from protocols.roster import run_id
from protocols.wire import Endpoint, Opened
from tests.test_daemon_federation import _gateway_address, _send

pytestmark = pytest.mark.processes

HONEST = ("e000", "e001")
ATTACKER = "e002"
HOSTILE_SCALE = 1e30


def round_start(transport: DialTransport, endpoint: Endpoint, timeout_s: float = CEILING_S) -> RoundStart:
    """The first RoundStart the gateway sends on ``transport`` (opened as an edge client opens it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for arrival in transport.poll(0.1):
            opened = endpoint.receive(arrival.connection, arrival.frame.buffer, now_s=time.monotonic())
            if isinstance(opened, Opened) and isinstance(opened.message, RoundStart):
                return opened.message
    raise AssertionError("no RoundStart reached the attacker")


def sealed(endpoint: Endpoint, message: Message) -> list[bytes]:
    return [bytes(f) for f in wire_messages(endpoint.seal((GATEWAY,), message))]


def attacker(files: FederationFiles) -> tuple[DialTransport, Endpoint]:
    config = load_edge_config(files.edge_configs[ATTACKER])
    identity = load_identity(config.key_path)
    roster = load_roster(files.network.roster)
    curve = (identity.curve_public_key.encode(), identity.curve_secret_key.encode(),
             roster.member(GATEWAY).curve_key.encode())
    return (DialTransport(_gateway_address(files), curve=curve),
            Endpoint(identity, roster, run_id(config.shared()), 1))


def test_a_taken_update_with_norms_times_1e30_ends_no_process(tmp_path: Path) -> None:
    # Prepare: hivemesh init's uplink (qsgd) and no norm bound; one round of all three, the attacker one.
    # The influence bounds off, as an operator may set them: with them on (the default) the overflow
    # never reaches the checkpoint (tests/test_daemon_federation_insider.py); off, the process lives too
    files = make_federation(tmp_path / "fed", edges=3, rounds=1, fraction=1.0, min_clients=3,
                            min_registered=3, round_timeout_s=120.0, max_samples=0,
                            samples_multiple=0, norm_multiple=0)
    config = load_edge_config(files.edge_configs[ATTACKER]).federation
    transport, endpoint = attacker(files)
    with processes(files) as run, transport:
        for name in (GATEWAY, *HONEST):
            run.start(name)
        # (its first status comes once it listens: _send's wait is then for a handshake, not for a
        # process start, which a loaded machine stretches past it)
        wait_until("the gateway listens", lambda: bool(status(files, GATEWAY)), files)
        _send(transport, sealed(endpoint, Heartbeat(step=0, loss=0.0)))
        start = round_start(transport, endpoint)
        # Execute: a small delta, encoded as an edge encodes it, its norms scaled after encoding
        model = start.tensors["x"]
        uplink = payload(config.uplink, model, seed=config.seed, name=ATTACKER, shapes=None)
        tensors, meta, _ = uplink.encode(torch.full_like(model, 1e-3), start.round)
        tensors = {k: v * HOSTILE_SCALE if k.endswith("norms") else v for k, v in tensors.items()}
        update = ClientUpdate(round=start.round, num_samples=10, tensors=tensors, meta=meta)
        _send(transport, sealed(endpoint, update))
        # Assert: the gateway ends the federation (before the fix: exit 1 at its checkpoint) ...
        assert run.wait(CEILING_S, [GATEWAY]) and run.exitcodes()[GATEWAY] == 0, describe(files)
        # ... and so does every honest edge (before: exit 3, its gateway gone)
        assert run.wait(CEILING_S, list(HONEST))
        assert [run.exitcodes()[name] for name in HONEST] == [0, 0]
    # and the update was taken; the gateway checkpointed the overflow
    [round_0] = closed_rounds(files).values()
    assert ATTACKER in round_0["taken"] and round_0["update_norm"] is None    # inf, written as null
    gateway = status(files, GATEWAY)
    assert gateway["state"] == "finished" and gateway["checkpoint_error"] == ""
    assert gateway["checkpoint_nonfinite"].get("protocol_meta.step_norm", 0) >= 1
    checkpoint = load_latest(files.network.out / "data" / GATEWAY / "checkpoints")
    assert checkpoint is not None and checkpoint.protocol_state[1]["step_norm"] == math.inf

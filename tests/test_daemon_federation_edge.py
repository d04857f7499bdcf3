"""``hivemesh edge`` in real processes on 127.0.0.1: how an edge client ends when its gateway is gone,
and what it trains (FedProx's pull) — beside tests/test_daemon_federation.py's acceptance runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from _federation_support import CEILING_S, describe, make_federation, processes, status

from peer.runtime.daemon import EXIT_STRANDED

pytestmark = pytest.mark.processes


def test_an_edge_whose_gateway_never_comes_gives_up_with_its_counters(tmp_path: Path) -> None:
    """The gateway is never started: after ``gateway_timeout_s`` with no connection and no message,
    the client exits 3 (not 0: its federation did not complete), saying why and with its counters,
    and leaves its checkpoint and a status that says it gave up."""
    # Prepare: a 1.5 s give-up; its heartbeats every 0.5 s find no connection
    files = make_federation(tmp_path / "fed", edges=2, rounds=1, min_clients=1,
                            edge_options={"gateway_timeout_s": 1.5})
    with processes(files) as run:
        # Execute
        run.start("e000")
        assert run.wait(CEILING_S, ["e000"]), describe(files)
        code = run.exitcodes()["e000"]
    # Assert
    assert code == EXIT_STRANDED
    log = (files.network.out / "data" / "e000" / "peer.log").read_text()
    assert "gave up on gateway gw0" in log and "gateway_timeout_s" in log and "never heard" in log, log
    assert "'rounds_trained': 0" in log and "'heartbeat':" in log, log    # the counters: unsent heartbeats
    found = status(files, "e000")
    assert found["state"] == "gave up" and found["rounds_trained"] == 0
    assert found["unsent"].get("heartbeat", 0) >= 2
    assert any((files.network.out / "data" / "e000" / "checkpoints").iterdir()), "no checkpoint written"

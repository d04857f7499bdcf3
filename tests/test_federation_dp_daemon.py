"""Client-level DP in real processes: a gateway with ``[federation.differential_privacy]`` and four
edge clients on 127.0.0.1. The gateway's status shows the epsilon spent so far, each line of its
``rounds.jsonl`` the epsilon after that round, both dp-accounting's figure (issue 13, item 2).
The helpers are test_daemon_federation.py's (same processes, same waits on files)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _federation_support import GATEWAY, closed_rounds, describe, make_federation, processes, status

from protocols.federation.accountant import RoundAccountant

pytestmark = pytest.mark.processes

CEILING_S = 180.0


def test_a_private_gateway_reports_epsilon_in_its_status_and_rounds(tmp_path: Path) -> None:
    # Prepare: 4 clients, 4 rounds, each client asked with probability 0.5; no round opens before all
    # four registered (a client that registers after the last round would wait for a result never sent)
    privacy = {"noise_multiplier": 1.2, "clip_norm": 0.5, "sampling_rate": 0.5, "delta": 1e-5}
    files = make_federation(tmp_path / "fed", edges=4, rounds=4, min_clients=2, min_registered=4,
                            local_epochs=1, round_timeout_s=20.0, differential_privacy=privacy)
    with processes(files) as run:
        # Execute
        run.start_all()
        assert run.wait(CEILING_S), describe(files)
        assert run.exitcodes() == {name: 0 for name in run.processes}, describe(files)
    # Assert
    accountant = RoundAccountant(0.5, 1.2, 1e-5)
    fed = status(files, GATEWAY)["federation"]
    assert fed["rounds_closed"] == 4
    assert fed["privacy"]["epsilon"] == pytest.approx(accountant.epsilon(4), rel=1e-9)
    assert fed["privacy"]["rounds_accounted"] == 4 and fed["privacy"]["delta"] == 1e-5
    rounds = closed_rounds(files)
    assert sorted(rounds) == [0, 1, 2, 3]
    for index, row in rounds.items():
        assert row["epsilon"] == pytest.approx(accountant.epsilon(index + 1), rel=1e-9)
        assert row["aggregated"] and row["clip_norm"] == 0.5 and row["taken"] == row["asked"]

"""Distributed DP in real processes: a gateway with ``[federation.differential_privacy]`` and
``[federation.secure_aggregation]`` and four edge clients on 127.0.0.1 (issue 13, item 2). Each
edge adds its noise share from the secret it drew from the OS; the gateway's status and every
line of its ``rounds.jsonl`` carry the distributed accountant's epsilon, and every round was
summed by SecAgg. The helpers are test_daemon_federation.py's (same processes, same waits)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _federation_support import GATEWAY, closed_rounds, describe, make_federation, processes, status

from peer.runtime.export import latest_params
from peer.runtime.peerconfig import load_peer_config
from protocols.federation.accountant import DistributedRoundAccountant
from protocols.federation.distributed_dp import round_epsilon
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure_config import SecureAggregationConfig

pytestmark = pytest.mark.processes

CEILING_S = 240.0


def test_a_gateway_under_distributed_dp_reports_its_epsilon_and_sums_every_round(tmp_path: Path) -> None:
    # Prepare: 4 clients all asked (q = 1) in 3 rounds, plain SecAgg with t = 2 (max_clients = 4: k <= 3 < 2t)
    privacy = {"noise_multiplier": 1.2, "clip_norm": 0.5, "sampling_rate": 1.0, "delta": 1e-5}
    secure = {"threshold": 2, "clip_value": 0.5, "bits": 16, "max_clients": 4, "advertise_timeout_s": 15.0,
              "share_timeout_s": 15.0, "masked_input_timeout_s": 20.0, "consistency_timeout_s": 15.0,
              "unmask_timeout_s": 15.0}
    files = make_federation(tmp_path / "fed", edges=4, rounds=3, min_clients=4, min_registered=4,
                            local_epochs=1, uplink="identity", round_timeout_s=90.0,
                            differential_privacy=privacy, secure_aggregation=secure,
                            gateway_options={"neighbour_timeout_s": 600.0})
    with processes(files) as run:
        # Execute
        run.start_all()
        assert run.wait(CEILING_S), describe(files)
        assert run.exitcodes() == {name: 0 for name in run.processes}, describe(files)
    # Assert
    numel = latest_params(load_peer_config(files.network.configs[GATEWAY]))[0].numel()
    accountant = DistributedRoundAccountant(1.0, round_epsilon(
        DifferentialPrivacyConfig(**privacy), SecureAggregationConfig(**secure), numel), 1e-5)
    fed = status(files, GATEWAY)["federation"]
    assert fed["rounds_closed"] == 3
    assert fed["privacy"]["epsilon"] == pytest.approx(accountant.epsilon(3), rel=1e-9)
    assert fed["privacy"]["mechanism"] == "distributed"
    rounds = closed_rounds(files)
    assert sorted(rounds) == [0, 1, 2]
    for index, row in rounds.items():
        assert row["closed_by"] == "secagg" and len(row["taken"]) == 4
        assert row["epsilon"] == pytest.approx(accountant.epsilon(index + 1), rel=1e-9)

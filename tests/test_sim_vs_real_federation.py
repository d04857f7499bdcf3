"""sim ≡ real for a federation (issue 12, acceptance g): one gateway and four edge clients in real
processes (``hivemesh peer`` with ``[federation]``, ``hivemesh edge``), and the simulator's
federation built from the very same files (sim/from_network.py), end with the same global model,
bit for bit.

The run is synchronous and its decisions do not depend on timing: every registered client is asked
in every round (fraction 1.0, no over-selection), a round closes when all of them answered (its
deadline is a ceiling that never fires), and the gateway opens round 0 only once all four are
registered. Each client's shard, data order and initial model come from one builder keyed by its
name (peer.train.build); the server combines updates in client-name order (protocols/federation/
common.py), and the uplink's stochastic rounding is keyed by (seed, client, round), so arrival
order moves nothing. The case is not plain FedAvg on purpose: FedProx's pull, a step count instead
of epochs, a compressed downlink, trimmed mean and FedAdam each take a path a driver could get wrong.

Beside the model: each round's asked, taken, missing and late clients and how it closed, the
gateway's counters, each client's counters, and the final model each client holds (the gateway's
``RoundResult``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
)

from peer.files.config import ConfigError
from peer.files.statefiles import CheckpointStore
from peer.runtime.export import latest_params
from peer.runtime.peerconfig import load_peer_config
from sim.federation import FederationRun
from sim.from_network import scenario_from_federation_files

EDGES = 4
# every client in every round, rounds closed by their quota; a few paths a driver could get wrong
FEDERATION: dict[str, Any] = {
    "rounds": 3, "fraction": 1.0, "min_clients": EDGES, "min_registered": EDGES, "over_selection": 0.0,
    "round_timeout_s": 600.0, "local_epochs": 0, "local_steps": 7, "max_samples": 200, "prox_mu": 0.01,
    "aggregator": "trimmed_mean", "trim_beta": 0.25, "downlink": "qsgd:bits=8",
    "server_opt": {"name": "fedadam", "lr": 0.05}}
ROUND_KEYS = ("asked", "taken", "missing", "late", "closed_by")


def prefixed(counters: dict[str, Any], prefix: str) -> dict[str, int]:
    return {k[len(prefix):]: int(v) for k, v in counters.items() if k.startswith(prefix)}


def client_model(folder: Path) -> torch.Tensor:
    """The model an edge client left in its last checkpoint (after the gateway's RoundResult)."""
    loaded = CheckpointStore(folder, keep=2).load_latest()
    assert loaded is not None, f"{folder}: no checkpoint"
    return loaded[0]["tensors"]["params"]


@pytest.mark.processes
def test_a_synchronous_federation_ends_with_the_same_model_in_the_simulator_and_in_processes(
        tmp_path: Path) -> None:
    # Prepare: the federation's files, and the simulator's scenario from them
    files = make_federation(tmp_path / "fed", edges=EDGES, **FEDERATION)
    scenario = scenario_from_federation_files(
        files.network.configs[GATEWAY], list(files.edge_configs.values()), duration_s=3600.0,
        nodes={"step_time_ms": 10.0}, links={"latency_ms": 1.0})
    # Execute
    simulated = FederationRun(scenario)
    result = simulated.run()
    with processes(files) as run:
        run.start_all()
        assert run.wait(CEILING_S), describe(files)
        codes = run.exitcodes()
    # Assert: the global model, bit for bit
    assert codes == {name: 0 for name in codes}, codes
    gateway = simulated.members[GATEWAY].server
    assert gateway is not None
    real = latest_params(load_peer_config(files.network.configs[GATEWAY]))[0]
    assert real.dtype == gateway.params.dtype
    gap = float((real.double() - gateway.params.double()).abs().max())
    assert torch.equal(real, gateway.params), f"max |diff| {gap:.3e}"
    assert not torch.equal(real, simulated.initial)        # three rounds moved it
    # the same rounds, the same participation
    rounds = closed_rounds(files)
    assert sorted(rounds) == [row["round"] for row in result.rounds] == list(range(FEDERATION["rounds"]))
    for row in result.rounds:
        assert {k: list(rounds[row["round"]][k]) if k != "closed_by" else rounds[row["round"]][k]
                for k in ROUND_KEYS} == {k: row[k] for k in ROUND_KEYS}
        assert row["taken"] == sorted(files.edge_configs) and row["closed_by"] == "quota"
    # the same counters, at the gateway and at each client
    fed = status(files, GATEWAY)["federation"]
    assert fed["counters"] == prefixed(result.peers[GATEWAY], "fedavg."), result.peers[GATEWAY]
    for edge in files.edge_configs:
        assert status(files, edge)["client"] == prefixed(result.peers[edge], "client."), edge
        # every client ends holding the gateway's final model, in both
        member = simulated.members[edge]
        assert member.trainer is not None and member.finished, edge
        assert torch.equal(client_model(files.network.out / "data" / edge), member.trainer.flat_params), edge


def test_what_the_simulator_cannot_model_is_refused_by_key(tmp_path: Path) -> None:
    """An edge client on its own data, a missing edge config, and clients spread over two gateways
    round-robin (the simulator gives gateway j the j-th block of clients) are refused, naming the key."""
    # Prepare
    files = make_federation(tmp_path / "one", edges=EDGES, **FEDERATION)
    gateway, edges = files.network.configs[GATEWAY], list(files.edge_configs.values())
    two = make_federation(tmp_path / "two", edges=EDGES, gateways=2, **FEDERATION)
    # Execute / Assert
    with pytest.raises(ConfigError, match="no edge config for e003"):
        scenario_from_federation_files(gateway, edges[:-1])
    with pytest.raises(ConfigError) as spread:
        scenario_from_federation_files(two.network.configs[GATEWAY], list(two.edge_configs.values()))
    assert spread.value.key == "edge.gateway" and "'e001'" in str(spread.value)
    edges[0].write_text(edges[0].read_text().replace("[edge]\n", '[edge]\ndata = "own.npz"\n'))
    with pytest.raises(ConfigError) as own:
        scenario_from_federation_files(gateway, edges)
    assert own.value.key == "edge.data"

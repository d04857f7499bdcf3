"""sim ≡ real for a federation (issue 12, acceptance g): gateways and edge clients in real processes
(``hivemesh peer`` with ``[federation]``, ``hivemesh edge``), and the simulator's federation built
from the very same files (sim/from_network.py), end with the same global model, bit for bit. Two
cases: one gateway and four clients, and two gateways with two clients each, gossiping once after
every FedAvg round (both drivers give client i of E to gateway i * G // E:
peer/files/federation_layout.py).

The run is synchronous and its decisions do not depend on timing: every registered client is asked
in every round (fraction 1.0, no over-selection), a round closes when all of them answered (its
deadline is a ceiling that never fires), and the gateway opens round 0 only once all four are
registered. Each client's shard, data order and initial model come from one builder keyed by its
name (peer.train.build); the server combines updates in client-name order (protocols/federation/
common.py), and the uplink's stochastic rounding is keyed by (seed, client, round), so arrival
order moves nothing. The one-gateway case is not plain FedAvg on purpose: FedProx's pull, a step
count instead of epochs, a compressed downlink, trimmed mean and FedAdam each take a path a driver
could get wrong. The two-gateway case adds the gateways' gossip rounds (D-PSGD, mixing after).

Beside the model: each round's asked, taken, missing and late clients and how it closed, the
gateway's counters, each client's counters, and the final model each client holds (the gateway's
``RoundResult``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _federation_support import CEILING_S, GATEWAY, describe, make_federation, processes, status

from peer.files.config import ConfigError
from peer.files.statefiles import CheckpointStore
from peer.runtime.export import latest_params
from peer.runtime.peerconfig import load_peer_config
from sim.federation import FederationRun
from sim.from_network import scenario_from_federation_files

EDGES = 4
ROUNDS = 3
# every client in every round, rounds closed by their quota (the deadline is a ceiling)
EVERY_CLIENT = {"rounds": ROUNDS, "fraction": 1.0, "over_selection": 0.0, "round_timeout_s": 600.0}
# one gateway: a few paths a driver could get wrong
FEDERATION: dict[str, Any] = {
    **EVERY_CLIENT, "min_clients": EDGES, "min_registered": EDGES, "local_epochs": 0, "local_steps": 7,
    "max_samples": 200, "prox_mu": 0.01, "aggregator": "trimmed_mean", "trim_beta": 0.25,
    "downlink": "qsgd:bits=8", "server_opt": {"name": "fedadam", "lr": 0.05}}
# two gateways of two clients each, one gossip exchange after every FedAvg round
GOSSIPING: dict[str, Any] = {**EVERY_CLIENT, "min_clients": 2, "min_registered": 2, "local_epochs": 1,
                             "max_samples": 200, "gossip_rounds": 1}
CASES = {"one gateway": (1, FEDERATION), "two gateways gossiping": (2, GOSSIPING)}
ROUND_KEYS = ("asked", "taken", "missing", "late", "closed_by")


def prefixed(counters: dict[str, Any], prefix: str) -> dict[str, int]:
    return {k[len(prefix):]: int(v) for k, v in counters.items() if k.startswith(prefix)}


def closed_rounds(folder: Path) -> dict[int, dict[str, Any]]:
    """A gateway's closed rounds (its ``rounds.jsonl``), by round."""
    return {row["round"]: row for row in map(json.loads, (folder / "rounds.jsonl").read_text().splitlines())}


def client_model(folder: Path) -> torch.Tensor:
    """The model an edge client left in its last checkpoint (after the gateway's RoundResult)."""
    loaded = CheckpointStore(folder, keep=2).load_latest()
    assert loaded is not None, f"{folder}: no checkpoint"
    return loaded[0]["tensors"]["params"]


@pytest.mark.processes
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_synchronous_federation_ends_with_the_same_model_in_the_simulator_and_in_processes(
        tmp_path: Path, case: str) -> None:
    # Prepare: the federation's files, and the simulator's scenario from them
    gateways, federation = CASES[case]
    files = make_federation(tmp_path / "fed", edges=EDGES, gateways=gateways, **federation)
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
    # Assert: each gateway's global model, bit for bit
    assert codes == {name: 0 for name in codes}, codes
    data = files.network.out / "data"
    assert sorted(files.network.configs) == list(scenario.federation.gateway_names())
    for gateway in files.network.configs:
        model = simulated.members[gateway].node.machine.params   # after its last gossip round
        real = latest_params(load_peer_config(files.network.configs[gateway]))[0]
        assert real.dtype == model.dtype
        gap = float((real.double() - model.double()).abs().max())
        assert torch.equal(real, model), f"{gateway}: max |diff| {gap:.3e}"
        assert not torch.equal(real, simulated.initial)        # three rounds moved it
        # the same rounds, the same participation
        rounds = closed_rounds(data / gateway)
        own = sorted(e for e, g in files.gateway_of.items() if g == gateway)
        simulated_rounds = [row for row in result.rounds if row["gateway"] == gateway]
        assert sorted(rounds) == [row["round"] for row in simulated_rounds] == list(range(ROUNDS))
        for row in simulated_rounds:
            assert {k: list(rounds[row["round"]][k]) if k != "closed_by" else rounds[row["round"]][k]
                    for k in ROUND_KEYS} == {k: row[k] for k in ROUND_KEYS}
            assert row["taken"] == own and row["closed_by"] == "quota"
        # the same counters
        fed = status(files, gateway)["federation"]
        assert fed["counters"] == prefixed(result.peers[gateway], "fedavg."), result.peers[gateway]
    for edge in files.edge_configs:
        assert status(files, edge)["client"] == prefixed(result.peers[edge], "client."), edge
        # every client ends holding its gateway's final model (RoundResult), in both
        member = simulated.members[edge]
        assert member.trainer is not None and member.finished, edge
        assert torch.equal(client_model(data / edge), member.trainer.flat_params), edge


def test_what_the_simulator_cannot_model_is_refused_by_key(tmp_path: Path) -> None:
    """An edge client on its own data, a missing edge config, a client served by another gateway
    than the rule gives it (edited by hand), and four gateways gossiping on a ring (the simulator's
    gateways gossip over complete:G) are refused, naming the key."""
    # Prepare
    files = make_federation(tmp_path / "one", edges=EDGES, **FEDERATION)
    gateway, edges = files.network.configs[GATEWAY], list(files.edge_configs.values())
    # Execute / Assert
    with pytest.raises(ConfigError, match="no edge config for e003"):
        scenario_from_federation_files(gateway, edges[:-1])
    edges[1].write_text(edges[1].read_text().replace('gateway = "gw0"', 'gateway = "gw1"'))
    with pytest.raises(ConfigError) as elsewhere:
        scenario_from_federation_files(gateway, edges)
    assert elsewhere.value.key == "edge.gateway" and "'e001'" in str(elsewhere.value)
    four = make_federation(tmp_path / "four", edges=EDGES, gateways=4, **GOSSIPING)
    with pytest.raises(ConfigError) as ring:
        scenario_from_federation_files(four.network.configs[GATEWAY], list(four.edge_configs.values()))
    assert ring.value.key == "network.topology"
    edges[0].write_text(edges[0].read_text().replace("[edge]\n", '[edge]\ndata = "own.npz"\n'))
    with pytest.raises(ConfigError) as own:
        scenario_from_federation_files(gateway, edges)
    assert own.value.key == "edge.data"

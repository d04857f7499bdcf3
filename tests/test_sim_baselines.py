"""The synchronous baselines' timing model, on real trainers (tiny logreg: the maths is not the point)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from protocols.compress.accounting import message_bytes
from protocols.messages import ParamPush
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from topology import default_names

N = 4
STEP_MS = 10.0
LATENCY_MS = 5.0
TASK = {"name": "logreg", "options": {"n_samples": 400, "n_features": 20}}
N_PARAMS = 20 * 2 + 2  # nn.Linear(20, 2) in float32
MEMBERS = default_names(N)


def _wire_bytes(values: int) -> int:
    """A message of ``values`` float32 parameters with its envelope, counted as gossip counts it."""
    return message_bytes(ParamPush(round=0, tensors={"x": torch.zeros(values, dtype=torch.float32)}))


MODEL_BYTES = _wire_bytes(N_PARAMS)


def _scenario(baseline: dict[str, Any], rounds: int, **links: float) -> Any:
    return scenario_from_dict({
        "seed": 3, "duration_s": 1000.0, "steps": rounds, "eval_every_s": 1000.0,
        "graph": {"spec": f"ring:{N}"},
        "links": {"latency_ms": LATENCY_MS, "bandwidth_mbps": 1.0, **links},
        "nodes": {"step_time_ms": STEP_MS},
        "baseline": baseline, "task": TASK, "trainer": {"lr": 0.1},
    })


def test_ring_allreduce_round_is_2n_minus_2_latencies_and_chunks_over_the_slowest_link() -> None:
    rounds = 3
    result = run_scenario(_scenario({"kind": "allreduce"}, rounds))
    chunk = _wire_bytes(math.ceil(N_PARAMS / N))
    assert chunk > math.ceil(N_PARAMS / N) * 4   # the envelope is counted, as gossip counts it
    comm_s = 2 * (N - 1) * (LATENCY_MS / 1000 + 8 * chunk / 1e6)
    assert result.simulated_time_s == pytest.approx(rounds * (STEP_MS / 1000 + comm_s), rel=1e-12)
    for name in MEMBERS:
        assert result.peers[name]["bytes_sent"] == rounds * 2 * (N - 1) * chunk  # 2 (n-1)/n B per round
        assert result.peers[name]["steps"] == rounds
    assert result.trace[-1].consensus_rms == 0.0  # exact averaging


def test_allreduce_waits_for_the_slowest_member_and_link() -> None:
    fast = run_scenario(_scenario({"kind": "allreduce"}, 1))
    slow_member = scenario_from_dict({**_as_dict(_scenario({"kind": "allreduce"}, 1)),
                                      "nodes": {"step_time_ms": STEP_MS, "speed": {MEMBERS[2]: 0.25}}})
    slowed = run_scenario(slow_member)
    assert slowed.simulated_time_s == pytest.approx(fast.simulated_time_s + 3 * STEP_MS / 1000, rel=1e-12)


def test_parameter_server_round_moves_n_models_through_the_server_link_each_way() -> None:
    server_mbps = 0.5
    result = run_scenario(_scenario({"kind": "parameter-server", "server_bandwidth_mbps": server_mbps,
                                     "server_latency_ms": 2.0}, 1))
    one_way_s = N * 8 * MODEL_BYTES / (server_mbps * 1e6)
    # Lower bound the issue asks for, and the exact figure of this model.
    assert result.simulated_time_s >= one_way_s
    assert result.simulated_time_s == pytest.approx(STEP_MS / 1000 + 2 * (one_way_s + 0.002), rel=1e-12)
    assert result.peers["server"]["bytes_sent"] == N * MODEL_BYTES
    assert all(result.peers[name]["bytes_sent"] == MODEL_BYTES for name in MEMBERS)
    assert result.bytes_sent == 2 * N * MODEL_BYTES


def test_baselines_train_the_same_averaged_model_on_every_member() -> None:
    result = run_scenario(_scenario({"kind": "allreduce"}, 20))
    accuracies = {result.peers[name]["final_accuracy"] for name in MEMBERS}
    assert len(accuracies) == 1
    assert result.trace[-1].mean_accuracy > result.trace[0].mean_accuracy


def _as_dict(scenario: Any) -> dict[str, Any]:
    return {"seed": scenario.seed, "duration_s": scenario.duration_s, "steps": scenario.steps,
            "eval_every_s": scenario.eval_every_s, "graph": {"spec": scenario.graph.spec},
            "links": {"latency_ms": scenario.links.latency_ms,
                      "bandwidth_mbps": scenario.links.bandwidth_mbps},
            "baseline": {"kind": scenario.baseline.kind}, "task": TASK, "trainer": {"lr": 0.1}}

"""BatchNorm statistics follow ``trainer.buffers``: "average" mixes them like the parameters, "local"
keeps them.

Acceptance (a) of issue 15: ``digits-cnn`` on 4 peers of a complete graph. With
``buffers = "average"`` and a final gossip round the floating buffers end equal
on every peer; with ``"local"`` (negative control) they differ, since each peer
normalised its own non-IID shard. Tolerance: a relative consensus distance
``max_i ||b_i - mean|| / ||mean||`` of at most 1e-6, float32 rounding of an
exact average (measured about 6e-8 for D-PSGD, 2e-7 for CHOCO), against about
5e-2 when the buffers stay local.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gossip_driver import digits_network

from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig
from protocols.consensus import max_relative_distance
from protocols.gossip import GossipConfig
from protocols.gossip.diloco import OuterNesterov
from sim.gossip_driver import GossipRun
from sim.scenario import scenario_from_dict
from sim.world import build_world

EQUAL = 1e-6     # float32 rounding of an exact average
APART = 1e-2     # buffers of peers that never mix them (measured about 5e-2)

# Every algorithm, each with enough final rounds to reach consensus on complete:4
# (asynchronous pairwise gossip contracts by a factor per exchange, not exactly in one round).
ALGORITHMS: dict[str, dict[str, Any]] = {
    "dpsgd": {"algorithm": "dpsgd"},
    "dpsgd-after": {"algorithm": "dpsgd", "mixing": "after"},
    "local": {"algorithm": "local", "local_steps": 2},
    "choco": {"algorithm": "choco"},
    "pushsum": {"algorithm": "pushsum"},
    "adpsgd": {"algorithm": "adpsgd", "final_gossip_rounds": 40},
    "dpsgd-diloco": {"algorithm": "dpsgd", "outer": "diloco", "outer_every": 4},
}


def _spreads(trainers: dict[str, Any]) -> tuple[float, float]:
    """(buffer, parameter) consensus distances over the peers."""
    names = sorted(trainers)
    return (max_relative_distance([trainers[n].flat_buffers for n in names]),
            max_relative_distance([trainers[n].flat_params for n in names]))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_buffers_end_equal_when_averaged_and_apart_when_local(algorithm: str) -> None:
    options = {"total_steps": 12, "final_gossip_rounds": 1, **ALGORITHMS[algorithm]}
    spreads = {}
    for buffers in ("average", "local"):
        network = digits_network(GossipConfig(**options), "complete:4", n=4, task="digits-cnn",
                                 trainer_options={"buffers": buffers}).run()
        trainer = network.trainers[network.names[0]]
        assert network.driver.finished == set(network.names)
        assert trainer.flat_buffers.numel() > 0 and trainer.step == 12
        spreads[buffers] = _spreads(network.trainers)
    (averaged, params_a), (kept, params_k) = spreads["average"], spreads["local"]
    assert averaged <= EQUAL, spreads
    assert kept >= APART, spreads            # negative control: unmixed statistics stay apart
    assert params_a <= EQUAL and params_k <= EQUAL, spreads    # the parameters agree either way


def test_the_mixed_vector_is_parameters_then_buffers_in_one_allocation() -> None:
    task = get_task("digits-cnn")
    averaged = Trainer(task, TrainerConfig(device="cpu"), np.arange(64), seed=0, member_index=0)
    local = Trainer(task, TrainerConfig(device="cpu", buffers="local"), np.arange(64), seed=0, member_index=0)
    n_params, n_buffers = averaged.flat_params.numel(), averaged.flat_buffers.numel()
    assert averaged.mixed.numel() == n_params + n_buffers and n_buffers == 2 * (16 + 32)
    assert local.mixed.data_ptr() == local.flat_params.data_ptr() and local.mixed.numel() == n_params
    assert sum(np.prod(s) for s in averaged.mixed_shapes) == averaged.mixed.numel()
    assert local.mixed_shapes == local.param_shapes
    # mixing the vector in place changes the model's running statistics themselves
    averaged.mixed[n_params:].fill_(0.25)
    for name, buffer in averaged.model.named_buffers():
        if buffer.is_floating_point():
            assert torch.all(buffer == 0.25), name
    averaged.run_steps(2)       # training still moves both parts, through the same views
    assert not torch.all(averaged.flat_buffers == 0.25)


def test_the_outer_step_moves_parameters_and_leaves_mixed_statistics_as_they_are() -> None:
    # anchor [w, var] = [1, 1]; after local work [0.5, 0.1]: a running variance that fell 10x
    params = torch.tensor([0.5, 0.1], dtype=torch.float64)
    outer = OuterNesterov(torch.ones(2, dtype=torch.float64), lr=0.7, momentum=0.9, every=1)
    outer.stepped = 1
    assert outer.after_round(1, params)
    # Nesterov on the parameter: 1 - 0.7 * (0.5 + 0.9 * 0.5); the statistic keeps its mixed value
    assert params.tolist() == pytest.approx([1 - 0.7 * 0.95, 0.1], abs=1e-15)
    assert outer.anchor.tolist() == params.tolist()
    # control: stepped like a parameter, the variance would overshoot below zero
    control = torch.tensor([0.5, 0.1], dtype=torch.float64)
    OuterNesterov(torch.ones(2, dtype=torch.float64), lr=0.7, momentum=0.9, every=1).after_round(1, control)
    assert control[1] < 0


def test_a_simulated_joiner_adopts_averaged_buffers_and_ends_with_the_others() -> None:
    # The state-sync answer is the mixed vector: one of parameters alone would be refused as the
    # wrong length (``unusable_wrong_length``), not adopted.
    spreads = {}
    for buffers in ("average", "local"):
        world = build_world(scenario_from_dict({
            "seed": 3, "duration_s": 5.0, "eval_every_s": 100.0, "steps": 30,
            "graph": {"spec": "complete:4"}, "links": {"latency_ms": 5.0, "bandwidth_mbps": 1000.0},
            "nodes": {"step_time_ms": 20.0, "neighbour_timeout_s": 0.5},
            "algorithm": {"algorithm": "dpsgd", "deadline_s": 0.2, "final_gossip_rounds": 1},
            "partition": {"scheme": "dirichlet", "alpha": 0.5},
            "task": {"name": "digits-cnn"}, "trainer": {"lr": 0.05, "buffers": buffers},
            "faults": {"churn": [{"node": "p03", "kind": "join", "at_s": 0.2}]}}))
        result = GossipRun(world).run()
        assert result.peers["p03"]["state_sync"] == {"adopted": 1}, result.peers["p03"]
        assert all(peer["finished"] for peer in result.peers.values())
        spreads[buffers] = _spreads(world.trainers)
    assert spreads["average"][0] <= EQUAL, spreads
    assert spreads["local"][0] >= APART, spreads

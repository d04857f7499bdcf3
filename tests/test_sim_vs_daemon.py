"""Same code: the simulator and real ZeroMQ peer processes end with the same parameters.

4 peers on a ring, synchronous D-PSGD, float32, one thread per process. The
daemons run for real over 127.0.0.1; the simulator runs the scenario made from
one of their peer config files (sim.from_network), so members, shards, seeds,
task and algorithm are the daemons' own. With every neighbour in time for
every round (no deadline missed on either side) both drivers feed each
machine the same messages, so the final parameters must agree exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _daemon_support import CEILING_S, describe, final_params, make_network, no_neighbour_lost, peers

from sim.from_network import scenario_from_peer_file
from sim.gossip_driver import GossipRun
from sim.world import build_world

pytestmark = [pytest.mark.processes, pytest.mark.slow]

STEPS = 30


def test_simulated_and_real_peers_end_with_identical_parameters(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=4, topology="ring", steps=STEPS,
                         gossip={"deadline_s": 60.0},
                         trainer={"optimizer": "sgd", "lr": 0.1, "dtype": "float32"})
    with peers(files) as processes:
        processes.start_all()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    real = final_params(files)

    scenario = scenario_from_peer_file(files.configs["p00"], duration_s=3600.0, eval_every_s=3600.0,
                                       nodes={"step_time_ms": 10.0}, links={"latency_ms": 1.0})
    world = build_world(scenario)
    result = GossipRun(world).run()
    assert sorted(real) == list(world.names)
    no_neighbour_lost(files)      # every real round was complete, as every simulated one is
    for name in world.names:
        assert result.peers[name]["metrics"].get("missed_deadline", 0.0) == 0.0
        assert result.peers[name]["steps"] == STEPS and result.peers[name]["finished"]
        simulated = world.trainers[name].flat_params.to(torch.float64)
        assert torch.equal(simulated, real[name]), (
            f"{name}: max |diff| {float((simulated - real[name]).abs().max()):.3e}")
    # The comparison can fail: the members really differ from one another.
    assert not torch.equal(real["p00"], real["p01"])

"""The simulator driving the real gossip machines: theory checks and the issue's acceptance scenarios."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from protocols.consensus import rms_distance
from protocols.rng import numpy_generator
from sim.gossip_driver import GossipRun
from sim.report import write_report
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.world import World, build_world
from topology import Topology
from topology.analysis import second_eigenvalue_modulus

LOGREG = {"name": "logreg", "options": {"n_samples": 800, "n_features": 20}}


# ------------------------------------------------------------------ (b) theory: pure averaging


AVERAGING_LATENCY_S = 0.01
AVERAGING_ROUNDS = 40
# x <- W x in float64 moves the mean only by rounding: about 1e-16 per round for values of
# order 1, so 1e-12 after 40 rounds of 16 members is loose for exact mixing and tight for any other.
MEAN_TOLERANCE = 1e-12


class SkewedFirstRow(Topology):
    """A broken mixing for the negative control: the first member takes half the weight its
    neighbours should get. Rows still sum to one (the self weight takes the rest), but the
    columns no longer do, so W is not doubly stochastic and the mean drifts towards it."""

    def in_neighbours(self, name: str, t: int = 0) -> dict[str, float]:
        weights = super().in_neighbours(name, t)
        return {j: w / 2 for j, w in weights.items()} if name == self.names[0] else weights


def averaging_world(spec: str, *, broken: bool = False) -> World:
    scenario = scenario_from_dict({
        "seed": 11, "duration_s": 10.0, "eval_every_s": 100.0, "graph": {"spec": spec},
        "links": {"latency_ms": AVERAGING_LATENCY_S * 1000, "bandwidth_mbps": 1e6},
        # No local steps: the machines only gossip (final rounds), so x <- W x exactly.
        "algorithm": {"algorithm": "dpsgd", "total_steps": 0, "final_gossip_rounds": AVERAGING_ROUNDS},
        "task": LOGREG, "trainer": {"dtype": "float64"},
    })
    world = build_world(scenario)
    if broken:
        good = world.topology
        world.topology = SkewedFirstRow(names=good.names, directed=good.directed, graph=good.graph,
                                        schedule=good.schedule, spec=good.spec)
    for name in world.names:  # disagreeing starting points (the task starts everyone equal)
        params = world.trainers[name].flat_params
        draw = numpy_generator(11, name, 0, "test-init").normal(size=params.numel())
        params.copy_(torch.from_numpy(draw))
    return world


def stacked_params(world: World) -> torch.Tensor:
    return torch.stack([world.trainers[n].flat_params for n in world.names])


def run_averaging(world: World) -> list[float]:
    """Consensus distance after each round (the engine stopped halfway between rounds)."""
    run = GossipRun(world)
    run.begin()
    distances = []
    for k in range(AVERAGING_ROUNDS):
        world.engine.run(until_s=(k + 0.5) * AVERAGING_LATENCY_S)  # between rounds k and k + 1
        distances.append(rms_distance(list(stacked_params(world))))
    return distances


@pytest.mark.parametrize("spec", ["ring:16", "torus:4x4", "exponential:16"])
def test_pure_averaging_shrinks_disagreement_at_the_spectral_rate_and_keeps_the_mean(spec: str) -> None:
    world = averaging_world(spec)
    mean_before = stacked_params(world).mean(0)
    distances = run_averaging(world)
    rate = second_eigenvalue_modulus(world.topology.mixing(0))
    # Skip the first rounds (faster modes still present) and stop before float64 noise.
    last = max(k for k in range(AVERAGING_ROUNDS) if distances[k] > 1e-9 * distances[0])
    first = min(8, last // 2)
    measured = (distances[last] / distances[first]) ** (1.0 / (last - first))
    assert last - first >= 4
    assert measured == pytest.approx(rate, rel=0.05), (spec, measured, rate)
    # A doubly stochastic W keeps the average: the members converge to the mean they started from.
    drift = float((stacked_params(world).mean(0) - mean_before).abs().max())
    assert drift <= MEAN_TOLERANCE, (spec, drift)


def test_the_mean_check_fails_on_a_mixing_that_is_not_doubly_stochastic() -> None:
    # Negative control for the assertion above: same run, first row's neighbour weights halved.
    world = averaging_world("ring:16", broken=True)
    mean_before = stacked_params(world).mean(0)
    run_averaging(world)
    drift = float((stacked_params(world).mean(0) - mean_before).abs().max())
    assert drift > 1e6 * MEAN_TOLERANCE, drift


# ------------------------------------------------------------------ helpers for training scenarios


def gossip_scenario(**overrides: Any) -> Any:
    data: dict[str, Any] = {
        "seed": 1, "duration_s": 60.0, "eval_every_s": 0.5, "target_accuracy": 0.85,
        "graph": {"spec": "ring:16"}, "links": {"latency_ms": 5.0, "bandwidth_mbps": 1000.0},
        "nodes": {"step_time_ms": 50.0}, "algorithm": {"algorithm": "dpsgd", "deadline_s": 0.5},
        "task": {"name": "digits-mlp"}, "trainer": {"lr": 0.1},
    }
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return scenario_from_dict(data)


# ------------------------------------------------------------------ (d) Lian et al. 2017


LIAN = {"target_accuracy": 0.88, "eval_every_s": 0.1, "stop_at_target": True,
        "partition": {"scheme": "dirichlet", "alpha": 0.5}, "nodes": {"step_time_ms": 50.0}}
ALLREDUCE = {"algorithm": None, "baseline": {"kind": "allreduce"}}


@pytest.mark.slow
def test_dpsgd_ring_beats_allreduce_on_a_slow_network() -> None:
    slow = {"latency_ms": 50.0, "bandwidth_mbps": 10.0}
    gossip = run_scenario(gossip_scenario(links=slow, duration_s=30.0, **LIAN))
    assert gossip.time_to_target_s is not None, [p.mean_accuracy for p in gossip.trace][-5:]
    # All-reduce only needs to be run as long as gossip took: reaching the target later loses anyway.
    allreduce = run_scenario(gossip_scenario(links=slow, duration_s=gossip.time_to_target_s, **LIAN,
                                             **ALLREDUCE))
    assert allreduce.time_to_target_s is None or allreduce.time_to_target_s > gossip.time_to_target_s
    assert allreduce.metrics["rounds"] >= 2  # it did train, just slowly (1.6 s of communication a round)


@pytest.mark.slow
def test_allreduce_is_not_slower_on_a_fast_network() -> None:
    fast = {"latency_ms": 0.1, "bandwidth_mbps": 10_000.0}
    allreduce = run_scenario(gossip_scenario(links=fast, duration_s=30.0, **LIAN, **ALLREDUCE))
    assert allreduce.time_to_target_s is not None
    gossip = run_scenario(gossip_scenario(links=fast, duration_s=allreduce.time_to_target_s, **LIAN))
    assert gossip.time_to_target_s is None or gossip.time_to_target_s >= allreduce.time_to_target_s


# ------------------------------------------------------------------ (f) attackers, churn, partitions


ATTACKERS = {"p01": "sign-flip", "p04": "noise", "p06": "stale-replay", "p11": "forged-key",
             "p13": "forged-signature"}


@pytest.mark.slow
def test_attackers_of_every_kind_are_refused_or_filtered_and_honest_peers_reach_the_target() -> None:
    scenario = gossip_scenario(
        graph={"spec": "torus:4x4"}, steps=80, duration_s=30.0, eval_every_s=1.0,
        # liveness scaled to a run of 1.6 s of training: a forger is never heard, so its honest
        # neighbours start by state sync once the others are ahead, and a replayer, heard once,
        # holds a sync's wait for its answer until it has been silent for neighbour_timeout_s
        nodes={"step_time_ms": 20.0, "behaviour": ATTACKERS, "neighbour_timeout_s": 0.3,
               "heartbeat_interval_s": 0.1},
        algorithm={"algorithm": "dpsgd", "deadline_s": 0.5, "norm_multiple": 3.0})
    result = run_scenario(scenario)
    honest = {n: p for n, p in result.peers.items() if p["behaviour"] == "honest"}
    assert len(honest) == 11
    # The codec refuses what is forged or replayed, by reason...
    for reason in ("unknown_sender", "bad_signature", "replay"):
        assert result.rejections.get(reason, 0) > 0, result.rejections
    assert result.rejections.get("internal_error", 0) == 0
    # ...and the insider filter screens what is validly signed but poisonous: every honest
    # neighbour of the sign-flip and noise members rejects (nearly) every round of theirs.
    poisoned = sum(1 for a in ("p01", "p04") for n in world_neighbours(scenario, a) if n in honest)
    rounds = 80
    rejected_by_honest = sum(p["metrics"].get("rejected_update", 0.0) for p in honest.values())
    assert rejected_by_honest >= 0.9 * poisoned * rounds, (rejected_by_honest, poisoned)
    for name, peer in sorted(honest.items()):
        assert peer["final_accuracy"] >= 0.85, (name, peer["final_accuracy"])


def world_neighbours(scenario: Any, name: str) -> list[str]:
    from topology import build

    topology = build(scenario.graph.spec)
    return sorted(topology.in_neighbours(name, 0))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["adpsgd", "dpsgd"])
def test_training_survives_churn_and_a_healing_partition(algorithm: str) -> None:
    # Asynchronous pairwise gossip has no round numbers to fall out of step while the halves are
    # apart; D-PSGD's halves drift more than max_rounds_ahead rounds apart, and re-align after
    # healing because the machines behind catch up (rounds_skipped).
    left = [f"p{i:02d}" for i in range(8)]
    scenario = gossip_scenario(
        graph={"spec": "exponential:16"}, steps=110, duration_s=40.0, eval_every_s=0.25,
        target_accuracy=0.0, links={"latency_ms": 10.0, "bandwidth_mbps": 100.0, "loss": 0.01},
        nodes={"step_time_ms": 25.0, "neighbour_timeout_s": 0.5},
        algorithm={"algorithm": algorithm, "deadline_s": 0.2},
        trainer={"lr": 0.1, "lr_decay": "cosine"},
        faults={"churn": [{"node": "p03", "kind": "crash", "at_s": 0.75},
                          {"node": "p03", "kind": "restart", "at_s": 2.0},
                          {"node": "p12", "kind": "leave", "at_s": 1.25}],
                "partitions": [{"start_s": 1.25, "end_s": 2.75, "groups": [left]}]})
    result = run_scenario(scenario)
    trace = result.trace
    before = [p for p in trace if p.time_s < 0.75]
    during = [p for p in trace if 1.25 < p.time_s < 2.75]
    after = [p for p in trace if p.time_s > 2.75]
    pre_fault = before[-1].consensus_rms
    # The split makes the halves drift apart; healing brings them back below the pre-fault level.
    assert max(p.consensus_rms for p in during) > pre_fault
    assert min(p.consensus_rms for p in after) < pre_fault
    assert after[-1].consensus_rms < pre_fault
    # Training went on throughout, and the crashed member came back and caught up.
    assert after[-1].mean_accuracy > during[0].mean_accuracy > before[0].mean_accuracy
    assert result.peers["p03"]["restarts"] == 1 and result.peers["p03"]["finished"]
    assert result.peers["p12"]["running"] is False
    assert result.dropped.get("partitioned", 0) > 0 and result.dropped.get("lost", 0) > 0
    assert result.peers["p03"]["state_sync"] == {"adopted": 1}  # it caught up through a neighbour
    if algorithm == "dpsgd":
        assert result.metrics.get("rounds_skipped", 0) > 0


# ------------------------------------------------------------------ (e) Koloskova et al. 2019


@pytest.mark.slow
def test_choco_top1_reaches_exact_gossips_accuracy_with_20x_fewer_bytes_in_the_report(tmp_path: Any) -> None:
    common = {"graph": {"spec": "ring:8"}, "duration_s": 60.0, "eval_every_s": 0.25, "target_accuracy": 0.9,
              "stop_at_target": True, "links": {"latency_ms": 20.0, "bandwidth_mbps": 10.0},
              "nodes": {"step_time_ms": 20.0}, "trainer": {"lr": 0.05}}
    exact = run_scenario(gossip_scenario(name="exact", algorithm={"algorithm": "dpsgd", "deadline_s": 1.0},
                                         **common))
    choco = run_scenario(gossip_scenario(name="choco", algorithm={
        "algorithm": "choco", "compression": "topk:fraction=0.01", "consensus_step": 0.1, "deadline_s": 1.0},
        **common))
    write_report([exact, choco], tmp_path, plots=False)
    row = {r["name"]: r for r in json.loads((tmp_path / "report.json").read_text())["comparison"]}
    assert row["exact"]["bytes_to_target"] is not None and row["choco"]["bytes_to_target"] is not None
    # Bytes are the codec's: headers, digests and signatures included (CHOCO's round 0 is uncompressed).
    assert row["choco"]["bytes_to_target_vs_first"] <= 1 / 20, row
    assert choco.peers["p00"]["payload_bytes_sent"] * 20 < exact.peers["p00"]["payload_bytes_sent"]


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "spec"), [("dpsgd", "exponential:8"),
                                                 ("pushsum", "directed-exponential:8")])
def test_a_late_joiner_syncs_state_from_a_neighbour_and_catches_up(algorithm: str, spec: str) -> None:
    # (push-sum used to go NaN here: the shares sent to the absent member drained the weights,
    # and steps added to x = w z were amplified by 1 / w)
    result = run_scenario(gossip_scenario(
        graph={"spec": spec}, duration_s=10.0, eval_every_s=0.5, steps=100,
        nodes={"step_time_ms": 20.0, "neighbour_timeout_s": 0.5},
        algorithm={"algorithm": algorithm, "deadline_s": 0.2},
        faults={"churn": [{"node": "p05", "kind": "join", "at_s": 1.0}]}))
    joiner = result.peers["p05"]
    assert joiner["state_sync"] == {"adopted": 1} and joiner["finished"]
    assert joiner["steps"] == 100  # it took over its neighbour's step count and finished with the rest
    assert [p.running for p in result.trace][:2] == [7, 7] and result.trace[-1].running == 8
    joined = next(p for p in result.trace if p.running == 8)   # its initial model, far from the others'
    assert result.trace[-1].consensus_rms < joined.consensus_rms
    assert joiner["final_accuracy"] >= 0.85

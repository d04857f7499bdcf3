"""The simulator's crashes restart from the member's last periodic checkpoint, as the daemon's do
(issue 16, item 5): the steps lost are at most the interval ``[checkpoint] every_steps``, measured
against the step the crashed member had reached, and the restarted member syncs again; a gateway
loses at most the interval in rounds and closes them again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_sim_federation import federation

from peer.files.config import ConfigError
from peer.runtime.netinit import create_network
from sim.from_network import scenario_from_peer_file
from sim.gossip_driver import GossipRun
from sim.run import run_scenario
from sim.scenario import ChurnEvent, scenario_from_dict
from sim.world import build_world

RING: dict[str, Any] = {
        "seed": 4, "duration_s": 30.0, "steps": 200, "eval_every_s": 5.0, "graph": {"spec": "ring:4"},
        "links": {"latency_ms": 1.0, "bandwidth_mbps": 1000.0},
        "nodes": {"step_time_ms": 10.0, "neighbour_timeout_s": 1.0, "heartbeat_interval_s": 0.1},
        "algorithm": {"algorithm": "dpsgd", "deadline_s": 0.1}, "trainer": {"lr": 0.1}}


def run(checkpoint: dict[str, Any], churn: list[dict[str, Any]], **nodes: float) -> dict[str, Any]:
    scenario = scenario_from_dict({**RING, "checkpoint": checkpoint, "faults": {"churn": churn},
                                   "nodes": {**RING["nodes"], **nodes}})
    return GossipRun(build_world(scenario)).run().peers


@pytest.mark.parametrize(("every", "resumed"), [(10, 50), (25, 50), (100, 0)])
def test_a_crash_placed_on_a_step_restarts_from_the_last_checkpoint_of_the_interval(every: int,
                                                                                   resumed: int) -> None:
    # Prepare: p01 is killed at its work point at step 57, down 0.5 s (a restart of its own)
    churn = [{"node": "p01", "kind": "crash", "at_step": 57, "down_s": 0.5}]

    # Execute
    peers = run({"every_steps": every}, churn)

    # Assert: the steps since its last checkpoint were lost, its neighbours' state was taken, it ended
    (detail,) = peers["p01"]["restarts_detail"]
    assert (detail["reached_step"], detail["resumed_step"]) == (57, resumed)
    assert detail["steps_lost"] == 57 - resumed and (detail["steps_lost"] <= every or resumed == 0)
    assert detail["restarted_at_s"] == pytest.approx(detail["crashed_at_s"] + 0.5)
    assert 0 < detail["recovery_s"] < 2.0
    assert peers["p01"]["state_sync"] == {"adopted": 1} and peers["p01"]["trainer_steps_set"][0] > 57
    assert all(p["finished"] and p["steps"] == 200 for p in peers.values()), peers


def test_a_restart_without_adoption_trains_again_the_work_its_checkpoint_had_asked_for() -> None:
    # Prepare: every member crashes together at 0.33 s and comes back at 0.5 s: nobody answers a
    # state sync (all are syncing), so each resumes its checkpoint (written at a work point, its
    # round's steps asked for and not trained) and must do them again, or it would wait for them
    # forever
    churn = [{"node": f"p{i:02d}", "kind": "crash", "at_s": 0.33, "down_s": 0.17} for i in range(4)]

    # Execute
    peers = run({"every_steps": 5}, churn, sync_timeout_s=0.2, sync_attempts=1)

    # Assert
    for name, peer in sorted(peers.items()):
        (detail,) = peer["restarts_detail"]
        assert 0 <= detail["steps_lost"] <= 5 and detail["resumed_step"] % 5 == 0, (name, detail)
        assert peer["state_sync"] == {"no_answer": 1} and detail["recovery_s"] > 0.2, (name, peer)
        assert peer["finished"] and peer["steps"] == 200, (name, peer)


def test_the_interval_comes_from_the_peer_file_and_a_command_line_override(tmp_path: Path) -> None:
    network = {"topology": "ring", "seed": 1, "task": "digits-mlp"}
    create_network(tmp_path / "net", peers=3, network=network, sections={"checkpoint": {"every_steps": 20}})

    from_file = scenario_from_peer_file(tmp_path / "net" / "p00.toml", duration_s=1.0)
    overridden = scenario_from_peer_file(tmp_path / "net" / "p00.toml", duration_s=1.0,
                                         checkpoint={"every_steps": 7})

    assert from_file.checkpoint.every_steps == 20 and overridden.checkpoint.every_steps == 7


def test_only_a_crash_takes_a_step_or_a_downtime() -> None:
    with pytest.raises(ValueError, match="at_step and down_s"):
        ChurnEvent(node="p00", kind="restart", at_s=1.0, down_s=1.0)
    with pytest.raises(ValueError, match="down_s"):
        ChurnEvent(node="p00", kind="crash", at_s=1.0, down_s=-2.0)
    with pytest.raises(ValueError, match="at_s must be >= 0"):
        ChurnEvent(node="p00", kind="crash")      # neither a time nor a step


@pytest.mark.parametrize("every", [1, 3])
def test_a_gateway_crash_restarts_from_its_checkpoint_of_rounds_and_closes_them_again(every: int) -> None:
    # Prepare: a gateway of 10 clients (5 asked a round), killed once its machine did 5 rounds (its
    # checkpoint every `every` rounds, the daemon's count), back 2 s later
    data = federation(server={"rounds": 12, "fraction": 0.5, "min_clients": 5, "round_timeout_s": 30.0},
                      nodes={"heartbeat_interval_s": 0.5, "neighbour_timeout_s": 30.0})
    data |= {"checkpoint": {"every_steps": every},
             "faults": {"churn": [{"node": "gw0", "kind": "crash", "at_step": 5, "down_s": 2.0}]}}

    # Execute
    result = run_scenario(scenario_from_dict(data))

    # Assert: it lost at most the interval, closed those rounds again, every round, and the bar
    (detail,) = result.peers["gw0"]["restarts_detail"]
    closed = [row["round"] for row in result.rounds]
    assert detail["reached_round"] == 5 and detail["resumed_round"] == 5 - 5 % every
    assert 0 <= detail["rounds_lost"] <= every and len(closed) - len(set(closed)) == detail["rounds_lost"]
    assert sorted(set(closed)) == list(range(12)) and detail["recovery_s"] > 0
    assert result.dropped["gateway_down"] > 0 and result.trace[-1].mean_accuracy >= 0.90


def test_a_federation_takes_no_client_churn() -> None:
    data = federation() | {"faults": {"churn": [{"node": "e001", "kind": "crash", "at_s": 1.0}]}}
    with pytest.raises(ConfigError, match=r"faults\.churn"):
        run_scenario(scenario_from_dict(data))

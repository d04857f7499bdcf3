"""``hivemesh edge`` in real processes on 127.0.0.1, beside tests/test_daemon_federation.py: how an
edge client ends when its gateway is gone, and issue 12's acceptance (d) and (f) with attackers and
slow devices made by test hooks (peer/runtime/testhooks.py ``signflip`` and ``pace``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from _daemon_support import json_lines
from _federation_support import (
    CEILING_S,
    GATEWAY,
    closed_rounds,
    describe,
    make_federation,
    processes,
    status,
    wait_until,
)

from peer.runtime.testhooks import Hook
from protocols.node.member import EXIT_STRANDED
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

pytestmark = pytest.mark.processes


def test_an_edge_whose_gateway_never_comes_gives_up_with_its_counters(tmp_path: Path) -> None:
    """The gateway is never started: after ``gateway_timeout_s`` with no connection and no message,
    the client exits 3 (not 0: its federation did not complete), saying why and with its counters,
    and leaves its checkpoint and a status that says it gave up."""
    # Prepare: a 3 s give-up (past peer/net/reach.py's SLOW_S with room to spare: the reason is
    # "no answer to the handshake" a second after the TCP connection); its heartbeats every 0.5 s find
    # no connection
    files = make_federation(tmp_path / "fed", edges=2, rounds=1, min_clients=1,
                            edge_options={"gateway_timeout_s": 3.0})
    with processes(files) as run:
        # Execute
        run.start("e000")
        assert run.wait(CEILING_S, ["e000"]), describe(files)
        code = run.exitcodes()["e000"]
    # Assert
    assert code == EXIT_STRANDED
    log = (files.network.out / "data" / "e000" / "peer.log").read_text()
    assert "gave up on gateway gw0" in log and "gateway_timeout_s" in log and "never heard" in log, log
    assert "with 0 rounds trained, 0 updates sent, no round trained; unsent: heartbeat" in log, log
    # the reserved port's backlog takes the TCP connection, nothing answers the handshake
    assert "connection: no answer to the handshake" in log, log
    found = status(files, "e000")
    assert found["state"] == "gave up" and found["rounds_trained"] == 0
    assert found["unsent"].get("heartbeat", 0) >= 2
    assert any((files.network.out / "data" / "e000" / "checkpoints").iterdir()), "no checkpoint written"


def test_an_edge_started_after_its_gateway_finished_gets_the_final_model(tmp_path: Path) -> None:
    """e000 and e001 train the federation's 2 rounds; e002 starts only once the gateway has finished
    (it lingers in its finish grace). The gateway answers e002's registration with the final
    ``RoundResult``: e002 exits 0 at once, with the gateway's final model and no round trained,
    instead of waiting ``gateway_timeout_s`` and exiting 3."""
    # Prepare: a long finish grace keeps the finished gateway up; e002 would give up after 60 s
    files = make_federation(tmp_path / "fed", edges=3, rounds=2, fraction=1.0, min_clients=2, local_epochs=1,
                            gateway_options={"finish_grace_s": 120.0},
                            edge_options={"gateway_timeout_s": 60.0})
    with processes(files) as run:
        run.start(GATEWAY)
        run.start("e000")
        run.start("e001")
        assert run.wait(CEILING_S, ["e000", "e001"]), describe(files)
        wait_until("the gateway finished", lambda: status(files, GATEWAY).get("state") == "finished", files)
        # Execute
        run.start("e002")
        assert run.wait(CEILING_S, ["e002"]), describe(files)
        run.terminate(GATEWAY)
        assert run.wait(CEILING_S, [GATEWAY]), describe(files)
        codes = run.exitcodes()
    # Assert
    assert codes == {GATEWAY: 0, "e000": 0, "e001": 0, "e002": 0}, codes
    late = status(files, "e002")
    assert late["state"] == "finished" and late["rounds_trained"] == 0, late
    # not the give-up: on its own clock (from before its dial, not counting its imports, which a
    # loaded machine stretches) it ended well before gateway_timeout_s
    assert late["uptime_s"] < 60.0, late["uptime_s"]
    fed = status(files, GATEWAY)["federation"]
    assert fed["phase"] == "finished" and fed["counters"]["final_answers"] == 1, fed
    assert "e002" in fed["registered"]
    log = (files.network.out / "data" / "e002" / "peer.log").read_text()
    assert "the federation finished; 0 rounds trained here" in log, log


# acceptance (d): iid shards, all 10 clients in every round, trimmed mean (0.2 a side); 15 rounds of
# 3 local epochs: the simulator's clean run is 0.958 there and its attacked run 2.2 points below
ROBUST: dict[str, Any] = {"rounds": 15, "local_epochs": 3, "fraction": 1.0, "min_clients": 10,
                          "aggregator": "trimmed_mean", "trim_beta": 0.2}
ATTACKERS = ("e003", "e007")


def simulated_accuracy(federation: dict[str, Any], attack: dict[str, str]) -> float:
    """The final global accuracy of the same federation in the simulator (same seed, task, shards,
    trainer and [federation] keys as make_federation's)."""
    from _federation_support import FEDERATION

    server = {**FEDERATION, **federation}
    scenario = scenario_from_dict({
        "name": "robust", "seed": 3, "duration_s": 5000.0, "task": {"name": "digits-mlp"},
        "trainer": {"optimizer": "sgd", "lr": 0.1, "batch_size": 32}, "partition": {"scheme": "iid"},
        "links": {"latency_ms": 1.0, "bandwidth_mbps": 1000.0}, "nodes": {"step_time_ms": 1.0},
        "federation": {"gateways": 1, "clients": 10, "server": server, "attack": attack}})
    return run_scenario(scenario).trace[-1].mean_accuracy


def test_trimmed_mean_holds_against_two_sign_flipping_edges(tmp_path: Path) -> None:
    """(d) in real processes: 1 gateway and 10 edges on iid shards, all 10 in each of 15 rounds, e003
    and e007 attackers (a ``signflip`` hook: sign-flipped updates scaled by 10), trimmed mean 0.2 a
    side. One real run only (a clean real run too would double the cost): its final accuracy must
    be within 3 points of the *simulator's clean run* of the same setting (same seed, shards,
    trainer and [federation] keys), which is the clean reference acceptance (d) asks for; the
    simulator's attacked run is printed beside it."""
    # Prepare
    files = make_federation(tmp_path / "fed", partition="iid", **ROBUST)
    hooks = {name: [Hook(at_step=0, action="signflip", scale=10.0)] for name in ATTACKERS}
    clean = simulated_accuracy(ROBUST, {})
    # Execute
    with processes(files) as run:
        run.start_all(hooks)
        assert run.wait(CEILING_S), describe(files)
        codes = run.exitcodes()
    # Assert
    assert codes == {name: 0 for name in codes}, codes
    gateway = status(files, GATEWAY)
    attacked = gateway["accuracy"]
    simulated = simulated_accuracy(ROBUST, {name: "signflip:10" for name in ATTACKERS})
    print(f"\n(d) trimmed mean 0.2, e003 and e007 sign-flip x10: real {attacked:.4f}; simulator clean "
          f"{clean:.4f}, attacked {simulated:.4f}")
    rounds = closed_rounds(files)
    assert sorted(rounds) == list(range(15))
    assert all(len(r["taken"]) == 10 for r in rounds.values()), rounds    # the attackers' updates too
    assert attacked >= clean - 0.03, f"real attacked {attacked:.4f} vs simulated clean {clean:.4f}"
    # the hook's attack is the simulator's (one definition, peer/train/attack.py): a synchronous
    # federation whose deadlines never fire ends where the simulator's does (acceptance (g))
    assert abs(attacked - simulated) <= 0.01, (attacked, simulated)


SLOW = ("e001", "e004", "e008")       # acceptance (f): 3 of 10 clients 5x slower
STEP_S = 0.02                         # an edge's least time per training step (a pace hook); 5x for SLOW
SYNC: dict[str, Any] = {"rounds": 30, "fraction": 0.5, "min_clients": 5, "local_epochs": 1,
                        "round_timeout_s": 120.0}
BUFFERED: dict[str, Any] = {**SYNC, "mode": "fedbuff", "rounds": 60, "concurrency": 10, "buffer_size": 5,
                            "max_staleness": 8}


def aggregations(files: Any) -> list[dict[str, Any]]:
    """The aggregations a gateway has written so far (``rounds.jsonl``: a FedAvg round or a FedBuff
    version per line, with the global accuracy after it; a line being written is not read)."""
    return json_lines(files.network.out / "data" / GATEWAY / "rounds.jsonl")


def reached(rows: list[dict[str, Any]], bar: float = 0.90) -> bool:
    return any(row["accuracy"] >= bar for row in rows)


def test_fedbuff_reaches_the_bar_before_sync_fedavg_waiting_for_slow_edges(tmp_path: Path) -> None:
    """(f) in real processes: two federations side by side on this host, each 1 gateway and 10 iid
    edges of which e001, e004 and e008 train 5x slower (a ``pace`` hook: 0.1 s a step against 0.02),
    one synchronous FedAvg (5 of 10 a round, each round waiting for every sampled client), one FedBuff
    (all 10 at once, aggregating every 5 updates). Every edge is held at its first work until both
    gateways have handed it out, so both start together. When the synchronous run's global model
    first reaches 0.90, the FedBuff gateway has reached it already and made more aggregations (of 5
    updates each) than the synchronous one's rounds: the order in time, asserted on counts. The
    wall times are printed, not asserted."""
    # Prepare
    sync = make_federation(tmp_path / "sync", partition="iid", **SYNC)
    buffered = make_federation(tmp_path / "fedbuff", partition="iid", **BUFFERED)
    gate = tmp_path / "gate"

    def hooks(marks: Path) -> dict[str, list[Hook]]:
        marks.mkdir()
        edges = [f"e{i:03d}" for i in range(10)]
        return {e: [Hook(at_step=0, action="pace", seconds=STEP_S * (5 if e in SLOW else 1)),
                    Hook(at_step=0, action="hold", gate=str(gate), mark=str(marks / e))] for e in edges}

    sync_hooks, buffered_hooks = hooks(tmp_path / "sync-marks"), hooks(tmp_path / "fedbuff-marks")
    with processes(sync) as sync_run, processes(buffered) as buffered_run:
        sync_run.start_all(sync_hooks)
        buffered_run.start_all(buffered_hooks)
        wait_until("every FedBuff edge and 5 synchronous ones given work",
                   lambda: len(list((tmp_path / "fedbuff-marks").iterdir())) == 10
                   and len(list((tmp_path / "sync-marks").iterdir())) == 5, buffered)
        # Execute
        gate.touch()
        began = time.monotonic()
        buffered_at_bar = None
        deadline = began + CEILING_S
        while not reached(aggregations(sync)):
            assert time.monotonic() < deadline, f"sync never reached 0.90: {describe(sync)}"
            if buffered_at_bar is None and reached(aggregations(buffered)):
                buffered_at_bar = time.monotonic() - began
            time.sleep(0.05)
        sync_at_bar = time.monotonic() - began
        sync_done, buffered_done = aggregations(sync), aggregations(buffered)
    # Assert
    buffered_took = "not yet" if buffered_at_bar is None else f"{buffered_at_bar:.1f} s"
    print(f"\n(f) to 0.90, wall time from the gate: FedBuff {buffered_took}, sync FedAvg "
          f"{sync_at_bar:.1f} s; then FedBuff had {len(buffered_done)} aggregations, "
          f"sync {len(sync_done)} rounds")
    assert reached(buffered_done), f"FedBuff not at 0.90 yet: {[r['accuracy'] for r in buffered_done]}"
    assert len(buffered_done) > len(sync_done), (len(buffered_done), len(sync_done))
    # the slow edges' work counted in FedBuff, discounted for its staleness; sync waited for them
    assert any(c in SLOW for row in buffered_done for c in row["contributors"])
    assert max(s for row in buffered_done for s in row["staleness"]) > 0
    assert any(set(row["taken"]) & set(SLOW) for row in sync_done)

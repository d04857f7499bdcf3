"""Federations in the simulator (sim/federation.py) on the per-member Node: acceptance (d) and (f) of
issue 12 on the virtual clock, gateways gossiping between FedAvg rounds, and availability patterns."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from peer.train.attack import parse_attack
from sim.availability import Availability
from sim.plots import figures
from sim.report import write_report
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.world import ScenarioResult

ATTACKERS = {"e003": "signflip:10", "e007": "signflip:10"}


def federation(scheme: str = "iid", *, gateways: int = 1, clients: int = 10,
               nodes: dict[str, Any] | None = None, **section: Any) -> dict[str, Any]:
    """A digits-mlp federation scenario; ``section``: [federation] keys, ``server``: its server's."""
    server = {"rounds": 10, "fraction": 1.0, "min_clients": clients, "local_epochs": 1, "seed": 3,
              **section.pop("server", {})}
    return {"name": "fed", "seed": 3, "duration_s": 5000.0, "task": {"name": "digits-mlp"},
            "trainer": {"lr": 0.1, "batch_size": 32}, "partition": {"scheme": scheme, "alpha": 0.3},
            "links": {"latency_ms": 5.0, "bandwidth_mbps": 100.0},
            "nodes": {"step_time_ms": 10.0, **(nodes or {})},
            "federation": {"gateways": gateways, "clients": clients, "server": server, **section}}


def run(data: dict[str, Any]) -> ScenarioResult:
    return run_scenario(scenario_from_dict(data))


def final_accuracy(result: ScenarioResult) -> float:
    return result.trace[-1].mean_accuracy


UNBOUNDED = "fedavg unbounded"   # plain FedAvg: the influence bounds (issue 32) off
AGGREGATORS = {"fedavg": {}, UNBOUNDED: {"aggregator": "fedavg", "samples_multiple": 0, "norm_multiple": 0},
               "trimmed_mean": {"aggregator": "trimmed_mean"}, "median": {"aggregator": "median"}}


def robust_table(scheme: str) -> dict[str, tuple[float, float]]:
    """(clean, attacked) final accuracy per aggregator: acceptance (d)'s runs on ``scheme`` shards."""
    table = {}
    for label, settings in AGGREGATORS.items():
        server = {"trim_beta": 0.2, "rounds": 20, **settings}
        clean = final_accuracy(run(federation(scheme, server=server)))
        attacked = final_accuracy(run(federation(scheme, server=server, attack=ATTACKERS)))
        table[label] = (clean, attacked)
    return table


def test_robust_aggregators_hold_against_sign_flipping_clients_where_fedavg_fails() -> None:
    # Prepare / Execute: acceptance (d) on iid shards: all 10 clients in each of 20 rounds, 2 of them
    # sign-flip x10 (after 10 rounds trimmed mean was 3.1 points short: it converges more slowly)
    table = robust_table("iid")
    # Assert: within 3 points of the same aggregator's clean run; plain FedAvg is driven below 0.5,
    # FedAvg with its default bounds is not
    for aggregator in ("trimmed_mean", "median"):
        clean, attacked = table[aggregator]
        assert clean >= 0.85, f"{aggregator}: clean run only {clean:.3f}"
        assert attacked >= clean - 0.03, f"{aggregator}: {attacked:.3f} attacked vs {clean:.3f} clean"
    assert table[UNBOUNDED][1] < 0.5, f"unbounded fedavg under attack still reached {table[UNBOUNDED][1]:.3f}"
    assert table[UNBOUNDED][0] >= 0.85 and table["fedavg"][1] > table[UNBOUNDED][1] + 0.2


def test_the_same_attack_on_dirichlet_shards_is_printed_as_a_table(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Acceptance (d)'s non-IID case has no bar (robust aggregation loses accuracy there: compare the
    clean column with FedAvg's): the table, printed past pytest's capture, is for the closing note.
    Plain FedAvg (its influence bounds off) is still driven off."""
    table = robust_table("dirichlet")
    with capsys.disabled():
        print("\nDirichlet(0.3), 10 clients all in each of 20 rounds, e003 and e007 sign-flip x10")
        print(f"{'aggregator':<17} {'clean':>6} {'attacked':>9} {'change':>7}")
        for aggregator, (clean, attacked) in table.items():
            print(f"{aggregator:<17} {clean:>6.3f} {attacked:>9.3f} {attacked - clean:>+7.3f}")
    assert table[UNBOUNDED][1] < 0.5 <= table[UNBOUNDED][0]


def test_every_client_takes_part_in_every_round_and_the_round_rows_say_so() -> None:
    result = run(federation(attack=ATTACKERS))
    assert [row["round"] for row in result.rounds] == list(range(10))
    assert all(row["participants"] == 10 and row["closed_by"] == "quota" for row in result.rounds)
    assert all(a["bytes_sent"] < b["bytes_sent"] and a["time_s"] < b["time_s"]
               for a, b in zip(result.rounds, result.rounds[1:], strict=False))
    assert result.rejections == {} and result.peers["gw0"]["fedavg.updates_taken"] == 100


def test_the_report_lists_the_rounds_and_draws_accuracy_and_participation_per_round(tmp_path: Path) -> None:
    result = run(federation(server={"rounds": 3}))
    written = {p.name for p in write_report([result], tmp_path)}
    assert {"report.json", "federation_rounds.png", "accuracy_vs_bytes.png"} <= written
    rounds = json.loads((tmp_path / "report.json").read_text())["scenarios"][0]["rounds"]
    assert [(r["round"], r["participants"]) for r in rounds] == [(0, 10), (1, 10), (2, 10)]
    axes = figures([result])["federation_rounds.png"].axes
    assert [a.get_title() for a in axes][2] == "Participation per round"
    assert list(axes[2].lines[0].get_ydata()) == [10, 10, 10]


def test_fedbuff_reaches_the_bar_sooner_than_sync_fedavg_when_three_clients_are_five_times_slower() -> None:
    # Prepare: acceptance (f): 10 clients, 3 of them 5x slower (speed 0.2); sync waits for every sampled one
    slow = {"speed": {"e001": 0.2, "e004": 0.2, "e008": 0.2}}
    common = {"local_epochs": 1, "min_clients": 5, "round_timeout_s": 1000.0}
    sync = federation(nodes=slow, server={"rounds": 40, "fraction": 0.5, **common})
    buffered = federation(nodes=slow, server={"mode": "fedbuff", "rounds": 60, "concurrency": 10,
                                              "buffer_size": 5, "max_staleness": 8, **common})
    sync["target_accuracy"] = buffered["target_accuracy"] = 0.90
    # Execute
    sync_run, buff_run = run(sync), run(buffered)
    # Assert: both reach 0.90; FedBuff in less simulated time, with the slow clients' work counted
    assert sync_run.time_to_target_s is not None and buff_run.time_to_target_s is not None
    assert buff_run.time_to_target_s < sync_run.time_to_target_s
    slow_updates = sum(c in slow["speed"] for row in buff_run.rounds for c in row["contributors"])
    assert slow_updates > 0 and max(s for row in buff_run.rounds for s in row["staleness"]) > 0


def test_gateways_gossip_between_fedavg_rounds_and_agree_after_the_last_gossip_rounds() -> None:
    # Prepare: 2 gateways with 5 clients each on Dirichlet(0.3) shards, 2 gossip rounds per FedAvg round
    data = federation("dirichlet", gateways=2, clients=5, gossip_rounds=2,
                      server={"rounds": 20, "local_epochs": 2, "min_clients": 5})
    # Execute
    result = run(data)
    # Assert: each gateway closed its 20 rounds with its own 5 clients; the models agree at the end
    for gateway, own in (("gw0", {f"e00{i}" for i in range(5)}), ("gw1", {f"e00{i}" for i in range(5, 10)})):
        rows = [r for r in result.rounds if r["gateway"] == gateway]
        assert len(rows) == 20 and all(set(r["taken"]) == own for r in rows)
        # a round's row is recorded after the gossip that follows it: the last is the final model's
        assert [r["round"] for r in rows] == list(range(20))
        assert rows[-1]["accuracy"] == result.peers[gateway]["accuracy"]
    last = result.trace[-1]
    assert last.consensus_rms < 1e-3 and last.mean_accuracy >= 0.90
    assert result.peers["gw0"]["fedavg.rounds_aggregated"] == 20


def test_gateways_may_gossip_by_push_sum_too() -> None:
    data = {**federation("dirichlet", gateways=2, clients=5, gossip_rounds=1,
                         server={"rounds": 5, "local_epochs": 2, "min_clients": 5}),
            "algorithm": {"algorithm": "pushsum"}}
    result = run(data)
    assert len(result.rounds) == 10 and result.trace[-1].consensus_rms < 1e-3


def test_clients_that_come_and_go_register_again_and_rounds_go_on_without_them() -> None:
    # Prepare: every client on for 70% of 2 s periods (a seeded draw); a round asks half the
    # registered ones (at least 3) and closes at 2 s with whatever answered
    nodes = {"neighbour_timeout_s": 1.5, "heartbeat_interval_s": 0.5, "step_time_ms": 100.0}
    data = federation(availability="random:0.7:2", nodes=nodes,
                      server={"rounds": 15, "fraction": 0.5, "min_clients": 3, "round_timeout_s": 2.0})
    # Execute
    result = run(data)
    # Assert: all 15 rounds closed; clients that went off mid-round made some close at the deadline
    # (their work lost, what was sent to them dropped); the registered set, so the round size, changed
    assert [r["round"] for r in result.rounds] == list(range(15))
    closed_by = {r["closed_by"] for r in result.rounds}
    assert closed_by == {"quota", "deadline"}
    assert result.dropped["work_lost_offline"] > 0 and result.dropped["client_offline"] > 0
    assert len({len(r["asked"]) for r in result.rounds}) > 1
    assert len({c for r in result.rounds for c in r["taken"]}) == 10   # everyone came on at some point
    assert final_accuracy(result) > 0.85


def test_availability_patterns_are_seeded_and_windows_wrap_midnight() -> None:
    random = Availability.parse("random:0.5:10")
    draws = [random.on(7, "e001", 10.0 * k + 1.0) for k in range(200)]
    assert draws == [random.on(7, "e001", 10.0 * k + 9.0) for k in range(200)]  # constant within a period
    assert 60 < sum(draws) < 140 and random.next_change_s(15.0) == 20.0
    night = Availability.parse("daily:20-6:24")                 # a 24 s day: one hour per second
    assert [night.on(0, "e", t) for t in (1.0, 7.0, 19.0, 21.0, 25.0)] == [True, False, False, True, True]
    assert night.next_change_s(1.0) == 6.0 and night.next_change_s(7.0) == 20.0
    assert Availability.parse("always").next_change_s(0.0) == math.inf
    assert parse_attack("signflip:10").flip_scale == 10.0
    for bad in ("sometimes", "random:2:10", "daily:8", "random:0.5:0"):
        with pytest.raises(ValueError, match="expected"):
            Availability.parse(bad)
    with pytest.raises(ValueError, match="signflip"):
        parse_attack("noise:3")


def test_a_member_named_in_the_scenario_must_exist_and_the_server_table_is_checked() -> None:
    with pytest.raises(ValueError, match=r"'federation\.attack\.e099': no such member"):
        run(federation(attack={"e099": "signflip:10"}))
    with pytest.raises(ValueError, match="aggregator"):
        scenario_from_dict(federation(server={"aggregator": "mode"}))
    with pytest.raises(ValueError, match="mixing 'after' is for algorithms"):
        scenario_from_dict({**federation(gateways=2, gossip_rounds=1), "algorithm": {"algorithm": "choco"}})
    with pytest.raises(ValueError, match="mode 'fedbuff' has none"):
        scenario_from_dict(federation(gateways=2, gossip_rounds=1, server={"mode": "fedbuff"}))


def test_the_federation_example_runs_through_the_cli_shortened(tmp_path: Path) -> None:
    from peer.cli.main import main

    example = Path(__file__).resolve().parent.parent / "examples" / "federation-edge.toml"
    code = main(["sim", str(example), "--out", str(tmp_path), "--no-plots", "--quiet",
                 "--set=federation.server.rounds=3"])
    assert code == 0
    scenario = json.loads((tmp_path / "report.json").read_text())["scenarios"][0]
    assert scenario["kind"] == "federation:sync" and scenario["members"] == 22
    assert sorted({(r["gateway"], r["round"]) for r in scenario["rounds"]}) == [
        (g, i) for g in ("gw0", "gw1") for i in range(3)]


def test_a_slow_uplink_makes_its_client_miss_the_rounds_others_fill_by_over_selection() -> None:
    # Prepare: e002's uplink carries 0.05 Mbit/s (its ~38 kB update takes ~6 s); each round asks all
    # 10 clients (over-selection) and takes the first 9 updates, with a 4 s deadline
    data = federation(nodes={"nic": {"e002": {"uplink_mbps": 0.05}}},
                      server={"rounds": 4, "fraction": 0.9, "min_clients": 9, "over_selection": 0.12,
                              "round_timeout_s": 4.0, "uplink": "identity"})
    # Execute
    result = run(data)
    # Assert: each round closed at its quota with the nine others, long before e002's first upload
    # was through (it trained, and its update was still on its uplink when the federation ended)
    rows = result.rounds
    assert [len(r["asked"]) for r in rows] == [10] * 4
    assert all(r["closed_by"] == "quota" and r["missing"] == ["e002"] for r in rows), rows
    assert result.peers["e002"]["client.updates_sent"] >= 1 and result.simulated_time_s < 6.0


def test_a_round_that_closed_at_its_deadline_lists_the_update_that_came_late() -> None:
    # Prepare: as above, but every round waits for all 10 until its 2 s deadline
    data = federation(nodes={"nic": {"e002": {"uplink_mbps": 0.05}}},
                      server={"rounds": 5, "round_timeout_s": 2.0, "uplink": "identity"})
    # Execute
    result = run(data)
    # Assert: rounds closed by the deadline with nine; e002's round-0 update (~6 s on its uplink)
    # arrived in a later round and is its round's late one, refused as late
    assert all(r["closed_by"] == "deadline" and r["missing"] == ["e002"] for r in result.rounds)
    assert result.rounds[0]["late"] == ["e002"]
    assert result.peers["gw0"]["fedavg.refused_late"] >= 1

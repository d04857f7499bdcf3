"""Grouped secure aggregation (issue 32, item 4 and acceptance c) and SecAgg's bar on repeat
offenders (item 3), in the simulator and on the pure pieces (protocols/federation/grouped.py).

Acceptance (c): 50 digits-mlp clients, all asked each round, drawn into 10 groups of 5 that each run
SecAgg; client e007 masks an extreme input every round (protocols/secagg/insider.py: every
coordinate 2^30 in the ring, far past what clipping allows). The median of the 10 group means keeps
the final accuracy within 2 points of the clean grouped run; plain SecAgg (one group) under the
same client is at chance (digits: 10 classes) from its first round.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from protocols.federation import FederationConfig, SecureAggregationConfig
from protocols.federation.grouped import combine_group_means, decode_groups, draw_groups, encode_groups
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure import COHORT_META, SecureClient
from protocols.messages import RoundStart
from protocols.secagg import SecAggConfigError
from sim.federation import FederationRun
from sim.scenario import scenario_from_dict
from sim.world import ScenarioResult

pytestmark = pytest.mark.slow

TIMEOUTS = {"advertise_timeout_s": 2.0, "share_timeout_s": 2.0, "masked_input_timeout_s": 20.0,
            "consistency_timeout_s": 2.0, "unmask_timeout_s": 2.0}


def simulate(*, clients: int, rounds: int, attack: dict[str, str], **secure: Any) -> ScenarioResult:
    """``clients`` digits-mlp clients (IID shards), all asked in each of ``rounds`` rounds of 3 local
    epochs, under SecAgg with ``secure`` settings; ``attack``: the scenario's attackers."""
    server = {"rounds": rounds, "fraction": 1.0, "min_clients": clients, "local_epochs": 3, "seed": 3,
              "uplink": "identity", "round_timeout_s": 40.0,
              "secure_aggregation": {"clip_value": 0.5, "bits": 16, **TIMEOUTS, **secure}}
    return FederationRun(scenario_from_dict({
        "name": "groups", "seed": 3, "duration_s": 5000.0, "task": {"name": "digits-mlp"},
        "trainer": {"lr": 0.1, "batch_size": 32}, "partition": {"scheme": "iid"},
        "links": {"latency_ms": 5.0, "bandwidth_mbps": 100.0}, "nodes": {"step_time_ms": 10.0},
        "federation": {"gateways": 1, "clients": clients, "server": server, "attack": attack}})).run()


def test_ten_groups_keep_one_extreme_masked_input_from_the_model() -> None:
    # Prepare / Execute
    extreme = {"e007": "secagg:extreme_input"}
    clean = simulate(clients=50, rounds=6, attack={}, groups=10)
    grouped = simulate(clients=50, rounds=6, attack=extreme, groups=10)
    plain = simulate(clients=50, rounds=2, attack=extreme)
    # Assert: every grouped round summed its 10 groups by SecAgg, the attacker's too; the model holds
    for result in (clean, grouped):
        assert [(row["closed_by"], row["participants"]) for row in result.rounds] == [("secagg", 50)] * 6
        assert result.peers["gw0"]["fedavg.secagg_groups_summed"] == 60
    final = {name: result.trace[-1].mean_accuracy for name, result in
             (("clean", clean), ("grouped", grouped), ("plain", plain))}
    print(f"\n50 clients, one extreme masked input each round: {final}")
    assert final["clean"] > 0.7  # the clean run learned: the comparison below means something
    assert final["grouped"] >= final["clean"] - 0.02, final
    assert all(point.mean_accuracy < 0.2 for point in plain.trace), [p.mean_accuracy for p in plain.trace]


def test_a_repeat_offender_is_barred_after_blame_limit_rounds() -> None:
    # Prepare: 6 clients; e005 deals garbage in round 1 and a wrong secret in round 3 (limit 2)
    attack = {"e005": "secagg:garbage_shares@1,secagg:wrong_secret@3", "e004": "secagg:false_accusation@2"}
    # Execute
    result = simulate(clients=6, rounds=5, attack=attack, blame_limit=2)
    # Assert: named in the rounds it cheated in, not asked from round 4 on; every round summed
    rows = result.rounds
    assert [row.get("blamed", {}) for row in rows] == [
        {}, {"e005": "bad_shares"}, {"e004": "false_accusation"}, {"e005": "wrong_secret"}, {}]
    assert all(row["closed_by"] == "secagg" for row in rows)
    assert "e005" in rows[3]["asked"] and "e005" not in rows[4]["asked"] and "e004" in rows[4]["asked"]
    assert [row["participants"] for row in rows] == [6, 5, 5, 5, 5]


@pytest.mark.parametrize("size", [5, 9, 10, 23, 50, 51])
def test_groups_are_drawn_from_the_names_alone(size: int) -> None:
    names = [f"c{i:02d}" for i in range(size)]
    groups = draw_groups(names, groups=10, min_group=5, run_id="run", round_index=4)
    assert len(groups) == min(10, max(1, size // 5))
    assert sorted(name for group in groups for name in group) == names  # each name once
    sizes = [len(group) for group in groups]
    assert min(sizes) >= min(5, size) and max(sizes) - min(sizes) <= 1
    assert draw_groups(reversed(names), groups=10, min_group=5, run_id="run", round_index=4) == groups
    assert decode_groups(encode_groups(groups)) == groups
    if len(groups) > 1:  # another round, another draw
        assert draw_groups(names, groups=10, min_group=5, run_id="run", round_index=5) != groups


def test_the_median_of_group_means_ignores_a_minority_of_extreme_groups() -> None:
    honest = [torch.full((3,), value) for value in (1.0, 2.0, 3.0, 4.0)]
    extreme = [torch.full((3,), 1e9), torch.full((3,), -1e9)]
    assert torch.equal(combine_group_means([*honest, extreme[0]], "median", 0.2), torch.full((3,), 3.0))
    trimmed = combine_group_means([*honest, *extreme], "trimmed_mean", 0.2)
    assert torch.equal(trimmed, torch.full((3,), 2.5))


def test_a_client_refuses_a_grouping_the_draw_does_not_give() -> None:
    config = SecureAggregationConfig(groups=2)
    names = [f"c{i:02d}" for i in range(10)]
    client = SecureClient(config, name="c00", server="gw", run_id="run", client_secret=bytes(32),
                          sign=lambda data: bytes(64), verify=lambda *args: True)
    drawn = draw_groups(names, groups=2, min_group=5, run_id="run", round_index=0)
    packed = (tuple(names[:5]), tuple(names[5:]))
    assert packed != drawn
    # Execute / Assert: the packed grouping gets nothing; the drawn one an advert
    start = RoundStart(round=0, tensors={}, meta={COHORT_META: encode_groups(packed)}, deadline_s=10.0)
    assert client.start(start, 0.0) == [] and client.counters["secagg_refused_bad_groups"] == 1
    start = RoundStart(round=1, tensors={}, meta={COHORT_META: encode_groups(draw_groups(
        names, groups=2, min_group=5, run_id="run", round_index=1))}, deadline_s=10.0)
    assert len(client.start(start, 0.0)) == 1


def test_group_settings_are_checked_naming_the_key() -> None:
    with pytest.raises(SecAggConfigError, match="min_group"):
        SecureAggregationConfig(groups=3, min_group=4)
    with pytest.raises(SecAggConfigError, match="group_aggregator"):
        SecureAggregationConfig(group_aggregator="mean")
    with pytest.raises(SecAggConfigError, match="blame_limit"):
        SecureAggregationConfig(blame_limit=-1)
    with pytest.raises(ValueError, match="groups"):
        FederationConfig(uplink="identity", secure_aggregation=SecureAggregationConfig(groups=2),
                         differential_privacy=DifferentialPrivacyConfig(sampling_rate=0.5))

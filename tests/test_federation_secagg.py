"""Secure aggregation inside the simulator's FedAvg rounds (protocols/federation/secure.py).

Issue 13, item 3 and acceptance (c) in the simulator: 10 edge clients under one gateway run the
five SecAgg+ rounds (k = 4 < n - 1) inside each FedAvg round, through the Nodes like any other
federation message. The masked run ends with the global model of the same run with masking off
(the same clipping and quantisation, summed in the same ring), bit for bit; with 3 clients that
share their keys and then never send a masked input (they train 10,000 times slower than the
round lasts), every round still completes over the 7 survivors, again equal to the unmasked run
of the same 7. Config refusals name their keys.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.files.config import ConfigError
from protocols.federation import FederationConfig, SecureAggregationConfig
from protocols.federation.secure import SecureServer, unwrap, wrap
from protocols.messages import ClientUpdate, SecAggMessage
from protocols.secagg.messages import Malformed, SurvivorSet
from sim.federation import HEADER_BYTES, FederationRun
from sim.scenario import scenario_from_dict
from sim.world import ScenarioResult

SLOW = {"e002": 1e-4, "e005": 1e-4, "e008": 1e-4}  # train 10,000x slower: share keys, never mask in time


def secure_federation(*, masking: bool, speed: dict[str, float] | None = None,
                      degree: int = 4) -> dict[str, Any]:
    """10 digits-mlp clients, all asked in each of 3 rounds; SecAgg+ with k = ``degree`` and short
    deadlines."""
    secure = {"degree": degree, "clip_value": 0.5, "bits": 16, "masking": masking, "advertise_timeout_s": 2.0,
              "share_timeout_s": 2.0, "masked_input_timeout_s": 20.0, "consistency_timeout_s": 2.0,
              "unmask_timeout_s": 2.0}
    server = {"rounds": 3, "fraction": 1.0, "min_clients": 10, "local_epochs": 1, "seed": 3,
              "uplink": "identity", "round_timeout_s": 40.0, "secure_aggregation": secure}
    return {"name": "secagg", "seed": 3, "duration_s": 5000.0, "task": {"name": "digits-mlp"},
            "trainer": {"lr": 0.1, "batch_size": 32}, "partition": {"scheme": "iid"},
            "links": {"latency_ms": 5.0, "bandwidth_mbps": 100.0},
            "nodes": {"step_time_ms": 10.0, "speed": speed or {}},
            "federation": {"gateways": 1, "clients": 10, "server": server}}


def run(data: dict[str, Any]) -> tuple[ScenarioResult, torch.Tensor, dict[str, float]]:
    """The result, the gateway's final global model and its counters."""
    federation = FederationRun(scenario_from_dict(data))
    result = federation.run()
    gateway = federation.gateways[0]
    server = federation.members[gateway].server
    assert server is not None
    return result, server.params.clone(), result.peers[gateway]


def test_masked_rounds_end_with_the_model_of_the_same_rounds_unmasked() -> None:
    # Prepare / Execute
    masked, masked_model, counters = run(secure_federation(masking=True))
    plain, plain_model, plain_counters = run(secure_federation(masking=False))
    # Assert: every round closed by SecAgg over all 10, the unmasked one by its quota, same models
    assert [(row["closed_by"], row["participants"]) for row in masked.rounds] == [("secagg", 10)] * 3
    assert [(row["closed_by"], row["participants"]) for row in plain.rounds] == [("quota", 10)] * 3
    assert torch.equal(masked_model, plain_model)
    assert not torch.equal(masked_model, FederationRun(scenario_from_dict(
        secure_federation(masking=True))).initial)  # the rounds moved the model
    assert counters["fedavg.secagg_taken_MaskedInput"] == 30
    assert counters["fedavg.secagg_taken_UnmaskShares"] == 30
    assert not any(key.startswith("fedavg.secagg_refused") for key in counters)
    # bytes and time of every SecAgg round are counted (the nine kinds' bytes add up to the total;
    # each FedAvg round's row has the five phases' durations, messages and bytes at the gateway,
    # which add up to the total too: each message is its body plus the modelled header); the
    # unmasked run sends none
    kinds = {k: v for k, v in masked.metrics.items() if k.startswith("bytes_secagg_")}
    assert len(kinds) == 9 and sum(kinds.values()) == masked.metrics["bytes_secagg"] > 0
    assert kinds["bytes_secagg_MaskedInput"] >= 30 * 4 * (masked.n_params + 1)  # 4 bytes a parameter, weight
    assert plain.metrics["bytes_secagg"] == 0
    at_gateway = 0
    for row in masked.rounds:
        phases = row["secagg_phases"]
        assert [cost["phase"] for cost in phases] == ["advertise", "share", "masked_input", "consistency",
                                                      "unmask"]
        assert all(cost["duration_s"] > 0 and cost["messages_received"] == 10 for cost in phases)
        at_gateway += sum(cost["bytes_sent"] + cost["bytes_received"]
                          + HEADER_BYTES * (cost["messages_sent"] + cost["messages_received"])
                          for cost in phases)
    assert at_gateway == masked.metrics["bytes_secagg"]
    assert all("secagg_phases" not in row for row in plain.rounds)
    assert "fedavg.secagg_taken_MaskedInput" not in plain_counters
    assert masked.metrics["final_accuracy"] == plain.metrics["final_accuracy"]


def test_three_clients_gone_after_sharing_keys_leave_every_round_to_the_survivors() -> None:
    # Prepare / Execute: e002, e005, e008 advertise and share keys in round 0, then train past the
    # masked-input deadline (and past the run): the gateway rebuilds their masks from the shares.
    # k = 8 < n - 1, t = 5: whatever the graph, each client keeps >= 5 live neighbours, enough to
    # hold its shares and to sign (with k = 6, t = 4, a survivor with all 3 gone among its neighbours
    # aborts, too_few_survivors, and the round fails: SecAgg+'s price for a small k)
    masked, masked_model, counters = run(secure_federation(masking=True, speed=SLOW, degree=8))
    plain, plain_model, _ = run(secure_federation(masking=False, speed=SLOW, degree=8))
    # Assert: all 3 rounds closed by SecAgg with the 7 others, and aggregated
    survivors = [f"e{i:03d}" for i in range(10) if f"e{i:03d}" not in SLOW]
    assert [row["closed_by"] for row in masked.rounds] == ["secagg"] * 3
    assert all(row["taken"] == survivors for row in masked.rounds)
    assert masked.rounds[0]["missing"] == sorted(SLOW)
    # round 0: the 3 shared keys, then missed the masked input; their mask keys were rebuilt
    assert counters["fedavg.secagg_taken_ShareKeys"] >= 10
    assert counters["fedavg.secagg_deadline_masked_input"] >= 1
    assert counters["fedavg.rounds_aggregated"] == 3
    # the same 7 updates, unmasked, give the same model
    assert [row["taken"] for row in plain.rounds] == [survivors] * 3
    assert torch.equal(masked_model, plain_model)


def test_secagg_messages_cross_the_wire_kind_and_bad_bodies_are_data() -> None:
    # Prepare
    message = SurvivorSet("run", 4, ("e000", "e001", "e002"))
    # Execute / Assert: a round trip, then a body that is not msgpack, and a round that disagrees
    assert unwrap(wrap(4, message)) == message
    garbage = SecAggMessage(round=4, tensors={"body": torch.tensor([0xC1, 0xFF], dtype=torch.uint8)})
    assert isinstance(unwrap(garbage), Malformed)
    moved = SecAggMessage(round=5, tensors=wrap(4, message).tensors)
    assert unwrap(moved) == Malformed("round: body and envelope disagree")
    assert isinstance(unwrap(SecAggMessage(round=4)), Malformed)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=200), round_index=st.integers(-2, 2**40))
def test_any_body_unwraps_to_a_message_or_malformed_and_the_gateway_counts_it(body: bytes,
                                                                               round_index: int) -> None:
    # Prepare: a gateway's secure side with a round open over three clients
    server = SecureServer(SecureAggregationConfig(max_clients=10), run_id="run",
                          verify=lambda member, signature, data: False, like=torch.zeros(4))
    server.open(0, ("e000", "e001", "e002"), 0.0)
    hostile = SecAggMessage(round=round_index, tensors={"body": torch.frombuffer(bytearray(body) or
                                                                                 bytearray(b"\x00"),
                                                                                 dtype=torch.uint8)})
    # Execute: never raises
    actions, outcome = server.receive("e000", hostile, 1.0)
    # Assert: nothing sent, nothing ended, one refusal counted (here, or by the round's machine)
    assert actions == [] or all(type(a).__name__ == "SetTimer" for a in actions)
    assert outcome is None
    server.open(1, ("e000", "e001", "e002"), 2.0)  # retires round 0's machine: its refusals counted
    assert sum(v for k, v in server.drain().items() if "refused" in k) == 1


def test_a_plain_update_is_refused_while_masking_is_on() -> None:
    # Prepare
    server = SecureServer(SecureAggregationConfig(max_clients=10), run_id="run",
                          verify=lambda member, signature, data: False, like=torch.zeros(4))
    # Execute / Assert: the FedAvg server counts it refused_bad_update_unmasked
    with pytest.raises(ValueError, match="unmasked"):
        server.decode_update(ClientUpdate(round=0, num_samples=1, tensors={"q": torch.zeros(4)}))


def test_a_round_secagg_cannot_finish_closes_unaggregated_and_says_why() -> None:
    # Prepare / Execute: k = 4, t = 3 and 3 clients gone after sharing: some client keeps fewer
    # than t live neighbours, so round 0 cannot be unmasked (later rounds, without them, can)
    result, _, counters = run(secure_federation(masking=True, speed=SLOW, degree=4))
    # Assert
    first = result.rounds[0]
    assert first["closed_by"].startswith("secagg_failed_") and first["participants"] == 0
    assert counters["fedavg.rounds_failed"] == 1
    assert [row["closed_by"] for row in result.rounds[1:]] == ["secagg", "secagg"]


@pytest.mark.parametrize(("server", "words"), [
    ({"mode": "fedbuff"}, "mode = 'fedbuff'"),
    ({}, "uplink defaults to qsgd:bits=8"),
    ({"uplink": "sign"}, "federation.uplink = 'sign'"),
    ({"uplink": "identity", "aggregator": "median"}, "federation.aggregator 'median'"),
    ({"uplink": "identity", "clip_norm": 1.0}, "federation.clip_norm"),
    ({"uplink": "identity", "min_clients": 2}, "federation.min_clients"),
    ({"uplink": "identity", "round_timeout_s": 60.0}, "federation.round_timeout_s"),
    ({"uplink": "identity", "differential_privacy": {"noise_multiplier": 1.0, "clip_norm": 0.1,
                                                     "sampling_rate": 0.5}}, "differential_privacy"),
])
def test_federation_settings_secagg_cannot_run_beside_are_refused_by_name(server: dict[str, Any],
                                                                            words: str) -> None:
    # Prepare: the default five deadlines need round_timeout_s >= 180
    data = {"min_clients": 3, "round_timeout_s": 200.0, **server, "secure_aggregation": {}}
    # Execute / Assert
    with pytest.raises(ConfigError) as caught:
        scenario_from_dict({**secure_federation(masking=True), "federation": {
            "gateways": 1, "clients": 10, "server": data}}).federation_config()
    assert words in str(caught.value)


def test_a_secure_config_loads_from_its_table_and_fp16_uplinks_pass() -> None:
    # Execute
    config = scenario_from_dict(secure_federation(masking=True)).federation_config()
    # Assert
    assert isinstance(config, FederationConfig)
    assert isinstance(config.secure_aggregation, SecureAggregationConfig)
    assert config.secure_aggregation.degree == 4 and config.secure_aggregation.masking
    FederationConfig(uplink="fp16", min_clients=3, round_timeout_s=200.0,
                     secure_aggregation=SecureAggregationConfig())
    with pytest.raises(ValueError, match="bits must be <= 24"):
        SecureAggregationConfig(masking=False, bits=28, max_clients=10)

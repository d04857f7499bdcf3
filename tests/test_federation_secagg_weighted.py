"""Secure aggregation's weighted mean and its phase costs (protocols/federation/secure.py).

Under SecAgg the gateway sees only a sum, so a client weighs itself: it scales its clipped update
by ``w / W`` (``w``: its sample count capped at ``weight_cap_samples`` = W) before quantising, and
appends ``w`` as one more ring element; the gateway divides the summed scaled updates (times W)
by the summed weight. These tests drive one gateway's ``SecureServer`` and five ``SecureClient``
by hand over a list (no sockets, no simulator): the masked mean is plain FedAvg's weighted mean
within the quantisation bound, it is the masking-off baseline's bit for bit, and its ring sum is
exactly the sum of the clients' integers. Each round's five phases report their time (from the
``now`` values given) and the bytes each way, and those add up to what crossed the list. In the
simulator, one round of ten clients on unequal shards moves the model as plain FedAvg does, within
the quantisation bound.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest
import torch

from peer.cli.status import _federation_lines
from protocols.events import Action, Send, SetTimer
from protocols.federation import FederationConfig, SecureAggregationConfig
from protocols.federation.aggregate import fedavg
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure import (
    SecureClient,
    SecureServer,
    body_bytes,
    mean_of_sum,
    quantise_update,
    ring_weight,
)
from protocols.messages import ClientUpdate, RoundStart, SecAggMessage
from protocols.secagg import SecAggConfigError
from protocols.secagg.fixedpoint import RING_MASK, levels
from protocols.secagg.local import SeededKeyring
from sim.federation import FederationRun
from sim.scenario import scenario_from_dict

NAMES = [f"e{i:03d}" for i in range(5)]
SAMPLES = {"e000": 7, "e001": 120, "e002": 400, "e003": 1000, "e004": 5000}  # e004 above the cap
NUMEL = 64
PHASES = ["advertise", "share", "masked_input", "consistency", "unmask"]
STEP_S = 0.25  # the list's delivery time: each message arrives this long after it was sent


def config(*, masking: bool, cap: int = 1000) -> SecureAggregationConfig:
    return SecureAggregationConfig(degree=4, clip_value=0.5, bits=16, max_clients=10, masking=masking,
                                   weight_cap_samples=cap)


def deltas(seed: int) -> dict[str, torch.Tensor]:
    """Each client's delta, within the clip (so clipping does not move the mean)."""
    generator = torch.Generator().manual_seed(seed)
    return {name: (torch.rand(NUMEL, generator=generator, dtype=torch.float64) - 0.5) * 0.9 for name in NAMES}


def one_round(secure: SecureAggregationConfig, updates: dict[str, torch.Tensor]
              ) -> tuple[torch.Tensor, SecureServer, int]:
    """One FedAvg round's SecAgg between a gateway and the clients of ``updates``: the mean update,
    the gateway's side, and the secagg body bytes that crossed the list (both ways)."""
    roster = SeededKeyring(NAMES, seed=5)
    like = torch.zeros(NUMEL, dtype=torch.float64)
    server = SecureServer(secure, run_id="run", verify=roster.verify, like=like)
    clients = {name: SecureClient(secure, name=name, server="gw", run_id="run", client_secret=bytes([i]) * 32,
                                  sign=roster.signer(name), verify=roster.verify)
               for i, name in enumerate(NAMES)}
    meta, _ = server.open(0, NAMES, 0.0)
    start = RoundStart(round=0, tensors={}, meta=meta, deadline_s=100.0)
    queue: deque[tuple[float, str, Action]] = deque()  # (when, from, action)
    for name in NAMES:
        queue.extend((STEP_S, name, action) for action in clients[name].start(start, 0.0))
    for name in NAMES:  # trained: the uploads go as soon as the shares are in (or, unmasked, now)
        queue.extend((STEP_S, name, action)
                     for action in clients[name].upload(0, updates[name], SAMPLES[name], 0.0))
    carried, plain = 0, {}
    while queue:
        when, sender, action = queue.popleft()
        if isinstance(action, SetTimer) or not isinstance(action, Send):
            continue
        message = action.message
        if isinstance(message, ClientUpdate):  # masking off: the baseline, in the clear
            plain[sender] = (server.decode_update(message), message.num_samples)
            continue
        assert isinstance(message, SecAggMessage)
        carried += body_bytes(message)
        if sender == "gw":
            replies = clients[action.recipients[0]].receive(message, when)
            queue.extend((when + STEP_S, action.recipients[0], reply) for reply in replies)
        else:
            actions, outcome = server.receive(sender, message, when)
            queue.extend((when + STEP_S, "gw", reply) for reply in actions)
            if outcome is not None:
                assert outcome.mean is not None and outcome.survivors == tuple(NAMES), outcome
    return server.aggregate(plain), server, carried


def test_the_masked_mean_is_fedavgs_weighted_mean_within_the_quantisation_bound() -> None:
    # Prepare
    secure = config(masking=True)
    updates = deltas(1)
    weights = [ring_weight(SAMPLES[name], secure) for name in NAMES]
    # Execute
    masked, _, _ = one_round(secure, updates)
    # Assert: FedAvg weighs by the counts capped at W (e004's 5000 counts 1000)
    assert weights == [7, 120, 400, 1000, 1000]
    expected = fedavg([updates[name] for name in NAMES], weights)
    # each client rounds to within half a step c / L of its scaled update; in the mean: n c W / (2 L sum w)
    step = secure.clip_value * secure.weight_cap_samples / levels(secure.bits)
    bound = len(NAMES) * step / (2 * sum(weights))
    error = float((masked - expected).abs().max())
    assert error <= bound
    # the negative control: the unweighted mean is far outside that bound
    assert float((torch.stack(list(updates.values())).mean(0) - expected).abs().max()) > 20 * bound


def test_masked_equals_the_unmasked_baseline_bit_for_bit_and_the_ring_sum_is_exact() -> None:
    # Prepare
    updates = deltas(2)
    # Execute
    masked, masked_server, _ = one_round(config(masking=True), updates)
    plain, _, _ = one_round(config(masking=False), updates)
    # Assert: the same integers in the same ring give the same mean, bit for bit
    assert torch.equal(masked, plain)
    integers = [quantise_update(updates[name], ring_weight(SAMPLES[name], config(masking=True)),
                                config(masking=True)) for name in NAMES]
    ring_sum = np.zeros(NUMEL + 1, dtype=np.int64)
    for values in integers:
        ring_sum = (ring_sum + values) & RING_MASK
    assert int(ring_sum[-1]) == 7 + 120 + 400 + 1000 + 1000  # the weights, summed exactly
    assert torch.equal(masked, mean_of_sum(ring_sum, len(NAMES), config(masking=True), masked))
    assert masked_server.mean is not None and torch.equal(masked_server.mean, masked)


def test_a_cap_of_one_is_the_unweighted_mean() -> None:
    # Prepare / Execute
    updates = deltas(3)
    masked, _, _ = one_round(config(masking=True, cap=1), updates)
    # Assert
    unweighted = torch.stack([updates[name] for name in NAMES]).mean(0)
    assert float((masked - unweighted).abs().max()) <= 0.5 / (2 * levels(16))


def test_each_phase_reports_its_time_and_bytes_and_they_add_up() -> None:
    # Prepare / Execute
    _, server, carried = one_round(config(masking=True), deltas(4))
    shown = server.status()
    costs = {cost["phase"]: cost for cost in server.phase_costs(0)}
    # Assert: five phases, in order; each took the list's two crossings or more (ask, answer)
    assert [cost["phase"] for cost in server.phase_costs(0)] == PHASES
    assert all(cost["duration_s"] >= STEP_S for cost in costs.values()), costs
    assert all(cost["messages_received"] == len(NAMES) for cost in costs.values()), costs
    assert [costs[phase]["messages_sent"] for phase in PHASES] == [5, 5, 5, 5, 0]  # unmask: no answer
    assert sum(cost["bytes_sent"] + cost["bytes_received"] for cost in costs.values()) == carried
    # the masked inputs: 4 bytes an element, the model and its weight, from each client
    assert costs["masked_input"]["bytes_received"] >= len(NAMES) * 4 * (NUMEL + 1)
    assert shown == {"round": 0, "phase": "none", "phases": server.phase_costs(0), "blamed": {},
                     "offences": {}, "barred": []}  # shown; the round is over
    server.open(1, NAMES, 10.0)
    assert server.phase_costs(0) == [] and [cost["phase"] for cost in server.phase_costs(1)] == ["advertise"]


def test_the_status_shows_the_open_rounds_phase() -> None:
    # Prepare
    server = SecureServer(config(masking=True), run_id="run", verify=lambda *args: False,
                          like=torch.zeros(3))
    # Execute
    server.open(7, NAMES, 10.0)
    # Assert
    assert server.status() == {"round": 7, "phase": "advertise", "phases": [{
        "phase": "advertise", "duration_s": 0.0, "messages_received": 0, "bytes_received": 0,
        "messages_sent": 0, "bytes_sent": 0}], "blamed": {}, "offences": {}, "barred": []}


def test_a_masked_sum_with_an_impossible_total_weight_is_not_a_mean() -> None:
    # Prepare: 3 clients with W = 10 can weigh 3..30 in all
    secure = config(masking=True, cap=10)
    like = torch.zeros(4)
    ring_sum = np.array([1, 2, 3, 4, 31], dtype=np.int64)
    # Execute / Assert
    assert mean_of_sum(ring_sum, 3, secure, like) is None
    assert mean_of_sum(np.array([1, 2, 3, 4, 2]), 3, secure, like) is None
    assert mean_of_sum(np.array([1, 2, 3, 4, 30]), 3, secure, like) is not None


def test_a_plain_update_with_a_weight_outside_the_cap_is_refused() -> None:
    # Prepare
    server = SecureServer(config(masking=False, cap=10), run_id="run", verify=lambda *args: False,
                          like=torch.zeros(3))
    # Execute / Assert
    server.decode_update(ClientUpdate(round=0, num_samples=5,
                                      tensors={"q": torch.tensor([1.0, -2.0, 3.0, 10.0])}))
    for weight in (0.0, 11.0, 2.5):
        with pytest.raises(ValueError):
            server.decode_update(ClientUpdate(round=0, num_samples=5,
                                              tensors={"q": torch.tensor([1.0, -2.0, 3.0, weight])}))


def test_the_weight_cap_is_checked_against_the_ring_and_the_federations_settings() -> None:
    # Execute / Assert: 1000 clients of weight up to 2^22 overflow the 32-bit ring's weight element
    with pytest.raises(SecAggConfigError, match="weight_cap_samples"):
        SecureAggregationConfig(max_clients=1000, weight_cap_samples=1 << 22)
    with pytest.raises(SecAggConfigError, match="weight_cap_samples must be an integer >= 1"):
        SecureAggregationConfig(weight_cap_samples=0)
    base = {"uplink": "identity", "min_clients": 3, "round_timeout_s": 200.0}
    with pytest.raises(ValueError, match="weight_cap_samples = 1"):
        FederationConfig(**base, aggregator="mean", secure_aggregation=SecureAggregationConfig())
    unit = SecureAggregationConfig(weight_cap_samples=1)
    FederationConfig(**base, aggregator="mean", secure_aggregation=unit)
    with pytest.raises(ValueError, match=r"federation\.max_samples"):
        FederationConfig(**base, max_samples=50, secure_aggregation=SecureAggregationConfig())
    capped = SecureAggregationConfig(weight_cap_samples=50)
    FederationConfig(**base, max_samples=50, secure_aggregation=capped)


def test_hivemesh_status_shows_the_last_rounds_secagg_phases_and_the_open_ones() -> None:
    # Prepare: a gateway's status.json ``federation`` after a masked round, the next one open
    _, server, _ = one_round(config(masking=True), deltas(5))
    phases = server.phase_costs(0)
    server.open(1, NAMES, 10.0)
    federation = {"mode": "sync", "round": 1, "phase": "open", "rounds_closed": 1, "asked": NAMES,
                  "last_rounds": [{"round": 0, "closed_by": "secagg", "asked": NAMES, "taken": NAMES,
                                   "secagg_phases": phases}],
                  "secagg": server.status()}
    # Execute
    lines = _federation_lines(federation)
    # Assert: one line per phase of round 0, with its time and what came in and went out
    shown = [line.split() for line in lines if line.startswith("    secagg ")]
    assert [words[1] for words in shown] == PHASES
    assert shown[0][2:4] == [f"{phases[0]['duration_s']:.2f}", "s"]
    assert f"({len(NAMES)})" in shown[2] and "(0)" in shown[4]  # 5 masked inputs in; no unmask answer
    assert "  secagg round 1: phase advertise" in lines


def simulated(*, secure: dict[str, Any] | None) -> tuple[torch.Tensor, list[int]]:
    """One FedAvg round of 10 digits-mlp clients on Dirichlet shares (unequal sizes) in the
    simulator, with ``secure`` as its secure_aggregation (None: plain FedAvg, float32 deltas):
    the global model after it, and the clients' sample counts."""
    server: dict[str, Any] = {"rounds": 1, "fraction": 1.0, "min_clients": 10, "local_epochs": 1, "seed": 3,
                              "uplink": "identity", "round_timeout_s": 40.0}
    if secure is not None:
        server["secure_aggregation"] = {"degree": 4, "clip_value": 1.0, "bits": 16, "max_clients": 10,
                                        "advertise_timeout_s": 2.0, "share_timeout_s": 2.0,
                                        "masked_input_timeout_s": 20.0, "consistency_timeout_s": 2.0,
                                        "unmask_timeout_s": 2.0, **secure}
    data = {"name": "weighted", "seed": 3, "duration_s": 5000.0, "task": {"name": "digits-mlp"},
            "trainer": {"lr": 0.1, "batch_size": 32}, "partition": {"scheme": "dirichlet", "alpha": 0.5},
            "links": {"latency_ms": 5.0, "bandwidth_mbps": 100.0}, "nodes": {"step_time_ms": 10.0},
            "federation": {"gateways": 1, "clients": 10, "server": server}}
    federation = FederationRun(scenario_from_dict(data))
    federation.run()
    gateway = federation.members[federation.gateways[0]].server
    assert gateway is not None and gateway.counters["rounds_aggregated"] == 1
    samples = [len(federation.trainers[name].shard) for name in federation.clients]
    return gateway.params.detach().clone(), samples


def test_a_simulated_secagg_round_moves_the_model_as_plain_fedavg_does_within_quantisation() -> None:
    # Prepare / Execute: the same round, plain FedAvg (weighted by samples, float32), SecAgg+ with a
    # cap above every shard, and SecAgg+ with W = 1 (the unweighted mean: the negative control)
    plain, samples = simulated(secure=None)
    weighted, _ = simulated(secure={"weight_cap_samples": 250})
    unweighted, _ = simulated(secure={"weight_cap_samples": 1})
    # Assert: unequal shards, all below the cap; SecAgg's model within the quantisation bound
    # n c W / (2 L sum w) of FedAvg's (plus float32's rounding), the unweighted one far outside it
    assert max(samples) <= 250 and max(samples) > 2 * min(samples), samples
    bound = 10 * 1.0 * 250 / (2 * levels(16) * sum(samples)) + 1e-6
    assert float((weighted - plain).abs().max()) <= bound
    assert float((unweighted - plain).abs().max()) > 10 * bound


def test_under_distributed_dp_every_client_weighs_one_whatever_the_cap() -> None:
    # Prepare: DP-FedAvg divides by the expected cohort, so a weight above 1 would bias the mean
    server = SecureServer(config(masking=False, cap=10), run_id="run", verify=lambda *args: False,
                          like=torch.zeros(3))
    server.privacy = DifferentialPrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, sampling_rate=0.5)
    server.divide_by = 4.0
    def plain(values: list[float], num_samples: int) -> ClientUpdate:
        return ClientUpdate(round=0, num_samples=num_samples, tensors={"q": torch.tensor(values)})

    # Execute
    taken = {"a": (server.decode_update(plain([4.0, -8.0, 0.0, 1.0], 5)), 5),
             "b": (server.decode_update(plain([4.0, 8.0, 0.0, 1.0], 50)), 50)}
    # Assert: the plain sum over q N, not a weighted mean; a weight of 2 is refused
    expected = mean_of_sum(np.array([8, 0, 0, 2]), 2, server.config, torch.zeros(3), 4.0)
    assert expected is not None and torch.equal(server.aggregate(taken), expected)
    assert mean_of_sum(np.array([8, 0, 0, 3]), 2, server.config, torch.zeros(3), 4.0) is None
    with pytest.raises(ValueError):
        server.decode_update(plain([1.0, 1.0, 1.0, 2.0], 5))

"""A vector an operator cannot encode is never handed to it (issue 32, item 1): finite values whose
norm overflows float32 (what an insider's accepted update can make of a model) made qsgd, sign and
powersgd raise while encoding, from a gateway's next RoundStart, a peer's next gossip message or
an edge's next update, outside any message's handling. ``encodable`` (protocols/gossip/payload.py)
says which vectors an operator takes; a machine counts what it cannot send (``nonfinite_params``),
a server ``model_unsendable``, an edge client ``nonfinite_update``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.events import Finished, Received, Send, Start, TimerFired, WorkDone
from protocols.federation import FedAvgClient, FedAvgServer, FederationConfig
from protocols.gossip import GossipConfig, make_machine
from protocols.gossip.payload import Payload
from protocols.messages import ClientUpdate, RoundResult, RoundStart
from tests.test_gateway_extreme_updates_hypothesis import SPECS, D
from topology import build

HUGE = 1e38  # finite in float32; 48 of them have no float32 norm


@settings(max_examples=150, deadline=None)
@given(spec=st.sampled_from(SPECS), magnitude=st.floats(min_value=0.0, max_value=3.4e38),
       values=st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=D, max_size=D))
def test_what_a_payload_calls_encodable_it_encodes(spec: str, magnitude: float, values: list[float]) -> None:
    payload = Payload(spec, numel=D, dtype=torch.float32, seed=0, name="p00")
    x = (torch.tensor(values, dtype=torch.float64) * magnitude).to(torch.float32)
    if payload.encodable(x):
        tensors, meta, _ = payload.encode(x, 0)
        assert tensors or meta


@pytest.mark.parametrize("config", [
    GossipConfig(algorithm="dpsgd", compression="qsgd:bits=8", total_steps=3),
    # CHOCO sends x - x_hat; with the insider filter off it measured no norm before encoding
    GossipConfig(algorithm="choco", compression="qsgd:bits=8", total_steps=3, norm_multiple=0.0,
                 choco_full_start=False),
], ids=["dpsgd", "choco"])
def test_a_peer_whose_parameters_overflow_its_operator_sends_nothing(config: GossipConfig) -> None:
    params = torch.full((D,), HUGE)
    machine = make_machine(config, name="p00", topology=build("ring:4"), params=params)
    actions = machine.handle(Start(), 0.0)
    actions += machine.handle(WorkDone(1, 0.0), 1.0)
    assert not any(isinstance(a, Send) for a in actions)
    assert machine.counters["nonfinite_params"] >= 1


def test_a_server_whose_model_its_downlink_cannot_carry_runs_its_rounds_without_sending_it() -> None:
    # Prepare: a sign downlink, and a global model an unbounded update overflowed
    config = FederationConfig(rounds=2, fraction=1.0, min_clients=2, round_timeout_s=10.0, uplink="identity",
                              downlink="sign")
    server = FedAvgServer(config, name="gw0", params=torch.full((D,), HUGE), clients=("e0", "e1"))
    # Execute: round 0 opens; one update, then the deadline; round 1 likewise, and the end
    actions = server.handle(Start(), 0.0)
    server.handle(Received("e0", ClientUpdate(round=0, num_samples=2**63, tensors={"x": torch.ones(D)})), 1.0)
    actions += server.handle(TimerFired("deadline/0"), 10.0)
    actions += server.handle(TimerFired("deadline/1"), 20.0)
    # Assert: no model went out, each time counted; the rounds closed and the server finished
    assert not any(isinstance(a, Send) and isinstance(a.message, RoundStart | RoundResult) for a in actions)
    assert server.counters["model_unsendable"] == 3      # two rounds' RoundStart and the final RoundResult
    assert sorted(server.reports) == [0, 1] and server.reports[0].aggregated
    assert any(isinstance(a, Finished) for a in actions)


def test_an_edge_whose_update_overflows_its_uplink_sends_nothing_and_counts_it() -> None:
    # Prepare: a qsgd uplink; a round's model, and training that left a finite delta with no float32 norm
    config = FederationConfig(rounds=2, fraction=1.0, min_clients=1, local_steps=1, local_epochs=0)
    client = FedAvgClient(config, name="e0", server="gw0", params=torch.zeros(D), num_samples=3,
                          steps_per_epoch=1)
    client.handle(Received("gw0", RoundStart(round=0, tensors={"x": torch.zeros(D)},
                                             meta=config.local_work(), deadline_s=10.0)), 0.0)
    client.params.fill_(HUGE)
    # Execute
    actions = client.handle(WorkDone(1, 0.0), 1.0)
    # Assert
    assert not any(isinstance(a, Send) for a in actions)
    assert client.counters["nonfinite_update"] == 1

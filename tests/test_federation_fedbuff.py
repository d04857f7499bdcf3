"""FedBuff (Nguyen et al. 2022) driven by hand: concurrency, aggregation every K updates,
staleness weights, refusal of stale updates, dispatch timeouts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from peer.runtime.peerconfig import PeerFederationSection
from protocols.events import Action, Finished, Received, Send, SetTimer, Start, TimerFired
from protocols.federation import FedBuffServer, FederationConfig, make_server, staleness_weight
from protocols.messages import ClientUpdate, RoundResult, RoundStart

CLIENTS = ("a", "b", "c", "d", "e")


def server(clients: Sequence[str] = CLIENTS, **overrides: object) -> FedBuffServer:
    # exact FedAvg arithmetic below: the influence bounds off, and a buffer may be one client's
    # (min_clients 1; tests/test_federation_influence.py)
    settings: dict[str, object] = {"mode": "fedbuff", "concurrency": 3, "buffer_size": 2, "rounds": 10,
                                   "max_staleness": 3, "round_timeout_s": 10.0, "uplink": "identity",
                                   "samples_multiple": 0, "norm_multiple": 0, "min_clients": 1}
    settings.update(overrides)
    made = make_server(FederationConfig(**settings), name="gw",  # type: ignore[arg-type]
                       params=torch.zeros(2, dtype=torch.float64), clients=clients)
    assert isinstance(made, FedBuffServer)
    return made


def update(version: int, delta: Sequence[float]) -> ClientUpdate:
    tensors = {"x": torch.tensor(delta, dtype=torch.float64)}
    return ClientUpdate(round=version, num_samples=10, tensors=tensors)


def started(actions: list[Action]) -> tuple[str, ...]:
    return tuple(r for a in actions if isinstance(a, Send) and isinstance(a.message, RoundStart)
                 for r in a.recipients)


def test_staleness_weight() -> None:
    assert staleness_weight(0, 0.5) == 1.0
    assert math.isclose(staleness_weight(3, 0.5), 0.5)
    assert staleness_weight(5, 0.0) == 1.0
    with pytest.raises(ValueError):
        staleness_weight(-1, 0.5)


def test_start_keeps_concurrency_clients_training() -> None:
    s = server()
    actions = s.handle(Start(), 0.0)
    busy = started(actions)
    assert len(busy) == 3 and set(busy) == set(s.busy)
    assert s.status()["training"] == {c: 0 for c in sorted(busy)}
    assert sum(isinstance(a, SetTimer) for a in actions) == 3


def test_every_k_updates_make_a_version_and_a_free_client_is_asked_again() -> None:
    s = server()
    a, b, _ = started(s.handle(Start(), 0.0))
    actions = s.handle(Received(a, update(0, [1, 0])), 1.0)
    assert s.version == 0 and len(started(actions)) == 1  # a replacement at version 0
    actions = s.handle(Received(b, update(0, [0, 3])), 2.0)
    assert s.version == 1
    assert torch.allclose(s.params, torch.tensor([0.5, 1.5], dtype=torch.float64))
    assert s.reports[1].staleness == (0, 0) and s.reports[1].weights == (1.0, 1.0)
    (new,) = [a for a in actions if isinstance(a, Send)]
    assert isinstance(new.message, RoundStart) and new.message.round == 1
    assert torch.allclose(new.message.tensors["x"], s.params)


def test_stale_updates_are_weighted_and_too_stale_ones_refused() -> None:
    # Prepare: two clients, both always training; "slow" answers after "fast" made versions 1 and 2
    s = server(concurrency=2, buffer_size=1, max_staleness=2, clients=("fast", "slow"))
    s.handle(Start(), 0.0)
    for version in range(2):
        s.handle(Received("fast", update(version, [0, 0])), 1.0 + version)
    assert s.version == 2 and s.busy["slow"].version == 0
    # Execute: the slow update is 2 versions old
    s.handle(Received("slow", update(0, [4, 0])), 5.0)
    # Assert: weighed 1/sqrt(3)
    report = s.reports[3]
    assert report.contributors == ("slow",) and report.staleness == (2,)
    assert math.isclose(report.weights[0], 1 / math.sqrt(3))
    assert torch.allclose(s.params, torch.tensor([4 / math.sqrt(3), 0.0], dtype=torch.float64))
    # slow is asked again at version 3; fast makes versions 4, 5, 6: slow's update is then 3 old
    assert s.busy["slow"].version == 3
    for step in range(3):
        s.handle(Received("fast", update(s.busy["fast"].version, [0, 0])), 6.0 + step)
    before = s.params.clone()
    s.handle(Received("slow", update(3, [100, 100])), 20.0)
    assert s.counters["refused_stale"] == 1 and s.version == 6
    assert torch.equal(s.params, before)
    assert s.busy["slow"].version == 6  # free again, and asked with the current model


def test_timeouts_free_the_client_and_its_late_update_is_refused() -> None:
    s = server(concurrency=1, clients=("a", "b"))
    (first,) = started(s.handle(Start(), 0.0))
    other = "b" if first == "a" else "a"
    s.unregister(first)  # so the replacement is the other one
    actions = s.handle(TimerFired(f"client/{first}/0"), 10.0)
    assert s.counters["missing"] == 1 and started(actions) == (other,)
    s.handle(Received(first, update(0, [1, 1])), 11.0)
    s.handle(Received(first, update(0, [1, 1])), 11.0)  # once late; after that, not ours
    s.handle(Received("stranger", update(0, [1, 1])), 11.0)
    assert s.counters["refused_late"] == 1 and s.counters["refused_not_sampled"] == 2
    assert s.counters["updates_taken"] == 0 and s.handle(TimerFired(f"client/{first}/0"), 12.0) == []


def test_wrong_version_and_finish() -> None:
    s = server(concurrency=2, buffer_size=1, rounds=1)
    a, b = started(s.handle(Start(), 0.0))
    s.handle(Received(a, update(7, [1, 1])), 1.0)
    assert s.counters["refused_wrong_round"] == 1
    actions = s.handle(Received(a, update(0, [1, 1])), 2.0)
    assert Finished() in actions
    (result,) = [x for x in actions if isinstance(x, Send) and isinstance(x.message, RoundResult)]
    assert result.recipients == CLIENTS
    s.handle(Received(b, update(0, [1, 1])), 3.0)
    assert s.counters["refused_after_finish"] == 1


def test_restore_keeps_the_version_and_the_model() -> None:
    s = server(buffer_size=1)
    (a, _, _) = started(s.handle(Start(), 0.0))
    s.handle(Received(a, update(0, [2, 2])), 1.0)
    fresh = server(buffer_size=1)
    fresh.restore_state(s.export_state())
    assert fresh.version == 1 and torch.equal(fresh.params, s.params)
    assert len(started(fresh.handle(Start(), 2.0))) == 3


def test_only_sync_federation_has_rounds_so_only_it_takes_gateway_gossip_rounds() -> None:
    assert FederationConfig(mode="sync").has_rounds and not FederationConfig(mode="fedbuff").has_rounds
    assert PeerFederationSection(mode="sync", gossip_rounds=2).gossip_rounds == 2
    assert PeerFederationSection(mode="fedbuff", gossip_rounds=0).gossip_rounds == 0
    with pytest.raises(ValueError, match="FedBuff has no rounds to gossip between"):
        PeerFederationSection(mode="fedbuff", gossip_rounds=2)

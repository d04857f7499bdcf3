"""Every (state, input) the servers can meet, from Hypothesis: any order of valid, late, early,
duplicate, malformed and foreign updates, deadlines and (un)registrations. Whatever comes, no
exception escapes, every update is either taken or refused with a reason (exactly once), and the
round records stay consistent."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.events import Received, Start, TimerFired
from protocols.federation import FedAvgServer, FedBuffServer, FederationConfig, make_server
from protocols.messages import ClientUpdate

CLIENTS = tuple(f"c{i}" for i in range(6))
NAMES = (*CLIENTS, "outsider")

update_kind = st.sampled_from(["good", "good", "good", "short", "nan", "no_samples", "empty"])
# an answer from the i-th client the server is waiting for (most often for the current round)
answer = st.tuples(st.just("answer"), st.sampled_from("012345"), st.sampled_from([0, 0, 0, -1, 1]),
                   update_kind)
step = st.one_of(
    answer, answer, answer,
    st.tuples(st.just("update"), st.sampled_from(NAMES), st.integers(-2, 2), update_kind),
    st.tuples(st.just("timer"), st.sampled_from(NAMES), st.integers(-1, 1), st.just("")),
    st.tuples(st.just("register"), st.sampled_from(NAMES), st.just(0), st.just("")),
    st.tuples(st.just("unregister"), st.sampled_from(NAMES), st.just(0), st.just("")),
)


def _update(round_index: int, kind: str) -> ClientUpdate:
    tensors = {"short": {"x": torch.ones(3)}, "nan": {"x": torch.full((4,), float("nan"))},
               "empty": {}}.get(kind, {"x": torch.ones(4)})
    return ClientUpdate(round=round_index, num_samples=0 if kind == "no_samples" else 5, tensors=tensors)


def _drive(server: FedAvgServer | FedBuffServer, steps: list[tuple[str, str, int, str]],
           current: Any, timer_key: Any, waiting: Any) -> int:
    """Feed ``steps``; returns how many updates were fed. ``waiting()``: the clients the server
    waits for now; ``current()``: its round; ``timer_key(name, offset)``: a timer near a live one."""
    now = 0.0
    fed = 0
    server.handle(Start(), now)
    for kind, name, offset, detail in steps:
        now += 1.0
        if kind == "answer":
            clients = sorted(waiting())
            if not clients:
                continue
            kind, name = "update", clients[int(name) % len(clients)]
        if kind == "update":
            fed += 1
            server.handle(Received(name, _update(current() + offset, detail)), now)
        elif kind == "timer":
            server.handle(TimerFired(timer_key(name, offset)), now)
        elif kind == "register":
            server.register(name, now)
        else:
            server.unregister(name)
    return fed


@settings(max_examples=150, deadline=None)
@given(st.lists(step, min_size=20, max_size=80), st.floats(0.0, 1.0), st.integers(0, 3))
def test_sync_server_counts_every_update_once_and_keeps_its_records(
        steps: list[tuple[str, str, int, str]], over_selection: float, seed: int) -> None:
    config = FederationConfig(fraction=0.5, min_clients=2, rounds=3, over_selection=over_selection, seed=seed,
                              uplink="identity")
    server = FedAvgServer(config, name="gw", params=torch.zeros(4), clients=CLIENTS)
    def timer_key(name: str, offset: int) -> str:
        return f"deadline/{server.round + offset}"

    fed = _drive(server, steps, lambda: server.round, timer_key, lambda: server.asked)
    assert server.counters["updates_taken"] + server.counters["refused_update"] == fed
    assert bool(torch.isfinite(server.params).all())
    for round_index, report in server.reports.items():
        assert report.round == round_index
        assert set(report.taken) <= set(report.asked)
        assert report.missing == tuple(c for c in report.asked if c not in report.taken)
        assert set(report.late) <= set(report.missing) and len(set(report.late)) == len(report.late)
        assert report.aggregated == (len(report.taken) >= config.min_updates)
    assert server.counters["rounds_aggregated"] + server.counters["rounds_failed"] == len(server.reports)


@settings(max_examples=150, deadline=None)
@given(st.lists(step, min_size=20, max_size=80), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2),
       st.integers(1, 3))
def test_fedbuff_server_counts_every_update_once_and_keeps_its_records(
        steps: list[tuple[str, str, int, str]], concurrency: int, buffer_size: int,
        max_staleness: int, min_clients: int) -> None:
    config = FederationConfig(mode="fedbuff", rounds=4, concurrency=concurrency, buffer_size=buffer_size,
                              max_staleness=max_staleness, uplink="identity", min_clients=min_clients)
    server = make_server(config, name="gw", params=torch.zeros(4), clients=CLIENTS)
    assert isinstance(server, FedBuffServer)

    def timer_key(name: str, offset: int) -> str:
        dispatch = server.busy.get(name)
        return f"client/{name}/{(dispatch.number if dispatch else 0) + offset}"

    def current() -> int:
        return server.version

    fed = _drive(server, steps, current, timer_key, lambda: server.busy)
    assert server.counters["updates_taken"] + server.counters["refused_update"] == fed
    assert len(server.busy) <= concurrency and set(server.busy) <= set(NAMES)
    assert server.counters["aggregations"] == server.version == len(server.reports)
    # a buffer is held while short of buffer_size updates or of min_clients distinct clients; a full one
    # asks none of its clients again, so each client adds at most one update to it once full
    held = {client for client, _, _, _ in server.buffer}
    assert len(server.buffer) < buffer_size or len(held) < min_clients
    assert len(server.buffer) < buffer_size + len(NAMES)
    for report in server.reports.values():
        assert len(report.contributors) >= buffer_size and len(set(report.contributors)) >= min_clients
        assert len(report.contributors) < buffer_size + len(NAMES)
        # aggregated as soon as both held: the last update is the one that completed them
        before = report.contributors[:-1]
        assert len(before) < buffer_size or len(set(before)) < min_clients
        assert all(0 <= s <= max_staleness for s in report.staleness)
    assert bool(torch.isfinite(server.params).all())

"""Edge clients added by a roster version while a simulated federation runs (issue 16, item 3):
sim/federation.py applies roster changes through the same Node as the daemon's gateway
(``change_membership``, protocols/node/membership.py's ``Serving``), so a joiner is served by the
gateway its roster entry names from the version's round on, as tests/test_gateway_edge_assignment.py
pins for the Node alone and tests/test_hosts_federation.py across hosts."""

from __future__ import annotations

from typing import Any

import pytest

from peer.files.config import ConfigError
from sim.federation import FederationRun
from sim.scenario import scenario_from_dict

EFFECTIVE_ROUND = 3
JOINERS = ("e002", "e005")      # the last of gw0's block (e000-e002) and of gw1's (e003-e005)


def scenario(**server: Any) -> dict[str, Any]:
    return {"name": "fed-join", "seed": 5, "duration_s": 5000.0, "task": {"name": "digits-mlp"},
            "trainer": {"lr": 0.1, "batch_size": 32}, "partition": {"scheme": "iid"},
            "links": {"latency_ms": 5.0, "bandwidth_mbps": 100.0},
            "nodes": {"step_time_ms": 100.0},   # rounds of ~1 s: a heartbeat (1 s) registers a joiner in time
            "federation": {"gateways": 2, "clients": 3,
                           "server": {"rounds": 8, "fraction": 1.0, "min_clients": 2, "local_epochs": 1,
                                      "seed": 3, **server}}}


def test_joiners_are_served_by_the_gateway_their_entry_names_from_their_round_on() -> None:
    # Prepare: e002 and e005 run from the start but are not on the roster (version 1)
    run = FederationRun(scenario_from_dict(scenario()), joining=JOINERS)
    assert [m.name for m in run.roster.with_role("edge")] == ["e000", "e001", "e003", "e004"]
    # Execute: the gateways learn version 2 (the joiners, from round 3) before round 1 closed
    learnt_at_s = 0.05
    run.engine.at(learnt_at_s, lambda: run.change_roster(run.roster_adding(JOINERS,
                                                                           effective_round=EFFECTIVE_ROUND)))
    result = run.run()
    # Assert: every round closed at each gateway; a joiner only at its own gateway, only from its round
    taken = {(row["gateway"], row["round"]): set(row["taken"]) for row in result.rounds}
    assert sorted(taken) == [(g, r) for g in ("gw0", "gw1") for r in range(8)]
    assert all(time_s > learnt_at_s for time_s in [row["time_s"] for row in result.rounds][2:])
    for gateway, block, joiner in (("gw0", {"e000", "e001"}, "e002"), ("gw1", {"e003", "e004"}, "e005")):
        rounds_in = [r for r in range(8) if joiner in taken[(gateway, r)]]
        assert rounds_in and min(rounds_in) >= EFFECTIVE_ROUND, (gateway, rounds_in)
        assert all(taken[(gateway, r)] <= block for r in range(EFFECTIVE_ROUND))
        assert all(taken[(gateway, r)] <= block | {joiner} for r in range(8))
    # the joiners' heartbeats between learning the version and its round: counted, not registered
    assert result.rejections.get("client_not_served_yet", 0) >= 1
    assert run.members["gw0"].node.membership.current.version == 2


def test_without_a_roster_change_a_joiner_is_never_served() -> None:
    run = FederationRun(scenario_from_dict(scenario(rounds=4)), joining=("e002",))
    result = run.run()
    assert all("e002" not in row["taken"] for row in result.rounds) and len(result.rounds) == 8
    assert result.rejections.get("heartbeat_not_neighbour", 0) >= 1     # a stranger's heartbeats


def test_a_joiner_must_be_a_client_of_the_scenario() -> None:
    with pytest.raises(ConfigError, match="e999"):
        FederationRun(scenario_from_dict(scenario()), joining=("e999",))

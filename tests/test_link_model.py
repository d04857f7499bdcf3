"""The link model with shared NICs: a member's links share its uplink and downlink (sim/network.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from peer.files.config import ConfigError
from protocols.rng import numpy_generator
from sim.network import LinkSpec, Network, NicSpec, uniform
from sim.plots import traffic_edges
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.world import build_world, nic_specs
from topology import GraphError, build

NBYTES = 125_000   # 1 Mbit
FAST = LinkSpec(latency_ms=0.0, bandwidth_mbps=1000.0)


def _last_arrival(recipients: tuple[str, ...], nics: dict[str, NicSpec] | None) -> float:
    network = Network({}, default=FAST, seed=0, nics=nics)
    return max(network.arrival_s("a", r, NBYTES, 0.0) for r in recipients)


def test_one_member_sending_to_two_neighbours_through_its_uplink_takes_twice_as_long_as_to_one() -> None:
    nics = {"a": NicSpec(uplink_mbps=1.0)}

    one = _last_arrival(("b",), nics)
    two = _last_arrival(("b", "c"), nics)

    assert one == 1.0                 # 1 Mbit at 1 Mbit/s; the 1 Gbit/s links are not the bottleneck
    assert two == 2 * one             # exactly: the copies queue through the one uplink
    # Control: without a shared uplink the two copies travel side by side, on links as slow as the NIC.
    slow_links = Network({}, default=LinkSpec(latency_ms=0.0, bandwidth_mbps=1.0), seed=0)
    assert max(slow_links.arrival_s("a", r, NBYTES, 0.0) for r in ("b", "c")) == one


def test_a_receivers_downlink_is_shared_by_all_links_into_it() -> None:
    network = Network({}, default=FAST, seed=0, nics={"c": NicSpec(downlink_mbps=1.0)})

    first = network.arrival_s("a", "c", NBYTES, 0.0)
    second = network.arrival_s("b", "c", NBYTES, 0.0)
    elsewhere = network.arrival_s("a", "d", NBYTES, 0.0)   # a's own link to d is not held up

    assert (first, second) == (1.0, 2.0)
    assert elsewhere == 8 * NBYTES / 1e9


def test_an_unlimited_nic_is_exactly_the_per_link_model() -> None:
    # The per-link model written out (sim/network.py before NICs): FIFO per link, jitter after latency,
    # never reordering a link's stream.
    spec = LinkSpec(latency_ms=3.0, bandwidth_mbps=7.0, jitter_ms=2.0, loss=0.1)
    names = ("a", "b", "c")
    draw = numpy_generator(5, "", 0, "test-sends")
    sends = sorted((float(draw.uniform(0, 1)), names[int(draw.integers(3))], names[int(draw.integers(3))],
                    int(draw.integers(1, 20_000))) for _ in range(300))
    with_nics = Network({}, default=spec, seed=9, nics={n: NicSpec() for n in names})
    without = Network({}, default=spec, seed=9)
    free_at: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], float] = {}
    for now, src, dst, nbytes in sends:
        if src == dst:
            continue
        start = max(now, free_at.get((src, dst), 0.0))
        free_at[(src, dst)] = start + 8.0 * nbytes / (spec.bandwidth_mbps * 1e6)
        index = with_nics.link(src, dst).messages
        expected = free_at[(src, dst)] + spec.latency_ms / 1000.0 + spec.jitter_ms / 1000.0 * uniform(
            9, f"{src}->{dst}", index, "jitter")
        expected = last[(src, dst)] = max(expected, last.get((src, dst), 0.0))
        lost = uniform(9, f"{src}->{dst}", index, "loss") < spec.loss
        for network in (with_nics, without):
            transfer = network.transmit(src, dst, nbytes, now)
            assert transfer.arrival_s == (None if lost else expected)   # bit for bit


# ---------------------------------------------------------------- the simulator's round time


RING = 8
STEPS = 10
LATENCY_MS = 5.0


def _ring(nodes: dict[str, Any], links: dict[str, Any]) -> Any:
    return scenario_from_dict({
        "seed": 4, "duration_s": 100.0, "steps": STEPS, "eval_every_s": 100.0,
        "graph": {"spec": f"ring:{RING}"}, "links": {"latency_ms": LATENCY_MS, **links},
        # compute (1 ms) hides under the exchange: a round costs the network's time
        "nodes": {"step_time_ms": 1.0, **nodes},
        "algorithm": {"algorithm": "dpsgd", "total_steps": STEPS},
        "task": {"name": "logreg", "options": {"n_samples": 200, "n_features": 500}},
        "trainer": {"batch_size": 8},
    })


def _round_s_and_message_bytes(scenario: Any) -> tuple[float, int]:
    """A round's time once every member has started (the wait for the neighbours' heartbeats
    before it is not a round), and the size of one model message."""
    result = run_scenario(scenario)
    peers = result.peers.values()
    sizes = {p["bytes_sent_by_kind"]["param_push"] / p["messages_sent_by_kind"]["param_push"] for p in peers}
    assert len(sizes) == 1 and all(p["steps"] == STEPS and p["finished"] for p in peers)
    started_s = max(p["started_at_s"] for p in peers)   # the rounds wait for the last to start
    return (result.simulated_time_s - started_s) / STEPS, int(sizes.pop())


def test_ring_round_at_1_mbit_uplink_matches_the_hand_computed_time() -> None:
    round_s, message_bytes = _round_s_and_message_bytes(
        _ring({"uplink_mbps": 1.0}, {"bandwidth_mbps": 1000.0}))
    # Each member sends its B-byte model to 2 neighbours through one 1 Mbit/s uplink; each waits for
    # the copy it is second to receive: 2 x 8 B / 1 Mbit/s, plus the latency.
    hand_s = 2 * 8 * message_bytes / 1e6 + LATENCY_MS / 1000
    assert round_s == pytest.approx(hand_s, rel=0.01)

    # Control: per-link bandwidth only (the old model), each link as fast as that uplink: measurably
    # shorter, one serialisation per round.
    per_link_s, same_bytes = _round_s_and_message_bytes(_ring({}, {"bandwidth_mbps": 1.0}))
    assert same_bytes == message_bytes
    assert per_link_s == pytest.approx(8 * message_bytes / 1e6 + LATENCY_MS / 1000, rel=0.01)
    assert per_link_s < 0.6 * round_s


def test_nics_come_from_the_scenario_and_the_graph_file(tmp_path: Any) -> None:
    graph = tmp_path / "ring.edgelist"
    graph.write_text("node p00 uplink_mbps=5 downlink_mbps=6\nnode p01 uplink_mbps=7\n"
                     "p00 p01\np01 p02\np02 p00\n")
    scenario = scenario_from_dict({
        "graph": {"spec": str(graph)}, "task": {"name": "logreg", "options": {"n_samples": 60}},
        "nodes": {"uplink_mbps": 9.0, "nic": {"p01": {"uplink_mbps": 8.0}}}})

    world = build_world(scenario)
    nics = nic_specs(world.topology, scenario.nodes)

    assert nics == {"p00": NicSpec(uplink_mbps=5.0, downlink_mbps=6.0),      # the graph file's
                    "p01": NicSpec(uplink_mbps=8.0, downlink_mbps=math.inf),  # the scenario's, by name
                    "p02": NicSpec(uplink_mbps=9.0, downlink_mbps=math.inf)}  # the scenario's default


def test_parameter_server_traffic_is_drawn_through_the_server() -> None:
    links = [("*", "server", 4, 400), ("server", "*", 4, 400)]
    edges = traffic_edges(links, ["p00", "p01"])
    assert sorted(edges) == [("p00", "server", 200.0), ("p01", "server", 200.0),
                             ("server", "p00", 200.0), ("server", "p01", 200.0)]
    assert sum(b for _, _, b in edges) == 800


@pytest.mark.parametrize(("nodes", "needle"), [
    ({"uplink_mbps": 0.0}, "key 'nodes.uplink_mbps': uplink_mbps must be > 0"),
    ({"nic": {"p00": {"uplnk_mbps": 3.0}}}, "nodes.nic.p00.uplnk_mbps: unknown key"),
    ({"nic": {"p00": {"downlink_mbps": -1.0}}}, "nodes.nic.p00.downlink_mbps must be > 0"),
])
def test_a_bad_nic_setting_names_its_key(nodes: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as error:
        scenario_from_dict({"nodes": nodes}, source="s.toml")
    assert str(error.value).startswith("s.toml") and needle in str(error.value)


def test_a_bad_nic_in_a_graph_file_names_the_node(tmp_path: Any) -> None:
    graph = tmp_path / "bad.edgelist"
    graph.write_text("node p01 uplink_mbps=0\np00 p01\n")
    with pytest.raises(GraphError) as error:
        build(str(graph))
    assert "node 'p01' has uplink_mbps 0.0" in str(error.value)

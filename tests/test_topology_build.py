"""Building topologies from specs: names, sizes, the Topology interface, and every generator's W."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from topology import GraphError, Topology, build, from_graph
from topology.analysis import consensus_rate

EVERY_SPEC = [
    "ring:16", "torus:4x4", "torus:3x5", "complete:8", "star:8", "hypercube:16", "exponential:32",
    "exponential:12", "one-peer-exponential:16", "one-peer-exponential:12", "regular:16:4",
    "erdos-renyi:16:0.3", "watts-strogatz:16:4:0.2", "directed-ring:8", "directed-exponential:8",
    "directed-exponential:6", "directed-one-peer-exponential:16", "directed-one-peer-exponential:12",
]


def _assert_valid(topology: Topology) -> None:
    n = len(topology.names)
    union = np.zeros((n, n))
    for t in range(topology.period):
        w = topology.mixing(t)
        assert w.shape == (n, n) and w.dtype == np.float64
        assert np.all(w >= 0)
        np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)  # column stochastic
        if not topology.directed:
            np.testing.assert_allclose(w, w.T, atol=1e-12)
            np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
        union += w
    support = nx.from_numpy_array((union > 0).astype(int).T, create_using=nx.DiGraph)
    assert nx.is_strongly_connected(support)


@pytest.mark.parametrize("spec", EVERY_SPEC)
@pytest.mark.parametrize("weights", ["metropolis", "max-degree"])
def test_every_generator_gives_a_valid_mixing_schedule(spec: str, weights: str) -> None:
    topology = build(spec, weights=weights, seed=3)
    _assert_valid(topology)
    assert topology.names == tuple(sorted(topology.names))
    assert topology.directed == spec.startswith("directed")


def test_one_peer_rounds_are_matchings_but_each_round_alone_is_disconnected() -> None:
    topology = build("one-peer-exponential:16")
    assert topology.period == 4
    for t in range(4):
        w = topology.mixing(t)
        assert set(np.round(np.diag(w), 12)) == {0.5}
        assert all(len(topology.in_neighbours(name, t)) == 1 for name in topology.names)
    assert nx.is_connected(topology.graph)


def test_names_are_sorted_and_size_must_agree() -> None:
    topology = build("ring", ["carol", "alice", "bob", "dave"])
    assert topology.names == ("alice", "bob", "carol", "dave")
    assert topology.in_neighbours("alice") == {"bob": pytest.approx(1 / 3), "dave": pytest.approx(1 / 3)}
    assert list(topology.in_neighbours("bob")) == ["alice", "carol"]
    assert topology.self_weight("alice") == pytest.approx(1 / 3)
    with pytest.raises(GraphError, match="says 5 members but the roster has 4"):
        build("ring:5", ["a", "b", "c", "d"])
    with pytest.raises(GraphError, match="duplicate member name 'a'"):
        build("ring", ["a", "a", "b"])
    with pytest.raises(GraphError, match="needs a size"):
        build("ring")


def test_directed_neighbours_follow_push_sum_convention() -> None:
    topology = build("directed-ring:4")
    assert topology.out_neighbours("p00") == {"p01": 0.5}
    assert topology.in_neighbours("p00") == {"p03": 0.5}
    assert topology.self_weight("p00") == 0.5
    assert topology.graph.has_edge("p00", "p01") and not topology.graph.has_edge("p01", "p00")


def test_random_graphs_are_seeded() -> None:
    first = build("erdos-renyi:20:0.2", seed=7).mixing(0)
    again = build("erdos-renyi:20:0.2", seed=7).mixing(0)
    other = build("erdos-renyi:20:0.2", seed=8).mixing(0)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize(("spec", "needle"), [
    ("hypercube:12", "power-of-two number of members, got 12"),
    ("erdos-renyi:30:0.01", "no connected graph"),
    ("regular:5:3", "degree 3 impossible for 5 members"),
    ("banana:4", "unknown topology 'banana'"),
    ("ring:x", "'x' is not an integer"),
    ("torus:3x3:2", "write torus:ROWSxCOLS"),
    ("ring:4:2", "too many"),
])
def test_bad_specs_raise_graph_error(spec: str, needle: str) -> None:
    with pytest.raises(GraphError, match=needle):
        build(spec)


def test_mixing_matrices_are_read_only_and_unknown_members_are_named() -> None:
    topology = build("ring:8")
    with pytest.raises(ValueError):
        topology.mixing(0)[0, 0] = 2.0
    with pytest.raises(GraphError, match="unknown member 'zed'"):
        topology.in_neighbours("zed")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 24), probability=st.floats(0.05, 1.0), graph_seed=st.integers(0, 2**32 - 1),
       x_seed=st.integers(0, 2**32 - 1), weights=st.sampled_from(["metropolis", "max-degree"]))
def test_any_connected_graph_gives_a_contraction_towards_the_mean(
        n: int, probability: float, graph_seed: int, x_seed: int, weights: str) -> None:
    graph = nx.relabel_nodes(nx.gnp_random_graph(n, probability, seed=graph_seed), lambda i: f"m{i:02d}")
    assume(nx.is_connected(graph))
    topology = from_graph(graph, weights=weights)
    _assert_valid(topology)
    x = np.random.default_rng(x_seed).standard_normal(n)
    mixed = topology.mixing(0) @ x
    assert mixed.mean() == pytest.approx(x.mean(), abs=1e-12)
    # One round shrinks disagreement by at least |lambda_2| (W - J/n has spectral norm |lambda_2|).
    assert np.linalg.norm(mixed - x.mean()) <= consensus_rate(topology) * np.linalg.norm(x - x.mean()) + 1e-12

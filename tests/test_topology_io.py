"""Graph files: round trips keep link and node attributes; malformed files name the problem."""

import re
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from topology import GraphError, build, from_graph
from topology.io import load, save


def _annotated_graph(directed: bool = False) -> nx.Graph:
    graph: nx.Graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_node("alpha", speed=2.0, role="gateway")
    graph.add_node("bravo", speed=0.5, role="peer")
    graph.add_node("charlie", speed=1.0, role="edge")
    graph.add_edge("alpha", "bravo", latency_ms=5.0, bandwidth_mbps=1000.0, loss=0.0)
    graph.add_edge("bravo", "charlie", latency_ms=40.5, bandwidth_mbps=10.0, loss=0.02)
    graph.add_edge("charlie", "alpha", latency_ms=12.0, bandwidth_mbps=100.0, loss=0.5)
    return graph


@pytest.mark.parametrize("suffix", [".graphml", ".json", ".edgelist"])
@pytest.mark.parametrize("directed", [False, True])
def test_round_trip_keeps_attributes(tmp_path: Path, suffix: str, directed: bool) -> None:
    graph = _annotated_graph(directed)
    path = tmp_path / f"g{suffix}"
    save(graph, path)
    loaded = load(path)
    assert loaded.is_directed() == directed
    assert dict(loaded.nodes(data=True)) == dict(graph.nodes(data=True))
    assert sorted(loaded.edges(data=True)) == sorted(graph.edges(data=True))
    assert isinstance(loaded.nodes["alpha"]["speed"], float)


@pytest.mark.parametrize("suffix", [".graphml", ".json", ".edgelist"])
def test_saved_topology_rebuilds_the_same_mixing(tmp_path: Path, suffix: str) -> None:
    original = build("watts-strogatz:12:4:0.3", seed=5)
    path = tmp_path / f"ws{suffix}"
    save(original.graph, path)
    for weights in ("metropolis", "edges"):
        rebuilt = build(str(path), weights=weights)
        assert rebuilt.names == original.names
        np.testing.assert_allclose(rebuilt.mixing(0), original.mixing(0), atol=1e-12)


def test_file_topology_checks_names_against_the_roster(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    save(_annotated_graph(), path)
    assert build(str(path), ["charlie", "bravo", "alpha"]).names == ("alpha", "bravo", "charlie")
    with pytest.raises(GraphError, match="unknown node 'charlie'"):
        build(str(path), ["alpha", "bravo"])
    with pytest.raises(GraphError, match="member 'delta' is missing"):
        build(str(path), ["alpha", "bravo", "charlie", "delta"])
    assert build(str(path)).graph.edges["alpha", "bravo"]["latency_ms"] == 5.0


MALFORMED = [
    ("g.edgelist", "a b\nb b\n", "self loop on node 'b'"),
    ("g.edgelist", "a b latency_ms=-3\n", "edge 'a'-'b' has latency_ms -3.0"),
    ("g.edgelist", "a b loss=1\n", "edge 'a'-'b' has loss 1.0; it must be in [0, 1)"),
    ("g.edgelist", "a b bandwidth_mbps=fast\n", "'bandwidth_mbps' must be a number, got 'fast'"),
    ("g.edgelist", "a b latency_ms\n", "g.edgelist:1: expected key=value, got 'latency_ms'"),
    ("g.edgelist", "a\n", "g.edgelist:1: expected 'SOURCE TARGET"),
    ("g.edgelist", "a b\nc d\n", "disconnected: c, d cannot be reached from 'a'"),
    ("g.edgelist", "node a speed=0\na b\n", "node 'a' has speed 0"),
    ("g.edgelist", "directed\na b\nb c\n", "not strongly connected"),
    ("g.edgelist", "a b weight=0.7\nb c weight=0.7\n", "negative self weight"),
    ("g.json", '{"nodes": ["a", "b"], "edges": [["a", "zed"]]}', "unknown node 'zed'"),
    ("g.json", '{"edges": [["a", "b"]', "not valid JSON"),
    ("g.json", '{"edges": [{"source": "a"}]}', "edges[0]: expected an object with a non-empty string"),
    ("g.json", '{"edges": [["a", "b"], ["a", "b"]]}', "duplicate edge 'a'-'b'"),
    ("g.graphml", "<graphml><graph", "malformed GraphML"),
    ("g.gml", "graph []", "unknown graph file type '.gml'"),
]


@pytest.mark.parametrize(("name", "text", "needle"), MALFORMED)
def test_malformed_graph_files_name_the_problem(tmp_path: Path, name: str, text: str, needle: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    weights = "edges" if "weight=" in text else "metropolis"
    with pytest.raises(GraphError, match=re.escape(needle)):
        build(str(path), weights=weights)


def test_weights_on_edges_must_be_symmetric_doubly_stochastic() -> None:
    graph = nx.DiGraph()
    graph.add_edge("a", "b", weight=0.5)
    graph.add_edge("b", "a", weight=0.3)
    assert from_graph(graph, weights="edges").mixing(0)[1, 0] == 0.5  # directed: column-stochastic is fine
    undirected = nx.path_graph(["a", "b", "c"])
    nx.set_edge_attributes(undirected, 0.5, "weight")
    topology = from_graph(undirected, weights="edges")
    assert topology.self_weight("b") == 0.0
    with pytest.raises(GraphError, match="has no 'weight' attribute"):
        from_graph(nx.path_graph(["a", "b", "c"]), weights="edges")


def test_missing_file_is_a_graph_error(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="cannot read graph file"):
        build(str(tmp_path / "nope.graphml"))

"""Graph files: edge list, GraphML and JSON, keeping what the simulator needs.

Edge attributes: ``latency_ms``, ``bandwidth_mbps``, ``loss`` (and an optional
mixing ``weight``); node attributes: ``speed`` (relative compute speed),
``uplink_mbps`` / ``downlink_mbps`` (the member's NIC, shared by all of its
links: see sim/network.py), ``role`` (peer, gateway, edge), and anything else scalar. Every loader checks
the graph (:func:`check_graph`) and raises GraphError naming the file and the
node or edge at fault.

Edge list format (one item a line, ``#`` starts a comment)::

    directed                                  # optional, before any edge
    node p00 speed=2.0 role=gateway uplink_mbps=100   # optional: attributes or isolated members
    p00 p01 latency_ms=5 bandwidth_mbps=100 loss=0.01

JSON format::

    {"directed": false,
     "nodes": ["p00", {"name": "p01", "speed": 0.5}],
     "edges": [["p00", "p01"], {"source": "p01", "target": "p02", "latency_ms": 20}]}
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

import networkx as nx

from topology.errors import GraphError

GRAPH_SUFFIXES = (".graphml", ".json", ".edgelist", ".edges")
Scalar = str | int | float | bool


def check_graph(graph: nx.Graph, source: str = "graph") -> nx.Graph:
    """Raise GraphError for self loops and out-of-range link or node attributes."""
    for node, data in graph.nodes(data=True):
        if "speed" in data:
            speed = _as_float(data["speed"], f"{source}: node {node!r} attribute 'speed'")
            if not speed > 0 or not math.isfinite(speed):
                raise GraphError(f"{source}: node {node!r} has speed {speed}; it must be positive")
        for key in ("uplink_mbps", "downlink_mbps"):
            if key in data:
                rate = _as_float(data[key], f"{source}: node {node!r} attribute {key!r}")
                if not rate > 0:
                    raise GraphError(f"{source}: node {node!r} has {key} {rate}; it must be > 0")
    for a, b, data in graph.edges(data=True):
        edge = f"{source}: edge {a!r}-{b!r}"
        if a == b:
            raise GraphError(f"{source}: self loop on node {a!r}")
        if "latency_ms" in data:
            latency_ms = _as_float(data["latency_ms"], f"{edge} attribute 'latency_ms'")
            if not latency_ms >= 0 or not math.isfinite(latency_ms):
                raise GraphError(f"{edge} has latency_ms {latency_ms}; it must be >= 0")
        if "bandwidth_mbps" in data:
            bandwidth = _as_float(data["bandwidth_mbps"], f"{edge} attribute 'bandwidth_mbps'")
            if not bandwidth > 0:
                raise GraphError(f"{edge} has bandwidth_mbps {bandwidth}; it must be > 0")
        if "loss" in data:
            loss = _as_float(data["loss"], f"{edge} attribute 'loss'")
            if not 0.0 <= loss < 1.0:
                raise GraphError(f"{edge} has loss {loss}; it must be in [0, 1)")
        if "weight" in data:
            weight = _as_float(data["weight"], f"{edge} attribute 'weight'")
            if not weight >= 0 or not math.isfinite(weight):
                raise GraphError(f"{edge} has weight {weight}; it must be >= 0")
    return graph


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise GraphError(f"{what} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise GraphError(f"{what} must be a number, got {value!r}") from None


def load(path: str | Path) -> nx.Graph:
    """Read a graph file (format by suffix); node names become strings."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in GRAPH_SUFFIXES:
        raise GraphError(f"{path}: unknown graph file type {suffix!r} (use {', '.join(GRAPH_SUFFIXES)})")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise GraphError(f"{path}: cannot read graph file ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise GraphError(f"{path}: graph file is not UTF-8 text") from None
    if suffix == ".graphml":
        graph = _parse_graphml(text, str(path))
    elif suffix == ".json":
        graph = _parse_json(text, str(path))
    else:
        graph = _parse_edgelist(text, str(path))
    return check_graph(graph, str(path))


def save(graph: nx.Graph, path: str | Path) -> None:
    """Write a graph file (format by suffix) with its node and edge attributes."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".graphml":
        nx.write_graphml(graph, path)
    elif suffix == ".json":
        path.write_text(json.dumps(to_json(graph), indent=1) + "\n", encoding="utf-8")
    elif suffix in (".edgelist", ".edges"):
        path.write_text(to_edgelist(graph), encoding="utf-8")
    else:
        raise GraphError(f"{path}: unknown graph file type {suffix!r} (use {', '.join(GRAPH_SUFFIXES)})")


# ---------------------------------------------------------------- GraphML

def _parse_graphml(text: str, source: str) -> nx.Graph:
    try:
        graph = nx.parse_graphml(text)
    except (ParseError, nx.NetworkXError, KeyError, ValueError, TypeError) as error:
        raise GraphError(f"{source}: malformed GraphML ({error})") from None
    if graph.is_multigraph():
        raise GraphError(f"{source}: parallel edges are not supported")
    return nx.relabel_nodes(graph, {node: str(node) for node in graph.nodes})


# ---------------------------------------------------------------- JSON

def to_json(graph: nx.Graph) -> dict[str, Any]:
    return {
        "directed": graph.is_directed(),
        "nodes": [{"name": str(node), **_scalars(data)} for node, data in graph.nodes(data=True)],
        "edges": [{"source": str(a), "target": str(b), **_scalars(data)}
                  for a, b, data in graph.edges(data=True)],
    }


def _scalars(data: dict[str, Any]) -> dict[str, Scalar]:
    return {key: value for key, value in data.items() if isinstance(value, str | int | float | bool)}


def _parse_json(text: str, source: str) -> nx.Graph:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise GraphError(f"{source}: not valid JSON (line {error.lineno}: {error.msg})") from None
    if not isinstance(document, dict) or not isinstance(document.get("edges"), list):
        raise GraphError(f"{source}: expected a JSON object with an 'edges' list (and optionally 'nodes')")
    directed = document.get("directed", False)
    if not isinstance(directed, bool):
        raise GraphError(f"{source}: 'directed' must be true or false, got {directed!r}")
    graph: nx.Graph = nx.DiGraph() if directed else nx.Graph()
    nodes = document.get("nodes")
    for k, item in enumerate(nodes or []):
        name, attrs = (item, {}) if isinstance(item, str) else _named(item, "name", f"{source}: nodes[{k}]")
        if name in graph:
            raise GraphError(f"{source}: duplicate node {name!r}")
        graph.add_node(name, **attrs)
    for k, item in enumerate(document["edges"]):
        where = f"{source}: edges[{k}]"
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            a, b, attrs = item[0], item[1], {}
        elif isinstance(item, dict):
            b, _ = _named(item, "target", where)
            a, attrs = _named(item, "source", where)
            attrs.pop("target", None)
        else:
            raise GraphError(f"{where}: expected [source, target] or an object with 'source' and 'target'")
        for end in (a, b):
            if nodes is not None and end not in graph:
                raise GraphError(f"{where}: unknown node {end!r} (not in 'nodes')")
        if graph.has_edge(a, b):
            raise GraphError(f"{where}: duplicate edge {a!r}-{b!r}")
        graph.add_edge(a, b, **attrs)
    return graph


def _named(item: Any, key: str, where: str) -> tuple[str, dict[str, Scalar]]:
    if not isinstance(item, dict) or not isinstance(item.get(key), str) or not item[key]:
        raise GraphError(f"{where}: expected an object with a non-empty string {key!r}")
    attrs = {k: v for k, v in item.items() if k != key}
    for k, v in attrs.items():
        if not isinstance(v, str | int | float | bool):
            raise GraphError(f"{where}: attribute {k!r} must be a string or number, got {v!r}")
    return item[key], attrs


# ---------------------------------------------------------------- edge list

def to_edgelist(graph: nx.Graph) -> str:
    lines = ["# hivemesh edge list: SOURCE TARGET [key=value ...]; node NAME [key=value ...]"]
    if graph.is_directed():
        lines.append("directed")
    for node, data in graph.nodes(data=True):
        lines.append(" ".join(["node", _token(str(node)), *_pairs(data)]))
    for a, b, data in graph.edges(data=True):
        lines.append(" ".join([_token(str(a)), _token(str(b)), *_pairs(data)]))
    return "\n".join(lines) + "\n"


def _token(text: str) -> str:
    if not text or any(c.isspace() or c in "#=" for c in text):
        raise GraphError(f"{text!r} cannot be written to an edge list "
                         "(no spaces, '#' or '=' in names or values)")
    return text


def _pairs(data: dict[str, Any]) -> list[str]:
    return [f"{_token(key)}={_token(str(value))}" for key, value in _scalars(data).items()]


def _value(text: str) -> Scalar:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def _parse_edgelist(text: str, source: str) -> nx.Graph:
    graph: nx.Graph = nx.Graph()
    seen_edge = False
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        where = f"{source}:{number}"
        if not words:
            continue
        if words == ["directed"]:
            if seen_edge or graph.number_of_nodes():
                raise GraphError(f"{where}: 'directed' must come before any node or edge")
            graph = nx.DiGraph()
            continue
        is_node = words[0] == "node"
        names = words[1:2] if is_node else words[:2]
        rest = words[2:]
        if len(names) < (1 if is_node else 2) or any("=" in name for name in names):
            raise GraphError(f"{where}: expected 'SOURCE TARGET [key=value ...]' "
                             "or 'node NAME [key=value ...]'")
        attrs: dict[str, Scalar] = {}
        for pair in rest:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise GraphError(f"{where}: expected key=value, got {pair!r}")
            attrs[key] = _value(value)
        if is_node:
            graph.add_node(names[0], **attrs)
        else:
            if graph.has_edge(names[0], names[1]):
                raise GraphError(f"{where}: duplicate edge {names[0]!r}-{names[1]!r}")
            graph.add_edge(names[0], names[1], **attrs)
            seen_edge = True
    if graph.number_of_nodes() == 0:
        raise GraphError(f"{source}: the edge list has no nodes")
    return graph

"""From a spec string ("ring:16", "torus:4x4", a graph file, ...) to a validated Topology."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import networkx as nx
import numpy as np

from topology import generators as gen
from topology.errors import GraphError
from topology.io import GRAPH_SUFFIXES, load
from topology.mixing import mixing_matrix
from topology.schedule import Topology, with_weights

# kind -> (directed, time-varying); the order is the order shown in help texts.
KINDS: dict[str, tuple[bool, bool]] = {
    "ring": (False, False),
    "torus": (False, False),
    "complete": (False, False),
    "star": (False, False),
    "hypercube": (False, False),
    "exponential": (False, False),
    "one-peer-exponential": (False, True),
    "regular": (False, False),
    "erdos-renyi": (False, False),
    "watts-strogatz": (False, False),
    "directed-ring": (True, False),
    "directed-exponential": (True, False),
    "directed-one-peer-exponential": (True, True),
}
SPEC_HELP = ("ring:16, torus:4x4, complete:8, star:8, hypercube:16, exponential:32, one-peer-exponential:16, "
             "regular:16:4, erdos-renyi:16:0.3, watts-strogatz:16:4:0.2, directed-ring:8, "
             "directed-exponential:8, directed-one-peer-exponential:16, or a .graphml/.json/.edgelist file")


def default_names(n: int) -> tuple[str, ...]:
    """p00, p01, ... (zero-padded so that string order is index order)."""
    width = max(2, len(str(n - 1)))
    return tuple(f"p{i:0{width}d}" for i in range(n))


def _sorted_names(names: Sequence[str]) -> tuple[str, ...]:
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name:
            raise GraphError(f"member names must be non-empty strings, got {name!r}")
        if name in seen:
            raise GraphError(f"duplicate member name {name!r}")
        seen.add(name)
    if not seen:
        raise GraphError("a topology needs at least one member")
    return tuple(sorted(seen))


def _number(spec: str, text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise GraphError(f"bad topology spec {spec!r}: {text!r} is not {what}") from None


def is_graph_file(spec: str) -> bool:
    """Whether ``spec`` names a graph file (by suffix or a path separator) rather than a generator."""
    return Path(spec).suffix.lower() in GRAPH_SUFFIXES or "/" in spec or "\\" in spec


def build(spec: str, names: Sequence[str] | None = None, *, seed: int = 0,
          weights: str = "metropolis") -> Topology:
    """A validated Topology for ``spec`` over ``names`` (sorted; None -> p00, p01, ...).

    A size in the spec must agree with ``names``; random graphs draw from
    ``numpy.random.default_rng(seed)``. ``weights`` is ``metropolis``,
    ``max-degree`` or ``edges`` (the ``weight`` attribute of each edge).
    """
    spec = spec.strip()
    if is_graph_file(spec):
        graph = load(spec)
        return from_graph(graph, names, weights=weights, spec=spec)
    kind, *args = spec.split(":")
    if kind not in KINDS:
        raise GraphError(f"unknown topology {kind!r} in spec {spec!r} (try {SPEC_HELP})")
    directed, _ = KINDS[kind]
    rounds = _generate(spec, kind, args, names, np.random.default_rng(seed))
    member_names = tuple(rounds[0].nodes)
    return from_rounds(rounds, member_names, directed=directed, weights=weights, spec=spec)


def _resolve_names(spec: str, size: int | None, names: Sequence[str] | None) -> tuple[str, ...]:
    if names is None:
        if size is None:
            raise GraphError(f"topology spec {spec!r} needs a size (e.g. {spec}:16) or member names")
        if size < 1:
            raise GraphError(f"topology spec {spec!r}: size must be at least 1, got {size}")
        return default_names(size)
    resolved = _sorted_names(names)
    if size is not None and size != len(resolved):
        raise GraphError(f"topology spec {spec!r} says {size} members but the roster has {len(resolved)}")
    return resolved


def _generate(spec: str, kind: str, args: list[str], names: Sequence[str] | None,
              rng: np.random.Generator) -> list[nx.Graph]:
    if kind == "torus":
        return [_torus(spec, args, names)]
    # Parameters after the size; when only those are given the size comes from the names.
    extra = {"regular": 1, "erdos-renyi": 1, "watts-strogatz": 2}.get(kind, 0)
    if len(args) > extra + 1:
        raise GraphError(f"bad topology spec {spec!r}: too many ':' parts (try {SPEC_HELP})")
    size = None
    if len(args) == extra + 1:
        size = int(_number(spec, args.pop(0), int))
    member = _resolve_names(spec, size, names)
    n = len(member)
    simple: dict[str, Callable[[Sequence[str]], nx.Graph]] = {
        "ring": gen.ring, "complete": gen.complete, "star": gen.star, "hypercube": gen.hypercube,
        "exponential": gen.exponential, "directed-ring": gen.directed_ring,
        "directed-exponential": gen.directed_exponential,
    }
    if kind in simple:
        return [simple[kind](member)]
    if kind == "one-peer-exponential":
        return list(gen.one_peer_exponential(member))
    if kind == "directed-one-peer-exponential":
        return list(gen.directed_one_peer_exponential(member))
    if n == 1:
        return [gen.complete(member)]
    if kind == "regular":
        degree = int(_number(spec, args[0], int)) if args else min(4, n - 1)
        return [gen.random_regular(member, degree, rng)]
    if kind == "erdos-renyi":
        # Default: twice the connectivity threshold ln(n)/n, so a connected draw is likely.
        probability = _number(spec, args[0], float) if args else min(1.0, 2 * math.log(n) / n)
        return [gen.erdos_renyi(member, probability, rng)]
    k = int(_number(spec, args[0], int)) if args else min(4, n - 1)
    probability = _number(spec, args[1], float) if len(args) > 1 else 0.2
    return [gen.watts_strogatz(member, k, probability, rng)]


def _torus(spec: str, args: list[str], names: Sequence[str] | None) -> nx.Graph:
    if len(args) > 1:
        raise GraphError(f"bad topology spec {spec!r}: write torus:ROWSxCOLS (e.g. torus:4x4)")
    if args and "x" in args[0].lower():
        rows_text, _, cols_text = args[0].lower().partition("x")
        rows, cols = int(_number(spec, rows_text, int)), int(_number(spec, cols_text, int))
        member = _resolve_names(spec, rows * cols, names)
    else:
        member = _resolve_names(spec, int(_number(spec, args[0], int)) if args else None, names)
        rows, cols = gen.torus_shape(len(member))
    return gen.torus(member, rows, cols)


def from_rounds(rounds: Sequence[nx.Graph], names: Sequence[str], *, directed: bool,
                weights: str = "metropolis", spec: str = "") -> Topology:
    """A Topology whose round t mixes over ``rounds[t]`` (all over the same member names)."""
    member = _sorted_names(names)
    schedule = tuple(mixing_matrix(graph, member, weights) for graph in rounds)
    union = nx.compose_all(list(rounds)) if len(rounds) > 1 else rounds[0]
    return Topology(names=member, directed=directed, graph=with_weights(union, schedule, member),
                    schedule=schedule, spec=spec)


def from_graph(graph: nx.Graph, names: Sequence[str] | None = None, *, weights: str = "metropolis",
               spec: str = "") -> Topology:
    """A static Topology over a given graph (e.g. loaded from a file); ``names``, when given,
    must be exactly the graph's nodes."""
    nodes = {str(node) for node in graph.nodes}
    if names is not None:
        member = _sorted_names(names)
        unknown = sorted(nodes - set(member))
        if unknown:
            raise GraphError(f"unknown node {unknown[0]!r} in the graph (not a member of the roster)")
        missing = sorted(set(member) - nodes)
        if missing:
            raise GraphError(f"member {missing[0]!r} is missing from the graph")
    return from_rounds([graph], sorted(nodes), directed=graph.is_directed(), weights=weights, spec=spec)

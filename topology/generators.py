"""Graph generators over sorted member names.

Every generator takes the member names (already sorted; index ``i`` is
``names[i]``) and returns a networkx graph with those names as nodes.
Time-varying generators return one graph per round of their period. Mixing
weights are put on the edges later (:mod:`topology.mixing`), so a generator
only decides *who talks to whom*.

Random generators take a ``numpy.random.Generator`` explicitly; each attempt
derives a fresh integer seed from it for networkx, so the same seed gives the
same graph and no global random state is touched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import networkx as nx
import numpy as np

from topology.errors import GraphError

# A random graph that is disconnected is redrawn; after this many tries the
# parameters are almost surely too sparse, so we say so instead of looping.
MAX_CONNECT_ATTEMPTS = 100


def _empty(names: Sequence[str], *, directed: bool = False) -> nx.Graph:
    graph: nx.Graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_nodes_from(names)
    return graph


def _add_offsets(graph: nx.Graph, names: Sequence[str], offsets: Sequence[int]) -> nx.Graph:
    """Connect i to i + d (mod n) for every offset d (skipping self loops)."""
    n = len(names)
    for i in range(n):
        for d in offsets:
            j = (i + d) % n
            if j != i:
                graph.add_edge(names[i], names[j])
    return graph


def _powers_of_two_below(n: int) -> list[int]:
    return [1 << k for k in range(n.bit_length()) if (1 << k) < n]


def _require_power_of_two(kind: str, n: int) -> int:
    if n < 1 or n & (n - 1):
        below = 1 << (n.bit_length() - 1) if n > 0 else 1
        raise GraphError(f"{kind} needs a power-of-two number of members, got {n} "
                         f"(nearest: {below} or {below * 2})")
    return n.bit_length() - 1


def ring(names: Sequence[str]) -> nx.Graph:
    """Each member talks to its two neighbours on a cycle."""
    return _add_offsets(_empty(names), names, [1])


def torus(names: Sequence[str], rows: int, cols: int) -> nx.Graph:
    """A rows x cols grid with wrap-around; member ``r * cols + c`` sits at (r, c)."""
    if rows < 1 or cols < 1 or rows * cols != len(names):
        raise GraphError(f"torus {rows}x{cols} needs {rows * cols} members, got {len(names)}")
    graph = _empty(names)
    for r in range(rows):
        for c in range(cols):
            here = names[r * cols + c]
            for other in (names[r * cols + (c + 1) % cols], names[((r + 1) % rows) * cols + c]):
                if other != here:
                    graph.add_edge(here, other)
    graph.graph["grid"] = (rows, cols)
    return graph


def torus_shape(n: int) -> tuple[int, int]:
    """The squarest rows x cols factorisation of n (rows <= cols)."""
    rows = math.isqrt(n)
    while rows > 1 and n % rows:
        rows -= 1
    return max(rows, 1), n // max(rows, 1)


def complete(names: Sequence[str]) -> nx.Graph:
    graph = _empty(names)
    graph.add_edges_from((a, b) for i, a in enumerate(names) for b in names[i + 1:])
    return graph


def star(names: Sequence[str]) -> nx.Graph:
    """The first (sorted) member is the hub."""
    graph = _empty(names)
    graph.add_edges_from((names[0], other) for other in names[1:])
    return graph


def hypercube(names: Sequence[str]) -> nx.Graph:
    """Members i and j are neighbours when their indices differ in one bit."""
    dims = _require_power_of_two("hypercube", len(names))
    graph = _empty(names)
    for i in range(len(names)):
        for k in range(dims):
            j = i ^ (1 << k)
            if j > i:
                graph.add_edge(names[i], names[j])
    return graph


def exponential(names: Sequence[str]) -> nx.Graph:
    """Static exponential graph: i talks to i +- 2^k for every 2^k < n."""
    return _add_offsets(_empty(names), names, _powers_of_two_below(len(names)))


def directed_ring(names: Sequence[str]) -> nx.DiGraph:
    """i sends to i + 1 only."""
    return _add_offsets(_empty(names, directed=True), names, [1])


def directed_exponential(names: Sequence[str]) -> nx.DiGraph:
    """i sends to i + 2^k for every 2^k < n."""
    return _add_offsets(_empty(names, directed=True), names, _powers_of_two_below(len(names)))


def one_peer_period(n: int) -> int:
    """Rounds in a one-peer exponential schedule: ceil(log2 n), at least 1."""
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def one_peer_exponential(names: Sequence[str]) -> list[nx.Graph]:
    """Round t pairs i with i + 2^t (mod n); a member already paired sits the round out.

    For n a power of two every round is a perfect matching (i with i XOR 2^t),
    and averaging each pair with weight 1/2 makes the period's product exactly J/n.
    """
    n = len(names)
    rounds = []
    for t in range(one_peer_period(n)):
        graph = _empty(names)
        paired: set[int] = set()
        distance = (1 << t) % n if n > 1 else 0
        for i in range(n):
            j = (i + distance) % n
            if i in paired or j in paired or i == j:
                continue
            graph.add_edge(names[i], names[j])
            paired.update((i, j))
        rounds.append(graph)
    return rounds


def directed_one_peer_exponential(names: Sequence[str]) -> list[nx.DiGraph]:
    """Round t: i sends to i + 2^t (mod n). With weight 1/2 (push-sum) the product is J/n for n = 2^k."""
    n = len(names)
    return [_add_offsets(_empty(names, directed=True), names, [(1 << t) % n if n > 1 else 0])
            for t in range(one_peer_period(n))]


def _connected_draw(kind: str, draw: Callable[[int], nx.Graph], rng: np.random.Generator,
                    names: Sequence[str], hint: str) -> nx.Graph:
    for _ in range(MAX_CONNECT_ATTEMPTS):
        graph = draw(int(rng.integers(0, 2**63 - 1)))
        if graph.number_of_nodes() <= 1 or nx.is_connected(graph):
            return nx.relabel_nodes(graph, dict(enumerate(names)))
    raise GraphError(f"{kind}: no connected graph in {MAX_CONNECT_ATTEMPTS} draws; {hint}")


def random_regular(names: Sequence[str], degree: int, rng: np.random.Generator) -> nx.Graph:
    n = len(names)
    if degree < 1 or degree >= n or (n * degree) % 2:
        raise GraphError(f"regular: degree {degree} impossible for {n} members "
                         "(need 1 <= degree < n and n * degree even)")
    return _connected_draw("regular", lambda s: nx.random_regular_graph(degree, n, seed=s), rng, names,
                           "try a larger degree")


def erdos_renyi(names: Sequence[str], probability: float, rng: np.random.Generator) -> nx.Graph:
    if not 0.0 < probability <= 1.0:
        raise GraphError(f"erdos-renyi: edge probability must be in (0, 1], got {probability}")
    n = len(names)
    return _connected_draw("erdos-renyi", lambda s: nx.gnp_random_graph(n, probability, seed=s), rng,
                           names, f"edge probability {probability} is too small for {n} members")


def watts_strogatz(names: Sequence[str], k: int, probability: float, rng: np.random.Generator) -> nx.Graph:
    n = len(names)
    if k < 2 or k >= n:
        raise GraphError(f"watts-strogatz: need 2 <= k < n neighbours, got k={k} for {n} members")
    if not 0.0 <= probability <= 1.0:
        raise GraphError(f"watts-strogatz: rewiring probability must be in [0, 1], got {probability}")
    return _connected_draw("watts-strogatz", lambda s: nx.watts_strogatz_graph(n, k, probability, seed=s),
                           rng, names, "try a smaller rewiring probability or a larger k")

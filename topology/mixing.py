"""Mixing matrices: building W from a graph, and checking that gossip with W converges.

Convention everywhere: ``x_i <- sum_j W[i, j] x_j``. An undirected edge
{a, b} gives ``W[a, b] = W[b, a]``; a directed edge a -> b (a sends to b)
gives ``W[b, a]``, the share of a's mass that b receives (push-sum).

- undirected gossip needs a connected graph and W symmetric doubly stochastic
  (then every member converges to the exact average);
- push-sum needs a strongly connected graph and W column stochastic (mass is
  conserved; the weight channel corrects for the non-uniform stationary vector).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np

from topology.errors import GraphError

WEIGHT_SCHEMES = ("metropolis", "max-degree", "edges")
# Rows/columns of W must sum to 1 to within this; weights read from files are
# often written with a few decimals, so exact equality would be too strict.
STOCHASTIC_TOLERANCE = 1e-6


def _shown(names: Sequence[str], limit: int = 5) -> str:
    listed = ", ".join(names[:limit])
    return listed + (f", ... ({len(names)} members)" if len(names) > limit else "")


def mixing_matrix(graph: nx.Graph, names: Sequence[str], weights: str = "metropolis") -> np.ndarray:
    """W for ``graph`` over ``names`` (sorted member names) with the given weight scheme.

    - ``metropolis``: undirected ``W[i,j] = 1 / (1 + max(deg i, deg j))``;
      directed: each sender keeps and sends equal shares, ``1 / (1 + outdeg)``.
    - ``max-degree``: every edge ``1 / (1 + max degree)`` (max out-degree when directed).
    - ``edges``: the ``weight`` attribute on every edge.
    The diagonal takes what is left, so rows (undirected) or columns (directed) sum to 1.
    """
    if weights not in WEIGHT_SCHEMES:
        raise GraphError(f"unknown weight scheme {weights!r} (choose from {', '.join(WEIGHT_SCHEMES)})")
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    directed = graph.is_directed()
    degree = dict(graph.out_degree() if directed else graph.degree())
    max_degree = max(degree.values(), default=0)
    matrix = np.zeros((n, n))
    for source, target, data in graph.edges(data=True):
        if source == target:
            raise GraphError(f"self loop on node {source!r}: a member's own share is implied, not an edge")
        if weights == "edges":
            if "weight" not in data:
                raise GraphError(f"edge {source!r}-{target!r} has no 'weight' attribute (weights='edges')")
            value = float(data["weight"])
        elif weights == "max-degree":
            value = 1.0 / (1 + max_degree)
        elif directed:
            value = 1.0 / (1 + degree[source])
        else:
            value = 1.0 / (1 + max(degree[source], degree[target]))
        i, j = index[source], index[target]
        matrix[j, i] = value
        if not directed:
            matrix[i, j] = value
    sums = matrix.sum(axis=0) if directed else matrix.sum(axis=1)
    matrix[np.diag_indices(n)] = 1.0 - sums
    return matrix


def validate_matrix(matrix: np.ndarray, names: Sequence[str], *, directed: bool, label: str = "W") -> None:
    """Raise GraphError naming the node or edge where W is not a valid mixing matrix."""
    n = len(names)
    if matrix.shape != (n, n):
        raise GraphError(f"{label} has shape {matrix.shape}, expected ({n}, {n})")
    if not np.all(np.isfinite(matrix)):
        i, j = np.argwhere(~np.isfinite(matrix))[0]
        raise GraphError(f"{label}: weight on edge {names[j]!r}->{names[i]!r} is not finite")
    if np.any(matrix < -STOCHASTIC_TOLERANCE):
        i, j = np.argwhere(matrix < -STOCHASTIC_TOLERANCE)[0]
        if i == j:
            raise GraphError(f"{label}: node {names[i]!r} has negative self weight {matrix[i, i]:.6g} "
                             "(its edge weights sum to more than 1)")
        raise GraphError(f"{label}: edge {names[j]!r}->{names[i]!r} has negative weight {matrix[i, j]:.6g}")
    if directed:
        sums = matrix.sum(axis=0)
        bad = np.flatnonzero(np.abs(sums - 1.0) > STOCHASTIC_TOLERANCE)
        if bad.size:
            k = int(bad[0])
            raise GraphError(f"{label} is not column stochastic: what node {names[k]!r} sends "
                             f"(itself included) sums to {sums[k]:.6g}, not 1")
        return
    asymmetric = np.argwhere(np.abs(matrix - matrix.T) > STOCHASTIC_TOLERANCE)
    if asymmetric.size:
        i, j = asymmetric[0]
        raise GraphError(f"{label} is not symmetric: edge {names[i]!r}-{names[j]!r} has weight "
                         f"{matrix[i, j]:.6g} one way and {matrix[j, i]:.6g} the other")
    sums = matrix.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > STOCHASTIC_TOLERANCE)
    if bad.size:
        k = int(bad[0])
        raise GraphError(f"{label} is not doubly stochastic: weights of node {names[k]!r} "
                         f"(itself included) sum to {sums[k]:.6g}, not 1")


def support_graph(matrices: Sequence[np.ndarray], names: Sequence[str], *, directed: bool) -> nx.Graph:
    """The graph of who hears from whom in any of the matrices (edge j -> i where W[i, j] > 0)."""
    graph: nx.Graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_nodes_from(names)
    for matrix in matrices:
        for i, j in np.argwhere(matrix > 0):
            if i != j:
                graph.add_edge(names[j], names[i])
    return graph


def validate_connectivity(graph: nx.Graph, names: Sequence[str], *, what: str = "graph") -> None:
    """Undirected: connected; directed: strongly connected. The error names unreachable members."""
    if len(names) <= 1:
        return
    first = names[0]
    if not graph.is_directed():
        reached = nx.node_connected_component(graph, first)
        missing = [name for name in names if name not in reached]
        if missing:
            raise GraphError(f"{what} is disconnected: {_shown(missing)} cannot be reached from {first!r}")
        return
    downstream = nx.descendants(graph, first) | {first}
    missing = [name for name in names if name not in downstream]
    if missing:
        raise GraphError(f"{what} is not strongly connected: {_shown(missing)} "
                         f"cannot be reached from {first!r}")
    upstream = nx.ancestors(graph, first) | {first}
    missing = [name for name in names if name not in upstream]
    if missing:
        raise GraphError(f"{what} is not strongly connected: {first!r} "
                         f"cannot be reached from {_shown(missing)}")


def validate_schedule(matrices: Sequence[np.ndarray], names: Sequence[str], *, directed: bool) -> None:
    """Every round's W must be stochastic; connectivity is required of the period's union only
    (a one-peer round alone is a matching, disconnected by design)."""
    if not matrices:
        raise GraphError("a mixing schedule needs at least one round")
    for t, matrix in enumerate(matrices):
        label = "W" if len(matrices) == 1 else f"W (round {t})"
        validate_matrix(matrix, names, directed=directed, label=label)
    what = "graph" if len(matrices) == 1 else f"union of the {len(matrices)} rounds"
    validate_connectivity(support_graph(matrices, names, directed=directed), names, what=what)

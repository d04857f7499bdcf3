"""The Topology: who mixes with whom, with which weight, in which round.

A static topology has one mixing matrix (period 1); a time-varying one (the
one-peer exponential graph) cycles through ``period`` matrices, round ``t``
using ``schedule[t % period]``. Matrices are validated once, when the
Topology is made, and are read-only afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from topology.errors import GraphError
from topology.mixing import validate_schedule


@dataclass(frozen=True, kw_only=True, eq=False)
class Topology:
    """Mixing schedule over sorted member names.

    ``directed`` False: every W is symmetric doubly stochastic (plain gossip
    averaging). ``directed`` True: every W is column stochastic (the push-sum
    family). ``graph`` is the union over the period, with node attributes
    (``speed``, ``role``) and edge attributes (``latency_ms``,
    ``bandwidth_mbps``, ``loss``) when the source gave them, and the mixing
    ``weight`` on each edge. The graph is frozen (``graph.copy()`` to edit).
    """

    names: tuple[str, ...]
    directed: bool
    graph: nx.Graph
    schedule: tuple[np.ndarray, ...]
    spec: str = ""  # how it was made, for display ("ring:16", a file path, ...)
    _index: dict[str, int] = field(init=False, repr=False)
    _in: tuple[tuple[dict[str, float], ...], ...] = field(init=False, repr=False)
    _out: tuple[tuple[dict[str, float], ...], ...] = field(init=False, repr=False)
    _neighbours: tuple[tuple[str, ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if list(self.names) != sorted(set(self.names)):
            raise GraphError("topology member names must be unique and sorted")
        if set(self.graph.nodes) != set(self.names) or self.graph.is_directed() != self.directed:
            raise GraphError("a topology's graph must have exactly the member names as nodes "
                             "and the same directedness")
        validate_schedule(self.schedule, self.names, directed=self.directed)
        nx.freeze(self.graph)  # shared by every reader; copy() it to change it
        frozen = []
        for matrix in self.schedule:
            copy = np.array(matrix, dtype=np.float64, copy=True)
            copy.setflags(write=False)
            frozen.append(copy)
        object.__setattr__(self, "schedule", tuple(frozen))
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(self.names)})
        ins, outs = [], []
        for matrix in self.schedule:
            ins.append(tuple(self._row(matrix[i], i) for i in range(len(self.names))))
            outs.append(tuple(self._row(matrix[:, i], i) for i in range(len(self.names))))
        object.__setattr__(self, "_in", tuple(ins))
        object.__setattr__(self, "_out", tuple(outs))
        # the union over the period, worked out once: drivers ask for it at every liveness check
        neighbours = (sorted({j for rows in (*ins, *outs) for j in rows[i]}) for i in range(len(self.names)))
        object.__setattr__(self, "_neighbours", tuple(tuple(names) for names in neighbours))

    def _row(self, values: np.ndarray, own: int) -> dict[str, float]:
        return {self.names[j]: float(values[j]) for j in np.flatnonzero(values > 0) if j != own}

    @property
    def period(self) -> int:
        """Number of mixing matrices in the schedule; 1 when static."""
        return len(self.schedule)

    @property
    def size(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        """Position of ``name`` among the sorted member names (its row/column in W)."""
        try:
            return self._index[name]
        except KeyError:
            raise GraphError(f"unknown member {name!r} (not in this topology)") from None

    def mixing(self, t: int = 0) -> np.ndarray:
        """W_t (float64, n x n, read-only): ``x_i <- sum_j W[i, j] x_j`` in round t."""
        return self.schedule[t % self.period]

    def in_neighbours(self, name: str, t: int = 0) -> dict[str, float]:
        """{j: W_t[i, j]} for every j != i with W_t[i, j] > 0, in name order: whom ``name`` hears from."""
        return dict(self._in[t % self.period][self.index(name)])

    def out_neighbours(self, name: str, t: int = 0) -> dict[str, float]:
        """{k: W_t[k, i]} for every k != i with W_t[k, i] > 0, in name order: whom ``name`` sends to."""
        return dict(self._out[t % self.period][self.index(name)])

    def neighbours(self, name: str) -> tuple[str, ...]:
        """Everyone ``name`` hears from or sends to in any round of the schedule, sorted, never itself.

        The one neighbour set of every driver: whom a peer connects to and whose silence it watches.
        """
        return self._neighbours[self.index(name)]

    def self_weight(self, name: str, t: int = 0) -> float:
        """W_t[i, i]: the share of its own value a member keeps in round t."""
        i = self.index(name)
        return float(self.schedule[t % self.period][i, i])


def with_weights(graph: nx.Graph, schedule: Sequence[np.ndarray], names: Sequence[str]) -> nx.Graph:
    """A copy of ``graph`` with each edge's mixing ``weight`` (its largest over the period)."""
    out = graph.copy()
    index = {name: i for i, name in enumerate(names)}
    for source, target, data in out.edges(data=True):
        i, j = index[source], index[target]
        data["weight"] = max(float(w[j, i]) if out.is_directed() else float(w[i, j]) for w in schedule)
    return out

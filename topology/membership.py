"""A graph whose membership changes at a round: the old graph before it, the new one from it on.

When the roster gains or loses members while a run goes on, every member
applies the change at the same ``effective_round`` (protocols/node/membership.py).
The machines already ask for the graph of each round (``in_neighbours(name,
t)``, the time-varying topologies' interface), so a membership change is one
more graph that answers by round: :class:`ChangingGraph` reads ``before`` for
rounds ``t < effective_round`` and ``after`` from it on. Changes chain: a second
one wraps the first as its ``before``.

A member missing from the graph of a round (a joiner before its round, a
leaver after it) has no neighbours in it and keeps its whole value (self
weight 1). ``names`` is the union of both graphs' members, so a machine built
for either side finds its own name.
"""

from __future__ import annotations

from typing import Protocol


class GraphView(Protocol):
    """What a machine reads of a graph (``topology.Topology`` has it): W_t by name, per round."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def directed(self) -> bool: ...

    @property
    def period(self) -> int: ...

    def in_neighbours(self, name: str, t: int) -> dict[str, float]: ...

    def out_neighbours(self, name: str, t: int) -> dict[str, float]: ...

    def self_weight(self, name: str, t: int) -> float: ...


class RoundGraph(GraphView, Protocol):
    """A :class:`GraphView` that also names a member's neighbours over all rounds (what the Node
    tracks for liveness and state sync)."""

    def neighbours(self, name: str) -> tuple[str, ...]: ...


class ChangingGraph:
    """``before`` for rounds < ``effective_round``, ``after`` from it on (see the module docstring)."""

    def __init__(self, before: RoundGraph, after: RoundGraph, effective_round: int) -> None:
        if before.directed != after.directed:
            raise ValueError("a membership change cannot turn a directed graph undirected or back")
        if effective_round < 0:
            raise ValueError(f"effective_round must be >= 0, not {effective_round}")
        self.before = before
        self.after = after
        self.effective_round = effective_round
        self._names = tuple(sorted({*before.names, *after.names}))
        self._before_names = frozenset(before.names)
        self._after_names = frozenset(after.names)

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def directed(self) -> bool:
        return self.after.directed

    @property
    def period(self) -> int:
        """The period of the graph in force from ``effective_round`` on (static graphs: 1)."""
        return self.after.period

    def _at(self, name: str, t: int) -> RoundGraph | None:
        graph, members = ((self.before, self._before_names) if t < self.effective_round
                          else (self.after, self._after_names))
        if name in members:
            return graph
        if name not in self._names:
            raise KeyError(f"unknown member {name!r} (in neither graph)")
        return None

    def in_neighbours(self, name: str, t: int = 0) -> dict[str, float]:
        graph = self._at(name, t)
        return {} if graph is None else graph.in_neighbours(name, t)

    def out_neighbours(self, name: str, t: int = 0) -> dict[str, float]:
        graph = self._at(name, t)
        return {} if graph is None else graph.out_neighbours(name, t)

    def self_weight(self, name: str, t: int = 0) -> float:
        graph = self._at(name, t)
        return 1.0 if graph is None else graph.self_weight(name, t)

    def neighbours(self, name: str) -> tuple[str, ...]:
        """Everyone ``name`` exchanges with on either side of the change (whom to stay connected to
        until the change is in force)."""
        found: set[str] = set()
        for graph, members in ((self.before, self._before_names), (self.after, self._after_names)):
            if name in members:
                found.update(graph.neighbours(name))
        return tuple(sorted(found))

    def neighbours_from(self, name: str) -> tuple[str, ...]:
        """Whom ``name`` exchanges with once the change is in force (none: it left)."""
        return self.after.neighbours(name) if name in self._after_names else ()

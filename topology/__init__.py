"""Communication graphs, mixing weights, time-varying schedules and spectral analysis.

``build("ring:16")`` (or a graph file) gives a validated :class:`Topology`:
the sorted member names and the mixing matrix of every round.
"""

from topology.errors import GraphError, HivemeshError
from topology.schedule import Topology
from topology.spec import KINDS, build, default_names, from_graph, from_rounds

__all__ = ["KINDS", "GraphError", "HivemeshError", "Topology", "build", "default_names", "from_graph",
           "from_rounds"]

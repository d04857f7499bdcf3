"""Errors of the graph layer: :class:`GraphError`, a :class:`HivemeshError` (protocols.errors).

The CLI prints either as ``hivemesh: error: ...``, never as a traceback.
"""

from protocols.errors import HivemeshError

__all__ = ["GraphError", "HivemeshError"]


class GraphError(HivemeshError, ValueError):
    """A malformed or unusable communication graph; the message names the node or edge."""

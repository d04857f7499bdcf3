"""The one exception family a user sees as a plain message instead of a traceback.

It lives in the lowest package so that every layer (topology, protocols,
peer, sim) can raise it; the CLI catches it and prints ``hivemesh: error: ...``.
"""


class HivemeshError(Exception):
    """A problem the user can fix: bad config, bad graph, bad key file, ..."""


class GraphError(HivemeshError, ValueError):
    """A malformed or unusable communication graph; the message names the node or edge."""

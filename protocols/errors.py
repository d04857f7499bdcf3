"""The one exception family a user sees as a plain message instead of a traceback.

Every layer (topology, protocols, peer, sim) raises it for a problem the user can fix; the CLI
catches it and prints ``hivemesh: error: ...``. This module imports nothing, so any module may
import it without forming a circle.
"""


class HivemeshError(Exception):
    """A problem the user can fix: bad config, bad graph, bad key file, ..."""

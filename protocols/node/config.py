"""NodeConfig: the settings of what a member does around its algorithm (liveness, state sync), one
definition for both drivers.

A peer file's ``[peer]`` table and a scenario's ``[nodes]`` table both extend it
(peer.runtime.peerconfig.PeerSection, sim.scenario.NodesConfig), so these keys have one
name, one default and one validation in both files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """Times are seconds of the driver's clock (wall clock for the daemon, virtual for the simulator)."""

    # signed liveness messages to every neighbour, with the trainer's step and "finished"
    heartbeat_interval_s: float = 1.0
    # a neighbour silent this long is reported down (the machine's deadlines still decide rounds)
    neighbour_timeout_s: float = 5.0
    # wait this long for every neighbour before the first round (slow starts, many processes)
    start_timeout_s: float = 60.0

    # each answer is the whole model: a neighbour that keeps asking must not make us send it in a loop
    sync_answer_interval_s: float = 5.0
    # a neighbour answers at once when it is running; one that has not in this long is asked again
    sync_timeout_s: float = 10.0
    # asks this many times, then the member trains on from its checkpoint (or the initial model) alone
    sync_attempts: int = 6

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval_s", "start_timeout_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not (math.isfinite(self.neighbour_timeout_s) and self.neighbour_timeout_s > 0):
            raise ValueError(f"neighbour_timeout_s must be > 0, got {self.neighbour_timeout_s}")
        if not self.sync_answer_interval_s >= 0:
            raise ValueError(f"sync_answer_interval_s must be >= 0, got {self.sync_answer_interval_s}")
        if not self.sync_timeout_s > 0:
            raise ValueError(f"sync_timeout_s must be > 0, got {self.sync_timeout_s}")
        if self.sync_attempts < 1:
            raise ValueError(f"sync_attempts must be >= 1, got {self.sync_attempts}")

    def node_config(self) -> NodeConfig:
        """Just these settings (a subclass's own keys dropped): what the Node is given."""
        return NodeConfig(**{f.name: getattr(self, f.name) for f in fields(NodeConfig)})

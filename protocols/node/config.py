"""NodeConfig: the settings of what a member does around its algorithm (state sync), one definition
for both drivers."""

from __future__ import annotations

from dataclasses import dataclass

SYNC_ANSWER_INTERVAL_S = 5.0  # the default of NodeConfig.sync_answer_interval_s (and of peer.toml's key)


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """Times are seconds of the driver's clock (wall clock for the daemon, virtual for the simulator)."""

    # each answer is the whole model: a neighbour that keeps asking must not make us send it in a loop
    sync_answer_interval_s: float = SYNC_ANSWER_INTERVAL_S
    # a neighbour answers at once when it is running; one that has not in this long is asked again
    sync_timeout_s: float = 10.0
    # then the member trains on from its checkpoint (or the initial model) alone
    sync_attempts: int = 6

    def __post_init__(self) -> None:
        if not self.sync_answer_interval_s >= 0:
            raise ValueError(f"sync_answer_interval_s must be >= 0, got {self.sync_answer_interval_s}")
        if not self.sync_timeout_s > 0:
            raise ValueError(f"sync_timeout_s must be > 0, got {self.sync_timeout_s}")
        if self.sync_attempts < 1:
            raise ValueError(f"sync_attempts must be >= 1, got {self.sync_attempts}")

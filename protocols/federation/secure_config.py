"""``[federation.secure_aggregation]``: protocols.secagg's settings, plus masking and the weights' cap.

Its own module, below both users: secure.py (the gateway's and the client's side of a secure
round) and distributed_dp.py (the noise each client adds under it) read it, and the federation
config (config.py) holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocols.federation.grouped import GROUP_AGGREGATORS
from protocols.secagg import SecAggConfig, SecAggConfigError
from protocols.secagg.fixedpoint import RING_BITS

PLAIN_BITS_MAX = 24  # masking off: quantised integers travel as float32, exact up to 2^24
WEIGHT_SUM_MAX = (1 << (RING_BITS - 1)) - 1  # the survivors' summed weight decodes exactly up to here


@dataclass(frozen=True, kw_only=True)
class SecureAggregationConfig(SecAggConfig):
    """``[federation.secure_aggregation]``: protocols.secagg's settings, plus whether to mask."""

    masking: bool = True  # false: clip and quantise only, in the clear (a baseline; no privacy)
    # W, samples: a client weighs min(num_samples, W) and scales its update by weight / W before
    # quantising (a client at the cap gets all 2^(bits-1) - 1 levels); 1: the unweighted mean
    weight_cap_samples: int = 1000
    # offences (secagg/blame.py) after which the gateway asks a client into no later round: 3, so a
    # one-off fault is not a ban while one colluder can cost the honest at most 3 accusations'
    # worth of shares; 0: never barred (still named)
    blame_limit: int = 3
    # grouped secure aggregation (grouped.py): each round's cohort drawn into up to ``groups``
    # groups of at least ``min_group``, SecAgg per group, the group means combined robustly, so one
    # extreme input spoils one group's mean only; 1: plain SecAgg over the whole cohort
    groups: int = 1
    min_group: int = 5  # a group's fewest clients: the crowd each group mean hides a client in
    group_aggregator: str = "median"  # or "trimmed_mean": how the group means are combined
    group_trim_beta: float = 0.2  # trimmed_mean: the share of group means dropped at each end

    def validate(self, num_clients: int | None = None) -> None:
        super().validate(num_clients)
        if isinstance(self.groups, bool) or not isinstance(self.groups, int) or self.groups < 1:
            raise SecAggConfigError(f"secure_aggregation.groups must be an integer >= 1, not {self.groups!r}")
        if isinstance(self.min_group, bool) or not isinstance(self.min_group, int) \
                or (self.groups > 1 and self.min_group < self.roster_floor()):
            raise SecAggConfigError(f"secure_aggregation.min_group must be an integer >= "
                                    f"{self.roster_floor()} (the smallest key roster a client accepts), "
                                    f"not {self.min_group!r}")
        if self.group_aggregator not in GROUP_AGGREGATORS:
            raise SecAggConfigError(f"secure_aggregation.group_aggregator must be one of "
                                    f"{GROUP_AGGREGATORS}, not {self.group_aggregator!r}")
        if not 0.0 <= self.group_trim_beta < 0.5:
            raise SecAggConfigError("secure_aggregation.group_trim_beta must be in [0, 0.5), "
                                    f"not {self.group_trim_beta}")
        limit = self.blame_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise SecAggConfigError(f"secure_aggregation.blame_limit must be an integer >= 0 (0: never bar), "
                                    f"not {limit!r}")
        if not self.masking and self.bits > PLAIN_BITS_MAX:
            raise SecAggConfigError(f"secure_aggregation.bits must be <= {PLAIN_BITS_MAX} with masking = "
                                    f"false (integers travel as float32), not {self.bits}")
        cap = self.weight_cap_samples
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise SecAggConfigError("secure_aggregation.weight_cap_samples must be an integer >= 1, "
                                    f"not {cap!r}")
        if self.max_clients * cap > WEIGHT_SUM_MAX:  # the summed weight is decoded as a signed ring value
            raise SecAggConfigError(
                f"secure_aggregation: {self.max_clients} clients of weight up to weight_cap_samples = {cap} "
                f"can overflow the ring's weight coordinate (their sum must stay <= {WEIGHT_SUM_MAX}); "
                "lower weight_cap_samples or max_clients")
        if not self.masking and cap > 1 << PLAIN_BITS_MAX:
            raise SecAggConfigError(f"secure_aggregation.weight_cap_samples must be <= 2^{PLAIN_BITS_MAX} "
                                    f"with masking = false (the weight travels as float32), not {cap}")

    def total_timeout_s(self) -> float:
        """The five rounds' deadlines together: the longest a masked round can take (s)."""
        return (self.advertise_timeout_s + self.share_timeout_s + self.masked_input_timeout_s
                + self.consistency_timeout_s + self.unmask_timeout_s)

"""``[federation.secure_aggregation]``: protocols.secagg's settings, plus masking and the weights' cap.

Its own module, below both users: secure.py (the gateway's and the client's side of a secure
round) and distributed_dp.py (the noise each client adds under it) read it, and the federation
config (config.py) holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def validate(self, num_clients: int | None = None) -> None:
        super().validate(num_clients)
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

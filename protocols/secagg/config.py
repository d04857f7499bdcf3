"""SecAgg's settings, and the federation settings it refuses to run beside.

One frozen dataclass, checked once (``validate``) with errors that name the key. ``threshold`` and
``degree`` depend on the cohort, so :meth:`SecAggConfig.degree_for` and
:meth:`SecAggConfig.threshold_for` resolve them for ``n`` clients that advertised keys.

Safety against a gateway that lies about who dropped needs ``2t > k`` (client.py's consistency
rule then leaves it at most one of each client's two secrets): the automatic t is a strict
majority of k, a fixed t is refused unless it is one at the largest k ``max_clients`` allows, and
every client checks it again on the roster it is sent (:meth:`SecAggConfig.runs_with`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from protocols.compress.spec import SpecError, parse_spec
from protocols.secagg.fixedpoint import RING_BITS, max_clients_for_bits

# Uplink compressors SecAgg refuses, and why: the gateway sums masked vectors in the ring, so every
# client must encode the same coordinates with the same (public) scale. Casts (identity, fp16,
# bf16) carry nothing per client and are accepted; the fixed-point encoding replaces them.
REFUSED_COMPRESSORS: dict[str, str] = {
    "qsgd": "carries a per-client norm per bucket (a scale)",
    "sign": "carries a per-client scale (mean |x|)",
    "powersgd": "sends per-client low-rank factors, whose sum is not the factors of the sum",
    "topk": "keeps a per-client set of coordinates",
    "topk-approx": "keeps a per-client set of coordinates",
    "randomk": "keeps a per-client set of coordinates (per-client seed)",
}


class SecAggConfigError(ValueError):
    """A SecAgg setting that is out of range, or a federation setting SecAgg cannot run with."""


@dataclass(frozen=True, kw_only=True)
class SecAggConfig:
    """How clients mask, share and quantise; how long the gateway waits in each of the five rounds."""

    degree: int = 0  # k, masking neighbours per client; 0: SecAgg+ auto (degree_for); >= n-1: plain SecAgg
    threshold: int = 0  # t, shares that rebuild a secret; 0: a strict majority of the k neighbours
    # the smallest key roster a client accepts (roster_floor: at most max_clients, at least t + 1
    # with t fixed); every client holds it from its own config, so a gateway cannot shrink a
    # client's neighbourhood, and with it t, below it: with 5, a gateway needs >= 3 colluders
    min_roster: int = 5
    clip_value: float = 1.0  # each coordinate is clipped to [-clip_value, clip_value] (update units)
    bits: int = 16  # per-client fixed-point width (sign included) inside the 32-bit ring
    max_clients: int = 1000  # the cohort size the ring must hold without overflow (checked against bits)
    advertise_timeout_s: float = 30.0  # round 0's deadline (keys advertised), from when the gateway opens it
    share_timeout_s: float = 30.0  # round 1's deadline (encrypted shares sent), from round 0's end
    masked_input_timeout_s: float = 60.0  # round 2's (masked inputs): clients train before they send
    consistency_timeout_s: float = 30.0  # round 3's (survivor set signed), from round 2's end
    unmask_timeout_s: float = 30.0  # round 4's (shares that remove the masks), from round 3's end

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, num_clients: int | None = None) -> None:
        """Raise SecAggConfigError naming the key that is wrong (and for ``num_clients``, if given)."""
        if self.degree < 0:
            raise SecAggConfigError(f"secure_aggregation.degree must be >= 0 (0: auto), not {self.degree}")
        if self.threshold < 0:
            raise SecAggConfigError("secure_aggregation.threshold must be >= 0 (0: majority of "
                                    f"neighbours), not {self.threshold}")
        if self.threshold == 1:
            raise SecAggConfigError("secure_aggregation.threshold must be >= 2: with 1 share any single "
                                    "neighbour (or the gateway holding one) learns the secret")
        if self.min_roster < 3:
            raise SecAggConfigError(f"secure_aggregation.min_roster must be >= 3, not {self.min_roster}: "
                                    "a sum of two tells each the other's input")
        if self.threshold and 2 * self.threshold <= self.degree_for(self.max_clients):
            k = self.degree_for(self.max_clients)
            raise SecAggConfigError(
                f"secure_aggregation.threshold = {self.threshold} is not a strict majority of the up to "
                f"{k} neighbours a client has (degree = {self.degree or 'auto'}, max_clients = "
                f"{self.max_clients}): a gateway telling two halves of them different survivor sets "
                f"could rebuild both of a client's secrets; set threshold > {k / 2:g}, or a smaller "
                "degree")
        if not (self.clip_value > 0 and math.isfinite(self.clip_value)):
            raise SecAggConfigError("secure_aggregation.clip_value must be > 0 and finite, "
                                    f"not {self.clip_value}")
        if not 2 <= self.bits <= RING_BITS - 1:
            raise SecAggConfigError(f"secure_aggregation.bits must be in [2, {RING_BITS - 1}], "
                                    f"not {self.bits}")
        if self.max_clients < 2:
            raise SecAggConfigError(f"secure_aggregation.max_clients must be >= 2, not {self.max_clients}")
        limit = max_clients_for_bits(self.bits)
        if self.max_clients > limit:
            raise SecAggConfigError(
                f"secure_aggregation: {self.max_clients} clients of {self.bits} bits can overflow the "
                f"{RING_BITS}-bit ring (at most {limit}); lower bits or max_clients")
        for key in ("advertise_timeout_s", "share_timeout_s", "masked_input_timeout_s",
                    "consistency_timeout_s", "unmask_timeout_s"):
            value = getattr(self, key)
            if not (value > 0 and math.isfinite(value)):
                raise SecAggConfigError(f"secure_aggregation.{key} must be > 0, not {value}")
        if num_clients is not None:
            if num_clients < 3:
                raise SecAggConfigError(f"secure aggregation needs at least 3 clients, not {num_clients}")
            if num_clients < self.roster_floor():
                raise SecAggConfigError(f"{num_clients} clients are fewer than the {self.roster_floor()} "
                                        "a client accepts in its key roster (secure_aggregation.min_roster, "
                                        "or threshold + 1)")
            if num_clients > self.max_clients:
                raise SecAggConfigError(f"{num_clients} clients exceed secure_aggregation.max_clients = "
                                        f"{self.max_clients} (the ring's overflow bound)")
            k = self.degree_for(num_clients)
            if self.threshold > k:
                raise SecAggConfigError(f"secure_aggregation.threshold = {self.threshold} exceeds the "
                                        f"{k} neighbours each of {num_clients} clients has")
            if 2 * self.threshold_for(num_clients) <= k:
                raise SecAggConfigError(f"secure_aggregation.threshold = {self.threshold} is not a strict "
                                        f"majority of the {k} neighbours each of {num_clients} clients has")

    def degree_for(self, num_clients: int) -> int:
        """k for ``num_clients``: the configured degree rounded up to even (a Harary ring needs it),
        or auto ``2 ceil(1.5 log2 n)`` (SecAgg+'s O(log n)), never above n - 1 (plain SecAgg)."""
        full = num_clients - 1
        wanted = self.degree if self.degree else 2 * math.ceil(1.5 * math.log2(max(num_clients, 2)))
        return full if wanted >= full else min(full, wanted + wanted % 2)

    def roster_floor(self) -> int:
        """The fewest advertised clients a round goes on with: ``min_roster`` (no more than
        ``max_clients``, the most a roster may hold) and, with t fixed, t + 1 (the survivors a sum
        needs)."""
        return max(min(self.min_roster, self.max_clients), self.threshold + 1 if self.threshold else 0)

    def runs_with(self, num_clients: int) -> bool:
        """Whether a round can go on with ``num_clients`` advertised: at least :meth:`roster_floor`
        and at most ``max_clients`` (the ring's bound; k grows with n), t <= k (each client has at
        least t neighbours to hold its shares) and 2t > k (two disjoint groups of neighbours, told
        different survivor sets, can never both reach t)."""
        t, k = self.threshold_for(num_clients), self.degree_for(num_clients)
        return self.roster_floor() <= num_clients <= self.max_clients and t <= k < 2 * t

    def threshold_for(self, num_clients: int) -> int:
        """t for ``num_clients``: the configured one, or floor(k/2) + 1 (a strict majority of the k
        neighbours, so two disjoint groups of honest neighbours can never both reach it). Never
        smaller for more clients (k grows with n), so a floor on the roster is a floor on t."""
        return self.threshold or self.degree_for(num_clients) // 2 + 1


def check_compatible(*, mode: str, uplink: str) -> None:
    """Refuse SecAgg beside FedBuff (no round for the masks to cancel in) and beside an uplink
    compressor listed in REFUSED_COMPRESSORS; ``uplink`` is a protocols/compress spec."""
    if mode == "fedbuff":
        raise SecAggConfigError("secure_aggregation cannot run with federation.mode = 'fedbuff': "
                                "masks cancel only in a sum over one synchronous round's cohort")
    try:
        name, _ = parse_spec(uplink)
    except SpecError as error:
        raise SecAggConfigError(f"federation.uplink: {error}") from None
    if name in REFUSED_COMPRESSORS:
        raise SecAggConfigError(f"secure_aggregation cannot run with federation.uplink = {uplink!r}: "
                                f"{name} {REFUSED_COMPRESSORS[name]}; use identity, fp16 or bf16")

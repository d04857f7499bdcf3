"""One federation's settings, shared by its server and its clients (part of the run id, so a
client with other settings is refused before it ever sends an update).

Defaults carry their unit and their reason; ``__post_init__`` names the key that is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from protocols.compress import SpecError, from_spec
from protocols.federation.distributed_dp import check_ring
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure_config import SecureAggregationConfig
from protocols.federation.server_opt import ServerOptConfig
from protocols.secagg import check_compatible

Aggregator = Literal["fedavg", "mean", "median", "trimmed_mean", "krum", "multi_krum"]
AGGREGATORS: tuple[str, ...] = ("fedavg", "mean", "median", "trimmed_mean", "krum", "multi_krum")
Mode = Literal["sync", "fedbuff"]


@dataclass(frozen=True, kw_only=True)
class FederationConfig:
    """How a server runs its rounds and how its clients train and upload."""

    mode: Mode = "sync"  # sync: FedAvg rounds; fedbuff: aggregate every buffer_size updates (asynchronous)
    rounds: int = 30  # sync: rounds to run; fedbuff: server model versions (aggregations) to make
    # --- sampling (sync) and concurrency (fedbuff)
    fraction: float = 0.1  # share of the registered clients asked each round (McMahan et al.'s C)
    # at least this many per round (fedbuff: distinct clients per buffer), and no round opens with fewer
    # registered
    min_clients: int = 2
    min_registered: int = 0  # no round opens before this many clients registered (0: min_clients)
    over_selection: float = 0.0  # ask ceil(m (1 + this)), take the first m (Bonawitz et al. 2019: 0.3)
    round_timeout_s: float = 60.0  # a round closes at this deadline with whatever answered (s)
    min_updates: int = 1  # a round closed with fewer accepted updates leaves the model unchanged
    # --- local work, sent in RoundStart: exactly one of the two is > 0
    local_epochs: int = 1  # epochs over the client's own data per round
    local_steps: int = 0  # or this many optimiser steps (0: use local_epochs)
    prox_mu: float = 0.0  # FedProx's proximal weight mu (Li et al. 2020); 0 = plain FedAvg
    # --- aggregation
    aggregator: Aggregator = "fedavg"  # fedavg weighs by (capped) num_samples; the others ignore it
    # each update's influence, bounded by its own round (FedBuff: its buffer) before any is applied
    # (influence.py); 0 turns one off. Not used under differential_privacy or secure_aggregation,
    # whose own clipping and weight cap bound each client (the gateway sees only sums under SecAgg)
    samples_multiple: float = 2.0  # a claimed num_samples is capped at this x the round's median claim
    norm_multiple: float = 2.0  # a delta is clipped to this x the round's median delta norm (L2)
    max_samples: int = 0  # a fixed cap on a client's claimed num_samples too (0: none)
    trim_beta: float = 0.2  # trimmed_mean: share dropped on each side, per coordinate
    byzantine: int = 0  # krum / multi_krum: clients assumed hostile (f)
    krum_selected: int = 0  # multi_krum: updates averaged (0: n - byzantine)
    clip_norm: float = 0.0  # a fixed L2 bound on each delta too (0: none)
    server_opt: ServerOptConfig = field(default_factory=ServerOptConfig)
    # client-level DP at the gateway (protocols/federation/privacy.py); None: off
    differential_privacy: DifferentialPrivacyConfig | None = None
    # secure aggregation, SecAgg+ (protocols/federation/secure.py, protocols/secagg/); None: off
    secure_aggregation: SecureAggregationConfig | None = None
    # --- FedBuff (Nguyen et al. 2022)
    buffer_size: int = 5  # K: the server aggregates every K accepted updates
    concurrency: int = 10  # clients training at once
    max_staleness: int = 10  # updates more server versions behind than this are refused
    staleness_exponent: float = 0.5  # weight (1 + s)^-this for s versions old (0.5: 1/sqrt)
    # --- payloads
    uplink: str = "qsgd:bits=8"  # a protocols/compress spec; clients keep error feedback across rounds
    downlink: str = "identity"  # the global model as sent; lossy specs change what clients start from
    seed: int = 0  # the root of every draw (sampling, stochastic rounding)

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "fedbuff"):
            raise ValueError(f"federation.mode must be sync or fedbuff, not {self.mode!r}")
        _at_least("rounds", self.rounds, 1)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"federation.fraction must be in (0, 1], not {self.fraction}")
        _at_least("min_clients", self.min_clients, 1)
        _at_least("min_registered", self.min_registered, 0)
        if not 0.0 <= self.over_selection <= 10.0:
            raise ValueError(f"federation.over_selection must be in [0, 10], not {self.over_selection}")
        if not (self.round_timeout_s > 0 and math.isfinite(self.round_timeout_s)):
            raise ValueError(f"federation.round_timeout_s must be > 0, not {self.round_timeout_s}")
        _at_least("min_updates", self.min_updates, 1)
        if self.local_epochs < 0 or self.local_steps < 0 or (self.local_epochs > 0) == (self.local_steps > 0):
            raise ValueError("federation: exactly one of local_epochs and local_steps must be > 0 "
                             f"(got {self.local_epochs}, {self.local_steps})")
        if self.prox_mu < 0:
            raise ValueError(f"federation.prox_mu must be >= 0, not {self.prox_mu}")
        if self.aggregator not in AGGREGATORS:
            raise ValueError(f"federation.aggregator must be one of {', '.join(AGGREGATORS)}, "
                             f"not {self.aggregator!r}")
        for key in ("samples_multiple", "norm_multiple"):
            multiple = getattr(self, key)
            if isinstance(multiple, bool) or not isinstance(multiple, int | float) \
                    or not (multiple == 0 or 1.0 <= multiple < math.inf):
                raise ValueError(f"federation.{key} must be 0 (off) or a number >= 1, not {multiple!r}")
        _at_least("max_samples", self.max_samples, 0)
        if not 0.0 <= self.trim_beta < 0.5:
            raise ValueError(f"federation.trim_beta must be in [0, 0.5), not {self.trim_beta}")
        _at_least("byzantine", self.byzantine, 0)
        _at_least("krum_selected", self.krum_selected, 0)
        if self.clip_norm < 0:
            raise ValueError(f"federation.clip_norm must be >= 0 (0 = off), not {self.clip_norm}")
        _at_least("buffer_size", self.buffer_size, 1)
        _at_least("concurrency", self.concurrency, 1)
        _at_least("max_staleness", self.max_staleness, 0)
        if self.staleness_exponent < 0:
            raise ValueError(f"federation.staleness_exponent must be >= 0, not {self.staleness_exponent}")
        for key in ("uplink", "downlink"):
            try:
                from_spec(getattr(self, key))
            except SpecError as error:
                raise ValueError(f"federation.{key}: {error}") from None
        if self.differential_privacy is not None:
            self._check_private()
        if self.secure_aggregation is not None:
            self._check_secure(self.secure_aggregation)

    @property
    def has_rounds(self) -> bool:
        """Whether the server runs rounds: sync FedAvg opens and closes them (a gateway's gossip can
        interleave with them, a client pauses between them); FedBuff aggregates every ``buffer_size``
        updates as they come, in no round."""
        return self.mode == "sync"

    def _check_private(self) -> None:
        """What DP-FedAvg's guarantee rests on: Poisson rounds, every sampled update counted the same."""
        if self.mode != "sync":
            raise ValueError("federation.differential_privacy needs mode 'sync': FedBuff's buffers are not "
                             "Poisson-sampled rounds, and the accountant knows only those")
        if self.over_selection != 0:
            raise ValueError(f"federation.over_selection must be 0 while differential_privacy is on, not "
                             f"{self.over_selection}: keeping the first m answers of n asked makes who "
                             "counts depend on speed, not on the Poisson draw the accountant assumes")
        if self.aggregator not in ("fedavg", "mean"):
            raise ValueError(f"federation.aggregator {self.aggregator!r} cannot be used with "
                             "differential_privacy: the noise is calibrated to the clipped mean (use fedavg)")
        if self.clip_norm != 0:
            raise ValueError("federation.clip_norm must be 0 while differential_privacy is on: the clip "
                             "norm is differential_privacy.clip_norm")

    def _check_secure(self, secure: SecureAggregationConfig) -> None:
        """What SecAgg's sum needs: one synchronous round, every asked client's masks in it, an
        uplink that carries no per-client scale, and a mean the gateway can take from a sum: each
        client's weight capped at ``secure_aggregation.weight_cap_samples`` (federation/secure.py)."""
        try:
            check_compatible(mode=self.mode, uplink=self.uplink)
        except ValueError as error:
            default = " (federation.uplink defaults to qsgd:bits=8: set uplink = \"identity\")" \
                if self.uplink == "qsgd:bits=8" else ""
            raise ValueError(f"{error}{default}") from None
        if self.differential_privacy is not None:  # distributed DP: the clients add the noise
            if secure.groups > 1:
                raise ValueError("secure_aggregation.groups must be 1 with differential_privacy: distributed "
                                 "DP's noise shares add up to its noise over the whole cohort's sum, not a "
                                 "group's")
            check_ring(self.differential_privacy, secure)
        if self.aggregator not in ("fedavg", "mean"):
            raise ValueError(f"federation.aggregator {self.aggregator!r} cannot be used with "
                             "secure_aggregation: the gateway sees only the sum (use fedavg or mean)")
        if self.aggregator == "mean" and secure.weight_cap_samples != 1:
            raise ValueError("federation.aggregator 'mean' under secure_aggregation needs "
                             "secure_aggregation.weight_cap_samples = 1 (every client weighs one), not "
                             f"{secure.weight_cap_samples}")
        if self.max_samples not in (0, secure.weight_cap_samples):
            raise ValueError(f"federation.max_samples = {self.max_samples} must be 0 or equal "
                             f"secure_aggregation.weight_cap_samples = {secure.weight_cap_samples}: under "
                             "secure aggregation the clients cap their own weight (the gateway never sees "
                             "num_samples), at weight_cap_samples")
        if self.clip_norm != 0:
            raise ValueError("federation.clip_norm must be 0 while secure_aggregation is on: the gateway "
                             "cannot clip a masked update (clients clip each coordinate to "
                             "secure_aggregation.clip_value)")
        if self.over_selection != 0:
            raise ValueError(f"federation.over_selection must be 0 while secure_aggregation is on, not "
                             f"{self.over_selection}: every asked client's masks are in the round's sum")
        if self.min_clients < 3:
            raise ValueError(f"federation.min_clients must be >= 3 while secure_aggregation is on, not "
                             f"{self.min_clients}: a sum of two tells each of them the other's update")
        if self.round_timeout_s < secure.total_timeout_s():
            raise ValueError(f"federation.round_timeout_s = {self.round_timeout_s} is shorter than the five "
                             f"secure_aggregation.*_timeout_s together ({secure.total_timeout_s()}): the "
                             f"round would close before its sum is formed (set round_timeout_s = "
                             f"{secure.total_timeout_s()} or more)")

    def clients_per_round(self, registered: int) -> int:
        """m (DP off): the updates a round takes, ``max(min_clients, ceil(fraction * registered))``,
        at most all."""
        return min(registered, max(self.min_clients, math.ceil(self.fraction * registered - 1e-9)))

    def asked_per_round(self, registered: int) -> int:
        """n >= m: the clients a round asks, ``ceil(m * (1 + over_selection))``, at most all."""
        wanted = self.clients_per_round(registered)
        return min(registered, math.ceil(wanted * (1.0 + self.over_selection) - 1e-9))

    def opening_registered(self) -> int:
        """The fewest registered clients a round opens with: ``min_registered``, at least ``min_clients``."""
        return max(self.min_clients, self.min_registered)

    def check_cohorts(self, served: int) -> None:
        """Refuse, naming the numbers, settings whose rounds can never run for a gateway serving
        ``served`` edge clients once they registered: the cohort a round asks must be one secure
        aggregation accepts (at least the key roster a client accepts, ``min_roster`` or
        ``threshold + 1``; ``threshold`` within the ``degree``; at most ``max_clients``), and under
        distributed DP the *expected* cohort ``q N`` must reach that roster. Fewer served than a
        round opens with is a wait, not an error (edges may join): the rounds are checked for as
        many as open one. :meth:`first_rounds_short` says what the rounds opened before then risk."""
        secure = self.secure_aggregation
        if secure is None or self.mode != "sync":
            return
        floor, registered, dp = secure.roster_floor(), max(self.opening_registered(), served), \
            self.differential_privacy
        roster = f"the {floor} a client accepts in its key roster (secure_aggregation.min_roster = " \
                 f"{secure.min_roster}, or threshold + 1)"
        if dp is not None:
            expected = dp.sampling_rate * registered
            if expected < floor:
                raise ValueError(
                    f"differential_privacy.sampling_rate = {dp.sampling_rate:g}: a round with {registered} "
                    f"registered clients asks {expected:g} of them on average, fewer than {roster}: most "
                    f"rounds fail; raise sampling_rate to at least {floor / registered:.2g}")
            return
        asked = self.asked_per_round(registered)
        if asked < floor:
            fraction = floor / registered
            raise ValueError(
                f"a round with {registered} registered clients asks {asked} (max(min_clients = "
                f"{self.min_clients}, fraction {self.fraction:g} x {registered})), fewer than {roster}: "
                f"every round fails; set min_clients to at least {floor}"
                + (f", or fraction to at least {fraction:.2g}" if fraction <= 1 else ""))
        try:
            secure.validate(asked)
        except ValueError as error:
            raise ValueError(f"with {asked} clients asked in a round: {error}") from None

    def first_rounds_short(self, served: int) -> str:
        """What a round opened before every served client registered risks (a round opens once
        ``opening_registered`` have): "" or one sentence, with the ``min_registered`` that avoids it."""
        secure = self.secure_aggregation
        if secure is None or self.mode != "sync" or self.differential_privacy is not None:
            return ""
        opening, floor = self.opening_registered(), secure.roster_floor()
        asked = self.asked_per_round(opening)
        if asked >= floor or opening >= served:
            return ""
        enough = next((n for n in range(opening, served + 1) if self.asked_per_round(n) >= floor), served)
        return (f"a round opened with {opening} registered clients asks {asked}, fewer than the {floor} "
                f"secure aggregation needs, and fails: set min_registered = {enough}")

    def noise_over_clip(self, served: int) -> str:
        """Under DP, "" or one sentence when the noise on each coordinate of the released mean,
        ``z C / (q N)`` (the noise multiplier times the clip norm over the expected cohort, with every
        served client registered), exceeds the clip norm ``C`` itself: then the noise outweighs any
        one round's mean update on every coordinate, and training learns little."""
        dp = self.differential_privacy
        if dp is None:
            return ""
        expected = dp.sampling_rate * max(self.opening_registered(), served)
        noise = dp.noise_multiplier * dp.clip_norm / expected if expected > 0 else math.inf
        if noise <= dp.clip_norm:
            return ""
        return (f"noise per coordinate {noise:.2g} (noise_multiplier {dp.noise_multiplier:g} x clip "
                f"{dp.clip_norm:g} / expected cohort {expected:g}) > clip {dp.clip_norm:g}: expect low "
                f"accuracy; raise sampling_rate or serve more clients (a cohort above "
                f"{dp.noise_multiplier:g}), or lower noise_multiplier")

    def warnings(self, served: int) -> list[str]:
        """What a gateway serving ``served`` edge clients risks that is no error: rounds opened short
        of SecAgg's floor, DP noise above the clip norm (said at start and by ``config check``)."""
        return [text for text in (self.first_rounds_short(served), self.noise_over_clip(served)) if text]

    def local_work(self) -> dict[str, int | float]:
        """What RoundStart's meta says about the local work (the client turns epochs into steps)."""
        return {"local_epochs": self.local_epochs, "local_steps": self.local_steps, "prox_mu": self.prox_mu}


def _at_least(key: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"federation.{key} must be an integer >= {low}, not {value!r}")

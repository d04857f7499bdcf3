"""Distributed DP under secure aggregation: what each client adds, and what the ring must hold.

Under SecAgg the gateway sees only the sum, so each client adds a share of the
noise before masking: the distributed discrete Gaussian (Kairouz, Liu and Steinke
2021), integer because the sum lives in the ring Z_2^32. A client
(:func:`noised_input`) clips its delta to L2 norm ``C`` (fixed: adaptive clipping
is refused under SecAgg), quantises it into the ring (``L / c`` ring units per
update unit), adds ``N_Z(0, sigma_i^2)`` per coordinate (:func:`discrete_gaussian`,
``sigma_i`` = :func:`client_share_units`) from a generator only it can seed
(:func:`noise_generator`, from its own SecAgg secret), then masks and sends it.
The gateway divides the decoded sum by the expected cohort ``m = q N``.

Each share is calibrated to ``t + 1`` survivors (:func:`share_stddev`), the
fewest the gateway can unmask, so every completed round carries at least the
target noise; ``secure_aggregation.threshold`` must therefore be fixed.

:func:`check_ring`: the sum decodes exactly while ``|sum| < 2^31``; the config
asks ``n L + TAIL_SIGMAS sigma_i sqrt(n) < 2^31`` at ``n = max_clients`` (a wrap
then has probability about 4e-22 per coordinate and round).

:func:`round_epsilon` is one round's bound, composed by
accountant.DistributedRoundAccountant. Why, and what is proven:
docs/design/privacy.md.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from protocols.federation.privacy import DifferentialPrivacyConfig, clip
from protocols.federation.secure_config import SecureAggregationConfig
from protocols.secagg.fixedpoint import RING_BITS, RING_MASK, levels, quantise

TAIL_SIGMAS = 10.0  # the ring holds the noise to this many deviations: 2 exp(-50) ~ 4e-22 a coordinate
PLAIN_EXACT = 1 << 24  # masking off: integers travel as float32, exact below 2^24


def ring_units(secure: SecureAggregationConfig) -> float:
    """Ring units per update unit: ``L / c`` (secagg.fixedpoint's scale)."""
    return levels(secure.bits) / secure.clip_value


def min_survivors(secure: SecureAggregationConfig) -> int:
    """The smallest cohort whose sum the gateway unmasks: ``t + 1`` (t fixed: check_ring)."""
    return secure.threshold + 1


def client_share_units(privacy: DifferentialPrivacyConfig, secure: SecureAggregationConfig) -> float:
    """sigma_i, one client's noise share in ring units: ``z C L / c / sqrt(t + 1)``."""
    total = privacy.noise_multiplier * privacy.clip_norm * ring_units(secure)
    return share_stddev(total, min_survivors(secure))


def sensitivity_units(privacy: DifferentialPrivacyConfig, secure: SecureAggregationConfig,
                      numel: int) -> float:
    """The L2 norm one client's quantised update can have, in ring units: ``C L / c + sqrt(d) / 2``
    (the clipped update scaled, plus rounding to nearest, which moves each of the ``d`` coordinates
    by 1/2 at most; the per-coordinate clip to ``c`` only shortens it). An all-zero update
    quantises to zeros, so this bounds what one client's data moves the sum by."""
    return privacy.clip_norm * ring_units(secure) + math.sqrt(numel) / 2


def check_ring(privacy: DifferentialPrivacyConfig, secure: SecureAggregationConfig) -> None:
    """Refuse (ValueError naming the keys) what distributed DP cannot run with: adaptive clipping,
    an automatic threshold, a share below half a ring unit (Kairouz et al.'s bound needs sigma >=
    1/2), and bits, clients and noise that could wrap the ring (module docstring)."""
    if privacy.adaptive:
        raise ValueError("federation.differential_privacy.target_quantile must be 0 (fixed clipping) with "
                         "secure_aggregation: adaptive clipping counts the updates within C, and under "
                         "SecAgg that bit would need a secure sum of its own (not built)")
    if secure.threshold == 0:
        raise ValueError("secure_aggregation.threshold must be set (>= 2) with differential_privacy: each "
                         "client calibrates its noise share to the t + 1 survivors the gateway needs, "
                         "and the automatic t depends on who advertises keys, known only later")
    if min_survivors(secure) > secure.max_clients:
        raise ValueError(f"secure_aggregation.threshold = {secure.threshold} needs more survivors than "
                         f"max_clients = {secure.max_clients}")
    share = client_share_units(privacy, secure)
    if privacy.noise_multiplier > 0 and share < 0.5:
        raise ValueError(f"differential_privacy: each client's noise share would be {share:.3g} ring "
                         "units, below the 1/2 the distributed discrete Gaussian's accounting needs; "
                         "raise secure_aggregation.bits or differential_privacy.noise_multiplier")
    n, limit = secure.max_clients, levels(secure.bits)
    reach = n * limit + TAIL_SIGMAS * share * math.sqrt(n)
    if reach >= 1 << (RING_BITS - 1):
        raise ValueError(
            f"secure_aggregation: {n} clients of {secure.bits} bits, each adding noise of {share:.4g} ring "
            f"units, can wrap the {RING_BITS}-bit ring ({n} x {limit} + {TAIL_SIGMAS:g} x {share:.4g} x "
            f"sqrt({n}) = {reach:.4g} >= 2^31); lower bits, max_clients or the noise")
    if not secure.masking and limit + TAIL_SIGMAS * share >= PLAIN_EXACT:
        raise ValueError(f"secure_aggregation: with masking = false a noised update ({limit} + "
                         f"{TAIL_SIGMAS:g} x {share:.4g}) would not travel exactly as float32 (< 2^24); "
                         "lower bits or the noise")


def plain_limit(privacy: DifferentialPrivacyConfig, secure: SecureAggregationConfig) -> int:
    """Masking off: the largest magnitude a noised plain update may carry (the gateway's check)."""
    return levels(secure.bits) + math.ceil(TAIL_SIGMAS * client_share_units(privacy, secure))


def noise_generator(client_secret: bytes, run_id: str, round_index: int, *,
                    attempt: int = 0) -> torch.Generator:
    """The client's noise for one attempt at one round, keyed by its own secret (the gateway cannot
    derive it). ``attempt`` is the client's own count of the times it was asked this round
    (federation/secure.py): two attempts drawing the same noise would cancel it in a difference.

    SHA-256 of (secret, run id, round, attempt) seeds torch's Mersenne Twister: a statistical
    generator, not a cryptographic one; its draws are only ever seen masked inside the sum."""
    digest = hashlib.sha256(b"ddp-noise\x00" + client_secret + b"\x00" + run_id.encode() + b"\x00"
                            + str(round_index).encode() + b"\x00" + str(attempt).encode()).digest()
    generator = torch.Generator()
    generator.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return generator


def noised_input(delta: torch.Tensor, privacy: DifferentialPrivacyConfig, secure: SecureAggregationConfig,
                 generator: torch.Generator) -> np.ndarray:
    """A client's delta clipped to ``C``, quantised into the ring and noised: int64 in [0, 2^32)."""
    clipped, _ = clip(delta.detach().to("cpu", torch.float64), privacy.clip_norm)
    quantised = quantise(clipped.numpy(), clip_value=secure.clip_value, bits=secure.bits)
    noise = discrete_gaussian(quantised.size, client_share_units(privacy, secure), generator).numpy()
    noised: np.ndarray = (quantised + noise) & RING_MASK
    return noised


def share_stddev(total_stddev: float, min_survivors: int) -> float:
    """Each client's share so that the sum of any ``min_survivors`` or more has at least
    ``total_stddev`` (variances add): ``total_stddev / sqrt(min_survivors)``."""
    if not (0.0 <= total_stddev < math.inf):
        raise ValueError(f"total_stddev must be >= 0, not {total_stddev}")
    if isinstance(min_survivors, bool) or not isinstance(min_survivors, int) or min_survivors < 1:
        raise ValueError(f"min_survivors must be an integer >= 1, not {min_survivors!r}")
    return total_stddev / math.sqrt(min_survivors)


def discrete_gaussian(count: int, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """``count`` draws of the discrete Gaussian N_Z(0, sigma^2), P(x) proportional to
    exp(-x^2 / (2 sigma^2)) on the integers, as int64.

    By rejection from a discrete Laplace of scale ``t = floor(sigma) + 1`` (Canonne, Kamath and
    Steinke 2020, "The Discrete Gaussian for Differential Privacy", Algorithm 3), the Laplace as
    the difference of two geometric draws. In float64 arithmetic, not their exact integer
    sampler: close enough for a test of the calibration, to be revisited before it guards
    real data (their exact sampler, or a cryptographic source)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    if not (0.0 <= sigma < math.inf):
        raise ValueError(f"sigma must be >= 0, not {sigma}")
    if sigma == 0 or count == 0:
        return torch.zeros(count, dtype=torch.int64)
    t = math.floor(sigma) + 1
    kept: list[torch.Tensor] = []
    have = 0
    while have < count:
        batch = 2 * (count - have) + 16  # acceptance is above one half for sigma >= 1
        laplace = _geometric(batch, t, generator) - _geometric(batch, t, generator)
        accept = torch.exp(-(laplace.abs().double() - sigma ** 2 / t) ** 2 / (2 * sigma ** 2))
        keep = torch.rand(batch, generator=generator, dtype=torch.float64) < accept
        kept.append(laplace[keep])
        have += int(keep.sum())
    return torch.cat(kept)[:count]


def _geometric(count: int, t: int, generator: torch.Generator) -> torch.Tensor:
    """Failures before a success of probability 1 - exp(-1/t): floor(-t log U), U in (0, 1]."""
    uniform = 1.0 - torch.rand(count, generator=generator, dtype=torch.float64)
    return torch.floor(-t * torch.log(uniform)).to(torch.int64)


def round_epsilon(privacy: DifferentialPrivacyConfig, secure: SecureAggregationConfig, numel: int) -> float:
    """Kairouz et al.'s eps for one round (accountant.kls_epsilon; RDP ``alpha eps^2 / 2``), for
    the client it protects: the noise counted is the *others'* shares only, at least ``t`` of them
    (the client's own share is its own, and counted as known to whoever attacks it), against the
    rounding-inflated sensitivity (:func:`sensitivity_units`); tau is taken at ``max_clients``
    summands, so the bound holds for every cohort the gateway can unmask. Infinite for z = 0."""
    from protocols.federation.accountant import kls_epsilon

    share = client_share_units(privacy, secure)
    if share == 0:
        return math.inf
    return kls_epsilon(sensitivity=sensitivity_units(privacy, secure, numel), share_stddev=share,
                       summands=secure.threshold, numel=numel, tau_summands=secure.max_clients)

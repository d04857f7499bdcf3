"""Client-level differential privacy for FedAvg rounds (DP-FedAvg), central: the gateway adds the noise.

McMahan et al. 2018: a round's output changes little whether or not any one client took part:

1. *sampling* is Poisson: each registered client is asked with probability ``q``
   (:func:`poisson_sample`), drawn from the gateway's own secret seed;
2. *clipping*: each update is scaled down to L2 norm ``C`` at most (:func:`clip`);
3. *the fixed-denominator mean*: the clipped updates' sum over the *expected*
   cohort ``m = q N``, plus Gaussian noise of standard deviation ``z C / m`` on
   every coordinate (:func:`noised_mean`).

Adaptive clipping (Andrew et al. 2021): ``C`` follows the ``target_quantile`` of
the updates' norms, from a noised count of the updates within ``C``
(:func:`noised_centred_count`: bits shifted to ±1/2, sensitivity 1/2) and a
geometric step (:func:`next_clip_norm`). The update's multiplier is raised to
``z_update = (z^-2 - (2 sigma_b)^-2)^-1/2``
(:meth:`DifferentialPrivacyConfig.update_noise_multiplier`), so the accountant
sees exactly one ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` per round.

Randomness: every draw comes from a generator keyed by (secret seed, gateway,
round, purpose) (protocols/rng.py); the secret seed is the driver's, never the
federation's shared ``seed``. With secure aggregation on too, the noise is the
clients' (distributed_dp.py). Why: docs/design/privacy.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from protocols.federation import influence
from protocols.rng import derive_seed


@dataclass(frozen=True, kw_only=True)
class DifferentialPrivacyConfig:
    """``[federation.differential_privacy]``: present = client-level DP on (central, at the gateway;
    distributed, by the clients, when ``[federation.secure_aggregation]`` is on too: distributed_dp.py).

    While on, ``sampling_rate`` replaces ``[federation] fraction``, every round aggregates (noise
    alone when nobody answered: ``min_updates`` does not apply), clients' sample counts are not
    weighed, and FedBuff, over-selection, robust aggregators and ``[federation] clip_norm`` are
    refused (FederationConfig says which, and why)."""

    # z: the noise's standard deviation over the clip norm; the privacy budget comes from it
    # (0: no noise, and epsilon is reported as infinite)
    noise_multiplier: float = 1.0
    clip_norm: float = 1.0  # C: each update's L2 norm bound (with adaptive clipping: where C starts)
    # q: each registered client is asked independently with this probability each round
    # (Poisson sampling; it replaces federation.fraction while DP is on)
    sampling_rate: float = 0.1
    delta: float = 1e-5  # the delta of the reported (epsilon, delta); well below 1 / clients
    # adaptive clipping (Andrew et al. 2021): 0 = C stays fixed; else the share of updates
    # C should cover (0.5: the median norm)
    target_quantile: float = 0.0
    clip_learning_rate: float = 0.2  # eta_C: C moves by exp(-eta_C (covered - target)) a round
    # sigma_b: the noise on the count of covered updates (clients), a sum of bits shifted to +-1/2
    # (sensitivity 1/2, so its multiplier is 2 sigma_b); it must exceed z / 2.
    # Andrew et al. use the expected cohort / 20
    count_noise_stddev: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.noise_multiplier < math.inf):
            raise ValueError(f"noise_multiplier must be >= 0 (0: no noise), not {self.noise_multiplier}")
        if not (0.0 < self.clip_norm < math.inf):
            raise ValueError(f"clip_norm must be > 0, not {self.clip_norm}")
        if not 0.0 < self.sampling_rate <= 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], not {self.sampling_rate}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), not {self.delta}")
        if not 0.0 <= self.target_quantile < 1.0:
            raise ValueError(f"target_quantile must be in [0, 1) (0: fixed clipping), "
                             f"not {self.target_quantile}")
        if not (0.0 < self.clip_learning_rate < math.inf):
            raise ValueError(f"clip_learning_rate must be > 0, not {self.clip_learning_rate}")
        if not (0.0 <= self.count_noise_stddev < math.inf):
            raise ValueError(f"count_noise_stddev must be >= 0, not {self.count_noise_stddev}")
        z = self.noise_multiplier
        if self.adaptive and z > 0 and not 2 * self.count_noise_stddev > z:
            raise ValueError(f"count_noise_stddev must be > noise_multiplier / 2 = {z / 2:g} with"
                             " adaptive clipping (the count's noise is part of the budget; "
                             f"Andrew et al. use the expected cohort / 20), not {self.count_noise_stddev}")

    @property
    def adaptive(self) -> bool:
        """Whether C follows a quantile of the norms (and the count query spends budget)."""
        return self.target_quantile > 0

    def update_noise_multiplier(self) -> float:
        """z_update: the multiplier of the update's own noise, raised with adaptive clipping so that
        the update and the count together cost one Gaussian query of multiplier ``z``."""
        z = self.noise_multiplier
        if not self.adaptive or z == 0:
            return z
        raised: float = (z ** -2 - (2 * self.count_noise_stddev) ** -2) ** -0.5
        return raised


def poisson_sample(seed: int, draw: int, names: Iterable[str], rate: float,
                   purpose: str = "dp-sample") -> tuple[str, ...]:
    """The names each kept with probability ``rate``, independently, keyed by (seed, name, draw); sorted.

    A name's coin depends on the key alone, so both drivers ask the same clients whatever order
    they registered in (as common.sample does for a fixed count)."""
    threshold = rate * 2.0 ** 63  # derive_seed is uniform on [0, 2^63)
    return tuple(sorted(name for name in set(names) if derive_seed(seed, name, draw, purpose) < threshold))


def clip(update: torch.Tensor, clip_norm: float) -> tuple[torch.Tensor, bool]:
    """``update`` scaled to L2 norm ``clip_norm`` when longer (a fresh tensor), and whether it was
    within the bound already (the bit adaptive clipping counts). The one clip: influence.clip's."""
    norm = influence.delta_norm(update)
    return influence.clip(update, norm, clip_norm), norm <= clip_norm


def noised_mean(clipped: Sequence[torch.Tensor], *, like: torch.Tensor, expected: float,
                stddev: float, generator: torch.Generator) -> torch.Tensor:
    """``sum(clipped) / expected`` plus N(0, stddev^2) on every coordinate, shaped like ``like``.

    The sum is taken in the order given (sort by client name) and in float64; no update at all
    still gives the noise (an empty round is released like any other: skipping it would tell
    that the cohort was empty)."""
    if not expected > 0:
        raise ValueError(f"the expected cohort must be > 0, not {expected}")
    total = torch.zeros(like.shape, dtype=torch.float64)
    for update in clipped:
        total += update.detach().to("cpu", torch.float64)
    noise = torch.randn(like.shape, generator=generator, dtype=torch.float64) * stddev
    return (total / expected + noise).to(like.dtype).to(like.device)


def noised_centred_count(covered: int, taken: int, stddev: float, generator: torch.Generator) -> float:
    """Adaptive clipping's count query: the sum over the ``taken`` updates of (bit - 1/2), where
    ``covered`` of the bits are 1, plus N(0, stddev^2). Adding or removing one client moves the
    sum by exactly 1/2 whatever its bit, which is the sensitivity the accounting assumes."""
    if not 0 <= covered <= taken:
        raise ValueError(f"need 0 <= covered <= taken, not {covered}, {taken}")
    return covered - taken / 2 + stddev * float(torch.randn((), generator=generator, dtype=torch.float64))


def next_clip_norm(clip_norm: float, noisy_centred_count: float, expected: float, target_quantile: float,
                   learning_rate: float) -> float:
    """Andrew et al.'s geometric step: ``C exp(-eta (covered_share - target))``, the covered share
    estimated as ``noisy_centred_count / m + 1/2`` (``m`` the expected cohort; unbiased when the
    cohort has its expected size). More updates within C than the target share shrink C; fewer
    grow it."""
    covered_share = noisy_centred_count / expected + 0.5
    return clip_norm * math.exp(-learning_rate * (covered_share - target_quantile))

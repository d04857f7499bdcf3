"""Distributed DP's noise shares (not wired yet): what each client adds under secure aggregation.

Under SecAgg the gateway sees only the sum, so it cannot add the noise itself: each client adds a
share before masking, and the shares sum to the noise the round needs. The sum lives in the
ring Z_2^32 (protocols/secagg/), so the noise must be integer: the distributed discrete Gaussian
(Kairouz, Liu and Steinke 2021, "The Distributed Discrete Gaussian Mechanism for Federated
Learning with Secure Aggregation"). Each client draws N_Z(0, sigma_i^2) per coordinate
(:func:`discrete_gaussian`), with ``sigma_i`` from :func:`share_stddev`.

Why the smallest cohort that can survive: a client cannot know how many others will still be
there when the sum is unmasked. Calibrating its share to ``min_survivors`` (SecAgg's threshold
t, at most the cohort) makes the noise of any cohort that completes at least the target; a
larger surviving cohort only adds noise (more privacy, less accuracy).

What is left for the wiring: the clients' own clipping and scaling into the ring (the noise is
in the same integer units), and accounting for a sum of discrete Gaussians, which is close to,
not exactly, a discrete Gaussian (Kairouz et al.'s bound; dp-accounting has no event for it, so
the accountant must be given their RDP bound, not this module's Gaussian event).
"""

from __future__ import annotations

import math

import torch


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

"""How far members are from agreeing on their parameters: the two measures the project reports.

Both take one flat parameter vector per member and compare each with the
members' mean x̄, in float64, summing in the order given (callers pass
members sorted by name, so results are reproducible).

- :func:`rms_distance` = sqrt(mean_i ||x_i − x̄||²), in the parameters' own
  units: the simulator's ``consensus_rms``, over every honest running member.
- :func:`max_relative_distance` = max_i ||x_i − x̄|| / ||x̄||, dimensionless: a
  peer's ``consensus_max_relative`` over itself and its neighbours heard, and
  the demo's and the tests' over whole networks. When x̄ = 0 it falls back to
  the absolute max_i ||x_i||.

One vector is a consensus of one (0). :func:`reconvergence_time_s`, from a series
of (time, distance) samples after a fault: from that sample on, the median
distance over a trailing window stays below ``REBOUND_FACTOR`` times its median
before the fault, to the end of the series (a dip that rises again does not
count); the multi-host suite and the simulator both measure with it. More:
docs/design/simulator.md.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

import torch

REBOUND_FACTOR = 1.5    # "agrees again": windowed median below 1.5x the pre-fault median (issue 16)


def _deviations(vectors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(||x_i − x̄|| per member, x̄), in float64."""
    if not vectors:
        raise ValueError("a consensus distance needs at least one vector")
    stacked = torch.stack([v.detach().to(torch.float64) for v in vectors])
    mean = stacked.mean(dim=0)
    return torch.linalg.vector_norm(stacked - mean, dim=1), mean


def rms_distance(vectors: Sequence[torch.Tensor]) -> float:
    """sqrt(mean_i ||x_i − x̄||²), in parameter units."""
    deviations, _ = _deviations(vectors)
    return float(deviations.pow(2).mean().sqrt())


def max_relative_distance(vectors: Sequence[torch.Tensor]) -> float:
    """max_i ||x_i − x̄|| / ||x̄|| (dimensionless; absolute when x̄ = 0)."""
    deviations, mean = _deviations(vectors)
    scale = float(torch.linalg.vector_norm(mean)) or 1.0
    return float(deviations.max()) / scale


def reconvergence_time_s(times_s: Sequence[float], distances: Sequence[float], *,
                         pre_fault_s: tuple[float, float], heal_s: float, window_s: float,
                         factor: float = REBOUND_FACTOR) -> float | None:
    """Seconds from ``heal_s`` to the first sample from which the trailing median stays re-converged.

    ``times_s`` (increasing) and ``distances`` are one series, in any one unit each. The bar is
    ``factor`` x the median of the samples with ``pre_fault_s[0] <= t < pre_fault_s[1]``. A sample's
    trailing median is over the samples with ``t - window_s < t' <= t`` (itself at least, so
    samples from before the heal count in the first windows after it). The answer is ``t - heal_s``
    of the earliest sample at or after ``heal_s`` whose trailing median, and that of every later
    sample, is below the bar (or 0, when the bar is: members that agreed exactly before the fault);
    None if the last sample's is not (it never re-converged), or if no
    sample follows the heal. A ValueError if the pre-fault window holds no sample.
    """
    if len(times_s) != len(distances):
        raise ValueError(f"{len(times_s)} times but {len(distances)} distances")
    if any(b < a for a, b in itertools.pairwise(times_s)):
        raise ValueError("times_s must not decrease")
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    before = [d for t, d in zip(times_s, distances, strict=True) if pre_fault_s[0] <= t < pre_fault_s[1]]
    if not before:
        raise ValueError(f"no sample in the pre-fault window {pre_fault_s}")
    bar = factor * statistics.median(before)
    found: float | None = None
    start = 0   # the first sample of the current trailing window
    for index, now in enumerate(times_s):
        while times_s[start] <= now - window_s:
            start += 1
        if now < heal_s:
            continue
        median = statistics.median(distances[start:index + 1])
        agrees = median < bar or median <= bar == 0   # (a bar of 0, exact agreement before: exact again)
        if not agrees:
            found = None        # it rose again: a later sample must start the streak afresh
        elif found is None:
            found = now - heal_s
    return found

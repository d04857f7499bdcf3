"""How far members are from agreeing on their parameters: the two measures the project reports.

Both take one flat parameter vector per member and compare each with the
members' mean x̄, in float64, summing in the order given (callers pass
members sorted by name, so results are reproducible).

- :func:`rms_distance` = sqrt(mean_i ||x_i − x̄||²), in the parameters' own
  units (absolute). The consensus distance of the decentralised-SGD
  literature (Ξ of Kong et al. 2021): the simulator's trace and reports give
  it over every honest running member (``consensus_rms``).
- :func:`max_relative_distance` = max_i ||x_i − x̄|| / ||x̄||, dimensionless
  (a fraction of the mean's norm). Scale-free, so one threshold (say 1e-3)
  means the same for any model: a peer's status gives it over itself and the
  neighbours it has heard (``consensus_max_relative``), and the demo and the
  tests over whole networks.

One vector is a consensus of one (0). When x̄ = 0, the relative distance
falls back to the absolute max_i ||x_i||, rather than dividing by zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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

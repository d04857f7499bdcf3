"""How a server turns its clients' updates into one: small pure functions on flat tensors.

Every function takes the updates as a sequence of equal-length 1-D float
tensors (each a client's delta: its trained model minus the global model it
was sent) and returns a fresh tensor; none modifies its inputs. Only
:func:`fedavg` reads the clients' sample counts: a robust aggregator that let a
client's claimed count weigh its vote would hand the round to whoever claims
the most (influence.py caps the claims and clips the deltas before any of these).

Robustness in one line each, with ``n`` updates of which ``f`` may be hostile:

- :func:`median`: each coordinate's median; moves at most to the honest
  values' range while ``f < n / 2``.
- :func:`trimmed_mean`: each coordinate drops its ``floor(beta * n)`` lowest
  and highest values; holds while ``f <= floor(beta * n)``.
- :func:`krum` / :func:`multi_krum`: the update(s) closest to their ``n - f - 2``
  nearest neighbours; needs ``n > 2f + 2`` for the guarantee.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _stack(updates: Sequence[torch.Tensor]) -> torch.Tensor:
    """The updates as rows of one (n, d) tensor; refuses an empty or ragged set."""
    if not updates:
        raise ValueError("aggregation needs at least one update")
    first = updates[0]
    for update in updates:
        if update.dim() != 1 or update.shape != first.shape:
            raise ValueError(f"updates must be 1-D tensors of one length, got {tuple(update.shape)} "
                             f"beside {tuple(first.shape)}")
    return torch.stack(list(updates))


def fedavg(updates: Sequence[torch.Tensor], num_samples: Sequence[int]) -> torch.Tensor:
    """The sample-weighted mean (McMahan et al. 2017, "Communication-Efficient Learning of Deep
    Networks from Decentralized Data"): sum_i n_i u_i / sum_i n_i. Cap the counts first (influence.py)."""
    stacked = _stack(updates)
    if len(num_samples) != len(updates) or any(n < 1 for n in num_samples):
        raise ValueError(f"fedavg needs one count >= 1 per update, got {list(num_samples)}")
    weights = torch.tensor([float(n) for n in num_samples], dtype=torch.float64)
    weights = (weights / weights.sum()).to(stacked.dtype)
    return weights @ stacked


def mean(updates: Sequence[torch.Tensor]) -> torch.Tensor:
    """The unweighted mean: what FedAvg would be if every client held the same number of samples."""
    return _stack(updates).mean(dim=0)


def median(updates: Sequence[torch.Tensor]) -> torch.Tensor:
    """Coordinate-wise median (Yin et al. 2018, "Byzantine-Robust Distributed Learning: Towards
    Optimal Statistical Rates"); with an even count, the mean of the two middle values."""
    ordered = _stack(updates).sort(dim=0).values
    n = ordered.shape[0]
    if n % 2:
        return ordered[n // 2].clone()
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(updates: Sequence[torch.Tensor], beta: float) -> torch.Tensor:
    """Coordinate-wise trimmed mean (Yin et al. 2018): per coordinate, drop the ``floor(beta * n)``
    lowest and as many highest values, average the rest. ``beta`` in [0, 0.5)."""
    if not 0.0 <= beta < 0.5:
        raise ValueError(f"trimmed mean needs 0 <= beta < 0.5 per side, not {beta}")
    ordered = _stack(updates).sort(dim=0).values
    n = ordered.shape[0]
    cut = int(beta * n)
    if n - 2 * cut < 1:  # beta < 0.5 keeps one at least; kept for clarity at tiny n
        cut = (n - 1) // 2
    return ordered[cut:n - cut].mean(dim=0)


def krum_scores(updates: Sequence[torch.Tensor], byzantine: int) -> torch.Tensor:
    """Each update's Krum score (Blanchard et al. 2017, "Machine Learning with Adversaries:
    Byzantine Tolerant Gradient Descent"): the sum of its squared distances to its ``n - f - 2``
    nearest other updates. With too few updates for that (n <= f + 2) the nearest one counts."""
    stacked = _stack(updates).to(torch.float64)
    n = stacked.shape[0]
    if byzantine < 0:
        raise ValueError(f"krum needs byzantine >= 0, not {byzantine}")
    if n == 1:
        return torch.zeros(1, dtype=torch.float64)
    distances = torch.full((n, n), float("inf"), dtype=torch.float64)
    for i in range(n):  # pair by pair: memory stays O(d), where a broadcast would take O(n^2 d)
        for j in range(i + 1, n):
            distances[i, j] = distances[j, i] = (stacked[i] - stacked[j]).pow(2).sum()
    nearest = max(1, n - byzantine - 2)
    return distances.topk(nearest, dim=1, largest=False).values.sum(dim=1)


def krum(updates: Sequence[torch.Tensor], byzantine: int) -> torch.Tensor:
    """Krum (Blanchard et al. 2017): the single update with the lowest score (a copy);
    ties go to the first, so the result depends only on the order given (sort by client name)."""
    scores = krum_scores(updates, byzantine)
    return updates[int(torch.argmin(scores))].clone()


def multi_krum(updates: Sequence[torch.Tensor], byzantine: int, selected: int) -> torch.Tensor:
    """Multi-Krum (Blanchard et al. 2017): the mean of the ``selected`` updates with the lowest
    Krum scores (``selected`` is clamped to [1, n]; 1 is Krum)."""
    scores = krum_scores(updates, byzantine)
    keep = max(1, min(selected, len(updates)))
    order = sorted(range(len(updates)), key=lambda i: (float(scores[i]), i))[:keep]
    return mean([updates[i] for i in order])


"""How far one update may move the model: its sample count capped and its delta clipped, both by
bounds the round (FedBuff: the buffer) sets for itself, before any update is applied.

FedAvg weighs a client by the ``num_samples`` it claims and adds its delta as sent, so one key
that claims 10^9 samples, or sends a delta 10^30 times too long, decides a round alone. A
fixed cap has to be guessed ahead (``max_samples``, ``clip_norm``) and is loose or clips honest
work; so, as the gossip insider filter does (protocols/gossip/robust.py), each bound here is a
multiple of what the round's own updates show:

- a claim is capped at ``samples_multiple`` x the round's lower median claim;
- a delta is clipped to ``norm_multiple`` x the lower median of the round's delta norms
  (norms in float64: a float32 delta scaled by 10^30 has a finite norm there).

Why the lower median: with h honest and f hostile updates in a round, it lies within the honest
values' range while ``f <= (n - 1) // 2``, and at most the largest honest value while ``f <= n
// 2`` (two updates, one hostile: the honest one sets the bound). So a hostile minority
weighs at most ``samples_multiple`` times the largest honest claim and moves the aggregate at
most ``norm_multiple`` times the largest honest norm; it can pull a bound down to the smallest
honest value, never below it. A round of one is its own median: only the fixed caps bound it.
Those counts are of clients, not updates: a FedBuff buffer may hold one client's updates several
times (a fast client is asked again at once), so each client votes once (``voters``), with the
lower median of its own values.

The fixed caps still apply where set; the tighter bound wins and names the reason each update
was bounded (``samples_median``, ``samples_max``, ``norm_median``, ``norm_fixed``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Updates = Mapping[str, tuple[torch.Tensor, int]]  # client -> (delta, claimed num_samples)


@dataclass(frozen=True)
class Bounds:
    """The bounds a round applied, and the updates as bounded."""

    updates: dict[str, tuple[torch.Tensor, int]]
    samples_cap: int  # the cap each claim met this round (0: none)
    norm_bound: float  # the L2 norm each delta was clipped to (inf: none)
    bounded: Counter[str]  # updates capped or clipped, by reason

    def report(self) -> dict[str, Any]:
        """What a round's report shows (JSON-able; a bound that was off is None)."""
        return {"samples_cap": self.samples_cap or None,
                "norm_bound": self.norm_bound if math.isfinite(self.norm_bound) else None,
                "bounded": dict(sorted(self.bounded.items()))}


def lower_median(values: Sequence[float]) -> float:
    """The ``(n - 1) // 2``-th smallest value: of an even count, the lower of the two middle ones."""
    if not values:
        raise ValueError("a median needs at least one value")
    return sorted(values)[(len(values) - 1) // 2]


def samples_cap(claims: Sequence[float], multiple: float) -> int:
    """``floor(multiple x lower median)`` of the claims, at least 1 (0: no cap, ``multiple`` 0, or a
    product past a float: 1e300 x a claim of 10^9)."""
    if multiple < 0:
        raise ValueError(f"samples multiple must be >= 0, not {multiple}")
    cap = multiple * lower_median([float(c) for c in claims])
    return 0 if multiple == 0 or math.isinf(cap) else max(1, math.floor(cap))


def delta_norm(delta: torch.Tensor) -> float:
    """The delta's L2 norm, taken in float64 (inf when not finite even there)."""
    return float(torch.linalg.vector_norm(delta.detach().to(torch.float64)))


def norm_bound(norms: Sequence[float], multiple: float) -> float:
    """``multiple x lower median`` of the norms (inf: no bound, ``multiple`` 0)."""
    if multiple < 0:
        raise ValueError(f"norm multiple must be >= 0, not {multiple}")
    return math.inf if multiple == 0 else multiple * lower_median(norms)


def clip(delta: torch.Tensor, norm: float, bound: float) -> torch.Tensor:
    """``delta`` (whose norm is ``norm``) scaled to norm ``bound`` when longer (a copy either way)."""
    if norm <= bound:
        return delta.clone()
    if bound <= 0 or not math.isfinite(norm):
        return torch.zeros_like(delta)
    return _toward_zero((delta.to(torch.float64) * (bound / norm)), delta.dtype)


def _toward_zero(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``exact`` in ``dtype``, each element rounded toward zero, so that no norm grows in the cast (a
    nearest rounding can: a subnormal float32 moves by up to half its whole value)."""
    rounded = exact.to(dtype)
    away = rounded.to(torch.float64).abs() > exact.abs()
    return torch.where(away, torch.nextafter(rounded, torch.zeros_like(rounded)), rounded)


def bound_updates(updates: Updates, *, samples_multiple: float, norm_multiple: float, max_samples: int = 0,
                  clip_norm: float = 0.0, voters: Mapping[str, str] | None = None) -> Bounds:
    """Each update's claim capped and its delta clipped: at the round's median bounds (the multiples;
    0 turns one off), or at the fixed ``max_samples`` / ``clip_norm`` where tighter (0: none).
    ``voters``: the client who sent each update (none: each its own), one vote each in the medians."""
    if not updates:
        return Bounds({}, 0, math.inf, Counter())
    names = sorted(updates)
    norms = {name: delta_norm(updates[name][0]) for name in names}
    median_cap = samples_cap(_votes({n: float(updates[n][1]) for n in names}, voters), samples_multiple)
    median_norm = norm_bound(_votes(norms, voters), norm_multiple)
    cap, cap_reason = _tighter((median_cap or math.inf, "samples_median"),
                               (max_samples or math.inf, "samples_max"))
    bound, bound_reason = _tighter((median_norm, "norm_median"), (clip_norm or math.inf, "norm_fixed"))
    bounded: Counter[str] = Counter()
    out: dict[str, tuple[torch.Tensor, int]] = {}
    for name in names:
        delta, claim = updates[name]
        if claim > cap:
            bounded[cap_reason] += 1
        if norms[name] > bound:
            bounded[bound_reason] += 1
        out[name] = (clip(delta, norms[name], bound), int(min(claim, cap)))
    return Bounds(out, 0 if math.isinf(cap) else int(cap), bound, bounded)


def _votes(values: Mapping[str, float], voters: Mapping[str, str] | None) -> list[float]:
    """One value per voter: the lower median of its updates' ``values`` (keyed by update)."""
    by_voter: dict[str, list[float]] = {}
    for name, value in values.items():
        by_voter.setdefault(name if voters is None else voters[name], []).append(value)
    return [lower_median(own) for own in by_voter.values()]


def _tighter(median: tuple[float, str], fixed: tuple[float, str]) -> tuple[float, str]:
    """The smaller bound and its reason (the median's on a tie)."""
    return fixed if fixed[0] < median[0] else median

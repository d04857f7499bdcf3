"""A client's round metrics (what its ``fit`` returned) on its ClientUpdate, and their mean at the server.

They travel in the update's ``meta`` as ``metric.<name>`` (no new wire field: ``meta`` already
carries small scalars). At most :data:`MAX_METRICS` of them, names of at most
:data:`MAX_NAME_CHARS` characters, values finite numbers. The client refuses to send anything
else (ValueError, said to the user); the server drops what breaks the rules and counts it, and
keeps the update. A round's metric is the mean over the updates taken, weighted by their
``num_samples``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from protocols.messages import Scalar

PREFIX = "metric."
MAX_METRICS = 16
MAX_NAME_CHARS = 64


def _valid(name: str, value: object) -> bool:
    return (0 < len(name) <= MAX_NAME_CHARS and isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def to_meta(metrics: Mapping[str, float]) -> dict[str, Scalar]:
    """``metrics`` as update meta; ValueError naming the first thing that breaks the rules."""
    if len(metrics) > MAX_METRICS:
        raise ValueError(f"{len(metrics)} metrics: at most {MAX_METRICS}")
    for name, value in metrics.items():
        if not isinstance(name, str) or not _valid(name, value):
            raise ValueError(f"metric {name}: expected a name of 1 to {MAX_NAME_CHARS} characters "
                             f"and a finite number, got {type(value).__name__} {value}")
    return {PREFIX + name: float(value) for name, value in metrics.items()}


def from_meta(meta: Mapping[str, Scalar]) -> tuple[dict[str, float], int]:
    """The metrics in an update's ``meta`` that keep the rules, and how many were dropped."""
    found = [(key[len(PREFIX):], value) for key, value in meta.items() if key.startswith(PREFIX)]
    kept = {name: float(value) for name, value in found[:MAX_METRICS] if _valid(name, value)}
    return kept, len(found) - len(kept)


def weighted_means(updates: Iterable[tuple[Mapping[str, float], int]]) -> dict[str, float]:
    """Each metric's mean over the updates that carry it, weighted by their ``num_samples``."""
    sums: dict[str, float] = {}
    weights: dict[str, int] = {}
    for metrics, num_samples in updates:
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + value * num_samples
            weights[name] = weights.get(name, 0) + num_samples
    return {name: sums[name] / weights[name] for name in sorted(sums)}

"""Grouped secure aggregation: a round's cohort drawn into groups, SecAgg per group, a robust mean of
the group means (issue 32, item 4).

SecAgg hides each input inside a sum, so the gateway cannot tell an extreme input from an honest
one: one client can move a plain SecAgg round's mean anywhere. With ``groups = G``, each round's
asked clients are drawn into G groups of at least ``min_group`` (fewer groups when the cohort is
too small; one group is plain SecAgg); each group runs its own SecAgg (protocols/secagg), so the
gateway learns G group sums (and each group's summed weight) and no more; then it combines the G
group means with a coordinate-wise median or trimmed mean (protocols/federation/aggregate.py). A
hostile client spoils only its own group's mean, which the median ignores while fewer than half of
the groups hold one (the trimmed mean: while at most ``floor(beta G)`` do).

The trade-off: privacy rests on a group's size (the gateway learns the mean of ``n / G`` clients,
not of ``n``; a group of ``min_group`` is a small crowd), robustness on the number of groups (b
hostile clients spoil at most b groups, so G > 2b for the median), and a median of G group means is
noisier than the mean of all n (an honest round loses a little accuracy when the groups disagree).

The draw (:func:`draw_groups`) is keyed by the run, the round and the names only, in the manner of
protocols/rng.py, so every client can check the grouping the gateway announces (RoundStart's
``secagg_cohort``: the groups, ``;``-separated, each ``,``-separated).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import torch

from protocols.federation.aggregate import median, trimmed_mean

GROUP_AGGREGATORS = ("median", "trimmed_mean")


def group_count(cohort_size: int, groups: int, min_group: int) -> int:
    """How many groups a cohort of ``cohort_size`` is drawn into: ``groups``, fewer when each would
    hold fewer than ``min_group``; at least one."""
    return max(1, min(groups, cohort_size // max(1, min_group)))


def draw_groups(names: Iterable[str], *, groups: int, min_group: int, run_id: str,
                round_index: int) -> tuple[tuple[str, ...], ...]:
    """The cohort ``names`` in :func:`group_count` groups whose sizes differ by one at most, each
    sorted, in a draw keyed by (run, round, name): the same whatever order the names come in."""
    ranked = sorted(set(names), key=lambda name: (hashlib.sha256(
        f"secagg-group\x00{run_id}\x00{round_index}\x00{name}".encode()).digest(), name))
    count = group_count(len(ranked), groups, min_group)
    return tuple(tuple(sorted(ranked[g::count])) for g in range(count))


def encode_groups(groups: Sequence[Sequence[str]]) -> str:
    """RoundStart's ``secagg_cohort``: each group comma-separated, the groups ``;``-separated."""
    return ";".join(",".join(sorted(group)) for group in groups)


def decode_groups(text: str) -> tuple[tuple[str, ...], ...]:
    """The groups of :func:`encode_groups`'s ``text``."""
    return tuple(tuple(group.split(",")) for group in text.split(";"))


def combine_group_means(means: Sequence[torch.Tensor], aggregator: str, trim_beta: float) -> torch.Tensor:
    """The robust mean of the group means: ``median`` or ``trimmed_mean`` (``trim_beta`` per side);
    one group's mean is itself."""
    if len(means) == 1:
        return means[0].clone()
    if aggregator == "median":
        return median(means)
    return trimmed_mean(means, trim_beta)

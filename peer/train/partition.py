"""Split a training set across N members, reproducibly from a seed.

``partition(labels, n_members, scheme=..., seed=...)`` returns one sorted int64
index array per member (member ``i`` gets element ``i``; every member computes the
same list from the same seed, so its shard follows from its index alone). Every
sample lands in exactly one shard and no shard is empty.

Schemes:

- ``iid``: a seeded permutation cut into N near-equal parts.
- ``dirichlet``: label skew (Hsu et al. 2019; Wang et al. 2020): for each class,
  the proportions of its samples going to each member are drawn from
  Dirichlet(alpha * 1_N). Small alpha: each member sees few classes.
- ``shards``: McMahan et al. 2017: sort by label, cut into N*k equal shards, deal
  k random shards to each member.
- ``file``: a JSON list of N lists of indices (written by :func:`save_index_file`).

A shard left empty by a draw is repaired deterministically: it takes the last
index of the currently largest shard (lowest member index on ties), repeated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from protocols.rng import numpy_generator
from topology.errors import HivemeshError

SCHEMES = ("iid", "dirichlet", "shards", "file")


class PartitionError(HivemeshError, ValueError):
    """A partition that cannot be made (too few samples, bad index file, bad option)."""


def partition(labels: Sequence[int] | np.ndarray, n_members: int, *, scheme: str = "iid", seed: int = 0,
              alpha: float = 0.5, shards_per_member: int = 2,
              path: str | Path | None = None) -> list[np.ndarray]:
    """The shards of ``len(labels)`` samples for ``n_members`` members (see the module docstring)."""
    labels = np.asarray(labels)
    n = len(labels)
    if n_members < 1:
        raise PartitionError(f"n_members must be at least 1, not {n_members}")
    if n < n_members:
        raise PartitionError(f"{n} samples cannot fill {n_members} non-empty shards")
    if scheme == "iid":
        order = numpy_generator(seed, "", 0, "partition-iid").permutation(n)
        shards = list(np.array_split(order, n_members))
    elif scheme == "dirichlet":
        shards = _dirichlet(labels, n_members, alpha, seed)
    elif scheme == "shards":
        shards = _label_shards(labels, n_members, shards_per_member, seed)
    elif scheme == "file":
        if path is None:
            raise PartitionError("scheme 'file' needs a path to a JSON index file")
        return load_index_file(path, n, n_members)
    else:
        raise PartitionError(f"unknown partition scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    return [np.sort(s).astype(np.int64) for s in _repair_empty(shards)]


def _dirichlet(labels: np.ndarray, n_members: int, alpha: float, seed: int) -> list[np.ndarray]:
    if not alpha > 0:
        raise PartitionError(f"dirichlet alpha must be positive, not {alpha}")
    rng = numpy_generator(seed, "", 0, "partition-dirichlet")
    parts: list[list[np.ndarray]] = [[] for _ in range(n_members)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(np.full(n_members, alpha))
        cuts = np.round(np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for member, piece in enumerate(np.split(members, cuts)):
            parts[member].append(piece)
    return [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]


def _label_shards(labels: np.ndarray, n_members: int, per_member: int, seed: int) -> list[np.ndarray]:
    if per_member < 1:
        raise PartitionError(f"shards_per_member must be at least 1, not {per_member}")
    n_shards = n_members * per_member
    if len(labels) < n_shards:
        raise PartitionError(f"{len(labels)} samples cannot make {n_shards} shards "
                             f"({n_members} members x {per_member})")
    rng = numpy_generator(seed, "", 0, "partition-shards")
    tiebreak = rng.permutation(len(labels))
    by_label = tiebreak[np.argsort(labels[tiebreak], kind="stable")]
    pieces = np.array_split(by_label, n_shards)
    deal = rng.permutation(n_shards)
    return [np.concatenate([pieces[s] for s in deal[m * per_member:(m + 1) * per_member]])
            for m in range(n_members)]


def _repair_empty(shards: list[np.ndarray]) -> list[np.ndarray]:
    shards = [np.asarray(s, dtype=np.int64) for s in shards]
    for member in range(len(shards)):
        if len(shards[member]) == 0:
            donor = max(range(len(shards)), key=lambda m: (len(shards[m]), -m))
            shards[member] = shards[donor][-1:]
            shards[donor] = shards[donor][:-1]
    return shards


# ---------------------------------------------------------------- index files


def save_index_file(path: str | Path, shards: Sequence[np.ndarray]) -> None:
    """Write shards as a JSON list of lists of ints."""
    Path(path).write_text(json.dumps([[int(i) for i in s] for s in shards]) + "\n")


def load_index_file(path: str | Path, n_samples: int, n_members: int) -> list[np.ndarray]:
    """Read and check an index file: N non-empty lists covering every sample exactly once."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PartitionError(f"{path}: no such index file") from None
    except (OSError, ValueError) as error:
        raise PartitionError(f"{path}: not a JSON index file: {error}") from None
    if not isinstance(data, list) or not all(isinstance(s, list) for s in data):
        raise PartitionError(f"{path}: expected a JSON list of lists of sample indices")
    if len(data) != n_members:
        raise PartitionError(f"{path}: has {len(data)} shards, the run has {n_members} members")
    shards = []
    for member, items in enumerate(data):
        if not items:
            raise PartitionError(f"{path}: shard {member} is empty")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise PartitionError(f"{path}: shard {member} holds something other than integers")
        shards.append(np.sort(np.asarray(items, dtype=np.int64)))
    every = np.concatenate(shards)
    if every.min() < 0 or every.max() >= n_samples:
        raise PartitionError(f"{path}: indices must lie in [0, {n_samples})")
    counts = np.bincount(every, minlength=n_samples)
    if (counts != 1).any():
        missing, repeated = int((counts == 0).sum()), int((counts > 1).sum())
        raise PartitionError(f"{path}: every sample must be in exactly one shard "
                             f"({missing} missing, {repeated} repeated)")
    return shards


# ---------------------------------------------------------------- label statistics


def label_entropy(labels: np.ndarray, shard: np.ndarray) -> float:
    """Entropy (nats) of the label distribution of one shard."""
    counts = np.unique(np.asarray(labels)[shard], return_counts=True)[1]
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def mean_label_entropy(labels: np.ndarray, shards: Sequence[np.ndarray]) -> float:
    """Mean over shards of :func:`label_entropy`."""
    return float(np.mean([label_entropy(labels, s) for s in shards]))


def expected_dirichlet_entropy(labels: np.ndarray, n_members: int, alpha: float, *, draws: int = 200,
                               seed: int = 0) -> float:
    """Monte Carlo expectation of the mean shard label entropy under the Dirichlet(alpha) scheme.

    Same generative model as ``partition(scheme="dirichlet")`` (each class split by
    Dirichlet(alpha * 1_N) proportions) but with continuous proportions: no rounding
    to whole samples and no repair, so it measures what the discrete partition should match.
    """
    labels = np.asarray(labels)
    class_counts = np.unique(labels, return_counts=True)[1].astype(np.float64)
    rng = numpy_generator(seed, "", 0, "partition-entropy-expectation")
    total = 0.0
    for _ in range(draws):
        proportions = rng.dirichlet(np.full(n_members, alpha), size=len(class_counts))  # classes x members
        mass = proportions * class_counts[:, None]
        p = mass / mass.sum(axis=0, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, -p * np.log(p), 0.0)
        total += float(terms.sum(axis=0).mean())
    return total / draws

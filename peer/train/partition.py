"""Split a training set across named members, reproducibly from a seed, stable as members come and go.

``partition(labels, names, scheme=..., seed=...)`` returns ``{name: sorted int64
index array}``. Each member's shard is keyed by its *name*, never its position:
every scheme is a rendezvous (highest-random-weight) assignment, each member
scoring each sample from a counter-based draw of (seed, member name, sample
index), the best score taking the sample. So:

- a member that joins takes samples only from the others, and one that leaves
  hands out only its own (each to its runner-up);
- every member computes the same assignment from the same seed and names, in
  any order; every sample lands in exactly one shard. Sizes are multinomial.

Schemes (``iid``: the winner of each sample is uniform over the members):

- ``dirichlet``: label skew; per class a Gamma(alpha) weight per member keyed by
  (seed, name, class), an exponential race, exactly Dirichlet(alpha * 1_N).
- ``shards``: McMahan et al. 2017's label-sorted runs, by consistent hashing
  (``shards_per_member`` points per member on a circle of label-sorted samples).
- ``file``: ``{name: [indices]}`` (:func:`save_index_file`): every member named,
  the lists disjoint and covering every sample.

An empty shard is repaired deterministically, in name order: only a repair moves
samples between members that did not join or leave. Details: docs/design/training.md.

``iid_shard(n, names, name, seed=...)`` is one member's ``iid`` shard, equal to
``partition(...)[name]``, from the count ``n`` alone, in chunks: its memory is that shard plus
a chunk (a lazy dataset of any size: no labels, no owner array of every sample).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from protocols.errors import HivemeshError
from protocols.rng import numpy_generator

SCHEMES = ("iid", "dirichlet", "shards", "file")

Shards = dict[str, np.ndarray]


class PartitionError(HivemeshError, ValueError):
    """A partition that cannot be made (too few samples, bad index file, bad option)."""


def partition(labels: Sequence[int] | np.ndarray, names: Sequence[str], *, scheme: str = "iid", seed: int = 0,
              alpha: float = 0.5, shards_per_member: int = 2,
              path: str | Path | None = None) -> Shards:
    """The shards of ``len(labels)`` samples for the members ``names`` (see the module docstring)."""
    labels = np.asarray(labels)
    names = list(names)
    n = len(labels)
    if not names:
        raise PartitionError("a partition needs at least one member")
    if len(set(names)) != len(names):
        raise PartitionError("member names must be unique")
    if n < len(names):
        raise PartitionError(f"{n} samples cannot fill {len(names)} non-empty shards")
    if scheme == "file":
        if path is None:
            raise PartitionError("scheme 'file' needs a path to a JSON index file")
        return load_index_file(path, n, names)
    if scheme == "iid":
        scores = _Scores(names, lambda name: -_uniform(seed, name, n, "partition-iid"))
    elif scheme == "dirichlet":
        scores = _dirichlet_scores(labels, names, alpha, seed)
    elif scheme == "shards":
        scores = _shard_scores(labels, names, shards_per_member, seed)
    else:
        raise PartitionError(f"unknown partition scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    owner = scores.winners(n)
    _repair_empty(owner, scores)
    return {name: np.flatnonzero(owner == m).astype(np.int64) for m, name in enumerate(names)}


IID_CHUNK = 1 << 18  # samples scored at a time by iid_shard: a few MiB whatever the dataset's size


def iid_shard(n: int, names: Sequence[str], name: str, *, seed: int = 0,
              chunk: int = IID_CHUNK) -> np.ndarray:
    """Member ``name``'s shard of ``partition(range(n), names, scheme="iid", seed=seed)``, from ``n``
    alone, scored ``chunk`` samples at a time (each member's draws are one keyed stream, drawn on)."""
    names = list(names)
    if name not in names:
        raise PartitionError(f"member {name} is not among the members to partition for")
    if not names or len(set(names)) != len(names) or n < len(names):
        return partition(np.zeros(n, dtype=np.int64), names, seed=seed)[name]  # its error
    order = sorted(range(len(names)), key=names.__getitem__)  # ties go to the smaller name
    streams = [numpy_generator(seed, names[m], 0, "partition-iid") for m in order]
    me = order.index(names.index(name))
    counts = np.zeros(len(names), dtype=np.int64)
    pieces = []
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        best = np.full(size, np.inf)
        owner = np.full(size, -1, dtype=np.int64)
        for rank, stream in enumerate(streams):
            score = -(1.0 - stream.random(size))
            better = score < best
            best[better] = score[better]
            owner[better] = rank
        counts += np.bincount(owner, minlength=len(names))
        pieces.append(start + np.flatnonzero(owner == me))
    if (counts == 0).any():  # a repair needs every owner: only when n is small enough to hold them
        return partition(np.zeros(n, dtype=np.int64), names, seed=seed)[name]
    return np.concatenate(pieces).astype(np.int64)


class _Scores:
    """Each member's score for every sample (lower wins), computed one member at a time."""

    def __init__(self, names: Sequence[str], score: Callable[[str], np.ndarray]) -> None:
        self.names = list(names)
        self.score = score

    def winners(self, n: int) -> np.ndarray:
        """The index (into ``names``) of each sample's winner; ties go to the smaller name."""
        best = np.full(n, np.inf)
        owner = np.full(n, -1, dtype=np.int64)
        for m in sorted(range(len(self.names)), key=self.names.__getitem__):
            score = self.score(self.names[m])
            better = score < best
            best[better] = score[better]
            owner[better] = m
        return owner


def _uniform(seed: int, name: str, n: int, purpose: str) -> np.ndarray:
    """n draws in (0, 1], the i-th keyed by (seed, name, i) alone (a prefix of one keyed stream)."""
    return 1.0 - numpy_generator(seed, name, 0, purpose).random(n)


def _dirichlet_scores(labels: np.ndarray, names: Sequence[str], alpha: float, seed: int) -> _Scores:
    if not alpha > 0:
        raise PartitionError(f"dirichlet alpha must be positive, not {alpha}")
    classes, class_of = np.unique(labels, return_inverse=True)

    def score(name: str) -> np.ndarray:
        # log Gamma(alpha) as log Gamma(alpha + 1) + log(U) / alpha: no underflow to log(0) for tiny alpha
        log_weight = np.empty(len(classes))
        for c, label in enumerate(classes):
            rng = numpy_generator(seed, name, int(label), "partition-dirichlet-weight")
            log_weight[c] = np.log(rng.gamma(alpha + 1.0)) + np.log(1.0 - rng.random()) / alpha
        race = -np.log(_uniform(seed, name, len(labels), "partition-dirichlet-race"))  # Exp(1)
        with np.errstate(divide="ignore"):
            return np.log(race) - log_weight[class_of]

    return _Scores(names, score)


def _shard_scores(labels: np.ndarray, names: Sequence[str], per_member: int, seed: int) -> _Scores:
    if per_member < 1:
        raise PartitionError(f"shards_per_member must be at least 1, not {per_member}")
    n = len(labels)
    tiebreak = numpy_generator(seed, "", 0, "partition-shards").permutation(n)
    by_label = tiebreak[np.argsort(labels[tiebreak], kind="stable")]
    position = np.empty(n)
    position[by_label] = (np.arange(n) + 0.5) / n  # each sample's place on the circle [0, 1)

    def score(name: str) -> np.ndarray:
        points = numpy_generator(seed, name, 0, "partition-shards-points").random(per_member)
        return np.min((position[:, None] - points[None, :]) % 1.0, axis=1)  # distance back to its point

    return _Scores(names, score)


def _repair_empty(owner: np.ndarray, scores: _Scores) -> None:
    """Give each empty member (in name order) the sample it scores best among those of members
    holding more than one (see the module docstring)."""
    counts = np.bincount(owner, minlength=len(scores.names))
    for m in sorted(np.flatnonzero(counts == 0), key=lambda m: scores.names[m]):
        counts = np.bincount(owner, minlength=len(scores.names))
        score = np.where(counts[owner] > 1, scores.score(scores.names[m]), np.inf)
        sample = int(np.argmin(score))
        owner[sample] = m


# ---------------------------------------------------------------- index files


def save_index_file(path: str | Path, shards: Mapping[str, np.ndarray]) -> None:
    """Write shards as a JSON object ``{name: [indices]}``."""
    data = {name: [int(i) for i in shard] for name, shard in sorted(shards.items())}
    Path(path).write_text(json.dumps(data) + "\n")


def load_index_file(path: str | Path, n_samples: int, names: Sequence[str]) -> Shards:
    """Read and check an index file: a non-empty list for every member in ``names``, the lists
    (of every name in the file) disjoint and covering every sample."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PartitionError(f"{path}: no such index file") from None
    except (OSError, ValueError) as error:
        raise PartitionError(f"{path}: not a JSON index file: {error}") from None
    if isinstance(data, list):
        raise PartitionError(f"{path}: a JSON list of shards is the old, positional format; shards are "
                             'keyed by member name now: write {"p00": [...], "p01": [...], ...}')
    if not isinstance(data, dict) or not all(isinstance(s, list) for s in data.values()):
        raise PartitionError(f"{path}: expected a JSON object of member name -> list of sample indices")
    missing = [name for name in names if name not in data]
    if missing:
        raise PartitionError(f"{path}: no shard for member(s) {', '.join(missing)}")
    shards: Shards = {}
    for name, items in sorted(data.items()):
        if not items and name in names:
            raise PartitionError(f"{path}: the shard of {name} is empty")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise PartitionError(f"{path}: the shard of {name} holds something other than integers")
        shards[name] = np.sort(np.asarray(items, dtype=np.int64))
    every = np.concatenate(list(shards.values()))
    if every.min() < 0 or every.max() >= n_samples:
        raise PartitionError(f"{path}: indices must lie in [0, {n_samples})")
    counts = np.bincount(every, minlength=n_samples)
    if (counts != 1).any():
        missing_n, repeated = int((counts == 0).sum()), int((counts > 1).sum())
        raise PartitionError(f"{path}: every sample must be in exactly one shard "
                             f"({missing_n} missing, {repeated} repeated)")
    return {name: shards[name] for name in names}


# ---------------------------------------------------------------- label statistics


def label_entropy(labels: np.ndarray, shard: np.ndarray) -> float:
    """Entropy (nats) of the label distribution of one shard."""
    counts = np.unique(np.asarray(labels)[shard], return_counts=True)[1]
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def mean_label_entropy(labels: np.ndarray, shards: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> float:
    """Mean over shards of :func:`label_entropy`."""
    values = shards.values() if isinstance(shards, Mapping) else shards
    return float(np.mean([label_entropy(labels, s) for s in values]))


def expected_dirichlet_entropy(labels: np.ndarray, n_members: int, alpha: float, *, draws: int = 200,
                               seed: int = 0) -> float:
    """Monte Carlo expectation of the mean shard label entropy under the Dirichlet(alpha) scheme.

    The generative model of ``partition(scheme="dirichlet")``: per class, proportions over the
    members from Dirichlet(alpha * 1_N), then each sample of the class won by a member drawn from
    them (multinomial counts), so the empirical entropy of small shards is matched too. A member
    left empty counts as entropy 0 (the repair gives it one sample).
    """
    labels = np.asarray(labels)
    class_counts = np.unique(labels, return_counts=True)[1]
    rng = numpy_generator(seed, "", 0, "partition-entropy-expectation")
    total = 0.0
    for _ in range(draws):
        proportions = rng.dirichlet(np.full(n_members, alpha), size=len(class_counts))  # classes x members
        counts = np.stack([rng.multinomial(k, p) for k, p in zip(class_counts, proportions, strict=True)])
        size = counts.sum(axis=0, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = counts / size
            terms = np.where(counts > 0, -p * np.log(p), 0.0)
        total += float(terms.sum(axis=0).mean())
    return total / draws

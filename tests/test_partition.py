import json
from pathlib import Path

import numpy as np
import pytest

from peer.train.partition import (
    PartitionError,
    expected_dirichlet_entropy,
    label_entropy,
    mean_label_entropy,
    partition,
    save_index_file,
)


def digits_like_labels(n: int = 1437, classes: int = 10, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=n)


def assert_exact_cover(shards: list[np.ndarray], n: int, n_members: int) -> None:
    assert len(shards) == n_members
    assert all(len(s) > 0 for s in shards)
    every = np.concatenate(shards)
    assert np.array_equal(np.sort(every), np.arange(n))
    assert all(s.dtype == np.int64 and np.all(np.diff(s) > 0) for s in shards)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize("n_members", [1, 7, 64])
def test_every_sample_in_exactly_one_nonempty_shard(scheme: str, n_members: int) -> None:
    labels = digits_like_labels()
    shards = partition(labels, n_members, scheme=scheme, seed=11, alpha=0.05)
    assert_exact_cover(shards, len(labels), n_members)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_reproducible_from_seed_and_seed_matters(scheme: str) -> None:
    labels = digits_like_labels()
    first = partition(labels, 10, scheme=scheme, seed=5)
    again = partition(labels, 10, scheme=scheme, seed=5)
    other = partition(labels, 10, scheme=scheme, seed=6)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_iid_shards_are_balanced() -> None:
    shards = partition(np.zeros(1000, dtype=np.int64), 7, scheme="iid", seed=0)
    assert {len(s) for s in shards} <= {142, 143}


def test_tiny_alpha_empties_are_repaired_deterministically() -> None:
    labels = digits_like_labels(n=200)
    shards = partition(labels, 150, scheme="dirichlet", seed=1, alpha=0.01)
    assert_exact_cover(shards, 200, 150)
    assert all(np.array_equal(a, b) for a, b in
               zip(shards, partition(labels, 150, scheme="dirichlet", seed=1, alpha=0.01), strict=True))


@pytest.mark.parametrize(("n_members", "alpha"), [(20, 0.5), (20, 1.0), (50, 0.5), (50, 1.0), (50, 5.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_mean_label_entropy_within_ten_percent_of_expectation(
        n_members: int, alpha: float, seed: int) -> None:
    labels = digits_like_labels()
    expected = expected_dirichlet_entropy(labels, n_members, alpha, draws=100)
    got = mean_label_entropy(labels, partition(labels, n_members, scheme="dirichlet", seed=seed, alpha=alpha))
    assert abs(got - expected) <= 0.1 * expected


def test_small_alpha_entropy_matches_on_average_over_seeds() -> None:
    # One draw at alpha=0.1 with 10 classes varies by +-30%; the average over seeds must still match.
    labels = digits_like_labels()
    expected = expected_dirichlet_entropy(labels, 20, 0.1, draws=100)
    got = np.mean([mean_label_entropy(labels, partition(labels, 20, scheme="dirichlet", seed=s, alpha=0.1))
                   for s in range(12)])
    assert abs(got - expected) <= 0.1 * expected


def test_smaller_alpha_means_more_skew() -> None:
    labels = digits_like_labels()
    entropies = [mean_label_entropy(labels, partition(labels, 20, scheme="dirichlet", seed=0, alpha=a))
                 for a in (0.05, 0.5, 100.0)]
    assert entropies[0] < entropies[1] < entropies[2]
    assert entropies[2] > 0.95 * np.log(10)


def test_mcmahan_shards_give_each_member_few_labels() -> None:
    labels = np.repeat(np.arange(10), 100)
    shards = partition(labels, 50, scheme="shards", seed=0, shards_per_member=2)
    assert_exact_cover(shards, 1000, 50)
    assert all(len(np.unique(labels[s])) <= 2 for s in shards)
    assert {len(s) for s in shards} == {20}


def test_index_file_round_trip_and_checks(tmp_path: Path) -> None:
    labels = digits_like_labels(n=100)
    shards = partition(labels, 4, scheme="dirichlet", seed=0)
    path = tmp_path / "index.json"
    save_index_file(path, shards)
    loaded = partition(labels, 4, scheme="file", path=path)
    assert all(np.array_equal(a, b) for a, b in zip(shards, loaded, strict=True))

    bad = [[int(i) for i in s] for s in shards]
    bad[1].append(bad[0][0])
    path.write_text(json.dumps(bad))
    with pytest.raises(PartitionError, match="exactly one shard"):
        partition(labels, 4, scheme="file", path=path)
    path.write_text(json.dumps([[0, 1], []]))
    with pytest.raises(PartitionError, match="2 shards"):
        partition(labels, 4, scheme="file", path=path)
    path.write_text("not json")
    with pytest.raises(PartitionError, match="not a JSON"):
        partition(labels, 4, scheme="file", path=path)


def test_bad_requests_are_user_errors() -> None:
    with pytest.raises(PartitionError, match="cannot fill"):
        partition([0, 1], 3)
    with pytest.raises(PartitionError, match="unknown partition scheme"):
        partition([0, 1, 2], 3, scheme="zipf")
    with pytest.raises(PartitionError, match="alpha"):
        partition([0, 1, 2], 3, scheme="dirichlet", alpha=0.0)


def test_label_entropy_of_known_distributions() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    assert label_entropy(labels, np.arange(8)) == pytest.approx(np.log(4))
    assert label_entropy(labels, np.array([0, 1])) == 0.0

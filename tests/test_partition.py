import json
from pathlib import Path

import numpy as np
import pytest

from peer.train.partition import (
    PartitionError,
    Shards,
    expected_dirichlet_entropy,
    label_entropy,
    mean_label_entropy,
    partition,
    save_index_file,
)

SCHEMES = ["iid", "dirichlet", "shards"]


def digits_like_labels(n: int = 1437, classes: int = 10, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=n)


def members(n: int) -> list[str]:
    return [f"p{i:02d}" for i in range(n)]


def assert_exact_cover(shards: Shards, n: int, names: list[str]) -> None:
    assert list(shards) == names
    assert all(len(s) > 0 for s in shards.values())
    every = np.concatenate(list(shards.values()))
    assert np.array_equal(np.sort(every), np.arange(n))
    assert all(s.dtype == np.int64 and np.all(np.diff(s) > 0) for s in shards.values())


def same(a: Shards, b: Shards) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n_members", [1, 7, 64])
def test_every_sample_in_exactly_one_nonempty_shard(scheme: str, n_members: int) -> None:
    labels = digits_like_labels()
    shards = partition(labels, members(n_members), scheme=scheme, seed=11, alpha=0.05)
    assert_exact_cover(shards, len(labels), members(n_members))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_reproducible_from_seed_and_seed_matters(scheme: str) -> None:
    labels = digits_like_labels()
    first = partition(labels, members(10), scheme=scheme, seed=5)
    assert same(first, partition(labels, members(10), scheme=scheme, seed=5))
    reordered = partition(labels, members(10)[::-1], scheme=scheme, seed=5)   # the order asked in
    assert all(np.array_equal(first[name], reordered[name]) for name in first)
    other = partition(labels, members(10), scheme=scheme, seed=6)
    assert not any(np.array_equal(first[name], other[name]) for name in first)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_joiner_takes_only_from_others_and_a_leaver_hands_out_only_its_own(scheme: str) -> None:
    # Prepare: ten members, then p10 joins, then p03 leaves (no shard is empty: no repair moves anything)
    labels = digits_like_labels()
    before = partition(labels, members(10), scheme=scheme, seed=2)
    joined = partition(labels, [*members(10), "p10"], scheme=scheme, seed=2)
    left = partition(labels, [n for n in members(10) if n != "p03"], scheme=scheme, seed=2)
    # Assert: every old member keeps what it had minus what the joiner took; the joiner took something
    assert len(joined["p10"]) > 0
    for name in members(10):
        assert np.isin(joined[name], before[name]).all()
        assert np.array_equal(np.union1d(joined[name], np.intersect1d(joined["p10"], before[name])),
                              before[name])
    # Assert: after a leave each member keeps all it had, and gains only samples the leaver had
    assert sum(len(s) for s in left.values()) == len(labels)
    for name, shard in left.items():
        assert np.isin(before[name], shard).all()
        assert np.isin(np.setdiff1d(shard, before[name]), before["p03"]).all()


def test_iid_shard_sizes_are_binomial() -> None:
    # Each sample is won by one of 7 members uniformly: sizes ~ Binomial(7000, 1/7), sd ~ 29.3
    n, k = 7000, 7
    shards = partition(np.zeros(n, dtype=np.int64), members(k), scheme="iid", seed=0)
    sd = np.sqrt(n * (1 / k) * (1 - 1 / k))
    sizes = np.array([len(s) for s in shards.values()])
    assert (np.abs(sizes - n / k) <= 4 * sd).all(), sizes
    assert sizes.std() > 0.3 * sd    # not cut to equal parts: they vary as a multinomial does


def test_tiny_alpha_empties_are_repaired_deterministically() -> None:
    labels = digits_like_labels(n=200)
    shards = partition(labels, members(150), scheme="dirichlet", seed=1, alpha=0.01)
    assert_exact_cover(shards, 200, members(150))
    assert same(shards, partition(labels, members(150), scheme="dirichlet", seed=1, alpha=0.01))


@pytest.mark.parametrize(("n_members", "alpha"), [(20, 0.5), (20, 1.0), (50, 0.5), (50, 1.0), (50, 5.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_mean_label_entropy_within_ten_percent_of_expectation(
        n_members: int, alpha: float, seed: int) -> None:
    labels = digits_like_labels()
    expected = expected_dirichlet_entropy(labels, n_members, alpha, draws=100)
    got = mean_label_entropy(labels, partition(labels, members(n_members), scheme="dirichlet", seed=seed,
                                               alpha=alpha))
    assert abs(got - expected) <= 0.1 * expected


def test_small_alpha_entropy_matches_on_average_over_seeds() -> None:
    # One draw at alpha=0.1 with 10 classes varies by +-30%; the average over seeds must still match.
    labels = digits_like_labels()
    expected = expected_dirichlet_entropy(labels, 20, 0.1, draws=100)
    got = np.mean([mean_label_entropy(labels, partition(labels, members(20), scheme="dirichlet", seed=s,
                                                        alpha=0.1))
                   for s in range(12)])
    assert abs(got - expected) <= 0.1 * expected


def test_smaller_alpha_means_more_skew() -> None:
    labels = digits_like_labels()
    entropies = [mean_label_entropy(labels, partition(labels, members(20), scheme="dirichlet", seed=0,
                                                      alpha=a)) for a in (0.05, 0.5, 100.0)]
    assert entropies[0] < entropies[1] < entropies[2]
    assert entropies[2] > 0.95 * np.log(10)


def test_mcmahan_shards_give_each_member_few_labels() -> None:
    # Label-sorted runs: a member's 2 runs (mean 10 samples each) rarely cross a boundary of a label's
    # 100 samples, so members see about 2 labels where iid members see all 10
    labels = np.repeat(np.arange(10), 100)
    shards = partition(labels, members(50), scheme="shards", seed=0, shards_per_member=2)
    assert_exact_cover(shards, 1000, members(50))
    seen = np.array([len(np.unique(labels[s])) for s in shards.values()])
    assert seen.max() <= 4 and seen.mean() <= 2.5, seen
    iid = partition(labels, members(50), scheme="iid", seed=0)
    assert np.mean([len(np.unique(labels[s])) for s in iid.values()]) > 5


def test_index_file_round_trip_and_checks(tmp_path: Path) -> None:
    labels = digits_like_labels(n=100)
    shards = partition(labels, members(4), scheme="dirichlet", seed=0)
    path = tmp_path / "index.json"
    save_index_file(path, shards)
    assert same(shards, partition(labels, members(4), scheme="file", path=path))
    # a member not in this run (another roster version) may be listed: its samples go unused here
    assert same({n: shards[n] for n in members(3)}, partition(labels, members(3), scheme="file", path=path))

    bad = {name: [int(i) for i in s] for name, s in shards.items()}
    bad["p01"].append(bad["p00"][0])
    path.write_text(json.dumps(bad))
    with pytest.raises(PartitionError, match="exactly one shard"):
        partition(labels, members(4), scheme="file", path=path)
    path.write_text(json.dumps({"p00": [0, 1], "p01": []}))
    with pytest.raises(PartitionError, match=r"no shard for member\(s\) p02, p03"):
        partition(labels, members(4), scheme="file", path=path)
    path.write_text(json.dumps([[0, 1], [2]]))
    with pytest.raises(PartitionError, match="keyed by member name"):
        partition(labels, members(2), scheme="file", path=path)
    path.write_text("not json")
    with pytest.raises(PartitionError, match="not a JSON"):
        partition(labels, members(4), scheme="file", path=path)


def test_bad_requests_are_user_errors() -> None:
    with pytest.raises(PartitionError, match="cannot fill"):
        partition([0, 1], members(3))
    with pytest.raises(PartitionError, match="unknown partition scheme"):
        partition([0, 1, 2], members(3), scheme="zipf")
    with pytest.raises(PartitionError, match="alpha"):
        partition([0, 1, 2], members(3), scheme="dirichlet", alpha=0.0)
    with pytest.raises(PartitionError, match="unique"):
        partition([0, 1, 2], ["a", "a"])


def test_label_entropy_of_known_distributions() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    assert label_entropy(labels, np.arange(8)) == pytest.approx(np.log(4))
    assert label_entropy(labels, np.array([0, 1])) == 0.0

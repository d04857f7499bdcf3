"""The topology maths held to theory: convergence rates, closed-form gaps, exact one-peer averaging."""

import math
from collections.abc import Iterator

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from topology import build
from topology.analysis import (
    bytes_per_round,
    consensus_rate,
    diameter,
    period_product,
    rounds_to_shrink,
    spectral_gap,
    summary,
)


@pytest.fixture(autouse=True)
def _one_blas_thread() -> Iterator[None]:
    # Small matrix products with several BLAS threads on a shared 2-core machine spin for seconds.
    with threadpool_limits(limits=1):
        yield


def _fitted_log_rate(w: np.ndarray, seed: int) -> float:
    """Slope of log ||X_t - mean|| for X <- W X, fitted over the steps before the error is 1e-10 of its start.

    Each member holds a 256-long vector (as it holds a model), so the start has a
    typical share along the slowest eigenvector instead of one unlucky coordinate.
    """
    x = np.random.default_rng(seed).standard_normal((w.shape[0], 256))
    start = np.linalg.norm(x - x.mean(axis=0))
    errors = [start]
    while True:
        x = w @ x
        error = np.linalg.norm(x - x.mean(axis=0))
        if error < 1e-10 * start:
            break
        errors.append(error)
        assert len(errors) < 10_000, "averaging did not converge"
    steps = np.arange(len(errors))
    return float(np.polyfit(steps, np.log(errors), 1)[0])


@pytest.mark.parametrize("spec", ["ring:16", "ring:25", "torus:4x4", "torus:8x8", "exponential:16",
                                  "exponential:32", "exponential:20"])
@pytest.mark.parametrize("seed", [0, 1])
def test_averaging_shrinks_disagreement_at_the_predicted_rate(spec: str, seed: int) -> None:
    topology = build(spec)
    predicted = math.log(consensus_rate(topology))
    measured = _fitted_log_rate(topology.mixing(0), seed)
    assert measured / predicted == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("n", [3, 5, 8, 16, 33, 100])
def test_ring_metropolis_gap_matches_closed_form(n: int) -> None:
    assert spectral_gap(build(f"ring:{n}")) == pytest.approx((2 / 3) * (1 - math.cos(2 * math.pi / n)),
                                                             rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("spec", ["one-peer-exponential:16", "directed-one-peer-exponential:16"])
def test_one_peer_exponential_period_averages_exactly(spec: str) -> None:
    topology = build(spec)
    assert topology.period == 4
    np.testing.assert_allclose(period_product(topology), np.full((16, 16), 1 / 16), atol=1e-15)
    assert spectral_gap(topology) == 1.0
    assert rounds_to_shrink(topology) == 4


def test_one_peer_round_alone_is_not_averaging() -> None:
    topology = build("one-peer-exponential:16")
    assert not np.allclose(topology.mixing(0) @ topology.mixing(1), 1 / 16)


def test_complete_graph_averages_in_one_round() -> None:
    topology = build("complete:8")
    np.testing.assert_allclose(topology.mixing(0), np.full((8, 8), 1 / 8), atol=1e-15)
    assert spectral_gap(topology) == 1.0 and rounds_to_shrink(topology) == 1 and diameter(topology) == 1


def test_rounds_to_shrink_1000x_agree_with_simulation() -> None:
    topology = build("torus:5x5")
    w, rounds = topology.mixing(0), rounds_to_shrink(topology)
    assert rounds is not None
    x = np.random.default_rng(0).standard_normal((25, 512))
    start = np.linalg.norm(x - x.mean(axis=0))
    for _ in range(rounds):
        x = w @ x
    shrink = start / np.linalg.norm(x - x.mean(axis=0))
    # The bound is asymptotic: the measured shrink lands near 1000x, well past 1000 / 2.
    assert 500 < shrink < 5000


def test_directed_push_sum_ratio_converges_at_predicted_rate() -> None:
    topology = build("directed-exponential:6")
    w = topology.mixing(0)
    x, weight = np.random.default_rng(1).standard_normal(6), np.ones(6)
    target = x.mean()
    rate = consensus_rate(topology)
    assert 0 < rate < 1
    for _ in range(math.ceil(math.log(1e-12) / math.log(rate))):
        x, weight = w @ x, w @ weight
    assert x.sum() == pytest.approx(target * 6)  # push-sum conserves mass
    np.testing.assert_allclose(x / weight, target, atol=1e-9)


def test_summary_reports_diameter_degrees_and_bytes() -> None:
    topology = build("ring:16")
    report = summary(topology, model_params=25_000_000)
    assert report["diameter"] == 8 and diameter(build("hypercube:16")) == 4
    assert report["degree"] == {"minimum": 2, "maximum": 2, "mean": 2.0}
    assert report["messages_per_round"] == 32
    assert report["bytes_per_round"] == 32 * 25_000_000 * 4 == bytes_per_round(topology, 25_000_000)
    assert bytes_per_round(build("one-peer-exponential:16"), 10) == 16 * 10 * 4
    assert bytes_per_round(build("directed-one-peer-exponential:16"), 10) == 16 * 10 * 4

"""Client-level differential privacy at the gateway (issue 13, item 2, central DP), driven by hand.

The settings that DP refuses, Poisson sampling, clipping (fixed and adaptive), the noise's
standard deviation on all-zero updates (acceptance e, second bar), the accountant against
dp-accounting's own composition (third bar), and no noise reported as an infinite epsilon
(the negative control). The 100-round training runs are in test_federation_dp_sim.py."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from peer.cli.status import _federation_lines
from peer.files.config import ConfigError, load
from peer.runtime.peerconfig import PeerFederationSection
from protocols.events import Action, Received, Send, Start, TimerFired
from protocols.federation import (
    DifferentialPrivacyConfig,
    FedAvgServer,
    FederationConfig,
    ServerPhase,
    make_server,
    report_row,
)
from protocols.federation.accountant import RoundAccountant
from protocols.federation.distributed_dp import discrete_gaussian, share_stddev
from protocols.federation.privacy import clip, next_clip_norm, noised_centred_count, poisson_sample
from protocols.messages import ClientUpdate, RoundStart
from protocols.rng import torch_generator

SECRET = 12345
Reply = Callable[[str, int], "torch.Tensor | None"]


def names(count: int) -> tuple[str, ...]:
    return tuple(f"c{i:03d}" for i in range(count))


def dp_config(rounds: int = 3, **privacy: float) -> FederationConfig:
    settings: dict[str, float] = {"noise_multiplier": 1.0, "clip_norm": 1.0, "sampling_rate": 0.1, **privacy}
    return FederationConfig(rounds=rounds, min_clients=2, uplink="identity", round_timeout_s=10.0,
                            differential_privacy=DifferentialPrivacyConfig(**settings))


def dp_server(config: FederationConfig, clients: int, dim: int = 4) -> FedAvgServer:
    return FedAvgServer(config, name="gw", params=torch.zeros(dim, dtype=torch.float64),
                        clients=names(clients), secret_seed=SECRET)


def drive(server: FedAvgServer, reply: Reply) -> list[tuple[str, ...]]:
    """Every round to the end: each asked client answers ``reply(name, round)`` (None: silent, so the
    deadline closes the round). The cohorts, by round (empty rounds close at once, unasked)."""
    pending: list[Action] = server.handle(Start(), 0.0)
    while server.phase is not ServerPhase.FINISHED:
        starts = [a for a in pending if isinstance(a, Send) and isinstance(a.message, RoundStart)]
        assert len(starts) == 1, "a round opens with one RoundStart"
        recipients, start = starts[0].recipients, starts[0].message
        assert isinstance(start, RoundStart)
        pending = []
        for name in recipients:
            delta = reply(name, start.round)
            if delta is not None:
                update = ClientUpdate(round=start.round, num_samples=1, tensors={"x": delta})
                pending += server.handle(Received(name, update), 1.0)
        if server.round == start.round:
            pending += server.handle(TimerFired(f"deadline/{start.round}"), 10.0)
    return [server.reports[r].asked for r in sorted(server.reports)]


def zeros(dim: int) -> Reply:
    return lambda name, round_index: torch.zeros(dim, dtype=torch.float64)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(("overrides", "privacy", "expected"), [
    ({"over_selection": 0.3}, {}, "over_selection must be 0 while differential_privacy is on"),
    ({"mode": "fedbuff"}, {}, "needs mode 'sync'"),
    ({"aggregator": "median"}, {}, "aggregator 'median' cannot be used with differential_privacy"),
    ({"clip_norm": 1.0}, {}, "the clip norm is differential_privacy.clip_norm"),
    ({}, {"noise_multiplier": -1.0}, "noise_multiplier must be >= 0"),
    ({}, {"clip_norm": 0.0}, "clip_norm must be > 0"),
    ({}, {"sampling_rate": 0.0}, "sampling_rate must be in (0, 1]"),
    ({}, {"sampling_rate": 1.5}, "sampling_rate must be in (0, 1]"),
    ({}, {"delta": 1.0}, "delta must be in (0, 1)"),
    ({}, {"target_quantile": 1.0}, "target_quantile must be in [0, 1)"),
    ({}, {"target_quantile": 0.5, "count_noise_stddev": 0.4},
     "count_noise_stddev must be > noise_multiplier / 2"),
])
def test_settings_dp_cannot_account_for_are_refused_naming_the_key(
        overrides: dict[str, object], privacy: dict[str, float], expected: str) -> None:
    # Prepare
    settings: dict[str, object] = {"uplink": "identity", **overrides}
    # Execute / Assert
    with pytest.raises(ValueError, match=None) as caught:
        FederationConfig(**settings, differential_privacy=DifferentialPrivacyConfig(**privacy))  # type: ignore[arg-type]
    assert expected in str(caught.value)


def test_the_toml_section_parses_and_its_errors_name_the_key() -> None:
    # Prepare: [federation] with [federation.differential_privacy], as a gateway's config has it
    table = {"rounds": 5, "differential_privacy": {"noise_multiplier": 1.1, "clip_norm": 0.5,
                                                   "sampling_rate": 0.2, "target_quantile": 0.5,
                                                   "count_noise_stddev": 1.0}}
    # Execute
    section = load(PeerFederationSection, table, source="peer.toml", prefix="federation")
    plain = load(PeerFederationSection, {"rounds": 5}, source="peer.toml", prefix="federation")
    # Assert
    assert section.differential_privacy == DifferentialPrivacyConfig(
        noise_multiplier=1.1, clip_norm=0.5, sampling_rate=0.2, target_quantile=0.5, count_noise_stddev=1.0)
    assert plain.differential_privacy is None
    with pytest.raises(ConfigError, match=r"'federation\.differential_privacy\.noise_multiplier'"):
        load(PeerFederationSection, {"differential_privacy": {"noise_multiplier": -2.0}}, source="peer.toml",
             prefix="federation")
    with pytest.raises(ConfigError, match=r"unknown key 'federation\.differential_privacy\.noise'"):
        load(PeerFederationSection, {"differential_privacy": {"noise": 1.0}}, source="peer.toml",
             prefix="federation")


def test_a_private_server_needs_the_gateways_own_secret_seed() -> None:
    with pytest.raises(ValueError, match="secret_seed"):
        make_server(dp_config(), name="gw", params=torch.zeros(4), clients=names(10))
    assert make_server(dp_config(), name="gw", params=torch.zeros(4), clients=names(10), secret_seed=1)


# ---------------------------------------------------------------- sampling and clipping


def test_poisson_sampling_asks_each_client_independently_whatever_the_order() -> None:
    # Prepare
    population = names(2000)
    # Execute
    drawn = poisson_sample(7, 0, population, 0.1)
    reversed_order = poisson_sample(7, 0, tuple(reversed(population)), 0.1)
    fewer = poisson_sample(7, 0, population[:1000], 0.1)
    # Assert: binomial(2000, 0.1) is 200 +- 13.4: four standard deviations either side
    assert abs(len(drawn) - 200) <= 4 * math.sqrt(2000 * 0.1 * 0.9)
    assert drawn == reversed_order and list(drawn) == sorted(drawn)
    assert fewer == tuple(name for name in drawn if name in set(population[:1000]))
    assert poisson_sample(7, 1, population, 0.1) != drawn
    assert poisson_sample(7, 0, population, 1.0) == tuple(sorted(population))


def test_a_private_server_asks_a_poisson_cohort_of_varying_size_and_takes_all_of_it() -> None:
    # Prepare: 100 clients, rate 0.1, every asked client answers
    server = dp_server(dp_config(rounds=30), clients=100)
    # Execute
    cohorts = drive(server, zeros(4))
    # Assert: the cohort sizes vary (Poisson, not a fixed m), average near q N, and every asked
    # client's update is taken (no over-selection)
    sizes = [len(c) for c in cohorts]
    assert len(set(sizes)) > 3 and 7 <= sum(sizes) / len(sizes) <= 13
    assert all(server.reports[r].taken == server.reports[r].asked for r in server.reports)
    # not the draw of the shared config seed: another secret asks others
    other = FedAvgServer(dp_config(rounds=30), name="gw", params=torch.zeros(4, dtype=torch.float64),
                         clients=names(100), secret_seed=SECRET + 1)
    assert drive(other, zeros(4)) != cohorts


def test_clip_scales_only_longer_updates() -> None:
    short, within = clip(torch.tensor([0.3, 0.4]), 1.0)
    long, inside = clip(torch.tensor([3.0, 4.0]), 1.0)
    assert within and torch.equal(short, torch.tensor([0.3, 0.4]))
    assert not inside and torch.allclose(long, torch.tensor([0.6, 0.8]))


def test_without_noise_the_aggregate_is_the_clipped_sum_over_the_expected_cohort() -> None:
    # Prepare: z = 0; each client sends a delta of norm 10, C = 1; q = 0.5 of 20: m = 10
    config = dp_config(rounds=1, noise_multiplier=0.0, sampling_rate=0.5)
    server = dp_server(config, clients=20)
    # Execute
    cohorts = drive(server, lambda name, r: torch.tensor([6.0, 8.0, 0.0, 0.0], dtype=torch.float64))
    # Assert: n clipped updates [0.6, 0.8] summed, divided by m = 10 however many answered
    n = len(cohorts[0])
    assert torch.allclose(server.params, torch.tensor([0.6, 0.8, 0.0, 0.0], dtype=torch.float64) * n / 10)
    assert server.counters["dp_updates_clipped"] == n


# ---------------------------------------------------------------- the noise (acceptance e, second bar)


@pytest.mark.parametrize("adaptive", [False, True])
def test_on_all_zero_updates_the_aggregate_has_standard_deviation_z_c_over_m(adaptive: bool) -> None:
    # Prepare: 100 clients, q = 0.1 (m = 10), z = 1.0, C = 0.5; 20,000 coordinates per round
    dim = 20_000
    privacy = {"noise_multiplier": 1.0, "clip_norm": 0.5, "sampling_rate": 0.1}
    if adaptive:
        privacy |= {"target_quantile": 0.5, "count_noise_stddev": 0.6}
    config = dp_config(rounds=5, **privacy)
    server = dp_server(config, clients=100, dim=dim)
    models: list[tuple[int, torch.Tensor]] = []

    def reply(name: str, round_index: int) -> torch.Tensor:
        if not models or models[-1][0] != round_index:
            models.append((round_index, server.params.clone()))
        return torch.zeros(dim, dtype=torch.float64)

    # Execute
    drive(server, reply)
    models.append((5, server.params.clone()))
    # Assert: each round moved the model by the noise alone, N(0, (z C / m)^2) per coordinate; with
    # adaptive clipping the update's multiplier is z_update (the count query takes the rest)
    z_update = config.differential_privacy.update_noise_multiplier() if config.differential_privacy else 0.0
    assert (z_update > 1.0) is adaptive
    for (round_index, before), (_, after) in itertools.pairwise(models):
        clip_norm = server.reports[round_index].clip_norm
        expected = z_update * clip_norm / 10
        measured = float((after - before).std())
        assert abs(measured - expected) <= 0.05 * expected, (round_index, measured, expected)
        assert abs(float((after - before).mean())) < 4 * expected / math.sqrt(dim)
    clip_norms = [server.reports[r].clip_norm for r in sorted(server.reports)]
    assert (clip_norms[-1] < clip_norms[0]) is adaptive  # zero updates are all covered: C shrinks


def test_a_round_nobody_was_drawn_for_still_releases_noise_and_is_accounted() -> None:
    # Prepare: 10 clients at rate 0.05: most rounds draw nobody
    server = dp_server(dp_config(rounds=20, sampling_rate=0.05), clients=10)
    # Execute
    drive(server, zeros(4))
    # Assert
    empty = [r for r, report in server.reports.items() if not report.asked]
    assert empty
    assert all(server.reports[r].closed_by == "empty" and server.reports[r].aggregated for r in empty)
    assert server.counters["closed_by_empty"] == len(empty)
    assert float(server.params.abs().sum()) > 0
    assert server.reports[19].epsilon == RoundAccountant(0.05, 1.0, 1e-5).epsilon(20)


# ---------------------------------------------------------------- adaptive clipping


def test_update_noise_multiplier_leaves_the_total_at_z() -> None:
    dp = DifferentialPrivacyConfig(noise_multiplier=1.0, target_quantile=0.5, count_noise_stddev=5.0)
    z_update = dp.update_noise_multiplier()
    assert z_update == pytest.approx((1.0 - 0.01) ** -0.5)
    assert z_update ** -2 + (2 * 5.0) ** -2 == pytest.approx(1.0)
    assert DifferentialPrivacyConfig(noise_multiplier=1.0).update_noise_multiplier() == 1.0


def test_next_clip_norm_moves_geometrically_toward_the_target_share() -> None:
    # the centred count: 8 of 10 covered is 8 - 5 = 3, a share of 3 / 10 + 1/2 = 0.8
    assert next_clip_norm(1.0, 3.0, 10.0, 0.5, 0.2) == pytest.approx(math.exp(-0.2 * 0.3))  # too many covered
    assert next_clip_norm(1.0, -3.0, 10.0, 0.5, 0.2) == pytest.approx(math.exp(0.2 * 0.3))
    assert next_clip_norm(1.0, 0.0, 10.0, 0.5, 0.2) == 1.0


def test_one_client_moves_the_count_query_by_half_whatever_its_bit() -> None:
    """The sensitivity the accounting assumes (1/2): with the same noise draw, one client more,
    covered or not, moves the released sum by exactly 1/2 (a raw 0/1 count would move by 1)."""
    def released(covered: int, taken: int) -> float:
        return noised_centred_count(covered, taken, 3.0, torch_generator(SECRET, "gw", 7, "dp-count"))

    for covered, taken in [(0, 0), (3, 5), (5, 5), (2, 9)]:
        base = released(covered, taken)
        assert released(covered + 1, taken + 1) - base == pytest.approx(0.5, abs=1e-12)
        assert released(covered, taken + 1) - base == pytest.approx(-0.5, abs=1e-12)
    with pytest.raises(ValueError, match="covered <= taken"):
        released(6, 5)


def test_the_server_steps_c_by_the_centred_count_over_the_expected_cohort() -> None:
    # Prepare: no noise at all (z = 0, sigma_b = 0), so C's steps show the statistic itself;
    # 20 clients at q = 0.5 (m = 10, cohorts of varying size); client i's norm is i / 10
    config = dp_config(rounds=12, noise_multiplier=0.0, clip_norm=1.0, sampling_rate=0.5,
                       target_quantile=0.5, count_noise_stddev=0.0)
    server = dp_server(config, clients=20)

    def reply(name: str, round_index: int) -> torch.Tensor:
        return torch.tensor([int(name[1:]) / 10, 0.0, 0.0, 0.0], dtype=torch.float64)

    # Execute
    drive(server, reply)
    # Assert: C_next = C exp(-eta ((covered - n/2) / m + 1/2 - target)), n the updates taken
    cohort_sizes = set()
    for r in range(11):
        report = server.reports[r]
        covered = sum(int(n[1:]) / 10 <= report.clip_norm for n in report.taken)
        share = (covered - len(report.taken) / 2) / 10 + 0.5
        assert server.reports[r + 1].clip_norm == pytest.approx(
            report.clip_norm * math.exp(-0.2 * (share - 0.5)), rel=1e-12), r
        cohort_sizes.add(len(report.taken))
    assert cohort_sizes - {10}, "some cohort differs from m, where the centred and raw counts part"


@pytest.mark.parametrize(("q", "z", "sigma_b", "rounds"),
                         [(0.1, 1.0, 1.0, 100), (0.1, 1.0, 5.0, 100), (0.5, 0.7, 0.4, 30),
                          (0.01, 2.0, 1.5, 500)])
def test_adaptive_clipping_is_accounted_with_the_two_queries_it_actually_runs(
        q: float, z: float, sigma_b: float, rounds: int) -> None:
    """Finding 4 of review 13: the reported epsilon (one Gaussian of multiplier z a round) equals
    dp-accounting's composition of the queries as run on the same Poisson sample: the update, of
    sensitivity C and noise z_update C, and the centred count, of sensitivity 1/2 (the test above)
    and noise sigma_b, so multiplier sigma_b / (1/2)."""
    dp = DifferentialPrivacyConfig(noise_multiplier=z, clip_norm=1.0, sampling_rate=q,
                                   target_quantile=0.5, count_noise_stddev=sigma_b)
    reported = RoundAccountant(q, dp.noise_multiplier, dp.delta).epsilon(rounds)
    actual = RdpAccountant()
    actual.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(dp.update_noise_multiplier()),
        dp_accounting.GaussianDpEvent(dp.count_noise_stddev / 0.5)])), rounds)
    assert reported == pytest.approx(float(actual.get_epsilon(dp.delta)), rel=1e-6)
    assert dp.update_noise_multiplier() > z  # the update's own noise pays for the count


def test_adaptive_clipping_finds_the_median_update_norm() -> None:
    # Prepare: client i's update has norm 0.5 + i / 100 (median 1.0); C starts at 0.1; q = 0.5
    config = dp_config(rounds=80, noise_multiplier=0.5, clip_norm=0.1, sampling_rate=0.5,
                       target_quantile=0.5, count_noise_stddev=2.5)
    server = dp_server(config, clients=100)

    def reply(name: str, round_index: int) -> torch.Tensor:
        return torch.tensor([0.5 + int(name[1:]) / 100, 0.0, 0.0, 0.0], dtype=torch.float64)

    # Execute
    drive(server, reply)
    # Assert: the last 20 rounds' C near the median norm
    late = [server.reports[r].clip_norm for r in range(60, 80)]
    assert 0.85 <= sum(late) / len(late) <= 1.15, late
    assert server.reports[0].clip_norm == 0.1


# ---------------------------------------------------------------- accounting (third bar, negative control)


def event(q: float, z: float) -> dp_accounting.DpEvent:
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))


def dp_accountings_own(q: float, z: float, rounds: int, delta: float) -> float:
    accountant = RdpAccountant()
    accountant.compose(event(q, z), rounds)
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize(("q", "z", "rounds"),
                         [(0.1, 1.0, 1), (0.1, 1.0, 30), (0.01, 0.7, 50), (0.5, 2.0, 10)])
def test_epsilon_equals_dp_accountings_own_composition(q: float, z: float, rounds: int) -> None:
    ours = RoundAccountant(q, z, 1e-5).epsilon(rounds)
    assert ours == pytest.approx(dp_accountings_own(q, z, rounds, 1e-5), rel=1e-9)
    assert 0 < ours < math.inf


def test_every_rounds_report_carries_the_epsilon_spent_so_far() -> None:
    # Prepare / Execute
    server = dp_server(dp_config(rounds=4, noise_multiplier=1.3, sampling_rate=0.2), clients=20)
    drive(server, zeros(4))
    # Assert
    epsilons = [float(server.reports[r].epsilon or 0.0) for r in range(4)]
    accountant = RdpAccountant()
    for epsilon in epsilons:  # dp-accounting composing round by round, as the rounds happen
        accountant.compose(event(0.2, 1.3))
        assert epsilon == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert epsilons == sorted(epsilons)
    status = server.status()["privacy"]
    assert status["epsilon"] == epsilons[-1] and status["delta"] == 1e-5 and status["rounds_accounted"] == 4
    # the text status says the same numbers (it showed none: issue 30, item 5)
    line = next(line for line in _federation_lines(server.status()) if line.strip().startswith("privacy"))
    assert line == (f"  privacy: central DP, epsilon {epsilons[-1]:.3g} spent at delta 1e-05 over 4 rounds "
                    f"(noise multiplier 1.3, sampling rate 0.2, clip norm {status['clip_norm']:.3g})")


def test_no_noise_is_reported_as_an_infinite_epsilon() -> None:
    # Prepare / Execute: the negative control
    server = dp_server(dp_config(rounds=2, noise_multiplier=0.0), clients=20)
    drive(server, zeros(4))
    # Assert: infinite, as dp-accounting says too, and written "inf" where JSON cannot hold it
    assert server.reports[1].epsilon == math.inf == dp_accountings_own(0.1, 0.0, 2, 1e-5)
    assert server.status()["privacy"]["epsilon"] == "inf"
    assert report_row(server.reports[1])["epsilon"] == "inf"
    assert RoundAccountant(0.1, 0.0, 1e-5).epsilon(0) == 0.0


def test_dp_off_reports_no_epsilon() -> None:
    server = FedAvgServer(FederationConfig(uplink="identity", rounds=1), name="gw", params=torch.zeros(4),
                          clients=names(4))
    drive(server, zeros(4))
    assert server.reports[0].epsilon is None and "privacy" not in server.status()
    assert server.epsilon() is None and report_row(server.reports[0])["epsilon"] is None


def test_the_accountant_drops_only_dp_accountings_unconverged_order_warnings(
        caplog: pytest.LogCaptureFixture) -> None:
    # Prepare / Execute: q = 0.1, z = 1.0 leaves some fractional orders unconverged (absl warns)
    with caplog.at_level(logging.WARNING, logger="absl"):
        RoundAccountant(0.1, 1.0, 1e-5)
        logging.getLogger("absl").warning("another warning")
    # Assert
    messages = [record.getMessage() for record in caplog.records]
    assert not any("failed to converge" in m for m in messages)
    assert "another warning" in messages


# ---------------------------------------------------------------- checkpoints


def test_a_restored_server_keeps_its_clip_norm_and_epsilon() -> None:
    # Prepare
    config = dp_config(rounds=6, clip_norm=0.5, target_quantile=0.5, count_noise_stddev=1.0)
    server = dp_server(config, clients=50)
    server.handle(Start(), 0.0)
    while server.round < 3:  # nobody answers: the deadlines close the rounds
        server.handle(TimerFired(f"deadline/{server.round}"), 10.0 * (server.round + 1))
    # Execute
    restored = dp_server(config, clients=50)
    restored.restore_state(server.export_state())
    # Assert
    assert restored.round == 3 and restored.dp_clip_norm == server.dp_clip_norm != 0.5
    assert restored.epsilon() == server.epsilon() == RoundAccountant(0.1, 1.0, 1e-5).epsilon(3)


# ---------------------------------------------------------------- distributed DP's shares (wired)


def test_discrete_gaussian_has_the_discrete_gaussians_shape_and_variance() -> None:
    # Prepare / Execute
    sigma = 3.0
    draws = discrete_gaussian(200_000, sigma, torch_generator(1, "c000", 0, "ddg"))
    # Assert: integers, mean 0, variance sigma^2 (for sigma >= 1 the two agree to 1e-30), and the
    # pmf's ratio P(0) / P(1) = exp(1 / (2 sigma^2))
    assert draws.dtype == torch.int64 and draws.numel() == 200_000
    assert abs(float(draws.double().mean())) < 4 * sigma / math.sqrt(200_000)
    assert float(draws.double().var()) == pytest.approx(sigma ** 2, rel=0.02)
    ratio = float((draws == 0).sum()) / float((draws == 1).sum())
    assert ratio == pytest.approx(math.exp(1 / (2 * sigma ** 2)), rel=0.03)
    assert torch.equal(draws, discrete_gaussian(200_000, sigma, torch_generator(1, "c000", 0, "ddg")))
    assert torch.equal(discrete_gaussian(5, 0.0, torch_generator(1, "c000", 0, "ddg")),
                       torch.zeros(5, dtype=torch.int64))


def test_shares_calibrated_to_the_smallest_cohort_sum_to_the_target_noise_or_more() -> None:
    # Prepare: total noise 10 (ring units), at least 20 of the cohort's clients survive
    sigma_i = share_stddev(10.0, 20)
    shares = [discrete_gaussian(50_000, sigma_i, torch_generator(2, f"c{i:03d}", 0, "ddg"))
              for i in range(30)]
    # Execute: the unmasked sums of 20 survivors, and of all 30
    least = torch.stack(shares[:20]).sum(0).double()
    everyone = torch.stack(shares).sum(0).double()
    # Assert
    assert sigma_i == pytest.approx(10.0 / math.sqrt(20))
    assert float(least.std()) == pytest.approx(10.0, rel=0.03)
    assert float(everyone.std()) == pytest.approx(10.0 * math.sqrt(30 / 20), rel=0.03)
    with pytest.raises(ValueError, match="min_survivors"):
        share_stddev(10.0, 0)

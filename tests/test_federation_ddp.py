"""Distributed DP under secure aggregation (protocols/federation/distributed_dp.py): issue 13, item 2.

A gateway's FedAvgServer and its FedAvgClients, each with its SecAgg side, run whole rounds here
through an in-process link (a list; deadlines fire when nothing is in flight), exactly the
classes both drivers reach. The clients "train" by adding a chosen delta (zero for the noise
tests), so the aggregate of a round is the model's move. What is checked:

(i)   zero updates, masking on: the aggregate's standard deviation is ``z C / m`` within 5%
      (20,000 coordinates: the estimate's own error is about 0.5%);
(ii)  exactness: with ``z = 0`` the masked aggregate equals the masking-off baseline bit for bit,
      and with noise too (each client's noise comes from its own secret, the same either way);
(iii) the epsilon in the reports and status is the accountant's for the same event; against
      dp-accounting's Gaussian when unsampled; z = 0 gives infinity;
(iv)  three of ten clients gone after sharing their keys: the seven survivors (t + 1) still
      carry the target noise;
(v)   bits, clients and noise that could wrap the ring are a config error naming the keys.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from typing import Any

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from peer.cli.status import _federation_lines
from peer.files.config import ConfigError
from protocols.events import Action, Received, Send, SetTimer, Start, StartWork, TimerFired, WorkDone
from protocols.federation import FederationConfig, SecureAggregationConfig
from protocols.federation.accountant import DistributedRoundAccountant, kls_epsilon, poisson_subsampled_rdp
from protocols.federation.client import FedAvgClient
from protocols.federation.distributed_dp import (
    client_share_units,
    discrete_gaussian,
    noise_generator,
    round_epsilon,
    sensitivity_units,
)
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure import SecureClient, SecureServer, unwrap
from protocols.federation.server import FedAvgServer
from protocols.messages import SecAggMessage
from protocols.secagg.fixedpoint import levels
from protocols.secagg.local import SeededKeyring
from protocols.secagg.messages import ShareKeys
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

GATEWAY = "gw"
DELTA = 1e-5


def configs(*, z: float, clients: int, threshold: int, masking: bool = True, rate: float = 1.0,
            clip_norm: float = 0.5, clip_value: float = 1.0, bits: int = 16,
            rounds: int = 1) -> FederationConfig:
    """Every client in every round (q = 1 unless told), plain SecAgg (k = n - 1), t fixed."""
    privacy = DifferentialPrivacyConfig(noise_multiplier=z, clip_norm=clip_norm, sampling_rate=rate,
                                        delta=DELTA)
    secure = SecureAggregationConfig(degree=clients - 1, threshold=threshold, clip_value=clip_value,
                                     bits=bits, max_clients=clients, masking=masking)
    return FederationConfig(rounds=rounds, min_clients=3, local_epochs=0, local_steps=1, uplink="identity",
                            round_timeout_s=10_000.0, differential_privacy=privacy, secure_aggregation=secure)


class Federation:
    """One gateway and its clients on a lossless instant link; clients in ``gone`` send nothing
    after their ShareKeys (they drop after key sharing)."""

    def __init__(self, config: FederationConfig, *, clients: int, numel: int,
                 gone: frozenset[str] = frozenset()) -> None:
        self.names = [f"c{i:02d}" for i in range(clients)]
        roster = SeededKeyring([*self.names, GATEWAY], seed=5)
        secure = config.secure_aggregation
        assert secure is not None
        gateway_side = SecureServer(secure, run_id="ddp", verify=roster.verify, like=torch.zeros(numel))
        self.server = FedAvgServer(config, name=GATEWAY, params=torch.zeros(numel), clients=self.names,
                                   secret_seed=11, secure=gateway_side)
        self.clients = {name: FedAvgClient(
            config, name=name, server=GATEWAY, params=torch.zeros(numel), num_samples=1, steps_per_epoch=1,
            secure=SecureClient(secure, name=name, server=GATEWAY, run_id="ddp",
                                client_secret=hashlib.sha256(name.encode()).digest(),
                                sign=roster.signer(name), verify=roster.verify)) for name in self.names}
        self.gone = gone
        self.shared: set[str] = set()
        self.deltas: dict[str, torch.Tensor] = {}  # what each client's training adds (default: 0)
        self.moves: list[torch.Tensor] = []  # the global model's move in each round
        self.now = 0.0
        self.timers: dict[tuple[str, str], float] = {}
        self.queue: deque[tuple[str, Any]] = deque()

    def run(self) -> list[torch.Tensor]:
        before = self.server.params.clone()
        self._act(GATEWAY, self.server.handle(Start(), self.now))
        last_round = 0
        while not self.server.finished:
            while self.queue:
                self._deliver(*self.queue.popleft())
                if self.server.round != last_round:  # a round closed: its move
                    self.moves.append(self.server.params - before)
                    before, last_round = self.server.params.clone(), self.server.round
            if self.server.finished:
                break
            (owner, key), self.now = min(self.timers.items(), key=lambda item: item[1])
            del self.timers[(owner, key)]
            self.queue.append((owner, TimerFired(key)))
        return self.moves

    def _deliver(self, owner: str, event: Any) -> None:
        machine = self.server if owner == GATEWAY else self.clients[owner]
        self._act(owner, machine.handle(event, self.now))

    def _act(self, owner: str, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Send(recipients=recipients, message=message):
                    if owner in self.gone and owner in self.shared:
                        continue  # gone after sharing its keys
                    if isinstance(message, SecAggMessage) and isinstance(unwrap(message), ShareKeys):
                        self.shared.add(owner)
                    for recipient in recipients:
                        self.queue.append((recipient, Received(sender=owner, message=message)))
                case SetTimer(key=key, at=at):
                    self.timers[(owner, key)] = at
                case StartWork(steps=steps):
                    client = self.clients[owner]
                    client.params += self.deltas.get(owner, torch.zeros_like(client.params))
                    self.queue.append((owner, WorkDone(steps=steps, loss=0.0)))


def target_stddev(config: FederationConfig, clients: int) -> float:
    privacy = config.differential_privacy
    assert privacy is not None
    return privacy.noise_multiplier * privacy.clip_norm / (privacy.sampling_rate * clients)


def test_zero_updates_masked_carry_noise_of_z_c_over_m() -> None:
    # Prepare: 5 clients, t = 4 (all five must survive), C = 0.5 in a ring of c = 1: z C / m = 0.15
    config = configs(z=1.5, clients=5, threshold=4, rounds=2)
    federation = Federation(config, clients=5, numel=10_000)
    # Execute
    moves = federation.run()
    # Assert: two rounds, each closed by SecAgg over all five; the noise's deviation is the target
    assert [federation.server.reports[r].closed_by for r in (0, 1)] == ["secagg", "secagg"]
    assert federation.server.counters["secagg_taken_MaskedInput"] == 10
    noise = torch.cat(moves).double()
    assert abs(float(noise.mean())) < 4 * target_stddev(config, 5) / math.sqrt(noise.numel())
    assert float(noise.std()) == pytest.approx(target_stddev(config, 5), rel=0.05)


def test_without_noise_the_masked_aggregate_is_the_unmasked_one_bit_for_bit_and_with_noise_too() -> None:
    # Prepare: each client trains a different delta, longer than C for some
    deltas = {f"c{i:02d}": torch.randn(3000, generator=torch.Generator().manual_seed(i)) * 0.02 * (i + 1)
              for i in range(6)}
    moves: dict[tuple[float, bool], torch.Tensor] = {}
    for z in (0.0, 0.8):
        for masking in (True, False):
            config = configs(z=z, clients=6, threshold=4, masking=masking)
            federation = Federation(config, clients=6, numel=3000)
            federation.deltas = deltas
            # Execute
            moves[(z, masking)] = federation.run()[0]
    # Assert: masking changes nothing, noise or not; the noise is there (and only it differs)
    assert torch.equal(moves[(0.0, True)], moves[(0.0, False)])
    assert torch.equal(moves[(0.8, True)], moves[(0.8, False)])
    assert not torch.equal(moves[(0.0, True)], moves[(0.8, True)])
    # without noise: the mean of the clipped updates over m = 6 (quantisation step 1/L per client)
    clipped = [d * min(1.0, 0.5 / float(d.norm())) for d in deltas.values()]
    assert torch.allclose(moves[(0.0, True)], torch.stack(clipped).sum(0) / 6, atol=6 / levels(16))


def test_reported_epsilon_is_the_accountants_and_dp_accountings_gaussian_when_unsampled() -> None:
    # Prepare
    config = configs(z=1.2, clients=5, threshold=4, rounds=3)
    federation = Federation(config, clients=5, numel=2000)
    # Execute
    federation.run()
    # Assert: the rows and status carry the accountant's epsilon for (q, Kairouz et al.'s eps, delta)
    privacy, secure = config.differential_privacy, config.secure_aggregation
    assert privacy is not None and secure is not None
    eps_round = round_epsilon(privacy, secure, 2000)
    accountant = DistributedRoundAccountant(1.0, eps_round, DELTA)
    reported = [federation.server.reports[r].epsilon for r in range(3)]
    assert reported == [accountant.epsilon(r + 1) for r in range(3)]
    assert federation.server.status()["privacy"]["epsilon"] == accountant.epsilon(3)
    assert federation.server.status()["privacy"]["mechanism"] == "distributed"
    text = "\n".join(_federation_lines(federation.server.status()))
    assert f"privacy: distributed DP, epsilon {accountant.epsilon(3):.3g} spent" in text
    assert "per round against the gateway" in text
    # Kairouz et al.'s eps by hand: the 4 others' shares against C L / c + sqrt(d) / 2 (tau ~ 0 here)
    share = 1.2 * 0.5 * levels(16) / math.sqrt(5)
    assert client_share_units(privacy, secure) == pytest.approx(share)
    by_hand = (0.5 * levels(16) + math.sqrt(2000) / 2) / (math.sqrt(4) * share)
    assert eps_round == pytest.approx(by_hand, rel=1e-12)
    # unsampled, that is exactly a Gaussian of multiplier 1 / eps: dp-accounting's own epsilon
    gaussian = RdpAccountant()
    gaussian.compose(dp_accounting.GaussianDpEvent(1 / eps_round), 3)
    assert accountant.epsilon(3) == pytest.approx(gaussian.get_epsilon(DELTA), rel=1e-9)


def test_sampled_epsilon_bounds_dp_accountings_sampled_gaussian_and_no_noise_is_infinite() -> None:
    # Prepare: Kairouz et al.'s eps of a round = 1 / 1.2; Poisson rate 0.1, 100 rounds
    accountant = DistributedRoundAccountant(0.1, 1 / 1.2, DELTA)
    exact = RdpAccountant()
    exact.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.2)), 100)
    # Execute / Assert: Zhu and Wang's general bound is above the Gaussian's exact amplification,
    # never above the unsampled curve, and the mechanism's own sampling lowers epsilon a lot
    assert exact.get_epsilon(DELTA) < accountant.epsilon(100) < 1.4 * exact.get_epsilon(DELTA)
    curve = lambda a: a / (2 * 1.2 ** 2)  # noqa: E731
    assert all(poisson_subsampled_rdp(curve, 0.1, a) <= curve(a) for a in (2, 3, 10, 64))
    assert accountant.epsilon(100) < DistributedRoundAccountant(1.0, 1 / 1.2, DELTA).epsilon(10)
    assert accountant.gateway_epsilon(1) == DistributedRoundAccountant(1.0, 1 / 1.2, DELTA).epsilon(1)
    # no noise: infinite, in the reports and the status ("inf" in JSON)
    federation = Federation(configs(z=0.0, clients=4, threshold=3), clients=4, numel=100)
    federation.run()
    assert federation.server.reports[0].epsilon == math.inf
    assert federation.server.status()["privacy"]["epsilon"] == "inf"
    assert kls_epsilon(sensitivity=1.0, share_stddev=0.0, summands=3, numel=10, tau_summands=3) == math.inf


def test_noise_survives_three_of_ten_gone_after_sharing_keys() -> None:
    # Prepare: t = 6, so each share is calibrated to 7 survivors; three leave after ShareKeys
    config = configs(z=1.0, clients=10, threshold=6, rounds=2)
    gone = frozenset({"c02", "c05", "c08"})
    federation = Federation(config, clients=10, numel=8000, gone=gone)
    # Execute
    moves = federation.run()
    # Assert: every round summed the 7 survivors; their noise is still z C / m (m = 10 expected)
    for r in (0, 1):
        report = federation.server.reports[r]
        assert report.closed_by == "secagg" and len(report.taken) == 7 and not gone & set(report.taken)
    assert float(torch.cat(moves).double().std()) == pytest.approx(target_stddev(config, 10), rel=0.05)
    # and with all ten there, the noise is sqrt(10 / 7) of the target: more, never less
    everyone = Federation(config, clients=10, numel=8000).run()
    assert float(torch.cat(everyone).double().std()) == pytest.approx(
        target_stddev(config, 10) * math.sqrt(10 / 7), rel=0.05)


def ddp_scenario(secure: dict[str, Any], privacy: dict[str, Any] | None = None) -> dict[str, Any]:
    privacy = {"noise_multiplier": 1.0, "clip_norm": 1.0, "sampling_rate": 0.5, **(privacy or {})}
    secure = {"threshold": 4, "degree": 6, **secure}  # k <= 6 < 2t
    server = {"min_clients": 3, "uplink": "identity", "round_timeout_s": 200.0,
              "differential_privacy": privacy, "secure_aggregation": secure}
    return {"name": "ddp", "seed": 1, "duration_s": 100.0, "task": {"name": "digits-mlp"},
            "federation": {"gateways": 1, "clients": 10, "server": server}}


@pytest.mark.parametrize(("secure", "privacy", "words"), [
    # 200 x (2^23 - 1) + 10 x 7.5e6 x sqrt(200) >= 2^31 (z = 0.5 fits: 1.68e9 + 2.65e8 < 2.147e9)
    ({"bits": 24, "max_clients": 200}, {"noise_multiplier": 2.0}, "can wrap the 32-bit ring"),
    ({"bits": 24, "max_clients": 10, "masking": False}, {}, "exactly as float32"),
    ({"threshold": 0}, {}, "secure_aggregation.threshold must be set"),
    ({}, {"target_quantile": 0.5, "count_noise_stddev": 1.0}, "target_quantile must be 0"),
    ({"bits": 4}, {"noise_multiplier": 0.01}, "below the 1/2"),
])
def test_settings_that_could_wrap_the_ring_or_cannot_be_accounted_are_config_errors(
        secure: dict[str, Any], privacy: dict[str, Any], words: str) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ConfigError) as caught:
        scenario_from_dict(ddp_scenario(secure, privacy)).federation_config()
    assert words in str(caught.value)
    # the same settings with a sum that fits load
    fits = scenario_from_dict(ddp_scenario({"bits": 24, "max_clients": 200}, {"noise_multiplier": 0.5}))
    assert fits.federation_config().secure_aggregation is not None


def test_sensitivity_counts_the_rounding_of_every_coordinate() -> None:
    # Prepare
    privacy = DifferentialPrivacyConfig(noise_multiplier=1.0, clip_norm=0.5)
    secure = SecureAggregationConfig(degree=6, threshold=4, clip_value=2.0, bits=12)
    # Execute / Assert: C L / c + sqrt(d) / 2
    assert sensitivity_units(privacy, secure, 400) == pytest.approx(0.5 * 2047 / 2.0 + 10.0)


def test_the_simulators_rows_and_report_carry_the_distributed_epsilon() -> None:
    # Prepare: 10 digits-mlp clients, q = 0.5, t = 3 of k <= 4 (2t > k), 3 rounds through sim/federation.py
    data = ddp_scenario({"threshold": 3, "degree": 4, "clip_value": 0.1, "max_clients": 10,
                         "masked_input_timeout_s": 60.0}, {"clip_norm": 0.1})
    data["federation"]["server"].update(rounds=3, local_epochs=1, round_timeout_s=400.0)
    data.update(duration_s=5000.0, trainer={"lr": 0.1, "batch_size": 32},
                links={"latency_ms": 5.0, "bandwidth_mbps": 100.0}, nodes={"step_time_ms": 10.0})
    scenario = scenario_from_dict(data)
    config = scenario.federation_config()
    # Execute
    result = run_scenario(scenario)
    # Assert: every row's epsilon is the distributed accountant's for that many rounds, and so the report's
    privacy, secure = config.differential_privacy, config.secure_aggregation
    accountant = DistributedRoundAccountant(0.5, round_epsilon(privacy, secure, result.n_params), DELTA)
    assert [row["epsilon"] for row in result.rounds] == [accountant.epsilon(r) for r in (1, 2, 3)]
    assert any(row["closed_by"] == "secagg" for row in result.rounds)
    assert result.metrics["epsilon"] == accountant.epsilon(3)
    assert any("distributed under SecAgg" in note for note in result.notes)


def test_a_clients_noise_is_its_own_and_never_reused_across_rounds() -> None:
    # Prepare
    secret = hashlib.sha256(b"c00").digest()
    draw = lambda key, run_id, r: discrete_gaussian(1000, 50.0, noise_generator(key, run_id, r))  # noqa: E731
    # Execute / Assert: the same (secret, run, round) repeats (determinism in the simulator); any
    # other round, run or secret gives other noise (a reused share would cancel in a difference)
    assert torch.equal(draw(secret, "ddp", 3), draw(secret, "ddp", 3))
    neighbour = hashlib.sha256(b"c01").digest()
    others = [draw(secret, "ddp", 4), draw(secret, "other", 3), draw(neighbour, "ddp", 3)]
    assert all(not torch.equal(draw(secret, "ddp", 3), other) for other in others)

"""The federation's pure maths: aggregators against hand-computed values and their robustness,
the server optimisers step by step, and FedProx's proximal term against autograd."""

from __future__ import annotations

import math

import pytest
import torch

from protocols.federation import ServerOptConfig, proximal_gradient, proximal_loss, server_step
from protocols.federation import aggregate as agg
from protocols.federation.common import combine
from protocols.federation.config import FederationConfig
from protocols.rng import torch_generator


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------- hand-computed values


def test_fedavg_weighs_by_samples() -> None:
    assert torch.equal(agg.fedavg([t(1, 2), t(3, 4)], [1, 3]), t(2.5, 3.5))


def test_combine_caps_a_lying_client_under_fedavg() -> None:
    # Prepare: one honest client at +1 with 100 samples, a liar at -1000 claiming 10^9
    config = FederationConfig(max_samples=100, norm_multiple=0)
    updates = {"honest": (t(1.0), 100), "liar": (t(-1000.0), 10**9)}
    # Execute / Assert: capped, the liar weighs as much as the honest client, not 10^7 times more
    combined = combine(config, updates)
    assert torch.equal(combined.delta, t((1.0 - 1000.0) / 2))
    assert combined.bounds.bounded == {"samples_max": 1}
    unbounded = combine(FederationConfig(samples_multiple=0, norm_multiple=0), updates)
    assert float(unbounded.delta) < -999.0 and not unbounded.bounds.bounded


def test_median_odd_and_even() -> None:
    assert torch.equal(agg.median([t(1, 9), t(5, 0), t(3, 4)]), t(3, 4))
    assert torch.equal(agg.median([t(1), t(2), t(3), t(10)]), t(2.5))


def test_trimmed_mean_drops_floor_beta_n_per_side() -> None:
    updates = [t(1), t(2), t(3), t(4), t(100)]
    assert torch.equal(agg.trimmed_mean(updates, 0.2), t(3.0))  # drops 1 and 100
    assert torch.equal(agg.trimmed_mean(updates, 0.0), t(22.0))  # the plain mean
    with pytest.raises(ValueError):
        agg.trimmed_mean(updates, 0.5)


def test_krum_scores_and_choice() -> None:
    updates = [t(0, 0), t(1, 0), t(0, 1), t(10, 10)]
    # f = 0: each score sums the squared distances to its n - f - 2 = 2 nearest others
    assert agg.krum_scores(updates, 0).tolist() == [2.0, 3.0, 3.0, 362.0]
    assert torch.equal(agg.krum(updates, 0), t(0, 0))
    assert torch.allclose(agg.multi_krum(updates, 0, 3), t(1 / 3, 1 / 3))
    assert torch.equal(agg.multi_krum(updates, 0, 1), agg.krum(updates, 0))


def test_aggregators_refuse_bad_input_and_leave_input_alone() -> None:
    with pytest.raises(ValueError):
        agg.mean([])
    with pytest.raises(ValueError):
        agg.median([t(1, 2), t(1)])
    updates = [t(3, 1), t(1, 2), t(2, 3)]
    before = [u.clone() for u in updates]
    for fn in (agg.mean, agg.median, lambda u: agg.trimmed_mean(u, 0.2), lambda u: agg.krum(u, 0)):
        fn(updates)
    assert all(torch.equal(a, b) for a, b in zip(updates, before, strict=True))


# ---------------------------------------------------------------- robustness


def _attacked(n_honest: int = 8, n_hostile: int = 2,
              dim: int = 50) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Honest updates around a common direction, plus sign-flipped x10 copies of their mean."""
    generator = torch_generator(0, "test", 0, "attack")
    direction = torch.randn(dim, generator=generator, dtype=torch.float64)
    honest = [direction + 0.1 * torch.randn(dim, generator=generator, dtype=torch.float64)
              for _ in range(n_honest)]
    honest_mean = torch.stack(honest).mean(dim=0)
    return honest + [-10.0 * honest_mean] * n_hostile, honest_mean


@pytest.mark.parametrize("name", ["median", "trimmed_mean", "krum", "multi_krum"])
def test_robust_aggregators_stay_near_the_honest_mean(name: str) -> None:
    # Prepare: 2 of 10 updates are the honest mean sign-flipped and scaled by 10
    updates, honest_mean = _attacked()
    config = FederationConfig(aggregator=name, trim_beta=0.2, byzantine=2)  # type: ignore[arg-type]
    # Execute
    result = combine(config, {f"c{i}": (u, 1) for i, u in enumerate(updates)}).delta
    # Assert: within a few percent of the honest mean, and pointing the same way
    error = float(torch.linalg.vector_norm(result - honest_mean) / torch.linalg.vector_norm(honest_mean))
    assert error < 0.15, f"{name}: relative error {error:.3f}"


def test_fedavg_is_not_robust() -> None:
    updates, honest_mean = _attacked()
    result = agg.fedavg(updates, [1] * len(updates))
    # (8 m - 20 m) / 10 = -1.2 m: the attack reverses the step
    assert float(torch.dot(result, honest_mean)) < 0
    assert torch.allclose(result, -1.2 * honest_mean)


def test_clipping_bounds_the_attack_under_fedavg() -> None:
    updates, honest_mean = _attacked()
    bound = float(max(torch.linalg.vector_norm(u) for u in updates[:8]))
    config = FederationConfig(clip_norm=bound, norm_multiple=0)
    result = combine(config, {f"c{i}": (u, 1) for i, u in enumerate(updates)}).delta
    assert float(torch.dot(result, honest_mean)) > 0  # clipped, the two cannot outweigh the eight


# ---------------------------------------------------------------- server optimisers


def test_fedavg_server_step_is_the_plain_sum() -> None:
    new, state = server_step(t(1, 1), t(0.5, -1), {}, ServerOptConfig())
    assert torch.equal(new, t(1.5, 0.0)) and state == {}


def test_fedavgm_accumulates_momentum() -> None:
    config = ServerOptConfig(name="fedavgm", lr=1.0, beta1=0.9)
    d = t(1.0, -2.0)
    x1, s1 = server_step(t(0, 0), d, {}, config)
    x2, s2 = server_step(x1, d, s1, config)
    assert torch.equal(x1, d)
    assert torch.allclose(s2["m"], 1.9 * d)
    assert torch.allclose(x2, d + 1.9 * d)


def test_adaptive_rules_first_step_by_hand() -> None:
    d = t(0.2, -0.1)
    lr, beta1, beta2, tau = 0.1, 0.9, 0.99, 1e-3
    m = (1 - beta1) * d
    expected_v = {"fedadagrad": d * d, "fedadam": (1 - beta2) * d * d, "fedyogi": (1 - beta2) * d * d}
    for name, v in expected_v.items():
        config = ServerOptConfig(name=name, lr=lr, beta1=beta1, beta2=beta2, tau=tau)  # type: ignore[arg-type]
        x, state = server_step(t(1, 1), d, {}, config)
        assert torch.allclose(state["v"], v), name
        assert torch.allclose(state["m"], m), name
        assert torch.allclose(x, t(1, 1) + lr * m / (v.sqrt() + tau)), name


def test_yogi_and_adam_second_moments_differ_on_the_second_step() -> None:
    d1, d2 = t(1.0), t(0.1)
    states = {}
    for name in ("fedadam", "fedyogi"):
        config = ServerOptConfig(name=name, beta2=0.9)
        _, s1 = server_step(t(0), d1, {}, config)
        _, states[name] = server_step(t(0), d2, s1, config)
    # v1 = 0.1; Adam: 0.9 * 0.1 + 0.1 * 0.01 = 0.091; Yogi: 0.1 - 0.1 * 0.01 * sign(0.1 - 0.01) = 0.099
    assert math.isclose(float(states["fedadam"]["v"]), 0.091)
    assert math.isclose(float(states["fedyogi"]["v"]), 0.099)


def test_server_step_leaves_inputs_alone() -> None:
    x, d = t(1, 2), t(3, 4)
    state = {"m": t(1, 1), "v": t(1, 1)}
    for name in ("fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"):
        server_step(x, d, state, ServerOptConfig(name=name))
    assert torch.equal(x, t(1, 2)) and torch.equal(d, t(3, 4))
    assert torch.equal(state["m"], t(1, 1)) and torch.equal(state["v"], t(1, 1))


def test_proximal_gradient_is_the_loss_gradient() -> None:
    params = t(1.0, -2.0, 0.5).requires_grad_(True)
    anchor = t(0.0, 1.0, 0.5)
    proximal_loss(params, anchor, 0.3).backward()
    assert params.grad is not None
    assert torch.allclose(params.grad, proximal_gradient(params, anchor, 0.3))
    assert torch.allclose(proximal_gradient(params, anchor, 0.3), t(0.3, -0.9, 0.0))

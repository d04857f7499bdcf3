"""CHOCO-SGD through the machine equals a plain numpy recursion, to float64 rounding.

The machine's round t (protocols/gossip/choco.py) overlaps the exchange with the local steps,
so the compressor sees the parameters *before* the steps of its round:

    q_i     = C(x_i - x_hat_i)                    (round 0 uncompressed: choco_full_start)
    x_hat_i = x_hat_i + q_i                       (every peer's copy of i's x_hat moves alike)
    x_i     = x_i - lr g(x_i)                     (H times)
    x_i     = x_i + gamma sum_j W_ij (x_hat_j - x_hat_i)

Koloskova et al. 2019 (Algorithm 2) compress after the step instead; that recursion is checked
to differ, so the test tells the two orders apart.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from gossip_driver import Driver, LogRegWorker

from protocols.compress import RngKey, from_spec
from protocols.gossip import GossipConfig, make_machine
from topology import build

Compressor = Callable[[np.ndarray], np.ndarray]
LR = 0.3
STEPS = 24
DIMENSION = 10
TOLERANCE = 1e-12  # float64 rounding over 24 rounds of 6 peers (the float32 casts are mirrored)


def identity(v: np.ndarray) -> np.ndarray:
    return v.copy()


def top_k(fraction: float) -> Compressor:
    """protocols.compress's top-k: the k largest |v| (ties to the lowest index), through float32."""

    def compress(v: np.ndarray) -> np.ndarray:
        v32 = v.astype(np.float32)  # operators run on float32 (compress.base.check_input)
        k = min(v.size, max(1, round(fraction * v.size)))
        kept = np.argsort(-np.abs(v32), kind="stable")[:k]
        out = np.zeros_like(v)
        out[kept] = v32[kept].astype(np.float64)
        return out

    return compress


def logreg_data(n_peers: int, m: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=DIMENSION)
    xs, ys = [], []
    for i in range(n_peers):
        x = rng.normal(loc=0.3 * i, size=(m, DIMENSION))  # heterogeneous shards: the peers disagree
        xs.append(x)
        ys.append((x @ truth + rng.normal(size=m) > 0).astype(np.float64))
    return xs, ys


def choco_numpy(w: np.ndarray, starts: np.ndarray, xs: list[np.ndarray], ys: list[np.ndarray], *,
                compress: Compressor, gamma: float, local_steps: int, compress_after_step: bool = False
                ) -> np.ndarray:
    """The recursion of the module docstring (or, with ``compress_after_step``, the paper's order)."""
    x, x_hat = starts.copy(), np.zeros_like(starts)
    n = len(x)

    def local(x: np.ndarray) -> np.ndarray:
        for _ in range(local_steps):
            x = x - LR * np.stack([LogRegWorker.gradient(xs[i], ys[i], x[i]) for i in range(n)])
        return x

    for t in range(STEPS // local_steps):
        if compress_after_step:
            x = local(x)
        q = x - x_hat if t == 0 else np.stack([compress(x[i] - x_hat[i]) for i in range(n)])
        x_hat = x_hat + q
        if not compress_after_step:
            x = local(x)
        x = x + gamma * (w @ x_hat - x_hat)  # sum_j W_ij (x_hat_j - x_hat_i): rows of W sum to 1
    return x


def choco_machines(spec: str, gamma: float, local_steps: int, starts: np.ndarray, xs: list[np.ndarray],
                   ys: list[np.ndarray]) -> tuple[np.ndarray, Driver]:
    topology = build("ring:6")
    names = topology.names
    workers = {n: LogRegWorker(xs[i], ys[i], LR, starts[i]) for i, n in enumerate(names)}
    config = GossipConfig(algorithm="choco", compression=spec, consensus_step=gamma, local_steps=local_steps,
                          total_steps=STEPS)
    machines = {n: make_machine(config, name=n, topology=topology, params=workers[n].flat_params, seed=0)
                for n in names}
    driver = Driver(machines, workers)
    driver.start()
    driver.run()
    assert driver.finished == set(names)
    assert all(driver.steps[n] == STEPS for n in names)
    return np.stack([workers[n].flat_params.numpy() for n in names]), driver


@pytest.mark.parametrize(("spec", "compress", "gamma", "local_steps"), [
    ("identity", identity, 1.0, 1),               # gamma = 1, no compression: D-PSGD with x_hat lag
    ("identity", identity, 0.4, 2),
    ("topk:fraction=0.3", top_k(0.3), 0.4, 1),     # 3 of 10 coordinates a round
    ("topk:fraction=0.1", top_k(0.1), 0.25, 2),
])
def test_choco_equals_the_numpy_recursion(spec: str, compress: Compressor, gamma: float,
                                          local_steps: int) -> None:
    # Prepare: 6 peers on a ring, full-batch logistic regression, different starts.
    xs, ys = logreg_data(6, m=40, seed=3)
    starts = np.random.default_rng(4).normal(size=(6, DIMENSION))
    w = build("ring:6").mixing(0)
    # Execute
    got, driver = choco_machines(spec, gamma, local_steps, starts, xs, ys)
    expected = choco_numpy(w, starts, xs, ys, compress=compress, gamma=gamma, local_steps=local_steps)
    # Assert
    assert not driver.rejections and not any(m.get("rejected_update") for m in driver.metrics.values())
    assert np.abs(got - expected).max() < TOLERANCE, np.abs(got - expected).max()
    # Negative controls: the paper's order (compress after the step) and a wrong gamma are far off.
    paper = choco_numpy(w, starts, xs, ys, compress=compress, gamma=gamma, local_steps=local_steps,
                        compress_after_step=True)
    other_gamma = choco_numpy(w, starts, xs, ys, compress=compress, gamma=0.9 * gamma,
                              local_steps=local_steps)
    assert np.abs(got - paper).max() > 1e6 * TOLERANCE
    assert np.abs(got - other_gamma).max() > 1e6 * TOLERANCE


def test_the_top_k_reference_is_the_operators_top_k() -> None:
    # The numpy compressor above must be the production one, or the recursion test proves nothing.
    v = np.random.default_rng(8).normal(size=1000)
    op = from_spec("topk:fraction=0.03")
    got = op.decompress(op.compress(torch.from_numpy(v), RngKey(0, "p", 0))).double().numpy()
    assert np.array_equal(got, top_k(0.03)(v))

"""CHOCO's consensus step γ, chosen from what every member shares: the mixing matrix and the compressor.

Koloskova et al. 2019 (Theorem 2) prove that CHOCO-gossip converges for

    γ ≤ γ* = ρ²δ / (16ρ + ρ² + 4β² + 2ρβ² − 8ρδ),

with ρ the spectral gap of W, β = ||I − W||₂ and δ the compressor's
contraction (E||C(x) − x||² ≤ (1 − δ)||x||²); far too small to train with
(about 3e-6 for top-1% on a ring of 16), and it is reported beside the step used.

The step used is found by trying: seeded CHOCO gossip alone (no training, the
same public-copy recursion as ``choco.py``, the real compressor) runs on this W
for ``PROBE_ROUNDS`` rounds at γ = 1, 2^-1/2, 1/2, ... (a grid of ratio √2);
CHOCO uses the largest γ under which the members' disagreement never rises
above where it started. Everything is keyed by the run's seed, so every member,
and both drivers, compute the same γ. A compressor under which no step of the
grid is stable (an unbiased quantiser whose noise exceeds the signal, such as
QSGD at 4 bits) is refused with a clear error.

The chosen step sits at the edge of stability; the guard in ``choco.py`` (halve
the step when ``||x - x_hat||`` grows) catches a slow drift later. Why this
rule, with the measurements behind it: docs/design/gossip-algorithms.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from protocols.compress import Compressor, RngKey, from_spec
from protocols.rng import torch_generator

PROBE_DIM = 512        # elements per member in the probe: one QSGD bucket; top-1% keeps 5 of them
PROBE_ROUNDS = 100     # long enough for the next grid step up to show (top-1% at 0.125 on a ring: x2 by 100)
GRID_RATIO = 2.0 ** -0.5  # steps tried: 1, 0.71, 0.5, ... (halving overshoots: 0.0625 vs 0.088 on a ring)
SMALLEST_STEP = 2.0 ** -12


@dataclass(frozen=True)
class ConsensusStepChoice:
    gamma: float              # what CHOCO uses: the largest stable step of the grid
    largest_stable: float     # the largest grid step under which the probe's disagreement never grew
    theoretical_bound: float  # Koloskova et al. 2019, Theorem 2 (for comparison; far smaller)
    contraction: float        # δ of the compressor, measured on the probe's vectors

    def describe(self) -> str:
        return (f"consensus_step {self.gamma:.4g} (the largest step of a √2 grid under which a seeded "
                f"gossip probe's disagreement never grew; theoretical bound {self.theoretical_bound:.2g}, "
                f"compressor contraction δ {self.contraction:.3g})")


def theoretical_bound(mixing: np.ndarray, contraction: float) -> float:
    """γ* of Koloskova et al. 2019, Theorem 2, for a symmetric doubly stochastic W (0 if δ <= 0)."""
    n = mixing.shape[0]
    if n <= 1 or contraction <= 0:
        return 0.0
    eigenvalues = np.linalg.eigvalsh((mixing + mixing.T) / 2)
    rho = 1.0 - float(np.sort(np.abs(eigenvalues))[-2])
    beta = float(np.max(np.abs(1.0 - eigenvalues)))
    delta = min(contraction, 1.0)
    denominator = 16 * rho + rho**2 + 4 * beta**2 + 2 * rho * beta**2 - 8 * rho * delta
    return max(rho**2 * delta / denominator, 0.0) if denominator > 0 else 0.0


def measured_contraction(compressor: Compressor, *, dim: int, seed: int, samples: int = 8) -> float:
    """δ = 1 − Σ||C(x) − x||² / Σ||x||² over seeded Gaussian vectors (negative: not a contraction)."""
    error = total = 0.0
    for index in range(samples):
        x = torch.randn(dim, generator=torch_generator(seed, "consensus-step", index, "contraction"))
        approx = compressor.decompress(compressor.compress(x, RngKey(seed, "consensus-step", index)))
        error += float(torch.sum((approx.to(torch.float64) - x.to(torch.float64)) ** 2))
        total += float(torch.sum(x.to(torch.float64) ** 2))
    return 1.0 - error / total


def probe_stable(mixing: np.ndarray, compressor: Compressor, gamma: float, *, seed: int,
                 dim: int = PROBE_DIM, rounds: int = PROBE_ROUNDS) -> bool:
    """Does CHOCO gossip alone (public copies starting exact, as with ``choco_full_start``) at step
    ``gamma`` on ``mixing`` keep the members' disagreement at or below its start for ``rounds`` rounds?"""
    n = mixing.shape[0]
    names = [f"m{i}" for i in range(n)]
    w = torch.tensor(mixing, dtype=torch.float64)
    x = torch.stack([torch.randn(dim, generator=torch_generator(seed, name, 0, "consensus-probe"),
                                 dtype=torch.float64) for name in names])
    x_hat = x.clone()
    start = float(torch.linalg.vector_norm(x - x.mean(dim=0)))
    for t in range(1, rounds + 1):
        q = torch.stack([
            compressor.decompress(compressor.compress((x[i] - x_hat[i]).to(torch.float32),
                                                      RngKey(seed, name, t))).to(torch.float64)
            for i, name in enumerate(names)])
        x_hat += q
        x += gamma * (w @ x_hat - x_hat)
        spread = float(torch.linalg.vector_norm(x - x.mean(dim=0)))
        if not spread <= start:     # grew (or went NaN): unstable, and no need to watch it further
            return False
    return True


def choose_consensus_step(mixing: np.ndarray, compression: str, *, seed: int) -> ConsensusStepChoice:
    """The largest γ in 1, 2^-1/2, 1/2, ... under which the probe is stable (see the module docstring).

    Raises ValueError when none down to ``SMALLEST_STEP`` is."""
    return _choose(np.ascontiguousarray(mixing, dtype=np.float64).tobytes(), mixing.shape[0], compression,
                   seed)


@functools.lru_cache(maxsize=16)   # every member of a simulation asks the same question
def _choose(mixing_bytes: bytes, n: int, compression: str, seed: int) -> ConsensusStepChoice:
    mixing = np.frombuffer(mixing_bytes, dtype=np.float64).reshape(n, n)
    compressor = from_spec(compression)
    contraction = measured_contraction(compressor, dim=PROBE_DIM, seed=seed)
    bound = theoretical_bound(mixing, contraction)
    k = 0
    while (gamma := GRID_RATIO**k) >= SMALLEST_STEP:
        if probe_stable(mixing, compressor, gamma, seed=seed):
            return ConsensusStepChoice(gamma=gamma, largest_stable=gamma, theoretical_bound=bound,
                                       contraction=contraction)
        k += 1
    raise ValueError(f"compression {compression!r}: CHOCO gossip diverges on this graph at every "
                     f"consensus step down to {SMALLEST_STEP:g} (contraction δ = {contraction:.3g}); "
                     "set consensus_step by hand or choose another compressor")

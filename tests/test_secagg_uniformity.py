"""Acceptance b: what the gateway sees of one client is indistinguishable from uniform in Z_2^32.

The test: a chi-square goodness of fit over 256 equal buckets of the ring (top 8 bits), another
over the low 8 bits, and a Kolmogorov-Smirnov test of value / 2^32 against U(0, 1), on 9,610
elements (the digits-mlp model). "Uniform" means every p-value > 1e-3 / (number of p-values the
test function checks), Bonferroni's bound: truly uniform vectors fail the whole family with
probability < 1e-3 (the seeds are fixed, so the outcome is too). The negative control is the
plain quantised update, which must fail (its smallest p < 1e-12). Two rounds of one client,
subtracted in the ring, must also look uniform: a seed reused across rounds would leave
x_1 - x_2 there, which fails like the control.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from protocols.secagg import SecAggConfig, quantise
from protocols.secagg.fixedpoint import RING, RING_MASK
from protocols.secagg.local import LocalRound
from protocols.secagg.messages import MaskedInput

NAMES = [f"client{i:02d}" for i in range(10)]
NUMEL = 9610  # digits-mlp: 64*128 + 128 + 128*10 + 10
FAMILY_P = 1e-3  # the chance that uniform vectors fail a whole test function
CONFIG = SecAggConfig(degree=4, threshold=3, clip_value=1.0, bits=16)


def uniformity_p_values(values: np.ndarray) -> list[float]:
    """p-values of three tests of ``values`` (ring elements) against the uniform distribution."""
    top = np.bincount((values >> 24).astype(np.int64), minlength=256)
    low = np.bincount((values & 0xFF).astype(np.int64), minlength=256)
    return [float(stats.chisquare(top).pvalue), float(stats.chisquare(low).pvalue),
            float(stats.kstest(values / RING, "uniform").pvalue)]


def _round(round_index: int, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the gateway received from each client in one round (run id and identities fixed)."""
    local = LocalRound(CONFIG, inputs, run_id="uniform", round_index=round_index, seed=3)
    assert local.run() is not None
    return {name: np.frombuffer(next(m for m in local.sent[name] if isinstance(m, MaskedInput)).masked,
                                dtype="<u4").astype(np.int64) for name in NAMES}


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: quantise(rng.normal(0.0, 0.05, NUMEL), clip_value=1.0, bits=16) for name in NAMES}


def test_one_masked_update_looks_uniform_and_the_plain_one_does_not() -> None:
    inputs = _inputs(0)
    seen = _round(1, inputs)
    p_min = FAMILY_P / (3 * len(NAMES))
    for name in NAMES:
        assert min(uniformity_p_values(seen[name])) > p_min, name
        assert min(uniformity_p_values(inputs[name])) < 1e-12, name  # negative control


def test_one_clients_masked_updates_in_two_rounds_differ_by_uniform_noise() -> None:
    inputs = _inputs(1)  # the same update twice: only the masks can differ
    first, second = _round(1, inputs), _round(2, inputs)
    p_min = FAMILY_P / (3 * len(NAMES))
    for name in NAMES:
        assert min(uniformity_p_values((first[name] - second[name]) & RING_MASK)) > p_min, name
    # the control: a different update with a reused mask leaves exactly x1 - x2, far from uniform
    other = _inputs(2)
    reused = (inputs[NAMES[0]] - other[NAMES[0]]) & RING_MASK
    assert min(uniformity_p_values(reused)) < 1e-12

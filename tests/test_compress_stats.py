"""Statistical contracts: unbiasedness (with negative controls), QSGD's variance, reproducibility."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy import stats

from protocols.compress import BadParts, Compressed, RngKey, from_spec

ALPHA = 1e-3  # each unbiasedness test wrongly rejects a truly unbiased operator once in 1,000 runs
DRAWS = 1200
DIM = 32

Operator = Callable[[torch.Tensor, int], torch.Tensor]


def x_fixed() -> torch.Tensor:
    x = torch.randn(DIM, generator=torch.Generator().manual_seed(11))
    x[:4] = torch.tensor([0.0, 1e-3, -2.5, 2.5])  # a zero, a tiny and two large coordinates
    return x


def via_spec(spec: str) -> Operator:
    op = from_spec(spec)
    return lambda x, draw: op.decompress(op.compress(x, RngKey(5, "p03", draw)))


def deterministic_rounding(x: torch.Tensor, draw: int) -> torch.Tensor:
    """QSGD's grid with round-to-nearest instead of random rounding: biased."""
    step = float(x.norm()) / 7
    return torch.round(x / step) * step


def biased_dither(x: torch.Tensor, draw: int) -> torch.Tensor:
    """Stochastic rounding whose noise is U[0, 0.9) instead of U[0, 1): a subtle bias."""
    step = float(x.norm()) / 7
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(draw)) * 0.9
    return torch.floor(x / step + noise) * step


def chi_square_of_means(operator: Operator, x: torch.Tensor) -> tuple[float, float]:
    """Sum over coordinates of z^2, z = (mean - x) / standard error; and the 1 - ALPHA critical value.

    A coordinate whose draws never varied (e.g. a tiny one that never rounded
    up) borrows the largest standard error seen, which is conservative; an
    operator that varies nowhere is judged by its bias alone (any miss is an
    infinite z).
    """
    draws = torch.stack([operator(x, draw) for draw in range(DRAWS)]).double()
    error = draws.mean(0) - x.double()
    standard_error = draws.std(0) / DRAWS**0.5
    floor = float(standard_error.max())
    if floor == 0.0:
        z = torch.where(error.abs() > 1e-6, torch.tensor(float("inf")), torch.tensor(0.0))
    else:
        z = error / torch.where(standard_error > 0, standard_error, floor)
    return float((z**2).sum()), float(stats.chi2.ppf(1 - ALPHA, df=DIM))


@pytest.mark.parametrize("spec", ["qsgd:bits=2", "qsgd:bits=4,bucket=16", "qsgd:bits=8,bucket=0",
                                  "randomk:fraction=0.25,unbiased=true"])
def test_unbiased_operators_pass_the_chi_square_test(spec: str) -> None:
    statistic, critical = chi_square_of_means(via_spec(spec), x_fixed())
    assert statistic < critical


@pytest.mark.parametrize(
    "operator",
    [via_spec("topk:fraction=0.25"), deterministic_rounding, biased_dither,
     via_spec("randomk:fraction=0.25")],
    ids=["topk", "deterministic-rounding", "biased-dither", "randomk-unscaled"],
)
def test_the_same_test_rejects_biased_operators(operator: Operator) -> None:
    statistic, critical = chi_square_of_means(operator, x_fixed())
    assert statistic > critical


@pytest.mark.parametrize("bucket", [0, 128])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_qsgd_variance_matches_theory_and_the_alistarh_bound(bits: int, bucket: int) -> None:
    n, s = 1000, 2 ** (bits - 1) - 1
    x = torch.randn(n, generator=torch.Generator().manual_seed(bits)).double()
    op = from_spec(f"qsgd:bits={bits},bucket={bucket}")
    errors = [float(((op.decompress(op.compress(x.float(), RngKey(1, "p", d))).double() - x) ** 2).sum())
              for d in range(300)]
    exact = bound = 0.0
    for part in x.split(bucket or n):
        # Exact: each element rounds to one of two levels a step apart, P(up) = the fractional part.
        step = float(part.norm()) / s
        fraction = (part.abs() / step) % 1
        exact += float((step**2 * fraction * (1 - fraction)).sum())
        # Alistarh et al. 2017, Lemma 3.1, per bucket of d elements: min(d / s^2, sqrt(d) / s) ||x||^2.
        d = part.numel()
        bound += min(d / s**2, d**0.5 / s) * float(part.norm()) ** 2
    assert exact <= bound
    assert np.mean(errors) == pytest.approx(exact, rel=0.1)


@pytest.mark.parametrize("spec", ["qsgd:bits=8", "qsgd:bits=2", "randomk:fraction=0.1",
                                  "randomk:fraction=0.1,unbiased=true", "powersgd:rank=2"])
def test_stochastic_operators_are_reproducible_from_their_key(spec: str) -> None:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(2))

    def parts(key: RngKey) -> Compressed:
        return from_spec(spec).compress(x, key)  # a fresh operator each time: no shared state

    first, again = parts(RngKey(1, "p01", 4)), parts(RngKey(1, "p01", 4))
    assert first.params == again.params
    assert all(torch.equal(first.parts[name], again.parts[name]) for name in first.parts)
    for other in (RngKey(2, "p01", 4), RngKey(1, "p02", 4), RngKey(1, "p01", 5)):
        different = parts(other)
        if spec.startswith("powersgd"):
            other = RngKey(other.seed, other.peer, 0)  # PowerSGD's only randomness is its first Q
            if other == RngKey(1, "p01", 0):
                continue
        assert not all(torch.equal(first.parts[name], different.parts[name]) for name in first.parts), other


def test_randomk_receiver_regenerates_the_indices() -> None:
    x = torch.randn(10_000)
    c = from_spec("randomk:fraction=0.01").compress(x, RngKey(3, "p", 1))
    assert set(c.parts) == {"values"} and c.parts["values"].numel() == 100
    y = from_spec("randomk:fraction=0.01").decompress(c)  # another instance, as on the receiver
    kept = torch.nonzero(y).squeeze(1)
    assert kept.numel() == 100
    assert torch.equal(y[kept], x[kept])
    for seed in (-1, 2**63, "7", 1.5, True):
        with pytest.raises(BadParts) as info:
            from_spec("randomk:fraction=0.01").decompress(Compressed(c.op, c.numel, c.parts, {"seed": seed}))
        assert info.value.reason == "bad_param"


@pytest.mark.parametrize("bucket", [0, 16])
def test_qsgd_rejects_bad_codes_and_norms(bucket: int) -> None:
    for bits, bad_byte in ((8, 255), (4, 0xF0), (2, 0b11)):
        op = from_spec(f"qsgd:bits={bits},bucket={bucket}")
        c = op.compress(torch.randn(100), RngKey(1, "p", 1))
        codes = c.parts["codes"].clone()
        codes[3] = bad_byte
        with pytest.raises(BadParts) as info:
            op.decompress(Compressed(c.op, c.numel, {**c.parts, "codes": codes}, c.params))
        assert info.value.reason == "bad_code"
        for norm in (float("nan"), float("inf"), -1.0):
            if bucket == 0:
                bad = Compressed(c.op, c.numel, c.parts, {"norm": norm})
            else:
                norms = c.parts["norms"].clone()
                norms[2] = norm
                bad = Compressed(c.op, c.numel, {**c.parts, "norms": norms})
            with pytest.raises(BadParts) as info:
                op.decompress(bad)
            assert info.value.reason in ("nonfinite", "nonfinite_param", "bad_param")
        with pytest.raises(BadParts) as info:
            op.decompress(Compressed(c.op, c.numel + 200, c.parts, c.params))
        assert info.value.reason == "wrong_length"


def test_qsgd_buckets_cut_the_error_of_a_long_vector() -> None:
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(8))
    errors = {}
    for bucket in (0, 512):
        op = from_spec(f"qsgd:bits=8,bucket={bucket}")
        errors[bucket] = float((op.decompress(op.compress(x, RngKey(1, "p", 0))) - x).norm() / x.norm())
    assert errors[512] < 0.25 < 1.0 < errors[0]

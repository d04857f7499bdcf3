"""Top-k by magnitude: values (float32) plus sorted indices in the narrowest integer type.

``topk`` keeps exactly the k largest |x|; among equal magnitudes at the cut
the lowest indices win, so the result is deterministic. It finds a threshold
from a strided sample, keeps the candidates above it (a little more than k),
and selects exactly among those: about 10x faster than ``torch.topk`` on 25M.

``topk-approx`` keeps everything at or above a sampled threshold and skips
the exact selection. Its contract (checked by the receiver too): the number
kept k' lies in ``[floor(k (1 - slack)), ceil(k (1 + slack))]``, and nothing
dropped is larger in magnitude than anything kept (zero magnitude slack: the
kept set is always a top-k' set). When the sample misses the band it falls
back to the exact selection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from protocols.compress.base import (
    BadParts,
    Compressed,
    RngKey,
    check_finite,
    check_header,
    check_input,
    chunks,
    get_part,
)
from protocols.compress.indices import decode_indices, encode_indices, scatter

# Strided sample size for the threshold estimate: 64 Ki values cost about 1 ms
# and put about 650 sample values above the 1% threshold.
SAMPLE = 1 << 16
# Vectors this short are selected directly, without a sample.
SMALL = 1 << 14
# Block length of the candidate scan: 256 Ki float32 (1 MiB) plus its mask stay in L2.
BLOCK = 1 << 18


def k_for(numel: int, fraction: float) -> int:
    """Elements kept: at least one (of a non-empty vector), at most all."""
    if numel == 0:
        return 0
    return min(numel, max(1, round(fraction * numel)))


def _at_least(x: torch.Tensor, threshold: float, scratch: dict[str, np.ndarray]) -> torch.Tensor:
    """Sorted positions with |x| >= threshold or NaN, found block by block while each block is in cache.

    A NaN is selected (and then refused) rather than silently dropped. numpy's
    ``nonzero`` on a boolean block ran 4x faster than ``torch.nonzero`` here.
    """
    magnitude = scratch.setdefault("magnitude", np.empty(BLOCK, dtype=np.float32))
    mask = scratch.setdefault("mask", np.empty(BLOCK, dtype=np.bool_))
    source = x.numpy()
    limit = np.float32(threshold)
    found: list[np.ndarray] = []
    for start, stop in chunks(x.numel(), BLOCK):
        length = stop - start
        np.abs(source[start:stop], out=magnitude[:length])
        np.less(magnitude[:length], limit, out=mask[:length])
        np.logical_not(mask[:length], out=mask[:length])  # not below: NaN counts as selected
        positions = mask[:length].nonzero()[0]
        if positions.size:
            positions += start
            found.append(positions)
    if not found:
        return torch.zeros(0, dtype=torch.int64)
    return torch.from_numpy(np.concatenate(found).astype(np.int64, copy=False))


def _sample(x: torch.Tensor, size: int) -> torch.Tensor:
    """|x| at evenly strided positions (about ``size`` of them)."""
    return x[::max(1, x.numel() // size)].abs()


def _candidates(x: torch.Tensor, k: int, scratch: dict[str, np.ndarray]) -> torch.Tensor:
    """Sorted positions at or above a threshold that lets at least k through (a few % more)."""
    numel = x.numel()
    threshold = 0.0
    if numel > SMALL:
        sample = _sample(x, SAMPLE)
        expected = sample.numel() * k / numel
        rank = int(expected + 4 * math.sqrt(expected) + 8)  # 4 sigma above the expected count
        if rank < sample.numel():
            threshold = float(torch.kthvalue(sample, sample.numel() - rank).values)
    while True:
        found = _at_least(x, threshold, scratch)
        if found.numel() >= k:
            return found
        if threshold == 0.0:
            raise ValueError("top-k: the input has NaN values")
        threshold = threshold / 4 if threshold > 1e-30 else 0.0  # the sample misled us: widen


def select_exact(x: torch.Tensor, k: int, scratch: dict[str, np.ndarray]) -> torch.Tensor:
    """Sorted positions of exactly the k largest |x|; ties go to the lowest index."""
    numel = x.numel()
    if k >= numel:
        return torch.arange(numel)
    if k == 0:
        return torch.zeros(0, dtype=torch.int64)
    found = _candidates(x, k, scratch)
    if found.numel() == k:
        return found
    values = x[found].abs_()
    if bool(torch.isnan(values).any()):
        raise ValueError("top-k: the input has NaN values")
    kth = torch.kthvalue(values, values.numel() - k + 1).values
    keep = values > kth
    missing = k - int(keep.sum())
    ties = torch.nonzero(values == kth).squeeze(1)[:missing]
    keep[ties] = True
    return found[keep]


def _decode_sparse(c: Compressed, op: str, low: int, high: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_header(c, op, {"indices", "values"})
    values = c.parts["values"]
    if not low <= values.numel() <= high:
        raise BadParts("wrong_length", f"{values.numel()} values, expected [{low}, {high}]")
    values = get_part(c, "values", torch.float32)
    check_finite(values, "values")
    return decode_indices(c, "indices", values.numel()), values


@dataclass(frozen=True, kw_only=True)
class TopK:
    """Exactly the ``round(fraction * numel)`` largest magnitudes."""

    fraction: float = 0.01  # 1%: the usual operating point of sparsified SGD with error feedback
    _scratch: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"topk fraction must be in (0, 1], got {self.fraction}")

    @property
    def name(self) -> str:
        return "topk"

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        k = k_for(x.numel(), self.fraction)
        indices = select_exact(x, k, self._scratch)
        return Compressed(
            op=self.name,
            numel=x.numel(),
            parts={"indices": encode_indices(indices, x.numel()), "values": x[indices]},
        )

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        k = k_for(c.numel, self.fraction) if isinstance(c.numel, int) else 0
        indices, values = _decode_sparse(c, self.name, k, k)
        return scatter(c.numel, indices, values, out)

    def subtract_sent(self, c: Compressed, acc: torch.Tensor) -> None:
        """acc -= decompress(c), touching only the sent positions (exact zeros there)."""
        indices, values = _decode_sparse(c, self.name, 0, c.numel)
        acc.index_put_((indices,), -values, accumulate=True)


@dataclass(frozen=True, kw_only=True)
class TopKApprox:
    """Everything above a sampled threshold: k' within ``slack`` of k, never a smaller kept than dropped."""

    fraction: float = 0.01  # as topk
    slack: float = 0.1  # 10%: about 5 standard deviations of the 256 Ki-sample estimate at 1%
    _scratch: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"topk-approx fraction must be in (0, 1], got {self.fraction}")
        if not 0.0 <= self.slack < 1.0:
            raise ValueError(f"topk-approx slack must be in [0, 1), got {self.slack}")

    @property
    def name(self) -> str:
        return "topk-approx"

    def k_range(self, numel: int) -> tuple[int, int]:
        """The band the number of kept elements always lies in."""
        k = k_for(numel, self.fraction)
        return min(k, math.floor(k * (1 - self.slack))), min(numel, math.ceil(k * (1 + self.slack)))

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        numel = x.numel()
        k = k_for(numel, self.fraction)
        low, high = self.k_range(numel)
        indices = None
        if numel > SMALL:
            sample = _sample(x, 4 * SAMPLE)
            rank = round(sample.numel() * k / numel)
            if 0 < rank < sample.numel():
                threshold = float(torch.kthvalue(sample, sample.numel() - rank + 1).values)
                found = _at_least(x, threshold, self._scratch)
                if low <= found.numel() <= high:
                    indices = found
        if indices is None:
            indices = select_exact(x, k, self._scratch)
        return Compressed(
            op=self.name,
            numel=numel,
            parts={"indices": encode_indices(indices, numel), "values": x[indices]},
        )

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        low, high = self.k_range(c.numel) if isinstance(c.numel, int) else (0, 0)
        indices, values = _decode_sparse(c, self.name, low, high)
        return scatter(c.numel, indices, values, out)

    def subtract_sent(self, c: Compressed, acc: torch.Tensor) -> None:
        """acc -= decompress(c), touching only the sent positions."""
        indices, values = _decode_sparse(c, self.name, 0, c.numel)
        acc.index_put_((indices,), -values, accumulate=True)

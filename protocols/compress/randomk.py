"""Random-k: k coordinates chosen uniformly without replacement from a counter-based key.

Only the values travel, with the derived 63-bit seed in the header; the
receiver regenerates the same sorted indices from (seed, numel, k). With
``unbiased`` the values are scaled by numel / k, so E[decompress] = x
(Stich et al. 2018); without it the operator is the contractive one that
error feedback wants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocols.compress.base import (
    Compressed,
    RngKey,
    check_finite,
    check_header,
    check_input,
    get_int,
    get_part,
)
from protocols.compress.indices import scatter
from protocols.compress.topk import k_for
from protocols.rng import derive_seed, numpy_generator


def random_indices(seed: int, numel: int, k: int) -> torch.Tensor:
    """k distinct positions in ``range(numel)``, sorted, from the sent ``seed`` alone."""
    generator = numpy_generator(seed, "", 0, "randomk-indices")
    chosen = generator.choice(numel, size=k, replace=False, shuffle=False)
    chosen.sort()
    return torch.from_numpy(chosen.astype(np.int64, copy=False))


@dataclass(frozen=True, kw_only=True)
class RandomK:
    """k = round(fraction * numel) random coordinates; ``unbiased`` scales them by numel / k."""

    fraction: float = 0.01  # as topk, for a like-for-like comparison
    unbiased: bool = False  # error feedback wants the contractive (unscaled) operator

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"randomk fraction must be in (0, 1], got {self.fraction}")

    @property
    def name(self) -> str:
        return "randomk"

    def _gain(self, numel: int, k: int) -> float:
        return numel / k if self.unbiased and k else 1.0

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        numel = x.numel()
        k = k_for(numel, self.fraction)
        seed = derive_seed(key.seed, key.peer, key.step, self.name)
        values = x[random_indices(seed, numel, k)]
        gain = self._gain(numel, k)
        if gain != 1.0:
            values.mul_(gain)
        return Compressed(op=self.name, numel=numel, parts={"values": values}, params={"seed": seed})

    def _decode(self, c: Compressed) -> tuple[torch.Tensor, torch.Tensor]:
        check_header(c, self.name, {"values"})
        k = k_for(c.numel, self.fraction)
        values = get_part(c, "values", torch.float32, k)
        seed = get_int(c, "seed", 0, 2**63 - 1)
        check_finite(values, "values")
        return random_indices(seed, c.numel, k), values

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        indices, values = self._decode(c)
        return scatter(c.numel, indices, values, out)

    def subtract_sent(self, c: Compressed, acc: torch.Tensor) -> None:
        """acc -= decompress(c), touching only the sent positions."""
        indices, values = self._decode(c)
        acc.index_put_((indices,), -values, accumulate=True)

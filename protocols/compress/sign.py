"""Scaled sign (EF-signSGD, Karimireddy et al. 2019): 1 bit per element plus scale = mean |x|.

Bit j of byte i (little bit order) is set when element 8i+j is negative;
zero counts as positive. Decoding maps each byte to its 8 signed values
through a 256-row table, so it is one gather instead of unpack + arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocols.compress.base import Compressed, RngKey, check_header, check_input, get_float, get_part

_BIT_TABLE = torch.from_numpy(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(np.float32)
)  # row b: the 8 bits of byte b, lowest first


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit per element (set = negative), little bit order, zero-padded to whole bytes."""
    return torch.from_numpy(np.packbits((x < 0).numpy(), bitorder="little"))


def unpack_signs(packed: torch.Tensor, numel: int, scale: float) -> torch.Tensor:
    """+scale or -scale per element, as a fresh float32 tensor of ``numel``."""
    table = 1.0 - 2.0 * _BIT_TABLE
    table.mul_(scale)
    return table[packed.to(torch.int64)].reshape(-1)[:numel]


@dataclass(frozen=True, kw_only=True)
class ScaledSign:
    """1 bit per element; every element decodes to +-mean|x|."""

    @property
    def name(self) -> str:
        return "sign"

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        numel = x.numel()
        scale = float(torch.linalg.vector_norm(x, 1)) / numel if numel else 0.0
        return Compressed(op=self.name, numel=numel, parts={"signs": pack_signs(x)}, params={"scale": scale})

    def decompress(self, c: Compressed) -> torch.Tensor:
        check_header(c, self.name, {"signs"})
        packed = get_part(c, "signs", torch.uint8, -(-c.numel // 8))
        return unpack_signs(packed, c.numel, get_float(c, "scale"))

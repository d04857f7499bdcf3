"""Scaled sign (EF-signSGD, Karimireddy et al. 2019): 1 bit per element plus scale = mean |x|.

Bit j of byte i (little bit order) is set when element 8i+j is negative;
zero counts as positive. Decoding maps each byte to its 8 signed values
through a 256-row table (``bitpack.table_decode``): one gather per byte.
Both directions run on cache-sized chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from protocols.compress.base import (
    CHUNK,
    Compressed,
    RngKey,
    check_header,
    check_input,
    chunks,
    get_float,
    get_part,
    output,
)
from protocols.compress.bitpack import table_decode

_BIT_TABLE = torch.from_numpy(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(np.float32)
)  # row b: the 8 bits of byte b, lowest first


def pack_signs(x: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """One bit per element (set = negative), little bit order, zero-padded to whole bytes."""
    numel = x.numel()
    packed = torch.empty(-(-numel // 8), dtype=torch.uint8)
    target = packed.numpy()
    negative = scratch if scratch is not None else torch.empty(CHUNK, dtype=torch.bool)
    for start, stop in chunks(numel):
        mask = torch.lt(x[start:stop], 0, out=negative[:stop - start])
        target[start // 8:-(-stop // 8)] = np.packbits(mask.numpy(), bitorder="little")
    return packed


def unpack_signs(
    packed: torch.Tensor, numel: int, scale: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """+scale or -scale per element (float32 of ``numel``), into ``out`` when given."""
    table = 1.0 - 2.0 * _BIT_TABLE
    table.mul_(scale)
    return table_decode(packed, table, numel, output(numel, out))


@dataclass(frozen=True, kw_only=True)
class ScaledSign:
    """1 bit per element; every element decodes to +-mean|x|."""

    _scratch: torch.Tensor = field(
        default_factory=lambda: torch.empty(CHUNK, dtype=torch.bool), repr=False, compare=False)

    @property
    def name(self) -> str:
        return "sign"

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        numel = x.numel()
        scale = float(torch.linalg.vector_norm(x, 1)) / numel if numel else 0.0
        if not math.isfinite(scale):
            raise ValueError("sign: the input has NaN or Inf values")
        packed = pack_signs(x, self._scratch)
        return Compressed(op=self.name, numel=numel, parts={"signs": packed}, params={"scale": scale})

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        check_header(c, self.name, {"signs"})
        packed = get_part(c, "signs", torch.uint8, -(-c.numel // 8))
        return unpack_signs(packed, c.numel, get_float(c, "scale"), out)

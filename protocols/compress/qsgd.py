"""QSGD (Alistarh et al. 2017): stochastic, unbiased quantisation to s levels per sign.

With b bits per element, s = 2^(b-1) - 1 levels per sign (127, 7, 1), and
v = x s / ||x||_2 in [-s, s], each element becomes ``floor(v + u)`` with u
uniform in [0, 1): one of the two levels around v, with E = v (rounding v
itself instead of |v| gives the same two levels with the same
probabilities). The code ``level + s`` in [0, 2s] is bit-packed: one per
byte at 8 bits, two at 4, four at 2 (lowest bits first). ``norm`` travels in
the header; decoding is ``(code - s) ||x|| / s``, and a code above 2s is
rejected (``bad_code``).

Codes are packed by ``bitpack.pack_codes``. The noise is 16-bit integers
from PCG64 keyed by (seed, peer, step, "qsgd"), so u takes 65,536 evenly
spaced values (midpoints): the rounding is unbiased to 2^-17 of a level
step, below float32 resolution of v near s.
All arithmetic runs on cache-sized chunks (see ``base.CHUNK``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from protocols.compress.base import (
    CHUNK,
    BadParts,
    Compressed,
    RngKey,
    check_header,
    check_input,
    chunks,
    get_float,
    get_part,
    output,
)
from protocols.compress.bitpack import pack_codes, unpack_codes
from protocols.rng import numpy_generator

BITS = (2, 4, 8)
_NOISE_SCALE = 2.0**-16
_NOISE_OFFSET = 0.5 + 0.5 * 2.0**-16  # int16 noise r -> u = (r + 32768 + 1/2) / 65536


def levels(bits: int) -> int:
    """Levels per sign for ``bits`` bits per element."""
    return 2 ** (bits - 1) - 1


@dataclass(frozen=True, kw_only=True)
class QSGD:
    """b-bit stochastic quantisation with the L2 norm sent alongside."""

    bits: int = 8  # 8 bits: 127 levels per sign, 4x smaller than float32 with little added variance
    _scratch: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"qsgd bits must be one of {BITS}, got {self.bits}")

    @property
    def name(self) -> str:
        return "qsgd"

    def _buffer(self, name: str, dtype: np.dtype) -> np.ndarray:
        buffer = self._scratch.get(name)
        if buffer is None:
            buffer = self._scratch.setdefault(name, np.empty(CHUNK, dtype=dtype))
        return buffer

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        numel = x.numel()
        s = levels(self.bits)
        per_byte = 8 // self.bits
        norm = float(torch.linalg.vector_norm(x)) if numel else 0.0
        if not math.isfinite(norm):
            raise ValueError("qsgd: the input has NaN or Inf values")
        gain = np.float32(s / norm if norm > 0 else 0.0)
        bitgen = numpy_generator(key.seed, key.peer, key.step, self.name).bit_generator
        packed = torch.empty(-(-numel // per_byte), dtype=torch.uint8)
        noise = self._buffer("noise", np.dtype(np.float32))
        value = self._buffer("value", np.dtype(np.float32))
        codes = self._buffer("codes", np.dtype(np.uint8))
        source = x.numpy()
        target = packed.numpy()
        for start, stop in chunks(numel):
            length = stop - start
            raw = bitgen.random_raw(-(-length // 4)).view(np.int16)[:length]
            u = np.multiply(raw, np.float32(_NOISE_SCALE), out=noise[:length])
            u += np.float32(_NOISE_OFFSET + s)
            v = np.multiply(source[start:stop], gain, out=value[:length])
            v += u  # v + s + u, in [0, 2s + 1)
            # Float rounding may reach 2s + 1 when one element holds (almost) the whole norm.
            torch.from_numpy(v).clamp_(max=2 * s)
            padded = -(-length // per_byte) * per_byte
            code = codes[:padded]
            np.copyto(code[:length], v, casting="unsafe")  # truncation = floor for non-negative values
            code[length:] = s  # padding decodes to 0 and is cut off
            target[start // per_byte:start // per_byte + padded // per_byte] = pack_codes(code, self.bits)
        return Compressed(op=self.name, numel=numel, parts={"codes": packed}, params={"norm": norm})

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        check_header(c, self.name, {"codes"})
        s = levels(self.bits)
        per_byte = 8 // self.bits
        packed = get_part(c, "codes", torch.uint8, -(-c.numel // per_byte))
        step = get_float(c, "norm") / s
        result = output(c.numel, out)
        source = packed.numpy()
        spread = self._buffer("spread", np.dtype(np.uint8))
        highest = 0
        for start, stop in chunks(packed.numel(), CHUNK // per_byte):
            codes = unpack_codes(source[start:stop], self.bits, spread)
            highest = max(highest, int(codes.max()))
            first = start * per_byte
            last = min(stop * per_byte, c.numel)
            codes_t = torch.from_numpy(codes[:last - first])
            torch.mul(codes_t, step, out=result[first:last]).sub_(s * step)
        if highest > 2 * s:
            raise BadParts("bad_code", f"a code above {2 * s}")
        return result

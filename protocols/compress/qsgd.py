"""QSGD (Alistarh et al. 2017): stochastic, unbiased quantisation to s levels per sign.

With b bits per element, s = 2^(b-1) - 1 levels per sign (127, 7, 1). The
vector is cut into buckets of ``bucket`` elements (0: one bucket, the whole
vector), each with its L2 norm; with v = x s / ||bucket||_2 in [-s, s], each
element becomes ``floor(v + u)``, u uniform in [0, 1): one of the two levels
around v, with E = v (rounding v itself instead of |v| gives the same two
levels with the same probabilities). The code ``level + s`` in [0, 2s] is
bit-packed: one per byte at 8 bits, two at 4, four at 2 (lowest bits first,
``bitpack.pack_codes``). Decoding is ``(code - s) ||bucket|| / s``; a code
above 2s is rejected (``bad_code``). The norms travel as a float32 part
``norms`` (or, with bucket=0, as the header parameter ``norm``).

The noise is 16-bit integers from PCG64 keyed by (seed, peer, step,
"qsgd"), so u takes 65,536 evenly spaced values (midpoints): the rounding is
unbiased to 2^-17 of a level step, below float32 resolution of v near s.
All arithmetic runs on cache-sized chunks (see ``base.CHUNK``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from protocols.compress.base import (
    CHUNK,
    BadParts,
    Compressed,
    RngKey,
    check_finite,
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
    count: int = 2 ** (bits - 1) - 1  # int ** int is typed as Any (a negative power is a float)
    return count


def bucket_norms(x: torch.Tensor, bucket: int) -> torch.Tensor:
    """float32 L2 norm of each run of ``bucket`` elements (the last one may be shorter)."""
    whole = x.numel() // bucket
    norms = torch.empty(-(-x.numel() // bucket), dtype=torch.float32)
    if whole:
        torch.linalg.vector_norm(x[:whole * bucket].view(whole, bucket), dim=1, out=norms[:whole])
    if norms.numel() > whole:
        norms[whole] = torch.linalg.vector_norm(x[whole * bucket:])
    return norms


def _scale(source: np.ndarray, factors: np.ndarray, bucket: int, first: int, target: np.ndarray) -> None:
    """target = source times the factor of each element's bucket (bucket ``first`` starts the block)."""
    length = source.size
    whole = length // bucket
    if whole:
        np.multiply(source[:whole * bucket].reshape(whole, bucket), factors[first:first + whole, None],
                    out=target[:whole * bucket].reshape(whole, bucket))
    if length > whole * bucket:
        np.multiply(source[whole * bucket:], factors[first + whole], out=target[whole * bucket:])


@dataclass(frozen=True, kw_only=True)
class QSGD:
    """b-bit stochastic quantisation with one L2 norm per bucket sent alongside."""

    bits: int = 8  # 8 bits: 127 levels per sign, 4x smaller than float32 with little added variance
    # 512: the paper's bucket size; one norm per 25M elements would make 8-bit noise 5x the signal.
    bucket: int = 512
    _scratch: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"qsgd bits must be one of {BITS}, got {self.bits}")
        if self.bucket != 0 and (self.bucket < 16 or self.bucket > CHUNK or self.bucket & (self.bucket - 1)):
            raise ValueError(f"qsgd bucket must be 0 (one norm) or a power of two in [16, {CHUNK}], "
                             f"got {self.bucket}")

    @property
    def name(self) -> str:
        return "qsgd"

    def _buffer(self, name: str, dtype: np.dtype) -> np.ndarray:
        buffer = self._scratch.get(name)
        if buffer is None:
            buffer = self._scratch.setdefault(name, np.empty(CHUNK, dtype=dtype))
        return buffer

    def _norms(self, x: torch.Tensor) -> torch.Tensor:
        if self.bucket == 0:
            return torch.linalg.vector_norm(x).reshape(1) if x.numel() else torch.zeros(1)
        return bucket_norms(x, self.bucket)

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        numel = x.numel()
        s = levels(self.bits)
        per_byte = 8 // self.bits
        bucket = self.bucket or max(numel, 1)
        norms = self._norms(x)
        if norms.numel() and not bool(torch.isfinite(norms).all()):
            raise ValueError("qsgd: the input has NaN or Inf values")
        gains = torch.where(norms > 0, s / norms, 0.0).numpy()
        bitgen = numpy_generator(key.seed, key.peer, key.step, self.name).bit_generator
        packed = torch.empty(-(-numel // per_byte), dtype=torch.uint8)
        noise = self._buffer("noise", np.dtype(np.float32))
        value = self._buffer("value", np.dtype(np.float32))
        codes = self._buffer("codes", np.dtype(np.uint8))
        source, target = x.numpy(), packed.numpy()
        for start, stop in chunks(numel):
            length = stop - start
            raw = bitgen.random_raw(-(-length // 4)).view(np.int16)[:length]
            u = np.multiply(raw, np.float32(_NOISE_SCALE), out=noise[:length])
            u += np.float32(_NOISE_OFFSET + s)
            v = value[:length]
            _scale(source[start:stop], gains, bucket, start // bucket, v)
            v += u  # v + s + u, in [0, 2s + 1)
            # Float rounding may reach 2s + 1 when one element holds (almost) the whole norm.
            torch.from_numpy(v).clamp_(max=2 * s)
            padded = -(-length // per_byte) * per_byte
            code = codes[:padded]
            np.copyto(code[:length], v, casting="unsafe")  # truncation = floor for non-negative values
            code[length:] = s  # padding decodes to 0 and is cut off
            target[start // per_byte:start // per_byte + padded // per_byte] = pack_codes(code, self.bits)
        if self.bucket == 0:
            return Compressed(op=self.name, numel=numel, parts={"codes": packed},
                              params={"norm": float(norms[0])})
        return Compressed(op=self.name, numel=numel, parts={"codes": packed, "norms": norms})

    def _steps(self, c: Compressed) -> torch.Tensor:
        """Level step (norm / s) per bucket, validated."""
        s = levels(self.bits)
        if self.bucket == 0:
            return torch.tensor([get_float(c, "norm") / s], dtype=torch.float32)
        norms = get_part(c, "norms", torch.float32, -(-c.numel // self.bucket))
        check_finite(norms, "norms")
        if norms.numel() and float(norms.min()) < 0:
            raise BadParts("bad_param", "a negative norm")
        return norms / s

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        check_header(c, self.name, {"codes"} if self.bucket == 0 else {"codes", "norms"})
        s = levels(self.bits)
        per_byte = 8 // self.bits
        bucket = self.bucket or max(c.numel, 1)
        packed = get_part(c, "codes", torch.uint8, -(-c.numel // per_byte))
        steps = self._steps(c).numpy()
        shifts = steps * np.float32(s)
        result = output(c.numel, out)
        values = result.numpy()
        source = packed.numpy()
        spread = self._buffer("spread", np.dtype(np.uint8))
        highest = 0
        for start, stop in chunks(packed.numel(), CHUNK // per_byte):
            codes = unpack_codes(source[start:stop], self.bits, spread)
            highest = max(highest, int(codes.max()))
            first = start * per_byte
            last = min(stop * per_byte, c.numel)
            block = values[first:last]
            _scale(codes[:last - first], steps, bucket, first // bucket, block)
            _subtract(block, shifts, bucket, first // bucket)
        if highest > 2 * s:
            raise BadParts("bad_code", f"a code above {2 * s}")
        return result


def _subtract(target: np.ndarray, shifts: np.ndarray, bucket: int, first: int) -> None:
    """target -= the shift of each element's bucket, in place."""
    length = target.size
    whole = length // bucket
    if whole:
        blocks = target[:whole * bucket].reshape(whole, bucket)
        blocks -= shifts[first:first + whole, None]
    if length > whole * bucket:
        target[whole * bucket:] -= shifts[first + whole]

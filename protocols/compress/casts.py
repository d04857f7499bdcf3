"""Identity and the two 16-bit casts: one part ``values``, nothing in the header.

fp16 saturates at +-65504 instead of overflowing to Inf (a receiver rejects
Inf); with error feedback the clipped amount is carried to the next round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from protocols.compress.base import (
    Compressed,
    RngKey,
    check_header,
    check_input,
    copy_checked,
    get_part,
    output,
)

FP16_MAX = 65504.0


def _decode_values(c: Compressed, op: str, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    check_header(c, op, {"values"})
    values = get_part(c, "values", dtype, c.numel)
    # Always a copy: received buffers may be read-only, and the caller mixes in place.
    result = output(c.numel, out)
    copy_checked(values, result, "values")
    return result


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Sends the float32 values as they are (a copy, so the caller may keep changing ``x``)."""

    @property
    def name(self) -> str:
        return "identity"

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        return Compressed(op=self.name, numel=x.numel(), parts={"values": x.clone()})

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        return _decode_values(c, self.name, torch.float32, out)


@dataclass(frozen=True, kw_only=True)
class Float16:
    """IEEE half precision: 2 bytes per element, 10-bit mantissa, saturating at 65504."""

    @property
    def name(self) -> str:
        return "fp16"

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        half = x.to(torch.float16)
        if half.numel():
            low, high = torch.aminmax(half)
            if bool(torch.isinf(low) | torch.isinf(high)):
                # Only inputs beyond the half range pay for the extra clamp pass.
                half = x.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
        return Compressed(op=self.name, numel=x.numel(), parts={"values": half})

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        return _decode_values(c, self.name, torch.float16, out)


@dataclass(frozen=True, kw_only=True)
class BFloat16:
    """bfloat16: float32's range with an 8-bit mantissa (round to nearest even)."""

    @property
    def name(self) -> str:
        return "bf16"

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        return Compressed(op=self.name, numel=x.numel(), parts={"values": x.to(torch.bfloat16)})

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        return _decode_values(c, self.name, torch.bfloat16, out)

"""Sparse index frames: the narrowest integer type that holds ``numel``, sorted, validated.

Only dtypes every codec knows are used (uint8, int16, int32, int64): an int16
index is stored minus 32768 so that 65,536 positions fit in two bytes.
"""

from __future__ import annotations

import torch

from protocols.compress.base import BadParts, Compressed, get_part, output

_INT16_OFFSET = 32768


def index_dtype(numel: int) -> torch.dtype:
    """The narrowest wire dtype for positions in ``range(numel)``."""
    if numel <= 256:
        return torch.uint8
    if numel <= 65536:
        return torch.int16
    if numel <= 2**31:
        return torch.int32
    return torch.int64


def encode_indices(indices: torch.Tensor, numel: int) -> torch.Tensor:
    """int64 positions (sorted ascending) -> the wire tensor (a fresh tensor)."""
    dtype = index_dtype(numel)
    if dtype == torch.int16:
        return (indices - _INT16_OFFSET).to(torch.int16)
    return indices.to(dtype, copy=True)


def decode_indices(c: Compressed, name: str, length: int) -> torch.Tensor:
    """Wire tensor -> int64 positions; rejects a wrong dtype, out-of-range, unsorted or repeated index."""
    wire = get_part(c, name, index_dtype(c.numel), length)
    indices = wire.to(torch.int64)
    if wire.dtype == torch.int16:
        indices += _INT16_OFFSET
    if indices.numel() == 0:
        return indices
    low, high = torch.aminmax(indices)
    if int(low) < 0 or int(high) >= c.numel:
        raise BadParts("index_out_of_range", f"[{int(low)}, {int(high)}] outside [0, {c.numel})")
    if indices.numel() > 1:
        steps = indices[1:] - indices[:-1]
        smallest = int(steps.min())
        if smallest == 0:
            raise BadParts("index_repeated", name)
        if smallest < 0:
            raise BadParts("index_unsorted", name)
    return indices


def scatter(
    numel: int, indices: torch.Tensor, values: torch.Tensor, out: torch.Tensor | None
) -> torch.Tensor:
    """A dense float32 vector (``out`` or fresh) with ``values`` at ``indices`` and zeros elsewhere."""
    if out is None:
        result = torch.zeros(numel, dtype=torch.float32)
    else:
        result = output(numel, out)
        result.zero_()
    result.index_put_((indices,), values.to(torch.float32))
    return result

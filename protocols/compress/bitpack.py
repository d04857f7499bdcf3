"""Sub-byte codes: packing b-bit codes into bytes and decoding bytes through a table.

Codes are packed lowest bits first (little bit order), matching numpy's
``packbits(bitorder="little")`` for 1-bit codes. Both directions work on
cache-sized chunks. ``unpack_codes`` spreads codes back into bytes with
strided shifts; ``table_decode`` maps each byte to a row of 8 // b float32
values with one gather (used for 1-bit signs, where a row is 8 values).
"""

from __future__ import annotations

import numpy as np
import torch

from protocols.compress.base import CHUNK, chunks

_WORD: dict[int, np.dtype] = {4: np.dtype("<u2"), 2: np.dtype("<u4")}


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes below 2^bits (length a multiple of 8 // bits) -> packed bytes.

    A little-endian word holds the byte-aligned codes of one output byte; a few
    shifts gather them into its low byte (e.g. 4 bits: ``v | v >> 4``).
    """
    if bits == 8:
        return codes
    words = codes.view(_WORD[bits])
    gathered = words.copy()
    for j in range(1, 8 // bits):
        gathered |= words >> (j * (8 - bits))
    return gathered.astype(np.uint8)


def unpack_codes(packed: np.ndarray, bits: int, codes: np.ndarray) -> np.ndarray:
    """Inverse of ``pack_codes``: ``codes[:len(packed) * 8 // bits]`` <- the codes, lowest bits first."""
    per_byte = 8 // bits
    if per_byte == 1:
        return packed
    mask = np.uint8((1 << bits) - 1)
    result = codes[:packed.size * per_byte]
    for j in range(per_byte):
        lane = result[j::per_byte]
        if j == 0:
            np.bitwise_and(packed, mask, out=lane)
        else:
            np.right_shift(packed, np.uint8(bits * j), out=lane)
            if j < per_byte - 1:
                lane &= mask
    return result


def table_decode(packed: torch.Tensor, table: torch.Tensor, numel: int, out: torch.Tensor) -> torch.Tensor:
    """out[:numel] = the rows of ``table`` (256 x per_byte float32) picked by each byte, in order."""
    per_byte = table.shape[1]
    whole = numel // per_byte
    rows = out[:whole * per_byte].view(whole, per_byte)
    index = torch.empty(min(CHUNK, max(whole, 1)), dtype=torch.int64)
    for start, stop in chunks(whole):
        idx = index[:stop - start]
        idx.copy_(packed[start:stop])
        torch.index_select(table, 0, idx, out=rows[start:stop])
    tail = numel - whole * per_byte
    if tail:
        out[whole * per_byte:] = table[int(packed[whole])][:tail]
    return out

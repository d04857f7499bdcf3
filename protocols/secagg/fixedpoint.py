"""Fixed point in the ring Z_2^32: clip, quantise, add, and decode the sum.

A client's float update ``x`` is clipped per coordinate to ``[-c, c]`` and rounded to the integer
``q = round(x / c * L)``, ``L = 2^(bits-1) - 1``, so ``|q| <= L``. Integers are held in int64 arrays
and reduced mod 2^32 (two's complement: ``-1`` is ``2^32 - 1``). A sum of ``n`` such values lies in
``[-n L, n L]``; it decodes exactly as long as ``n L < 2^31`` (:func:`max_clients_for_bits`), which
the config checks for its ``max_clients``. The step is ``c / L`` per coordinate per client, so the
rounding error of a sum of ``n`` is at most ``n c / (2 L)``. A ``scale`` in [0, 1] multiplies the
clipped value before rounding (a weighted client's ``w / W``: protocols/federation/secure.py), so
``|q| <= L`` and the bound above still hold.

Rounding is to nearest (ties to even), deterministic: no randomness, so masking on and off give the
same integers bit for bit.
"""

from __future__ import annotations

import numpy as np

RING_BITS = 32
RING = 1 << RING_BITS
RING_MASK = RING - 1


def levels(bits: int) -> int:
    """L, the largest magnitude a ``bits``-bit signed value takes."""
    return (1 << (bits - 1)) - 1


def max_clients_for_bits(bits: int) -> int:
    """The most clients whose ``bits``-bit values sum in the ring without wrapping: n L < 2^31."""
    return ((1 << (RING_BITS - 1)) - 1) // levels(bits)


def quantise(update: np.ndarray, *, clip_value: float, bits: int, scale: float = 1.0) -> np.ndarray:
    """Clip to [-clip_value, clip_value], multiply by ``scale`` (in [0, 1]), round to ``bits``-bit
    signed integers, reduce into the ring (int64 in [0, 2^32)). NaN is refused: a ValueError, not a
    silent zero."""
    x = np.asarray(update, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("an update to quantise must be finite")
    if not 0.0 <= scale <= 1.0:
        raise ValueError(f"scale must be in [0, 1] (|q| <= L), not {scale}")
    scaled = np.clip(x, -clip_value, clip_value) * (levels(bits) * scale / clip_value)
    return np.rint(scaled).astype(np.int64) & RING_MASK


def ring_add(total: np.ndarray, value: np.ndarray) -> np.ndarray:
    """(total + value) mod 2^32, in place into ``total`` and returned."""
    np.add(total, value, out=total)
    np.bitwise_and(total, RING_MASK, out=total)
    return total


def ring_sub(total: np.ndarray, value: np.ndarray) -> np.ndarray:
    """(total - value) mod 2^32, in place into ``total`` and returned."""
    np.subtract(total, value, out=total)
    np.bitwise_and(total, RING_MASK, out=total)
    return total


def to_signed(ring_values: np.ndarray) -> np.ndarray:
    """The centred integers of ring elements: [2^31, 2^32) become negative."""
    values = np.asarray(ring_values, dtype=np.int64) & RING_MASK
    return np.where(values >= 1 << (RING_BITS - 1), values - RING, values)


def dequantise_sum(ring_sum: np.ndarray, *, clip_value: float, bits: int) -> np.ndarray:
    """The float sum of the clients' clipped updates, from their sum in the ring (float64)."""
    return to_signed(ring_sum).astype(np.float64) * (clip_value / levels(bits))


def to_bytes(ring_values: np.ndarray) -> bytes:
    """Ring elements as little-endian uint32 (4 bytes each): what a masked input carries."""
    return np.asarray(ring_values, dtype=np.int64).astype("<u4").tobytes()


def from_bytes(data: bytes, numel: int) -> np.ndarray | None:
    """Inverse of :func:`to_bytes`; None when the length is not 4 * ``numel``."""
    if len(data) != 4 * numel:
        return None
    return np.frombuffer(data, dtype="<u4").astype(np.int64)

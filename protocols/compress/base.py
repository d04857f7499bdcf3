"""The one interface every compression operator implements.

compress(x, key) -> Compressed (parts sent as raw frames + small scalar params)
decompress(c, out=None) -> tensor of ``c.numel`` float32, or raises BadParts with a reason.
``out``: a float32 buffer of ``c.numel`` the caller reuses (a fresh 100 MB tensor
costs about as much as the decoding itself: page faults); otherwise a new one.

Operators never alias their input in ``parts`` (the caller may change ``x``
in place while the parts are in flight) and never modify received parts
(the codec may hand out read-only buffers). The helpers below are the shared
validation every ``decompress`` runs before anything is applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from protocols.messages import Scalar

# The largest flat vector a receiver agrees to allocate (8 GiB of float32):
# a forged header must not make us allocate without bound.
MAX_NUMEL = 2**31 - 1

# Chunk length for the fused elementwise loops: 64 Ki float32 = 256 KiB stays
# in L2, so a chain of five elementwise ops costs about one pass over memory.
CHUNK = 1 << 16


class BadParts(ValueError):
    """Received parts that must not be applied; ``reason`` is a short counted code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class RngKey:
    """Counter-based randomness key: (seed, peer, step) plus the purpose is the operator name."""

    seed: int
    peer: str
    step: int


@dataclass(frozen=True)
class Compressed:
    """What goes on the wire for one flat tensor: ``parts`` as raw frames, ``params`` in the header."""

    op: str
    numel: int
    parts: dict[str, torch.Tensor]
    params: dict[str, Scalar] = field(default_factory=dict)

    @property
    def payload_bytes(self) -> int:
        """Bytes of the raw frames (the header adds the rest: see ``packing.message_bytes``)."""
        return sum(t.numel() * t.element_size() for t in self.parts.values())


class Compressor(Protocol):
    @property
    def name(self) -> str: ...

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed: ...

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor: ...


# ---------------------------------------------------------------- shared helpers


def chunks(numel: int, size: int = CHUNK) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive cache-sized blocks covering ``range(numel)``."""
    for start in range(0, numel, size):
        yield start, min(start + size, numel)


def check_input(x: torch.Tensor) -> torch.Tensor:
    """The input contract: a 1-D floating tensor; returned as contiguous CPU float32.

    Operators run on the CPU (the frames leave from there anyway): a CUDA input
    is copied over once here, and a CPU float32 input is used as it is.
    """
    if x.dim() != 1 or not x.is_floating_point():
        raise ValueError(f"compress takes a 1-D float tensor, got {tuple(x.shape)} {x.dtype}")
    return x.detach().to("cpu", torch.float32).contiguous()


def output(numel: int, out: torch.Tensor | None) -> torch.Tensor:
    """The caller's buffer (checked) or a fresh float32 tensor of ``numel``."""
    if out is None:
        return torch.empty(numel, dtype=torch.float32)
    if out.dtype != torch.float32 or out.shape != (numel,) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor of shape ({numel},), "
                         f"got {tuple(out.shape)} {out.dtype}")
    return out


def check_header(c: Compressed, op: str, expected: set[str]) -> None:
    """The op is ours, the element count is sane, and exactly the expected parts are present."""
    if c.op != op:
        raise BadParts("wrong_op", f"{c.op!r} given to {op!r}")
    if not isinstance(c.numel, int) or isinstance(c.numel, bool) or not 0 <= c.numel <= MAX_NUMEL:
        raise BadParts("bad_numel", repr(c.numel))
    missing = expected - set(c.parts)
    if missing:
        raise BadParts("missing_part", ",".join(sorted(missing)))
    extra = set(c.parts) - expected
    if extra:
        raise BadParts("unexpected_part", ",".join(sorted(extra)))


def get_part(c: Compressed, name: str, dtype: torch.dtype, length: int | None = None) -> torch.Tensor:
    """Part ``name`` as a 1-D tensor of ``dtype`` (and ``length`` elements when given)."""
    t = c.parts[name]
    if t.dtype != dtype:
        raise BadParts("wrong_dtype", f"{name}: {t.dtype}, expected {dtype}")
    if t.dim() != 1:
        raise BadParts("wrong_shape", f"{name}: {tuple(t.shape)}")
    if length is not None and t.numel() != length:
        raise BadParts("wrong_length", f"{name}: {t.numel()} elements, expected {length}")
    return t


def get_float(c: Compressed, name: str, *, nonnegative: bool = True) -> float:
    """A finite float parameter (ints are accepted: msgpack may send 0.0 as 0)."""
    value = c.params.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadParts("bad_param", f"{name}={value!r}")
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise BadParts("nonfinite_param", f"{name}={number}")
    if nonnegative and number < 0:
        raise BadParts("bad_param", f"{name}={number} < 0")
    return number


def get_int(c: Compressed, name: str, low: int, high: int) -> int:
    """An integer parameter in ``[low, high]``."""
    value = c.params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadParts("bad_param", f"{name}={value!r} not an int in [{low}, {high}]")
    return value


def check_finite(t: torch.Tensor, name: str) -> None:
    """Reject NaN/Inf in one pass without allocating (min/max propagate NaN)."""
    if t.numel() == 0:
        return
    low, high = torch.aminmax(t)
    if not (torch.isfinite(low) and torch.isfinite(high)):
        raise BadParts("nonfinite", name)


def copy_checked(source: torch.Tensor, target: torch.Tensor, name: str) -> None:
    """target <- source (any float dtype), rejecting NaN/Inf; checks each block while it is in cache."""
    lows: list[torch.Tensor] = []
    highs: list[torch.Tensor] = []
    for start, stop in chunks(source.numel(), 4 * CHUNK):
        block = target[start:stop]
        block.copy_(source[start:stop])
        low, high = torch.aminmax(block)
        lows.append(low)
        highs.append(high)
    if lows and not bool(torch.isfinite(torch.stack(lows + highs)).all()):
        raise BadParts("nonfinite", name)

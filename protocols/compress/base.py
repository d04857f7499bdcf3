"""The one interface every compression operator implements.

compress(x, key) -> Compressed (parts sent as raw frames + small scalar params)
decompress(c, numel) -> tensor, or raises BadParts with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from protocols.messages import Scalar


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


class Compressor(Protocol):
    name: str

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed: ...

    def decompress(self, c: Compressed) -> torch.Tensor: ...

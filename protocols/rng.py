"""Counter-based randomness: every draw is keyed by (seed, peer, step, purpose).

No generator is shared or consumed in event order, so two drivers that
deliver events in different orders still draw the same numbers.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(seed: int, peer: str, step: int, purpose: str) -> int:
    """A 63-bit seed that depends only on the key, never on call order."""
    key = f"{seed}\x00{peer}\x00{step}\x00{purpose}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def torch_generator(seed: int, peer: str, step: int, purpose: str) -> torch.Generator:
    """A fresh CPU torch generator for this key."""
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, peer, step, purpose))
    return generator


def numpy_generator(seed: int, peer: str, step: int, purpose: str) -> np.random.Generator:
    """A fresh numpy PCG64 generator for this key."""
    return np.random.Generator(np.random.PCG64(derive_seed(seed, peer, step, purpose)))

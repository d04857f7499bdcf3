"""Compression operators (pure functions over flat tensors) and error feedback.

``from_spec("topk:fraction=0.01")`` builds an operator; ``compress`` gives a
``Compressed`` whose parts travel as raw frames (``pack``/``unpack`` put them
into a message's tensors/meta); ``decompress`` validates and rebuilds, or
raises ``BadParts(reason)``. ``ErrorFeedback`` wraps any operator.
``accounting.message_bytes`` gives the exact bytes a message takes on the wire.

Specs (``name`` or ``name:key=value,...``), float32 sizes per element:

=====================================  ===========================================
identity                               4 bytes
fp16 / bf16                            2 bytes (fp16 saturates at 65504)
qsgd:bits=8|4|2,bucket=512             b bits, stochastic and unbiased, + a norm per
                                       bucket (bucket=0: one norm for the vector)
topk:fraction=0.01                     exactly k values + indices (8-64 bits)
topk-approx:fraction=0.01,slack=0.1    k' in k(1 -+ slack), never a smaller kept than dropped
randomk:fraction=0.01,unbiased=false   k values; indices regenerated from a seed
sign                                   1 bit + the scale mean|x|
powersgd:rank=4                        rank-r factors per matrix (needs ``shapes``
                                       for a model; else one near-square matrix)
=====================================  ===========================================
"""

from protocols.compress.base import BadParts, Compressed, Compressor, RngKey
from protocols.compress.feedback import ErrorFeedback
from protocols.compress.packing import pack, unpack
from protocols.compress.registry import REGISTRY, from_spec
from protocols.compress.spec import SpecError

__all__ = [
    "REGISTRY",
    "BadParts",
    "Compressed",
    "Compressor",
    "ErrorFeedback",
    "RngKey",
    "SpecError",
    "from_spec",
    "pack",
    "unpack",
]

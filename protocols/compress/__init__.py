"""Compression operators (pure functions over flat tensors) and error feedback.

``from_spec("topk:fraction=0.01")`` builds an operator; ``compress`` gives a
``Compressed`` whose parts travel as raw frames (``pack``/``unpack`` put them
into a message's tensors/meta); ``decompress`` validates and rebuilds, or
raises ``BadParts(reason)``. ``ErrorFeedback`` wraps any operator.
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

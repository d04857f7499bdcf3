"""A GPT-2-shaped decoder-only transformer on the bytes of a text, with nothing downloaded.

The model is GPT-2's: learned token and position embeddings, ``layers`` pre-norm blocks
(causal self-attention through ``scaled_dot_product_attention``, a 4x GELU MLP), a final
LayerNorm, and a read-out tied to the token embedding; weights start as GPT-2's do
(normal, std 0.02; residual projections scaled by 1/sqrt(2 layers)).

Tokens are the file's bytes (any file; default the text shipped in ``peer/train/data/``),
so no tokenizer is fetched. ``vocab`` may be raised above 256 to reach a shape's parameter
count: GPT-2 small (``layers=12, width=768, heads=12, context=1024, vocab=50257``) has
124,439,808 parameters, but its ids 256 and up never occur in the data and only learn to
be unlikely; it is GPT-2's size and compute, not its tokenizer.

The bytes are held once, as uint8: a sample is a strided view of ``context`` bytes (a
window every ``stride`` bytes; test windows do not overlap), so memory is the text's size
whatever the context. The first 90% of the bytes train, the last 10% test; loss is nats
per byte. ``autocast`` is the Task's (base.py): "auto" trains in bf16 autocast on a CUDA
device with bf16, with parameters kept in float32.

Bar: test loss at least 0.5 nats/byte below the text's unigram byte entropy.
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import nn

from peer.train.tasks.base import AUTOCAST_MODES, Task, TaskError, classification_metrics, seeded
from peer.train.tasks.charlm import BAR_BELOW_UNIGRAM, DEFAULT_TEXT, TEST_FRACTION, Block

BYTES = 256  # the tokens: a text's bytes
INIT_STD = 0.02  # GPT-2's initial weight scale
EVAL_LOGITS = 1 << 24  # logits per evaluation chunk (64 MB in float32): bounded at any vocab and context


@functools.cache
def read_bytes(path: str | None) -> bytes:
    """The bytes of the file at ``path`` (None: the shipped text), cached per process."""
    try:
        if path is None:
            return (resources.files("peer.train") / "data" / DEFAULT_TEXT).read_bytes()
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TaskError(f"gpt: no such text file {path}") from None
    except OSError as error:
        raise TaskError(f"gpt: cannot read {path}: {error}") from None


def byte_entropy(data: bytes) -> float:
    """Entropy (nats/byte) of the bytes' frequencies: the loss of the best context-free model."""
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=BYTES)
    p = counts[counts > 0] / len(data)
    return float(-(p * np.log(p)).sum())


def window_views(ids: torch.Tensor, context: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows ``ids[s:s+context]`` and their next-byte targets, for s every ``stride``: views, no copy."""
    count = (len(ids) - context - 1) // stride + 1
    shape, strides = (count, context), (stride, 1)
    return ids.as_strided(shape, strides), ids.as_strided(shape, strides, ids.storage_offset() + 1)


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` GPT-2 blocks, a final norm, a tied read-out."""

    def __init__(self, *, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.token.weight
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            assert isinstance(block, Block)
            for projection in (block.proj, block.mlp[-1]):
                assert isinstance(projection, nn.Linear)
                nn.init.normal_(projection.weight, std=INIT_STD / math.sqrt(2 * layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()  # the data is uint8; embeddings index with int64
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.norm(self.blocks(self.token(ids) + self.position(positions))))


def byte_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats per byte of (batch, time, vocab) logits against uint8 targets."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1).long())


def gpt(*, path: str | None = None, layers: int = 2, width: int = 128, heads: int = 4, context: int = 64,
        vocab: int = BYTES, stride: int = 0, autocast: str = "auto") -> Task:
    """The gpt task on ``path`` (default: the shipped text); ``stride`` 0: ``context // 8``."""
    stride = stride or max(1, context // 8)
    if context < 2 or width < 1 or layers < 1 or heads < 1 or stride < 1:
        raise TaskError("gpt: context >= 2, and layers, width, heads, stride >= 1")
    if width % heads:
        raise TaskError(f"gpt: width {width} must be a multiple of heads {heads}")
    if vocab < BYTES:
        raise TaskError(f"gpt: vocab must be at least {BYTES} (the tokens are bytes), not {vocab}")
    if autocast not in AUTOCAST_MODES:
        raise TaskError(f"gpt: autocast must be one of {', '.join(AUTOCAST_MODES)}, not {autocast!r}")
    data = read_bytes(path)
    split = int(len(data) * (1 - TEST_FRACTION))
    if split <= context + 1 or len(data) - split <= context + 1:
        least = math.ceil((context + 2) / TEST_FRACTION)
        raise TaskError(f"gpt: the text is too short ({len(data)} bytes) for context {context}: "
                        f"its last 10% must hold a window, so about {least} bytes at least")
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    train_x, train_y = window_views(ids[:split], context, stride)
    test_x, test_y = window_views(ids[split:], context, context)
    entropy = byte_entropy(data)

    def build(seed: int) -> nn.Module:
        with seeded(seed):
            return GPT(vocab=vocab, context=context, width=width, layers=layers, heads=heads)

    def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        batch = max(1, EVAL_LOGITS // (context * vocab))
        return classification_metrics(model, x, y, byte_cross_entropy, batch=batch)

    return Task(name="gpt", build_model=build, train_x=train_x, train_y=train_y, test_x=test_x,
                test_y=test_y, loss_fn=byte_cross_entropy, evaluate_fn=evaluate,
                bar={"loss": entropy - BAR_BELOW_UNIGRAM}, autocast=autocast,
                info={"unigram_entropy": entropy, "bytes": len(data),
                      "bits_per_byte_factor": 1 / math.log(2)})

"""A tiny character-level transformer on a text file the user names.

The default text (``peer/train/data/hive.txt``, about 7 KB, written for this project and
free to use) trains in a few seconds on one CPU thread. The text is split once:
the first 90% trains, the last 10% tests. Training samples are windows of
``context`` characters starting every ``stride`` characters; test windows do not
overlap, so each test character is scored once. Loss is nats per character.

Bar: test loss at least 0.5 nats/char below the text's unigram entropy (the loss of
the best model that ignores context).
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import nn

from peer.train.tasks.base import Task, TaskError, seeded

DEFAULT_TEXT = "hive.txt"  # in peer/train/data/
TEST_FRACTION = 0.1  # the tail of the text: unseen sentences, same style
BAR_BELOW_UNIGRAM = 0.5  # nats/char the model must beat the unigram entropy by


@functools.cache
def read_text(path: str | None) -> str:
    """The text at ``path`` (None: the shipped one), cached per process."""
    try:
        if path is None:
            return (resources.files("peer.train") / "data" / DEFAULT_TEXT).read_text(encoding="utf-8")
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"charlm: no such text file {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TaskError(f"charlm: cannot read {path} as UTF-8 text: {error}") from None


def unigram_entropy(text: str) -> float:
    """Entropy (nats/char) of the text's character frequencies."""
    counts = np.unique(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32), return_counts=True)[1]
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def windows(ids: torch.Tensor, context: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``ids[s:s+context]`` and next-character targets, for s every ``stride``."""
    starts = torch.arange(0, len(ids) - context, stride)
    offsets = torch.arange(context)
    x = ids[starts[:, None] + offsets]
    return x, ids[starts[:, None] + offsets + 1]


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual connection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        shape = (batch, time, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, width))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and a linear read-out."""

    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.norm(self.blocks(self.token(ids) + self.position(positions))))


def charlm(*, path: str | None = None, context: int = 32, width: int = 48, layers: int = 2, heads: int = 4,
           stride: int = 2) -> Task:
    """The char-LM task on ``path`` (default: the shipped text)."""
    if context < 2 or width < 1 or layers < 1 or heads < 1 or stride < 1:
        raise TaskError("charlm: context >= 2, and width, layers, heads, stride >= 1")
    if width % heads:
        raise TaskError(f"charlm: width {width} must be a multiple of heads {heads}")
    text = read_text(path)
    split = int(len(text) * (1 - TEST_FRACTION))
    if split <= context + 1 or len(text) - split <= context + 1:
        raise TaskError(f"charlm: the text is too short ({len(text)} characters) for context {context}")
    vocab = sorted(set(text))
    lookup = {char: i for i, char in enumerate(vocab)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.int64)
    train_x, train_y = windows(ids[:split], context, stride)
    test_x, test_y = windows(ids[split:], context, context)
    entropy = unigram_entropy(text)

    def build(seed: int) -> nn.Module:
        with seeded(seed):
            return CharTransformer(len(vocab), context, width, layers, heads)

    return Task(name="charlm", build_model=build, train_x=train_x, train_y=train_y, test_x=test_x,
                test_y=test_y, bar={"loss": entropy - BAR_BELOW_UNIGRAM},
                info={"unigram_entropy": entropy, "vocab": "".join(vocab), "characters": len(text),
                      "bits_per_char_factor": 1 / math.log(2)})

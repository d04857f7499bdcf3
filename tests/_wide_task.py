"""A task whose model is large on the wire and cheap to train, for tests of large messages.

The digits, through one very wide hidden layer: 64 -> ``hidden`` -> 10 has ``75 * hidden + 10``
parameters (``hidden`` = 800,000: 60M, a 240 MB float32 message), while a step of a small batch
costs a few hundred million multiply-adds. Evaluated in chunks, so no activation of the whole
test set is ever held.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from peer.train.tasks import get_task, seeded

EVAL_CHUNK = 16     # test images per forward pass: 16 x hidden activations at a time


def wide_digits(*, hidden: int = 800_000) -> dict[str, Any]:
    digits = get_task("digits-mlp")

    def build(seed: int) -> nn.Module:
        with seeded(seed):
            return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        loss = correct = 0.0
        with torch.no_grad():
            for start in range(0, len(inputs), EVAL_CHUNK):
                logits = model(inputs[start:start + EVAL_CHUNK])
                chunk = targets[start:start + EVAL_CHUNK]
                loss += float(nn.functional.cross_entropy(logits, chunk, reduction="sum"))
                correct += float((logits.argmax(dim=1) == chunk).sum())
        return {"loss": loss / len(inputs), "accuracy": correct / len(inputs)}

    return {"model": build, "train": (digits.train_x, digits.train_y),
            "test": (digits.test_x, digits.test_y), "evaluate": evaluate}

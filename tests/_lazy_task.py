"""A lazy custom task for tests/test_lazy_data.py: a Dataset of generated samples, each computed from a
seeded hash of its index (nothing is held per sample), and a child that trains one member on it."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES, CLASSES = 8, 4


class HashedSamples(Dataset[tuple[torch.Tensor, int]]):
    """``n`` samples; sample ``i``'s features and label come from blake2b(seed, i) alone."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        digest = hashlib.blake2b(f"{self.seed}/{i}".encode(), digest_size=FEATURES + 1).digest()
        label = digest[0] % CLASSES
        x = torch.tensor([b / 255.0 - 0.5 for b in digest[1:]])
        x[label] += 1.0  # learnable: the label's feature stands out
        return x, label


class LabelledSamples(HashedSamples):
    """The same, with every label at once (what a label-skew partition needs)."""

    def labels(self) -> np.ndarray:
        return np.array([self[i][1] for i in range(self.n)], dtype=np.int64)


def lazy_task(n_samples: int = 10_000, test_samples: int = 500, labelled: bool = False) -> dict[str, Any]:
    kind = LabelledSamples if labelled else HashedSamples

    def model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    return {"model": model, "train": kind(n_samples, 1), "test": kind(test_samples, 2)}


def main() -> None:
    """Build member p03's trainer of 16 on ``argv[1]`` samples, train a few steps, print the peak RSS."""
    from peer.files.schema import NetworkSection
    from peer.train.build import build_trainers
    from peer.train.trainer import TrainerConfig

    network = NetworkSection(task="tests._lazy_task:lazy_task", task_options={"n_samples": int(sys.argv[1])})
    names = [f"p{i:02d}" for i in range(16)]
    _, trainers = build_trainers(network, TrainerConfig(batch_size=32), members=names, wanted=("p03",))
    trainer = trainers["p03"]
    loss = trainer.run_steps(20)
    metrics = trainer.evaluate()
    status = Path("/proc/self/status").read_text()
    peak_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
    print(json.dumps({"peak_kib": peak_kib, "shard": len(trainer.shard), "loss": loss,
                      "accuracy": metrics["accuracy"]}))


if __name__ == "__main__":
    main()

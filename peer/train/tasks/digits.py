"""scikit-learn's 8x8 handwritten digits (1,797 images, shipped inside its wheel: no download).

Fixed split: a stratified 80/20 split with ``random_state=0`` (1,437 train, 360 test);
features standardised with the training split's mean and standard deviation.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from peer.train.tasks.base import Task, seeded

TEST_FRACTION = 0.2  # 360 test images: enough to resolve 1% accuracy differences
SPLIT_SEED = 0  # the split is part of the task's definition, never the run's seed


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Standardised (train_x, train_y, test_x, test_y) as float32/int64 numpy arrays; loaded once."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y)
    mean = train_x.mean(axis=0)
    std = train_x.std(axis=0)
    std[std < 1e-6] = 1.0  # always-blank border pixels
    train_x = ((train_x - mean) / std).astype(np.float32)
    test_x = ((test_x - mean) / std).astype(np.float32)
    return train_x, train_y, test_x, test_y


class DigitsCNN(nn.Module):
    """Two 3x3 conv layers with BatchNorm (its running statistics are the trainer's buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape(-1, 1, 8, 8)))


def _build_mlp(seed: int) -> nn.Module:
    with seeded(seed):
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _build_cnn(seed: int) -> nn.Module:
    with seeded(seed):
        return DigitsCNN()


def _tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    train_x, train_y, test_x, test_y = _digits()
    return (torch.from_numpy(train_x), torch.from_numpy(train_y),
            torch.from_numpy(test_x), torch.from_numpy(test_y))


def digits_mlp() -> Task:
    """64-128-10 MLP; bar: test accuracy >= 0.95."""
    train_x, train_y, test_x, test_y = _tensors()
    return Task(name="digits-mlp", build_model=_build_mlp, train_x=train_x, train_y=train_y,
                test_x=test_x, test_y=test_y, bar={"accuracy": 0.95})


def digits_cnn() -> Task:
    """Small CNN with BatchNorm on the 8x8 images; bar: test accuracy >= 0.97."""
    train_x, train_y, test_x, test_y = _tensors()
    return Task(name="digits-cnn", build_model=_build_cnn, train_x=train_x, train_y=train_y,
                test_x=test_x, test_y=test_y, bar={"accuracy": 0.97})

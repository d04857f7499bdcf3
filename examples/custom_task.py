"""A custom training task: scikit-learn's iris flowers with a small MLP.

hivemesh loads a task named ``module:function`` or ``path/to/file.py:function``
and calls the function with the task's options as keyword arguments. ``examples/``
is not an installed package, so name this file by its path (relative to the
folder of the config file that names it, or absolute)::

    # scenario.toml
    [task]
    name = "examples/custom_task.py:make_task"
    options = { hidden = 16 }

    # peer.toml (the task is part of what every member agrees on)
    [network]
    task = "examples/custom_task.py:make_task"
    task_options = { hidden = 16 }

or put ``examples`` on ``PYTHONPATH`` and use the module form::

    PYTHONPATH=examples hivemesh sim scenario.toml    # name = "custom_task:make_task"

In Python: ``peer.train.tasks.get_task("examples/custom_task.py:make_task", hidden=16)``.

The function returns either a :class:`peer.train.tasks.Task` or, as here, a plain mapping:

- ``"model"``: a function ``seed -> torch.nn.Module``; the same seed must give the
  same initial weights (every member starts from the same model);
- ``"train"`` and ``"test"``: ``(inputs, targets)`` tensors (a fixed split: the run's
  seed must not change it); ``labels`` for partitioning are the training targets; or
  map-style ``torch.utils.data.Dataset``s of ``(input, target)``, read per batch, for data too
  big to hold (docs/operations.md#tasks);
- ``"loss"`` (optional): ``loss(output, target) -> scalar mean loss``; default cross-entropy;
- ``"evaluate"`` (optional): ``evaluate(model, inputs, targets) -> {"loss": ..., ...}``,
  called without gradients on the test split; default: loss and accuracy;
- ``"bar"`` (optional): the quality the task should reach, e.g. ``{"accuracy": 0.9}``.

Keep data loading cheap and deterministic: the simulator calls this once per process
and shares the tensors between all its peers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


def make_task(*, hidden: int = 16) -> dict[str, Any]:
    """Iris (150 flowers, 4 features, 3 species): 100 train, 50 test, standardised."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    x = np.asarray(iris.data, dtype=np.float32)
    y = np.asarray(iris.target, dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(x))  # a fixed split, part of the task
    train, test = order[:100], order[100:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    x = (x - mean) / std

    def build(seed: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # seed the init without touching the global generator
            torch.manual_seed(seed)
            return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 3))

    def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        with torch.no_grad():
            logits = model(inputs)
            return {"loss": float(nn.functional.cross_entropy(logits, targets)),
                    "accuracy": float((logits.argmax(dim=1) == targets).float().mean())}

    return {
        "model": build,
        "train": (torch.from_numpy(x[train]), torch.from_numpy(y[train])),
        "test": (torch.from_numpy(x[test]), torch.from_numpy(y[test])),
        "evaluate": evaluate,
        "bar": {"accuracy": 0.9},
    }

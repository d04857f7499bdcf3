"""A federation client whose training is the user's own ``fit``, Flower-style.

hivemesh keeps the connection, registration, rounds, the uplink (compression with
error feedback, SecAgg, DP clipping) and checkpoints; ``fit`` only trains the model
it is given (the task's model, with the round's global weights in it) and says how
many samples it saw and what it measured. One line of an edge's config selects it::

    hivemesh init --gateways 1 --edges 3 --rounds 5 --out net --partition iid
    # in each net/e00N.toml, under [edge]:
    #     fit = "/path/to/examples/own_client.py:fit"
    hivemesh peer --config net/gw0.toml      # and: hivemesh edge --config net/e00N.toml

The data here is scikit-learn's 8x8 digits with the built-in task's split and
standardisation; each client takes every ``clients``-th sample of a fixed shuffle,
from ``client_index`` on (a user's client reads its own data instead).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BATCH = 32


@functools.cache
def my_shard(client_index: int, clients: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This client's (x, y): its share of the digits training split, standardised."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data, target = load_digits(return_X_y=True)
    x, _, y, _ = train_test_split(data, target, test_size=0.2, random_state=0, stratify=target)
    scale = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(scale < 1e-6, 1.0, scale)
    mine = np.random.default_rng(0).permutation(len(x))[client_index::clients]
    return torch.tensor(x[mine], dtype=torch.float32), torch.tensor(y[mine])


def fit(model: nn.Module, round_config: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """One round: ``local_steps`` SGD steps at the round's ``lr`` on this client's shard."""
    x, y = my_shard(round_config["client_index"], round_config["clients"])
    optimizer = torch.optim.SGD(model.parameters(), lr=round_config["lr"])
    generator = torch.Generator().manual_seed(round_config["round"] * 1000 + round_config["client_index"])
    losses, correct, seen = [], 0, 0
    model.train()
    for _ in range(round_config["local_steps"]):
        batch = torch.randint(len(x), (BATCH,), generator=generator)
        logits = model(x[batch])
        loss = F.cross_entropy(logits, y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        correct += int((logits.argmax(1) == y[batch]).sum())
        seen += BATCH
    return len(x), {"loss": sum(losses) / len(losses), "train_accuracy": correct / seen}

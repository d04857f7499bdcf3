"""A plain PyTorch training loop made a hivemesh member: the five lines marked ``# hivemesh``.

The loop is the user's own: an MLP on scikit-learn's 8x8 digits, AdamW, a
OneCycleLR schedule, gradient accumulation over 4 micro-batches, bf16 autocast on
the CPU. hivemesh gossips the model with the member's neighbours between steps,
syncs a late joiner, checkpoints (model, optimizer, scheduler) and writes the
status file; a member killed and started again goes on from its checkpoint::

    hivemesh init --peers 4 --out net --partition iid --steps 200
    python examples/own_loop.py net/p00.toml --steps 200     # and p01, p02, p03
    hivemesh status net/data/p00

Without the marked lines (and with ``range(args.steps)`` and all the data) it is
the plain loop it was.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import peer  # hivemesh

MICRO_BATCH = 32
ACCUMULATE = 4   # micro-batches per optimizer step


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardised (train x, train y, test x, test y): the split the built-in digits task uses."""
    bunch = load_digits()
    x, y = torch.tensor(bunch.data, dtype=torch.float32), torch.tensor(bunch.target)
    train_x, test_x, train_y, test_y = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    mean, std = train_x.mean(0), train_x.std(0, correction=0)
    std[std < 1e-6] = 1.0   # always-blank border pixels
    return (train_x - mean) / std, train_y, (test_x - mean) / std, test_y


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x)
    model.train()
    accuracy = (logits.argmax(1) == y).float().mean().item()
    return {"accuracy": accuracy, "loss": F.cross_entropy(logits, y).item()}


def batches(indices: torch.Tensor, step: int) -> Iterator[torch.Tensor]:
    """The micro-batches of optimizer step ``step``: a function of the step, so a resumed run goes on."""
    generator = torch.Generator().manual_seed(step)
    for _ in range(ACCUMULATE):
        yield indices[torch.randint(len(indices), (MICRO_BATCH,), generator=generator)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a peer config that `hivemesh init` wrote")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (as `hivemesh init --steps`)")
    parser.add_argument("--lr", type=float, default=0.01, help="OneCycleLR's peak learning rate")
    args = parser.parse_args()
    torch.set_num_threads(1)

    train_x, train_y, test_x, test_y = digits()
    torch.manual_seed(0)   # every member starts from the same model
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps)

    with peer.join(args.config, model, optimizer=optimizer, scheduler=scheduler,  # hivemesh
                   evaluate=lambda net: evaluate(net, test_x, test_y)) as m:
        mine = torch.arange(m.rank, len(train_x), m.world_size)  # hivemesh: this member's share of the data
        while (step := m.steps) < args.steps:  # hivemesh: its steps (a restart or a catch-up moves them)
            for micro in batches(mine, step):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(train_x[micro]), train_y[micro]) / ACCUMULATE
                loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            m.step(loss * ACCUMULATE)  # hivemesh
    print(json.dumps({"steps": args.steps, **evaluate(model, test_x, test_y)}))


if __name__ == "__main__":
    main()

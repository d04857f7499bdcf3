"""What a new network starts from (``hivemesh init``, ``hivemesh demo``): [network.gossip], [network.trainer].

Kept as plain tables so that ``hivemesh init`` writes exactly what a user
would edit; the daemon validates them against GossipConfig and TrainerConfig.
"""

from __future__ import annotations

from typing import Any

# digits-mlp with plain SGD: 0.1 reaches >= 0.90 on Dirichlet(0.5) shards within a few hundred
# steps; cosine decay to 0 drives the peers to consensus at the end (the named mechanism).
_TASK_LR = {"digits-mlp": 0.1, "digits-cnn": 0.05, "logreg": 0.5, "charlm": 0.05, "gpt": 0.05}


def gossip_table(*, algorithm: str, compression: str, steps: int, seed: int) -> dict[str, Any]:
    """``compression`` "identity" (the CLI's default): the algorithm's own suggestion (CHOCO: top-1%)."""
    from protocols.gossip import suggested_compression

    table: dict[str, Any] = {"algorithm": algorithm, "total_steps": steps, "seed": seed}
    if compression == "identity":
        compression = suggested_compression(algorithm)
    if compression != "identity":
        table["compression"] = compression
    return table


def trainer_table(*, task: str, steps: int) -> dict[str, Any]:
    """``steps`` 0: no ``total_steps`` (a federation's schedule spans its rounds)."""
    table: dict[str, Any] = {"optimizer": "sgd", "lr": _TASK_LR.get(task, 0.05), "batch_size": 32,
                             "lr_decay": "cosine"}
    if steps:
        table["total_steps"] = steps
    return table

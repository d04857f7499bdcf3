"""One insider's round in memory: ``hivemesh init``'s federation (digits-mlp, Dirichlet(0.5) shards
of 6 edge clients (``edges``), half of them asked a round, one local epoch, qsgd:bits=8 uplink) on
the real server and client roles, with one asked client attacking in one round (peer/train/attack.py's spec).

A synchronous driver: every asked client trains and answers at once, so a round closes at its
quota and the run is the same bit for bit each time (no clock, no sockets).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from peer.cli.init import default_federation
from peer.train.attack import Attack, forge, parse_attack, sign_flip
from peer.train.partition import partition
from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig
from protocols.events import Action, Received, Send, Start, StartWork, WorkDone
from protocols.federation import FedAvgClient, FederationConfig, make_server

SEED = 0


def run_rounds(rounds: int, *, edges: int = 6, attack: str = "", attack_rounds: Collection[int] = (),
               attacker: str = "", **server: Any) -> dict[str, Any]:
    """``rounds`` FedAvg rounds; in each of ``attack_rounds`` the client ``attacker`` (empty: the first
    asked) is the attacker of ``attack`` where asked. What it leaves: the accuracy after each round,
    the server's reports and counters."""
    init = default_federation(rounds=rounds, gateways=1, edges=edges, seed=SEED)    # `hivemesh init`'s
    init.pop("gossip_rounds", None)   # a gateway key (written with 2 gateways or more), not the server
    config = FederationConfig(**{**init, **server})
    names = tuple(f"e{i:03d}" for i in range(edges))
    task = get_task("digits-mlp")
    shards = partition(task.labels, names, scheme="dirichlet", alpha=0.5, seed=SEED)
    trainer_config = TrainerConfig(lr=0.1, batch_size=32, device="cpu")
    trainers = {name: Trainer(task, trainer_config, shards[name], seed=SEED, member_index=i)
                for i, name in enumerate(names)}
    evaluator = Trainer(task, trainer_config, shards[names[0]], seed=SEED, member_index=0)
    server = make_server(config, name="gw0", params=evaluator.flat_params, clients=names)
    clients = {name: FedAvgClient(config, name=name, server="gw0", params=trainer.flat_params,
                                  num_samples=len(shards[name]), steps_per_epoch=trainer.steps_per_epoch)
               for name, trainer in trainers.items()}
    accuracy: list[float] = []
    inbox: list[Action] = list(server.handle(Start(), 0.0))
    while inbox:
        action = inbox.pop(0)
        if not isinstance(action, Send):
            continue
        for name in action.recipients:
            client = clients[name]
            attacking = server.round in attack_rounds and name == (attacker or server.asked[0])
            villain = parse_attack(attack) if attacking else Attack()
            for step in client.handle(Received("gw0", action.message), 0.0):
                if isinstance(step, StartWork):
                    trainers[name].run_steps(step.steps)
                    if villain.flip_scale and client.anchor is not None:
                        sign_flip(trainers[name].flat_params, client.anchor, villain.flip_scale)
                    for sent in client.handle(WorkDone(steps=step.steps, loss=0.0), 0.0):
                        if isinstance(sent, Send):
                            closed = len(server.reports)
                            inbox += server.handle(Received(name, forge(sent.message, villain)), 0.0)
                            if len(server.reports) > closed:
                                accuracy.append(float(evaluator.evaluate("test")["accuracy"]))
    return {"accuracy": accuracy, "reports": server.reports, "counters": dict(server.counters)}

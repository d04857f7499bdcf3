"""End to end in memory: 1 FedAvg server and 10 clients on digits-mlp, Dirichlet(0.3) shards,
5 clients a round, QSGD 8-bit uploads with error feedback: acceptance (a)'s bar, without sockets.

The driver here is a Python list of messages, like h11's tests: the roles decide everything,
the test only carries messages, runs the trainers' steps and reads the server's reports.
"""

from __future__ import annotations

from collections import deque

import torch

from peer.train.partition import partition
from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig
from protocols.events import Action, Event, Finished, Received, Send, Start, StartWork, WorkDone
from protocols.federation import FedAvgClient, FedAvgServer, FederationConfig
from protocols.messages import Message

SEED = 3
CLIENTS = tuple(f"edge{i}" for i in range(10))


def run_federation(config: FederationConfig, *, scheme: str = "dirichlet", attackers: tuple[str, ...] = ()
                   ) -> tuple[FedAvgServer, dict[str, FedAvgClient], Trainer]:
    """Every role to its end; returns the server, the clients, and a trainer holding the final model.

    ``attackers`` train honestly, then upload their delta sign-flipped and scaled by 10."""
    task = get_task("digits-mlp")
    shards = partition(task.labels, CLIENTS, scheme=scheme, alpha=0.3, seed=SEED)
    trainer_config = TrainerConfig(lr=0.1, batch_size=32, device="cpu")
    trainers = {name: Trainer(task, trainer_config, shards[name], seed=SEED, member_index=i)
                for i, name in enumerate(CLIENTS)}
    global_model = trainers[CLIENTS[0]].flat_params.clone()  # every member starts from the seed's model
    server = FedAvgServer(config, name="gateway", params=global_model, clients=CLIENTS)
    clients = {name: FedAvgClient(config, name=name, server="gateway", params=trainer.flat_params,
                                  num_samples=len(shards[name]), steps_per_epoch=trainer.steps_per_epoch)
               for name, trainer in trainers.items()}
    wire: deque[tuple[str, str, Message]] = deque()  # (recipient, sender, message)
    finished: set[str] = set()
    now = 0.0

    def carry(owner: str, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Send(recipients=recipients, message=message):
                    wire.extend((r, owner, message) for r in recipients)
                case StartWork(steps=steps):
                    loss = trainers[owner].run_steps(steps)
                    if owner in attackers:
                        anchor, params = clients[owner].anchor, trainers[owner].flat_params
                        assert anchor is not None
                        params.copy_(anchor - 10.0 * (params - anchor))
                    carry(owner, clients[owner].handle(WorkDone(steps=steps, loss=loss), now))
                case Finished():
                    finished.add(owner)
                case _:
                    pass

    def feed(name: str, event: Event) -> None:
        role = server if name == "gateway" else clients[name]
        carry(name, role.handle(event, now))

    for name in ("gateway", *CLIENTS):
        feed(name, Start())
    while wire:
        recipient, sender, message = wire.popleft()
        now += 0.01
        feed(recipient, Received(sender, message))
    assert finished == {"gateway", *CLIENTS}, "every role should have finished"
    evaluator = trainers[CLIENTS[0]]
    evaluator.flat_params.copy_(server.params)
    return server, clients, evaluator


def test_fedavg_on_dirichlet_digits_reaches_the_bar_in_30_rounds() -> None:
    # Prepare: acceptance (a)'s setting
    config = FederationConfig(rounds=30, fraction=0.5, min_clients=5, local_epochs=2, uplink="qsgd:bits=8",
                              max_samples=1000, seed=SEED)
    # Execute
    server, clients, evaluator = run_federation(config)
    # Assert: the bar, and a clean record: 5 taken every round, nothing refused or missing
    accuracy = evaluator.evaluate("test")["accuracy"]
    assert accuracy >= 0.90, f"test accuracy {accuracy:.3f} after 30 rounds"
    assert len(server.reports) == 30
    reports = server.reports.values()
    assert all(len(r.taken) == 5 and r.missing == () and r.closed_by == "quota" for r in reports)
    assert server.counters["refused_update"] == 0
    # sampling spread the work: every client trained in some round, and the clients' final models
    # are the server's (RoundResult)
    assert all(c.counters["rounds_trained"] > 0 for c in clients.values())
    assert all(torch.equal(c.params, server.params) for c in clients.values())


def _accuracy(config: FederationConfig, attackers: tuple[str, ...]) -> float:
    _, _, evaluator = run_federation(config, scheme="iid", attackers=attackers)
    return evaluator.evaluate("test")["accuracy"]


def test_robust_aggregators_hold_against_sign_flipping_clients_where_fedavg_fails() -> None:
    # Prepare: acceptance (d)'s setting on iid shards: all 10 clients every round, 2 of them
    # upload their update sign-flipped and scaled by 10
    attackers = ("edge3", "edge7")
    common = {"rounds": 10, "fraction": 1.0, "min_clients": 10, "local_epochs": 1, "seed": SEED}
    accuracies = {}
    # Execute
    for aggregator in ("trimmed_mean", "median"):
        config = FederationConfig(aggregator=aggregator, trim_beta=0.2, **common)  # type: ignore[arg-type]
        accuracies[aggregator] = (_accuracy(config, ()), _accuracy(config, attackers))
    fedavg = _accuracy(FederationConfig(**common), attackers)  # type: ignore[arg-type]
    # Assert: within 3 points of the same aggregator's clean run; FedAvg is driven off
    for aggregator, (clean, attacked) in accuracies.items():
        assert attacked >= clean - 0.03, f"{aggregator}: {attacked:.3f} attacked vs {clean:.3f} clean"
        assert clean >= 0.85, f"{aggregator}: clean run only {clean:.3f}"
    assert fedavg < 0.5, f"fedavg under attack still reached {fedavg:.3f}"

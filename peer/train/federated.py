"""A federation client's local work: one round's steps, at the federation's place on the schedule.

A client trains only in the rounds it is asked into, so its own step count says little about
how far the federation has come: a learning-rate schedule counted on it would decay at a pace
set by the client's luck in sampling and its shard's size. The schedule counts the federation's
global work instead: the ``steps`` local steps of round ``r`` (FedBuff: of model version ``r``,
the version the client starts from) sit at schedule steps ``r * steps`` ... ``r * steps + steps - 1``,
as if every round had been this client's. The horizon is ``trainer.total_steps`` when written,
else (0) the federation's ``rounds * steps``, so the last round ends just short of it and a
cosine schedule never reaches 0 inside the run.

Both federation drivers, the edge client (peer/runtime/edge.py) and the simulator
(sim/federation.py), train a round through :func:`train_round`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch import nn

from peer.train.trainer import SchedulePoint, Trainer, TrainerConfig, lr_at
from protocols.errors import HivemeshError
from protocols.federation.client import FedAvgClient
from protocols.federation.client_metrics import to_meta


def round_schedule(config: TrainerConfig, *, round_index: int, rounds: int, steps: int) -> SchedulePoint:
    """Where ``steps`` local steps of round (or model version) ``round_index`` of ``rounds`` sit on
    the learning-rate schedule."""
    if round_index < 0 or rounds < 1 or steps < 1:
        raise ValueError(f"round {round_index} of {rounds} with {steps} steps: out of range")
    return SchedulePoint(step=round_index * steps, total_steps=config.total_steps or rounds * steps)


def train_round(trainer: Trainer, client: FedAvgClient, steps: int) -> float:
    """The client's ``StartWork(steps)``: its round's steps on ``trainer`` (FedProx's pull toward the
    round's global model when ``prox_mu > 0``); the mean training loss."""
    schedule = round_schedule(trainer.config, round_index=max(client.round, 0), rounds=client.config.rounds,
                              steps=steps)
    return trainer.run_steps(steps, proximal=(client.anchor, client.prox_mu), schedule=schedule)


Fit = Callable[[nn.Module, dict[str, Any]], tuple[int, dict[str, float]]]


def fit_round(trainer: Trainer, client: FedAvgClient, steps: int, fit: Fit, *, member_index: int,
              members: int) -> float:
    """The client's ``StartWork(steps)`` done by the user's ``fit(model, round_config)`` on the task's
    model (``trainer.model``, whose parameters are the client's flat vector): the update is the model
    after it minus the round's model, as with :func:`train_round`. ``fit`` returns ``(num_samples,
    metrics)``: the update's weight and the metrics sent with it (protocols/federation/client_metrics.py).
    ``round_config``: ``round``, ``local_steps``, ``lr`` (the schedule's value at the round's first step),
    ``schedule_step``, ``total_steps``, and ``client_index`` of ``clients`` (this client among the
    roster's edge clients, to pick a demo shard). Nan: fit reports no loss to the trainer's status."""
    point = round_schedule(trainer.config, round_index=max(client.round, 0), rounds=client.config.rounds,
                           steps=steps)
    round_config: dict[str, Any] = {
        "round": max(client.round, 0), "local_steps": steps,
        "lr": lr_at(trainer.config, point.step, point.total_steps), "schedule_step": point.step,
        "total_steps": point.total_steps, "client_index": member_index, "clients": members}
    answer = fit(trainer.model, round_config)
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], dict)
            and isinstance(answer[0], int) and not isinstance(answer[0], bool) and answer[0] >= 1):
        raise HivemeshError("fit must return (num_samples, metrics): a positive int and a dict, "
                            f"got {type(answer).__name__}")
    num_samples, metrics = answer
    try:
        to_meta(metrics)
    except ValueError as error:
        raise HivemeshError(f"fit's metrics: {error}") from None
    client.num_samples, client.metrics = num_samples, dict(metrics)
    trainer.step += steps
    loss = metrics.get("loss", math.nan)
    return float(loss)

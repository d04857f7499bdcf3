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

from peer.train.trainer import SchedulePoint, Trainer, TrainerConfig
from protocols.federation.client import FedAvgClient


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

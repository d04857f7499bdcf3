"""A client's fit metrics on its ClientUpdate (protocols/federation/client_metrics.py): the client
refuses to send what breaks the rules, the server drops and counts it and keeps the update, and a
round's report holds each metric's mean over the updates taken, weighted by their samples."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from test_federation_server import config, round_start, server, update
from torch import nn

from peer.train.federated import fit_round
from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig, lr_at
from protocols.errors import HivemeshError
from protocols.events import Received, Send, Start, WorkDone
from protocols.federation import FedAvgClient, FederationConfig
from protocols.federation.client_metrics import MAX_METRICS, from_meta, to_meta, weighted_means
from protocols.messages import ClientUpdate, RoundStart


def with_meta(round_index: int, num_samples: int, meta: dict[str, float | str | bool]) -> ClientUpdate:
    plain = update(round_index, [0, 0, 0, 0], num_samples=num_samples)
    return ClientUpdate(round=plain.round, num_samples=num_samples, tensors=plain.tensors, meta=meta)


def test_metrics_go_as_prefixed_meta_and_come_back() -> None:
    meta = to_meta({"loss": 0.5, "seen": 3})
    assert meta == {"metric.loss": 0.5, "metric.seen": 3.0}
    assert from_meta({**meta, "x/op": "identity"}) == ({"loss": 0.5, "seen": 3.0}, 0)


@pytest.mark.parametrize("metrics", [{"loss": math.nan}, {"loss": math.inf}, {"flag": True}, {"": 1.0},
                                     {"name": "text"}, {f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}])
def test_the_client_refuses_metrics_that_break_the_rules(metrics: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="metric"):
        to_meta(metrics)


def test_the_server_drops_and_counts_bad_metrics() -> None:
    meta = {"metric.loss": 0.5, "metric.bad": math.nan, "metric.word": "high", "metric.flag": True}
    assert from_meta(meta) == ({"loss": 0.5}, 3)
    many = {f"metric.m{i:02d}": 1.0 for i in range(MAX_METRICS + 4)}
    kept, dropped = from_meta(many)
    assert (len(kept), dropped) == (MAX_METRICS, 4)


def test_the_mean_is_weighted_by_samples_over_the_updates_that_carry_it() -> None:
    means = weighted_means([({"loss": 1.0, "acc": 0.5}, 1), ({"loss": 4.0}, 3)])
    assert means == {"acc": 0.5, "loss": 3.25}


def test_a_rounds_report_holds_the_weighted_mean_and_counts_what_was_dropped() -> None:
    s = server(config(fraction=0.2))  # m = 2
    a, b = round_start(s.handle(Start(), 0.0)).recipients
    s.handle(Received(a, with_meta(0, 1, {"metric.loss": 1.0, "metric.bad": math.inf})), 1.0)
    s.handle(Received(b, with_meta(0, 3, {"metric.loss": 4.0})), 2.0)
    report = s.reports[0]
    assert report.aggregated and report.taken == (a, b)
    assert report.client_metrics == {"loss": 3.25}
    assert s.counters["client_metrics_dropped"] == 1
    assert torch.equal(s.params, torch.zeros(4, dtype=torch.float64))


def test_a_round_without_metrics_reports_none() -> None:
    s = server(config(fraction=0.2))
    for client in round_start(s.handle(Start(), 0.0)).recipients:
        s.handle(Received(client, update(0, [1, 0, 0, 0])), 1.0)
    assert s.reports[0].client_metrics == {}


# ---------------------------------------------------------------- the edge's round through the user's fit


def fit_setup() -> tuple[Trainer, FedAvgClient]:
    settings = TrainerConfig(lr=0.1, lr_decay="cosine", device="cpu")
    trainer = Trainer(get_task("logreg"), settings, np.arange(64), seed=0, member_index=0)
    fed = FederationConfig(rounds=4, uplink="identity")
    client = FedAvgClient(fed, name="e000", server="gw", params=trainer.flat_params, num_samples=64,
                          steps_per_epoch=trainer.steps_per_epoch)
    model = trainer.flat_params.detach().clone()
    meta = {"local_epochs": 0, "local_steps": 3, "prox_mu": 0.0}
    client.handle(Received("gw", RoundStart(round=1, tensors={"x": model}, meta=meta, deadline_s=10.0)), 0.0)
    return trainer, client


def test_fit_trains_the_model_in_place_and_its_metrics_and_samples_go_with_the_update() -> None:
    trainer, client = fit_setup()
    seen: list[dict[str, Any]] = []

    def fit(model: nn.Module, round_config: dict[str, Any]) -> tuple[int, dict[str, float]]:
        seen.append(dict(round_config))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        return 7, {"loss": 0.25}

    loss = fit_round(trainer, client, 3, fit, member_index=1, members=3)
    sent = [a.message for a in client.handle(WorkDone(3, loss), 1.0) if isinstance(a, Send)]
    assert seen == [{"round": 1, "local_steps": 3, "lr": lr_at(trainer.config, 3, 12), "schedule_step": 3,
                     "total_steps": 12, "client_index": 1, "clients": 3}]
    (update,) = sent
    assert isinstance(update, ClientUpdate) and update.num_samples == 7 and loss == 0.25
    assert update.meta["metric.loss"] == 0.25
    assert torch.equal(update.tensors["x"], torch.ones(trainer.flat_params.numel()))
    assert trainer.step == 3


@pytest.mark.parametrize("answer", [None, (0, {}), (5, {"loss": math.nan}), (True, {}), (5, [1.0])])
def test_fit_returning_anything_but_samples_and_good_metrics_is_one_clear_error(answer: object) -> None:
    trainer, client = fit_setup()
    with pytest.raises(HivemeshError, match=r"^fit"):
        fit_round(trainer, client, 3, lambda model, config: answer, member_index=0, members=1)

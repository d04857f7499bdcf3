"""A client's fit metrics on its ClientUpdate (protocols/federation/client_metrics.py): the client
refuses to send what breaks the rules, the server drops and counts it and keeps the update, and a
round's report holds each metric's mean over the updates taken, weighted by their samples."""

from __future__ import annotations

import math

import pytest
import torch
from test_federation_server import config, round_start, server, update

from protocols.events import Received, Start
from protocols.federation.client_metrics import MAX_METRICS, from_meta, to_meta, weighted_means
from protocols.messages import ClientUpdate


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

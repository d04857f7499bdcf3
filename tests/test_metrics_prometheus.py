"""The Prometheus endpoint and the metrics.jsonl fields (issue 17, item 3; acceptance b).

One real run of two peers gives the snapshots: p00 serves its metrics (``[peer]
metrics_port``) and is scraped while a test hook holds it; what both left on disk
feeds the collector, the check of docs/monitoring.md's table and ``hivemesh status``.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from _daemon_support import (
    CEILING_S,
    describe,
    hold_at,
    make_network,
    peers,
    status,
    wait_for_files,
    wait_for_step,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from peer.cli.main import main
from peer.files.fields import MACHINE_GAUGE_WORDS, SNAPSHOT_FIELDS, field_for, markdown_table
from peer.runtime.prometheus import MetricsServer, SnapshotCollector, sample_key
from protocols.errors import HivemeshError
from protocols.events import Action, Metric, SetTimer, Start, StartWork, TimerFired, WorkDone
from protocols.gossip import GossipConfig, make_machine, suggested_compression
from protocols.gossip.config import ALGORITHMS
from topology import build

MONITORING = Path(__file__).resolve().parent.parent / "docs" / "monitoring.md"   # carries the fields table
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True)
class Run:
    out: Path
    statuses: dict[str, dict[str, Any]]
    metric_lines: list[dict[str, Any]]
    scraped: str                    # p00's endpoint while held at step 10
    held_status: dict[str, Any]     # its status.json at that moment


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("prom") / "net"
    files = make_network(out, peers=2, steps=30, peer_options={"eval_every_steps": 10})
    port = _free_port()
    config = files.configs["p00"]
    config.write_text(config.read_text().replace("[peer]\n", f"[peer]\nmetrics_port = {port}\n", 1))
    other = files.configs["p01"]
    other.write_text(other.read_text().replace("[peer]\n", "[peer]\ntensorboard = true\n", 1))
    gate, marks = out / "go", out / "marks"
    marks.mkdir()
    with peers(files) as processes:
        processes.start("p00", [hold_at(10, gate, marks, "p00")])
        processes.start("p01")
        wait_for_files([marks / "p00-held-10"])
        wait_for_step(files, ["p00"], 10)     # a status written while held: what the endpoint serves
        scraped = _fetch(port)
        held_status = status(files, "p00")
        gate.touch()
        assert processes.wait(CEILING_S), describe(files)
        assert processes.exitcodes() == {"p00": 0, "p01": 0}, describe(files)
    lines = (out / "data" / "p00" / "metrics.jsonl").read_text().splitlines()
    yield Run(out, {name: status(files, name) for name in files.configs}, [json.loads(x) for x in lines],
              scraped, held_status)


def _samples(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _collected(snapshot: Mapping[str, Any]) -> tuple[str, Samples]:
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot))
    text = generate_latest(registry).decode()
    return text, _samples(text)


def _numbers(snapshot: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in the snapshot, by dotted path (booleans count: neighbours' up and finished)."""
    for key, value in snapshot.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _numbers(value, f"{path}.")
        elif isinstance(value, bool | int | float) and key != "pid":
            yield path, float(value)


@pytest.mark.processes
def test_every_number_of_a_real_status_is_a_prometheus_sample_with_its_value(run: Run) -> None:
    snapshot = {k: v for k, v in run.statuses["p00"].items() if k not in ("pid", "updated_at")}
    text, samples = _collected(snapshot)
    served = {}
    for path, number in _numbers(snapshot):
        field = field_for(path)
        assert field is not None, f"{path}: not described in peer/files/fields.py"
        key = sample_key(path)
        if key is not None:
            served[path] = samples.get((key[0], tuple(sorted(key[1].items()))))
            assert served[path] == pytest.approx(number * (1e-3 if field.unit == "ms" else 1.0)), path
    assert served.keys() >= {"rejections." + reason for reason in snapshot["rejections"]}
    assert all(k in served for k in ("metrics.round", "step", "loss", "accuracy", "test_loss",
                                     "consensus_max_relative", "bytes_received", "bytes_sent_to.p01",
                                     "bytes_received_from.p01", "neighbours.p01.latency_ms"))
    # the one number not served is the sum of the ones that are
    assert snapshot["bytes_sent"] == samples[("hivemesh_bytes_sent_total", (("neighbour", "p01"),))] > 0
    assert samples[("hivemesh_step", ())] == snapshot["step"] == 30
    assert samples[("hivemesh_test_loss", ())] == snapshot["test_loss"] > 0
    assert samples[("hivemesh_peer_info", (("name", "p00"), ("state", "finished"), ("stranded", "")))] == 1
    assert not [name for name, _ in samples if name.startswith("hivemesh_metrics_")]   # round: once
    assert "# TYPE hivemesh_rejections_total counter" in text
    assert "# TYPE hivemesh_bytes_sent_total counter" in text


@pytest.mark.processes
def test_a_peer_serves_its_metrics_while_it_runs(run: Run) -> None:
    samples = _samples(run.scraped)
    assert samples[("hivemesh_step", ())] == run.held_status["step"] == 10
    info = (("name", "p00"), ("state", "held by a test hook"), ("stranded", ""))
    assert samples[("hivemesh_peer_info", info)] == 1
    assert samples[("hivemesh_bytes_sent_total", (("neighbour", "p01"),))] > 0
    assert samples[("hivemesh_neighbour_up", (("neighbour", "p01"),))] == 1


@pytest.mark.processes
def test_every_field_the_daemon_writes_is_documented_in_the_monitoring_doc(run: Run) -> None:
    written = {key for line in run.metric_lines for key in line} | set(run.statuses["p00"])
    nested = {f"{head}.{key}" for head in ("receive_buffers", "metrics")
              for key in run.statuses["p00"][head]}
    nested |= {f"neighbours.*.{key}" for info in run.statuses["p00"]["neighbours"].values() for key in info}
    rows = set(re.findall(r"^\| `([^`]+)` \|", MONITORING.read_text(), flags=re.MULTILINE))
    described = {path: field_for(path) for path in written | nested}
    undocumented = sorted(path for path, field in described.items()
                          if path not in rows and (field is None or field.key not in rows))
    assert undocumented == []
    # and the monitoring doc's table is the one generated from the fields (python -m peer.files.fields)
    assert {f.key for f in SNAPSHOT_FIELDS} <= rows


def test_the_monitoring_doc_table_of_fields_is_the_one_generated_from_them() -> None:
    assert markdown_table() in MONITORING.read_text()     # regenerate: python -m peer.files.fields


def test_the_endpoint_serves_over_http_on_loopback() -> None:
    snapshot = {"name": "p00", "state": "training", "step": 7, "bytes_sent_to": {"p01": 1234},
                "rejections": {"bad_signature": 3}, "neighbours": {"p01": {"latency_ms": 2.5, "up": True}},
                "metrics": {"round": 4.0, "stale_message": 2.0}}
    server = MetricsServer(lambda: snapshot, host="127.0.0.1", port=0)
    try:
        samples = _samples(_fetch(server.port))
    finally:
        server.close()
    assert samples[("hivemesh_step", ())] == 7
    assert samples[("hivemesh_bytes_sent_total", (("neighbour", "p01"),))] == 1234
    assert samples[("hivemesh_rejections_total", (("reason", "bad_signature"),))] == 3
    assert samples[("hivemesh_neighbour_latency_seconds", (("neighbour", "p01"),))] == 0.0025
    assert samples[("hivemesh_gossip_round", ())] == 4      # named so: a gateway's FedAvg round is another
    assert samples[("hivemesh_protocol_events_total", (("event", "stale_message"),))] == 2
    assert ("hivemesh_protocol_events_total", (("event", "round"),)) not in samples


def test_before_the_first_status_the_endpoint_serves_no_numbers_and_no_error() -> None:
    _, samples = _collected({})
    assert samples == {("hivemesh_peer_info", (("name", ""), ("state", ""), ("stranded", ""))): 1.0,
                       ("hivemesh_warnings", ()): 0.0}


def test_a_metrics_port_in_use_is_an_error_naming_the_key() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(HivemeshError) as raised:
            MetricsServer(dict, host="127.0.0.1", port=port, key="net/p00.toml: [peer] metrics_port")
    said = str(raised.value)
    assert said.startswith(f"net/p00.toml: [peer] metrics_port = {port}: 127.0.0.1:{port} is in use"), said


@pytest.mark.processes
def test_the_daemon_names_the_key_of_a_bad_or_taken_metrics_port(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = make_network(tmp_path / "net", peers=2)
    for listener in files.listeners.values():
        listener.close()    # the peer binds its own roster port here
    config = files.configs["p00"]
    assert main(["peer", "--config", str(config), "--metrics-port", "70000"]) == 2
    assert "--metrics-port: metrics_port must be a TCP port" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["peer", "--config", str(config), "--quiet", "--metrics-port", str(port)]) == 2
    error = capsys.readouterr().err
    assert f"{config}: [peer] metrics_port (or --metrics-port) = {port}: 127.0.0.1:{port} is in use" in error


@pytest.mark.processes
def test_after_a_real_run_status_shows_the_neighbour_finished(run: Run) -> None:
    from peer.cli.status import neighbour_word

    for name, other in (("p00", "p01"), ("p01", "p00")):
        info = run.statuses[name]["neighbours"][other]
        assert info["finished"] is True, info       # its last heartbeats said so, within our finish grace
        assert neighbour_word(info, running=False) == "finished"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_machine_metric_is_a_gauge_with_words_or_a_counter(algorithm: str) -> None:
    # the collector and `hivemesh status` tell gauges from event counts by MACHINE_GAUGE_WORDS
    params = torch.randn(64, generator=torch.Generator().manual_seed(0))
    config = GossipConfig(algorithm=algorithm, compression=suggested_compression(algorithm), total_steps=3)
    machine = make_machine(config, name="p00", topology=build("ring:4"), params=params, seed=0)
    # alone on the ring (no neighbour answers): train when asked, let each deadline pass, three rounds
    actions: list[Action] = []
    pending, now = machine.handle(Start(), 0.0), 0.0
    while pending and len(actions) < 200:
        actions += pending
        action, pending = pending[0], pending[1:]
        match action:
            case StartWork():
                pending += machine.handle(WorkDone(action.steps, 0.5), now)
            case SetTimer():
                now = max(now, action.at)
                pending += machine.handle(TimerFired(action.key), now)
    names = {action.name for action in actions if isinstance(action, Metric)}
    assert "round" in names         # control: the metrics were seen
    assert set(machine.gauges()) <= set(MACHINE_GAUGE_WORDS)
    assert {n for n in names if n not in MACHINE_GAUGE_WORDS} <= set(machine.counters)


@pytest.mark.processes
def test_a_peer_asked_for_tensorboard_writes_each_evaluation_as_scalars(run: Run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lines = [json.loads(x) for x in (run.out / "data" / "p01" / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run.out / "data" / "p01" / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "accuracy", "test_loss", "metrics/round", "bytes_sent_to/p00", "step"} <= tags
    for tag in ("accuracy", "test_loss", "metrics/round"):
        written = [(line["step"], line["metrics"]["round"] if tag == "metrics/round" else line[tag])
                   for line in lines]
        read = [(event.step, event.value) for event in events.Scalars(tag)]
        assert [step for step, _ in read] == [step for step, _ in written] == [10, 20, 30]
        assert [value for _, value in read] == pytest.approx([value for _, value in written], rel=1e-6)
    assert not (run.out / "data" / "p00" / "tensorboard").exists()     # opt-in


def test_tensorboard_without_its_package_is_an_error_naming_the_key(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from peer.runtime.tensorboard import ScalarLog

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # as if not installed
    with pytest.raises(HivemeshError, match=r"^p01.toml: \[peer\] tensorboard = true needs the tensorboard"):
        ScalarLog(tmp_path, key="p01.toml: [peer] tensorboard")


def test_a_gateway_serves_its_fedavg_round_apart_from_its_gossip_round() -> None:
    # a gateway 6 FedAvg rounds into 10, two gossip rounds after each: its gossip machine counted 12
    snapshot = {"name": "gw0", "state": "training", "step": 0, "metrics": {"round": 12.0},
                "federation": {"mode": "sync", "round": 6, "rounds": 10, "rounds_closed": 6}}
    _, samples = _collected(snapshot)
    assert samples[("hivemesh_federation_round", ())] == 6
    assert samples[("hivemesh_federation_rounds", ())] == 10
    assert samples[("hivemesh_federation_rounds_closed_total", ())] == 6
    assert samples[("hivemesh_gossip_round", ())] == 12
    assert not [name for name, _ in samples if name == "hivemesh_round"]

"""The simulator's pure parts: the event engine, the link model, scenario loading."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from peer.files.config import ConfigError
from sim.engine import Engine
from sim.network import FifoLink, LinkSpec, Network, PartitionSpec
from sim.scenario import load_scenario

# ------------------------------------------------------------------ engine


def test_engine_runs_events_in_time_then_schedule_order() -> None:
    engine = Engine()
    seen: list[tuple[float, str]] = []
    def note(label: str) -> None:
        seen.append((engine.now_s, label))

    for time_s, label in [(2.0, "c"), (1.0, "a"), (2.0, "d"), (1.0, "b"), (0.5, "first")]:
        engine.at(time_s, functools.partial(note, label))
    engine.run()
    assert seen == [(0.5, "first"), (1.0, "a"), (1.0, "b"), (2.0, "c"), (2.0, "d")]
    assert engine.now_s == 2.0


def test_engine_events_can_schedule_more_and_run_stops_at_until() -> None:
    engine = Engine()
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(engine.now_s)
        engine.after(1.0, tick)

    engine.at(0.0, tick)
    assert engine.run(until_s=3.5) == 3.5
    assert ticks == [0.0, 1.0, 2.0, 3.0]
    engine.run(until_s=5.0)
    assert ticks == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_engine_refuses_the_past_and_nan() -> None:
    engine = Engine()
    engine.at(1.0, lambda: None)
    engine.run()
    with pytest.raises(ValueError, match=r"already at 1\.0"):
        engine.at(0.5, lambda: None)
    with pytest.raises(ValueError):
        engine.at(math.nan, lambda: None)


# ------------------------------------------------------------------ links


def test_one_message_arrives_at_latency_plus_serialisation_exactly() -> None:
    spec = LinkSpec(latency_ms=50.0, bandwidth_mbps=10.0)
    link = FifoLink(spec)
    nbytes = 125_000  # 1 Mbit: 0.1 s at 10 Mbit/s
    assert link.send(nbytes, now_s=2.0) == 2.0 + 0.05 + 8 * nbytes / 10e6


def test_a_second_message_right_behind_queues_behind_the_first() -> None:
    link = FifoLink(LinkSpec(latency_ms=10.0, bandwidth_mbps=8.0))
    first = link.send(1_000_000, now_s=0.0)   # 1 s on the wire
    second = link.send(500_000, now_s=0.2)    # waits until t = 1.0, then 0.5 s
    assert first == pytest.approx(1.0 + 0.01, abs=1e-12)
    assert second == pytest.approx(1.0 + 0.5 + 0.01, abs=1e-12)
    # Once the link is idle again, a message does not wait.
    third = link.send(1_000, now_s=10.0)
    assert third == pytest.approx(10.0 + 0.001 + 0.01, abs=1e-12)


def test_directions_and_pairs_are_separate_links_with_their_own_specs() -> None:
    slow = LinkSpec(latency_ms=100.0, bandwidth_mbps=1.0)
    network = Network({("a", "b"): slow}, default=LinkSpec(latency_ms=1.0, bandwidth_mbps=1000.0), seed=0)
    ab = network.transmit("a", "b", 1000, 0.0)
    ba = network.transmit("b", "a", 1000, 0.0)
    assert ab.arrival_s == pytest.approx(0.1 + 8000 / 1e6)
    assert ba.arrival_s == pytest.approx(0.001 + 8000 / 1e9)
    assert network.traffic() == [("a", "b", 1, 1000), ("b", "a", 1, 1000)]


def test_loss_is_counter_based_and_close_to_its_rate() -> None:
    spec = LinkSpec(loss=0.2)

    def fates(order: list[tuple[str, str]]) -> dict[tuple[str, str], list[bool]]:
        network = Network({}, default=spec, seed=7)
        out: dict[tuple[str, str], list[bool]] = {}
        for src, dst in order:
            out.setdefault((src, dst), []).append(network.transmit(src, dst, 100, 0.0).dropped is None)
        return out

    pairs = [("a", "b"), ("b", "c")] * 500
    forward = fates(pairs)
    backward = fates(list(reversed(pairs)))
    # Interleaving other links' traffic differently changes nothing on a link.
    assert forward == backward
    delivered = sum(forward[("a", "b")]) / 500
    assert 0.72 < delivered < 0.88


def test_jitter_delays_but_never_reorders_a_link() -> None:
    network = Network({}, default=LinkSpec(latency_ms=5.0, jitter_ms=20.0, bandwidth_mbps=1e4), seed=3)
    arrivals = [network.transmit("a", "b", 10, i * 0.001).arrival_s for i in range(200)]
    assert all(a is not None for a in arrivals)
    assert arrivals == sorted(arrivals)  # type: ignore[type-var]
    delays = [a - i * 0.001 for i, a in enumerate(arrivals)]  # type: ignore[operator]
    assert min(delays) >= 0.005 and max(delays) > 0.015


def test_partitions_cut_groups_and_edges_only_while_active() -> None:
    split = PartitionSpec(start_s=10.0, end_s=20.0, groups=(("a", "b"), ("c",)))
    cut = PartitionSpec(start_s=0.0, end_s=5.0, edges=(("a", "b"),))
    network = Network({}, default=LinkSpec(), seed=0, partitions=[split, cut])
    assert network.transmit("a", "b", 10, 1.0).dropped == "partitioned"
    assert network.transmit("b", "a", 10, 1.0).dropped == "partitioned"
    assert network.transmit("a", "c", 10, 1.0).dropped is None
    assert network.transmit("a", "b", 10, 12.0).dropped is None
    assert network.transmit("a", "c", 10, 12.0).dropped == "partitioned"
    assert network.transmit("d", "c", 10, 12.0).dropped == "partitioned"  # d is in the "rest" group
    assert network.transmit("d", "a", 10, 12.0).dropped == "partitioned"
    assert network.transmit("a", "c", 10, 20.0).dropped is None  # healed at end_s
    assert network.dropped["partitioned"] == 5


@pytest.mark.parametrize("bad", [{"latency_ms": -1.0}, {"bandwidth_mbps": 0.0}, {"loss": 1.0}])
def test_bad_link_specs_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LinkSpec(**bad)


# ------------------------------------------------------------------ scenarios


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario-test.toml"
    path.write_text(text)
    return path


def test_scenario_loads_nested_tables_and_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, """
seed = 5
duration_s = 30
[graph]
spec = "ring:4"
[links]
latency_ms = 50
bandwidth_mbps = 10
[nodes]
step_time_ms = 50
speed = { p01 = 0.25 }
behaviour = { p02 = "sign-flip" }
[algorithm]
algorithm = "dpsgd"
[[faults.churn]]
node = "p03"
kind = "crash"
at_s = 3
[[faults.partitions]]
start_s = 5
end_s = 8
groups = [["p00", "p01"], ["p02", "p03"]]
""")
    scenario = load_scenario(path)
    assert scenario.name == "test"
    assert scenario.seed == 5 and scenario.duration_s == 30.0
    assert scenario.links == LinkSpec(latency_ms=50.0, bandwidth_mbps=10.0)
    assert scenario.nodes.speed == {"p01": 0.25}
    assert scenario.behaviour("p02") == "sign-flip" and scenario.behaviour("p00") == "honest"
    assert scenario.faults.churn[0].node == "p03"
    assert scenario.faults.partitions[0].cuts("p00", "p02")
    assert scenario.algorithm == {"algorithm": "dpsgd"}
    scenario.check_names(("p00", "p01", "p02", "p03"))
    with pytest.raises(ConfigError, match=r"key 'faults\.churn\[0\]\.node': no member 'p03'"):
        scenario.check_names(("p00", "p01", "p02"))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[links]\nlatency_ms = -3", "latency_ms must be >= 0"),
        ("[links]\nlatncy_ms = 3", "unknown key 'links.latncy_ms'"),
        ("[nodes]\nbehaviour = { p00 = 'evil' }", "key 'nodes.behaviour.p00': expected one of"),
        ("[[faults.partitions]]\nstart_s = 5\nend_s = 2\nedges = [['a', 'b']]", "start_s < end_s"),
        ("verify_fraction = 0", "verify_fraction must be in (0, 1]"),
        ("[baseline]\nkind = 'allreduce'\n[algorithm]\nalgorithm = 'dpsgd'", "not both"),
        ("[baseline]\nkind = 'ring'", "key 'baseline.kind': expected one of"),
    ],
)
def test_bad_scenarios_name_the_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    assert str(caught.value).startswith(str(path))
    assert needle in str(caught.value)

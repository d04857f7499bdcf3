"""A graph file's edge and node attributes reach the simulator: link delays, loss and compute times
in a real simulated run are the file's, for every file format; links and nodes the file leaves
bare keep the scenario's defaults."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from sim.gossip_driver import GossipRun
from sim.network import Transfer
from sim.scenario import scenario_from_dict
from sim.world import World, build_world
from topology import io

DEFAULT_LATENCY_MS = 1.0
DEFAULT_BANDWIDTH_MBPS = 1000.0
STEP_TIME_MS = 10.0
# (latency_ms, bandwidth_mbps, loss) of the annotated edges; the other two edges of the ring are bare.
EDGES = {("p00", "p01"): (40.0, 5.0, 0.3), ("p02", "p03"): (7.5, 200.0, 0.0)}
SPEEDS = {"p00": 2.0, "p02": 0.5}  # p01 and p03 are bare: speed 1


def annotated_ring(*, attributes: bool = True) -> nx.Graph:
    graph = nx.cycle_graph([f"p{i:02d}" for i in range(4)])
    if attributes:
        for (u, v), (latency_ms, bandwidth_mbps, loss) in EDGES.items():
            graph.edges[u, v].update(latency_ms=latency_ms, bandwidth_mbps=bandwidth_mbps, loss=loss)
        for name, speed in SPEEDS.items():
            graph.nodes[name].update(speed=speed, role="gateway")
    return graph


def world_from_file(path: Path) -> World:
    return build_world(scenario_from_dict({
        "seed": 3, "duration_s": 30.0, "eval_every_s": 100.0, "graph": {"spec": str(path)},
        "links": {"latency_ms": DEFAULT_LATENCY_MS, "bandwidth_mbps": DEFAULT_BANDWIDTH_MBPS},
        "nodes": {"step_time_ms": STEP_TIME_MS},
        "algorithm": {"algorithm": "dpsgd", "total_steps": 20, "deadline_s": 0.5},
        "task": {"name": "logreg", "options": {"n_samples": 200, "n_features": 5}},
    }))


class Observed:
    """What a run did: every transmission, and every unit of work (start and end times)."""

    def __init__(self) -> None:
        self.sends: dict[tuple[str, str], list[tuple[float, int, Transfer]]] = defaultdict(list)
        self.work: dict[str, list[tuple[float, int]]] = defaultdict(list)  # (start, steps)
        self.done: dict[str, list[float]] = defaultdict(list)


def observed_run(world: World) -> Observed:
    """Run the scenario with the network's transmit and the driver's work hooks recorded."""
    seen = Observed()
    run = GossipRun(world)
    assert world.network is not None
    transmit = world.network.transmit

    def recording_transmit(src: str, dst: str, nbytes: int, now_s: float) -> Transfer:
        transfer = transmit(src, dst, nbytes, now_s)
        seen.sends[(src, dst)].append((now_s, nbytes, transfer))
        return transfer

    work_point, work_done = run._work_point, run._work_done

    def recording_work_point(peer: Any, steps: int) -> None:   # the machine's StartWork, taken at once
        seen.work[peer.name].append((world.engine.now_s, steps))
        work_point(peer, steps)

    def recording_work_done(peer: Any, incarnation: int) -> None:
        seen.done[peer.name].append(world.engine.now_s)
        work_done(peer, incarnation)

    world.network.transmit = recording_transmit  # type: ignore[method-assign]
    run._work_point = recording_work_point  # type: ignore[method-assign]
    run._work_done = recording_work_done  # type: ignore[method-assign]
    result = run.run()
    assert all(peer["finished"] for peer in result.peers.values())
    return seen


def link_values(u: str, v: str, *, attributes: bool) -> tuple[float, float, float]:
    given = EDGES.get((u, v)) or EDGES.get((v, u))
    return given if attributes and given else (DEFAULT_LATENCY_MS, DEFAULT_BANDWIDTH_MBPS, 0.0)


def delays_s(seen: Observed) -> dict[tuple[str, str], list[tuple[float, int]]]:
    """(arrival - send, bytes) of every delivered message, by directed link. One send a round,
    rounds >= 5 ms apart, at most 0.6 ms on the wire: a link is always idle when a message
    comes, so each delay is exactly 8 B / R + latency."""
    return {link: [(transfer.arrival_s - now_s, nbytes) for now_s, nbytes, transfer in sends
                   if transfer.arrival_s is not None]
            for link, sends in seen.sends.items()}


@pytest.mark.parametrize("suffix", [".edgelist", ".json", ".graphml"])
def test_graph_file_attributes_set_link_delays_loss_and_compute_times(tmp_path: Path, suffix: str) -> None:
    # Prepare
    path = tmp_path / f"links{suffix}"
    io.save(annotated_ring(), path)
    world = world_from_file(path)
    # Execute
    seen = observed_run(world)
    # Assert: links, both directions of each undirected edge (an idle link: 8 B / R + latency).
    delays = delays_s(seen)
    assert len(delays) == 8
    for (src, dst), messages in sorted(delays.items()):
        latency_ms, bandwidth_mbps, _ = link_values(src, dst, attributes=True)
        assert len(messages) >= 10, (src, dst)
        for delay_s, nbytes in messages:
            expected = 8 * nbytes / (bandwidth_mbps * 1e6) + latency_ms / 1000
            assert delay_s == pytest.approx(expected, rel=1e-9), (src, dst)
    # Loss: only the lossy edge loses messages, near its rate.
    for link, sends in sorted(seen.sends.items()):
        lost = sum(transfer.dropped == "lost" for _, _, transfer in sends)
        loss = link_values(*link, attributes=True)[2]
        assert (lost > 0) == (loss > 0), link
        assert abs(lost / len(sends) - loss) < 0.25, (link, lost, len(sends))
    # Nodes: every unit of work takes steps x step_time / speed (speed 1 where the file gives none).
    for name in world.names:
        assert len(seen.work[name]) == len(seen.done[name]) == 20
        for (start_s, steps), done_s in zip(seen.work[name], seen.done[name], strict=True):
            expected = steps * STEP_TIME_MS / 1000 / SPEEDS.get(name, 1.0)
            assert done_s - start_s == pytest.approx(expected, rel=1e-9), name
    # Role is carried onto the world's graph (no simulator component models roles yet).
    assert world.topology.graph.nodes["p00"]["role"] == "gateway"


def test_without_attributes_the_same_checks_see_the_defaults(tmp_path: Path) -> None:
    # Negative control: the bare ring gives other delays and no loss, so the checks above can fail.
    path = tmp_path / "links.edgelist"
    io.save(annotated_ring(attributes=False), path)
    seen = observed_run(world_from_file(path))
    delay_s, nbytes = delays_s(seen)[("p00", "p01")][0]
    bare = 8 * nbytes / (DEFAULT_BANDWIDTH_MBPS * 1e6) + DEFAULT_LATENCY_MS / 1000
    annotated = 8 * nbytes / (5.0 * 1e6) + 40.0 / 1000
    assert delay_s == pytest.approx(bare, rel=1e-9)
    assert delay_s != pytest.approx(annotated, rel=1e-9)
    assert not any(t.dropped for sends in seen.sends.values() for _, _, t in sends)
    start_s, steps = seen.work["p00"][0]
    assert seen.done["p00"][0] - start_s == pytest.approx(steps * STEP_TIME_MS / 1000, rel=1e-9)

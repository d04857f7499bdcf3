"""Gossip machines driven by hand and by the list driver, on tiny problems of our own (fast, pure)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gossip_driver import Driver, LogRegWorker, QuadraticWorker

from protocols.events import (
    CancelTimer,
    Finished,
    Metric,
    Received,
    Send,
    SetTimer,
    Start,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import ParamPush
from topology import build


def _logreg_data(n_peers: int, m: int, d: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=d)
    xs, ys = [], []
    for i in range(n_peers):
        x = rng.normal(loc=0.3 * i, size=(m, d))
        xs.append(x)
        ys.append((x @ truth + rng.normal(size=m) > 0).astype(np.float64))
    return xs, ys


# ------------------------------------------------------------ (a) exactness


def test_a_dpsgd_equals_the_numpy_recursion_in_float64() -> None:
    # Prepare: 6 peers on a ring, full-batch logistic regression, different starts.
    topology = build("ring:6")
    names = topology.names
    xs, ys = _logreg_data(len(names), m=40, d=5, seed=3)
    lr, steps = 0.3, 25
    starts = np.random.default_rng(4).normal(size=(len(names), 5))
    workers = {n: LogRegWorker(xs[i], ys[i], lr, starts[i]) for i, n in enumerate(names)}
    config = GossipConfig(algorithm="dpsgd", total_steps=steps)
    machines = {n: make_machine(config, name=n, topology=topology, params=workers[n].flat_params, seed=0)
                for n in names}
    # Execute
    driver = Driver(machines, workers)
    driver.start()
    driver.run()
    # Assert: x_{t+1} = W x_t - lr g(x_t), row by row.
    w_matrix = topology.mixing(0)
    expected = starts.copy()
    for _ in range(steps):
        grads = np.stack([LogRegWorker.gradient(xs[i], ys[i], expected[i]) for i in range(len(names))])
        expected = w_matrix @ expected - lr * grads
    got = np.stack([workers[n].flat_params.numpy() for n in names])
    assert driver.finished == set(names)
    assert np.abs(got - expected).max() < 1e-12
    assert all(driver.steps[n] == steps for n in names)


# ------------------------------------------------------------ config


@pytest.mark.parametrize(("options", "needle"), [
    ({"algorithm": "gossip"}, "algorithm must be one of"),
    ({"algorithm": "dpsgd", "local_steps": 4}, "local_steps must be 1"),
    ({"algorithm": "local", "local_steps": 0}, "local_steps must be >= 1"),
    ({"compression": "topk:fraction=0.01"}, "use it with algorithm 'choco'"),
    ({"algorithm": "choco", "consensus_step": 0.0}, "consensus_step"),
    ({"deadline_s": 0.0}, "deadline_s"),
    ({"outer": "diloco", "algorithm": "local", "local_steps": 8, "outer_every": 12}, "multiple of"),
    ({"norm_multiple": -1.0}, "norm_multiple"),
])
def test_config_rejects_bad_values_with_a_clear_message(options: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        GossipConfig(**options)


def test_algorithms_refuse_graphs_they_cannot_use() -> None:
    params = torch.zeros(3)
    with pytest.raises(ValueError, match="undirected"):
        make_machine(GossipConfig(), name="p00", topology=build("directed-ring:4"), params=params)
    with pytest.raises(ValueError, match="static undirected"):
        make_machine(GossipConfig(algorithm="choco"), name="p00", topology=build("one-peer-exponential:4"),
                     params=params)
    with pytest.raises(ValueError, match="not a member"):
        make_machine(GossipConfig(), name="zz", topology=build("ring:4"), params=params)


# ------------------------------------------------------------ rounds by hand


def _push(round_index: int, x: torch.Tensor) -> ParamPush:
    return ParamPush(round=round_index, tensors={"x": x})


def test_a_missing_neighbour_is_left_out_at_the_deadline_and_counted() -> None:
    # Prepare: p0 on a complete graph of 3 (W = 1/3 everywhere), one local step of its own.
    topology = build("complete:3")
    params = torch.tensor([3.0, 0.0], dtype=torch.float64)
    machine = make_machine(GossipConfig(total_steps=1, deadline_s=5.0), name="p00", topology=topology,
                           params=params)
    # Execute
    first = machine.handle(Start(), 0.0)
    params -= torch.tensor([1.0, 1.0], dtype=torch.float64)  # the "trainer" steps: x_local = x - (1, 1)
    waiting = machine.handle(WorkDone(1, 0.5), 1.0)
    machine.handle(Received("p01", _push(0, torch.tensor([6.0, 3.0], dtype=torch.float64))), 2.0)
    fired = machine.handle(TimerFired("gossip-deadline:0"), 6.0)
    # Assert: it sent x before its step, waited with a deadline, then mixed p01 only.
    sends = [a for a in first if isinstance(a, Send)]
    assert sends[0].recipients == ("p01", "p02")
    assert torch.equal(sends[0].message.tensors["x"], torch.tensor([3.0, 0.0], dtype=torch.float64))
    assert StartWork(1) in first
    assert waiting == [SetTimer("gossip-deadline:0", 6.0)]
    x_local, x_sent = torch.tensor([2.0, -1.0]), torch.tensor([3.0, 0.0])
    expected = x_local + (torch.tensor([6.0, 3.0]) - x_sent) / 3  # p02's third stays on x_sent
    assert torch.allclose(params, expected.to(torch.float64), atol=1e-15)
    assert Metric("missed_deadline", 1.0) in fired
    assert Finished() in fired
    assert machine.counters["missed_deadline"] == 1


def test_the_round_closes_without_waiting_when_every_neighbour_is_in() -> None:
    topology = build("ring:4")
    params = torch.zeros(2)
    machine = make_machine(GossipConfig(total_steps=2), name="p00", topology=topology, params=params)
    machine.handle(Start(), 0.0)
    machine.handle(Received("p01", _push(0, torch.ones(2))), 0.1)
    machine.handle(Received("p03", _push(0, torch.ones(2))), 0.2)
    actions = machine.handle(WorkDone(1, 0.0), 1.0)
    assert not any(isinstance(a, SetTimer) for a in actions)
    assert StartWork(1) in actions  # round 1 started at once
    assert torch.allclose(params, torch.full((2,), 2 / 3))


def test_later_rounds_are_buffered_too_far_ahead_dropped_and_old_ones_counted_stale() -> None:
    topology = build("ring:4")
    params = torch.zeros(2)
    config = GossipConfig(algorithm="local", local_steps=1, total_steps=10, max_rounds_ahead=2)
    machine = make_machine(config, name="p00", topology=topology, params=params)
    machine.handle(Start(), 0.0)
    machine.handle(Received("p01", _push(1, torch.ones(2))), 0.1)  # one ahead: kept
    machine.handle(Received("p01", _push(3, torch.ones(2))), 0.1)  # three ahead: dropped
    machine.handle(Received("p01", _push(1, torch.ones(2))), 0.1)  # duplicate
    machine.handle(Received("p02", _push(0, torch.ones(2))), 0.1)  # not a neighbour
    machine.handle(Received("p01", _push(0, torch.ones(2))), 0.2)
    machine.handle(Received("p03", _push(0, torch.ones(2))), 0.2)
    machine.handle(WorkDone(1, 0.0), 1.0)
    actions = machine.handle(Received("p03", _push(0, torch.ones(2))), 1.1)  # round 0 is closed
    assert machine.counters == {"dropped_future": 1, "duplicate_message": 1, "not_neighbour": 1,
                                "stale_message": 1}
    assert actions == [Metric("stale_message", 1.0)]
    assert 1 in machine.inbox and "p01" in machine.inbox[1]


def test_cancels_its_deadline_when_the_last_neighbour_arrives() -> None:
    machine = make_machine(GossipConfig(total_steps=1), name="p00", topology=build("ring:3"),
                           params=torch.zeros(1))
    machine.handle(Start(), 0.0)
    assert machine.handle(WorkDone(1, 0.0), 1.0) == [SetTimer("gossip-deadline:0", 11.0)]
    machine.handle(Received("p01", _push(0, torch.ones(1))), 1.5)
    actions = machine.handle(Received("p02", _push(0, torch.ones(1))), 2.0)
    assert actions[0] == CancelTimer("gossip-deadline:0")
    assert Finished() in actions


# ------------------------------------------------------------ determinism


def _quadratic_run(algorithm: str, order_seed: int,
                   **options: object) -> tuple[list[bytes], dict[str, torch.Tensor]]:
    topology = build("ring:5")
    targets = torch.randn(len(topology.names), 6, generator=torch.Generator().manual_seed(1))
    workers = {n: QuadraticWorker(torch.zeros(6), targets[i], lr=0.2) for i, n in enumerate(topology.names)}
    config = GossipConfig(algorithm=algorithm, total_steps=12, **options)
    machines = {n: make_machine(config, name=n, topology=topology, params=workers[n].flat_params, seed=7)
                for n in topology.names}
    # a different step time per peer changes the arrival order of messages
    times = {n: 1.0 + 0.37 * ((i * order_seed) % 5) for i, n in enumerate(topology.names)}
    sent: list[bytes] = []

    def record(sender: str, message: object) -> object:
        assert isinstance(message, ParamPush)
        sent.append(f"{sender}/{message.round}".encode() + b"".join(
            t.numpy().tobytes() for _, t in sorted(message.tensors.items())))
        return message

    driver = Driver(machines, workers, step_time_s=times, tamper={n: record for n in topology.names})
    driver.start()
    driver.run()
    return sorted(sent), {n: w.flat_params.clone() for n, w in workers.items()}


@pytest.mark.parametrize("algorithm", ["dpsgd", "choco", "pushsum"])
def test_arrival_order_does_not_change_a_single_bit(algorithm: str) -> None:
    options = {"compression": "topk:fraction=0.5", "consensus_step": 0.5} if algorithm == "choco" else {}
    sent_a, final_a = _quadratic_run(algorithm, 1, **options)
    sent_b, final_b = _quadratic_run(algorithm, 3, **options)
    assert sent_a == sent_b
    assert all(torch.equal(final_a[n], final_b[n]) for n in final_a)

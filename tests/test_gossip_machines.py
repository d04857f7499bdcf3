"""Gossip machines driven by hand and by the list driver, on tiny problems of our own (fast, pure)."""

from __future__ import annotations

import math
from typing import Any

import networkx as nx
import numpy as np
import pytest
import torch
from gossip_driver import Driver, LogRegWorker, QuadraticWorker

from peer.files.config import ConfigError, load
from protocols.errors import HivemeshError
from protocols.events import (
    CancelTimer,
    Finished,
    Metric,
    NeighbourUp,
    Received,
    Send,
    SetTimer,
    Start,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.gossip import GossipConfig, PushSum, make_machine
from protocols.gossip.mixing import nesterov_outer_step
from protocols.gossip.robust import NormFilter
from protocols.messages import ParamPush
from topology import build, from_graph


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
    ({"algorithm": "choco", "consensus_step": -0.1}, "consensus_step"),
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


def test_a_neighbour_that_comes_up_mid_round_is_sent_the_round_again() -> None:
    # A late joiner (or a restarted peer) comes up after this round's message was sent into the void:
    # without the resend, the round it joins would wait out its deadline for a message never to come.
    topology = build("ring:4")
    machine = make_machine(GossipConfig(total_steps=2), name="p00", topology=topology, params=torch.zeros(2))
    assert machine.handle(NeighbourUp("p01"), 0.0) == []          # no round yet: nothing to resend
    first = machine.handle(Start(), 0.0)
    sent = [a for a in first if isinstance(a, Send)]
    again = [a for a in machine.handle(NeighbourUp("p01"), 0.5) if isinstance(a, Send)]
    assert again == [Send(("p01",), sent[0].message)]
    assert machine.counters["resent_on_neighbour_up"] == 1
    # the receiver applies a (sender, round) once: the resent copy is counted, never mixed twice
    receiver = make_machine(GossipConfig(total_steps=2), name="p01", topology=topology, params=torch.zeros(2))
    receiver.handle(Start(), 0.0)
    for copy in (sent[0].message, again[0].message):
        receiver.handle(Received("p00", copy), 0.6)
    assert receiver.counters["duplicate_message"] == 1


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


def test_later_rounds_are_buffered_duplicates_dropped_and_old_ones_counted_stale() -> None:
    # (a round more than max_rounds_ahead ahead makes the machine catch up: test_gossip_catchup.py)
    topology = build("ring:4")
    params = torch.zeros(2)
    config = GossipConfig(algorithm="local", local_steps=1, total_steps=10, max_rounds_ahead=2)
    machine = make_machine(config, name="p00", topology=topology, params=params)
    machine.handle(Start(), 0.0)
    machine.handle(Received("p01", _push(1, torch.ones(2))), 0.1)  # one ahead: kept
    machine.handle(Received("p01", _push(1, torch.ones(2))), 0.1)  # duplicate
    machine.handle(Received("p02", _push(0, torch.ones(2))), 0.1)  # not a neighbour
    machine.handle(Received("p01", _push(0, torch.ones(2))), 0.2)
    machine.handle(Received("p03", _push(0, torch.ones(2))), 0.2)
    machine.handle(WorkDone(1, 0.0), 1.0)
    actions = machine.handle(Received("p03", _push(0, torch.ones(2))), 1.1)  # round 0 is closed
    assert machine.counters == {"duplicate_message": 1, "not_neighbour": 1, "stale_message": 1}
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


# ------------------------------------------------------------ DiLoCo


def test_e_nesterov_outer_step_matches_torch_sgd_nesterov() -> None:
    generator = torch.Generator().manual_seed(2)
    start = torch.randn(5, generator=generator, dtype=torch.float64)
    anchor, momentum = start.clone(), torch.zeros(5, dtype=torch.float64)
    reference = torch.nn.Parameter(start.clone())
    optimiser = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(3):
        params = anchor + torch.randn(5, generator=generator, dtype=torch.float64)  # after inner rounds
        reference.grad = (reference.detach() - params).clone()  # the pseudo-gradient
        optimiser.step()
        nesterov_outer_step(params, anchor, momentum, lr=0.7, momentum=0.9)
        assert torch.allclose(params, reference.detach(), rtol=0, atol=1e-14)
        assert torch.equal(params, anchor)


def test_e_the_diloco_outer_step_equals_a_hand_computed_nesterov_step() -> None:
    # Prepare: the same local-SGD run without and with DiLoCo; the outer step falls after the last round.
    topology = build("ring:4")
    targets = torch.arange(12, dtype=torch.float64).reshape(4, 3)

    def run(outer: str) -> dict[str, torch.Tensor]:
        workers = {n: QuadraticWorker(torch.ones(3, dtype=torch.float64), targets[i], lr=0.25)
                   for i, n in enumerate(topology.names)}
        config = GossipConfig(algorithm="local", local_steps=2, total_steps=4, outer=outer,
                              outer_every=4, outer_lr=0.7, outer_momentum=0.9)
        machines = {n: make_machine(config, name=n, topology=topology, params=workers[n].flat_params)
                    for n in topology.names}
        driver = Driver(machines, workers)
        driver.start()
        driver.run()
        return {n: w.flat_params for n, w in workers.items()}

    # Execute
    inner, outer = run("none"), run("diloco")
    # Assert: pseudo-gradient d = x0 - x_inner; m = d; x = x0 - lr (d + mu m) = x0 - 0.7 * 1.9 * d
    x0 = torch.ones(3, dtype=torch.float64)
    for name in topology.names:
        hand = x0 - 0.7 * (1 + 0.9) * (x0 - inner[name])
        assert torch.allclose(outer[name], hand, rtol=0, atol=1e-14), name
        assert not torch.allclose(outer[name], inner[name])


# ------------------------------------------------------------ push-sum


def test_d_push_sum_mass_is_exact_and_the_ratio_reaches_the_average_when_weights_vary() -> None:
    # A directed ring plus two chords from p0: columns sum to 1 (dyadic: 1/2, 1/4), rows do not,
    # so the push-sum weights w drift away from 1.
    graph = nx.DiGraph()
    graph.add_edges_from([(f"p{i}", f"p{(i + 1) % 8}") for i in range(8)] + [("p0", "p2"), ("p0", "p5")])
    topology = from_graph(graph)
    starts = torch.randn(8, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    workers = {n: QuadraticWorker(starts[i], starts[i], lr=0.0) for i, n in enumerate(topology.names)}
    machines = {n: make_machine(GossipConfig(algorithm="pushsum", total_steps=0, final_gossip_rounds=150),
                                name=n, topology=topology, params=workers[n].flat_params)
                for n in topology.names}
    masses: list[float] = []
    weights: set[float] = set()

    def observe(driver: Driver) -> None:
        held = [m.mass for m in driver.machines.values() if isinstance(m, PushSum)]
        flying = [float(msg.meta["w"]) for _, _, msg in driver.in_flight() if isinstance(msg, ParamPush)]
        masses.append(math.fsum(held + flying))
        weights.update(m.weight for m in driver.machines.values() if isinstance(m, PushSum))

    driver = Driver(machines, workers, observe=observe)
    driver.start()
    driver.run()
    assert len(weights) > 8  # the weights really varied
    # dyadic shares stay exact until the weights need more than 53 bits (about 25 rounds here)
    assert set(masses[:200]) == {8.0}
    assert max(abs(mass - 8.0) for mass in masses) < 1e-12
    average = starts.mean(dim=0)
    for worker in workers.values():
        assert torch.allclose(worker.flat_params, average, atol=1e-9)


# ------------------------------------------------------------ insider filter


def test_the_norm_filter_rejects_nonfinite_and_outsized_norms_only() -> None:
    screen = NormFilter(multiple=10.0)
    assert screen.screen([0.0, 0.0], own_norm=0.5) == [True, True]  # peers that start equal
    assert screen.screen([1.0, float("nan"), 1.2], own_norm=0.8) == [True, False, True]
    assert screen.screen([0.9, 60.0], own_norm=0.7) == [True, False]  # 60 > 10 x max(median, own)
    assert screen.screen([4.0], own_norm=0.5) == [True]  # within 10 x the median of the history
    assert 60.0 not in screen.history and float("nan") not in screen.history
    assert NormFilter(multiple=0.0).screen([1e30, float("inf")], own_norm=1.0) == [True, False]


# ------------------------------------------------------------ joining by state sync


def test_a_joiner_continues_from_the_round_it_was_given() -> None:
    params = torch.zeros(3)
    machine = make_machine(GossipConfig(total_steps=20), name="p01", topology=build("ring:4"), params=params)
    params.fill_(2.0)  # the driver copied a neighbour's parameters in
    machine.join_at(7, 7)
    actions = machine.handle(Start(), 100.0)
    sends = [a for a in actions if isinstance(a, Send)]
    assert sends[0].message.round == 7 and torch.equal(sends[0].message.tensors["x"], params)
    assert StartWork(1) in actions
    assert machine.export_state()[1]["steps_done"] == 7


def test_choco_refuses_to_join_by_state_sync() -> None:
    machine = make_machine(GossipConfig(algorithm="choco"), name="p01", topology=build("ring:4"),
                           params=torch.zeros(3))
    with pytest.raises(HivemeshError, match="cannot join"):
        machine.join_at(3, 3)


# ------------------------------------------------------------ same events, same actions


class _Recorder:
    """Wraps a machine and keeps every (event, now, actions) it saw."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine
        self.log: list[tuple[Any, float, list[Any]]] = []

    def handle(self, event: Any, now: float) -> list[Any]:
        actions = self.machine.handle(event, now)
        self.log.append((event, now, actions))
        return actions

    def export_state(self) -> Any:
        return self.machine.export_state()

    def restore_state(self, state: Any) -> None:
        self.machine.restore_state(state)


def _fingerprint(actions: list[Any]) -> list[Any]:
    out: list[Any] = []
    for action in actions:
        if isinstance(action, Send) and isinstance(action.message, ParamPush):
            message = action.message
            out.append((action.recipients, message.round, message.want_reply, sorted(message.meta.items()),
                        [(k, t.dtype, t.numpy().tobytes()) for k, t in sorted(message.tensors.items())]))
        else:
            out.append(action)
    return out


@pytest.mark.parametrize("algorithm", ["dpsgd", "local", "choco", "pushsum", "adpsgd"])
def test_the_same_events_give_the_same_actions_bit_for_bit(algorithm: str) -> None:
    spec = "directed-exponential:5" if algorithm == "pushsum" else "ring:5"
    options: dict[str, Any] = {"algorithm": algorithm, "total_steps": 8, "final_gossip_rounds": 2}
    if algorithm == "local":
        options["local_steps"] = 2
    if algorithm == "choco":
        options.update(compression="sign", consensus_step=0.5)
    topology = build(spec)
    targets = torch.randn(5, 6, generator=torch.Generator().manual_seed(4))

    def fresh() -> tuple[dict[str, QuadraticWorker], dict[str, Any]]:
        workers = {n: QuadraticWorker(torch.zeros(6), targets[i], lr=0.3)
                   for i, n in enumerate(topology.names)}
        machines = {n: make_machine(GossipConfig(**options), name=n, topology=topology,
                                    params=workers[n].flat_params, seed=11) for n in topology.names}
        return workers, machines

    workers, machines = fresh()
    recorders = {n: _Recorder(m) for n, m in machines.items()}
    driver = Driver(recorders, workers, step_time_s={n: 1.0 + 0.3 * i for i, n in enumerate(topology.names)})
    driver.start()
    driver.run()
    # replay each peer's events into a fresh machine, running its worker where the first one did
    replay_workers, replay_machines = fresh()
    for name, recorder in recorders.items():
        for event, now, actions in recorder.log:
            again = replay_machines[name].handle(event, now)
            assert _fingerprint(again) == _fingerprint(actions)
            for action in again:
                if isinstance(action, StartWork):
                    replay_workers[name].run_steps(action.steps)
        assert torch.equal(replay_workers[name].flat_params, workers[name].flat_params)


def test_malformed_updates_are_rejected_and_counted_without_stalling_the_round() -> None:
    params = torch.zeros(4)
    machine = make_machine(GossipConfig(total_steps=1), name="p00", topology=build("complete:4"),
                           params=params)
    machine.handle(Start(), 0.0)
    machine.handle(Received("p01", ParamPush(round=0, tensors={"x": torch.ones(3)})), 0.1)  # wrong length
    machine.handle(Received("p02", ParamPush(round=0, tensors={"y": torch.ones(4)})), 0.1)  # no "x"
    machine.handle(Received("p03", ParamPush(round=0, tensors={"x": torch.ones(4, dtype=torch.int64)})), 0.1)
    actions = machine.handle(WorkDone(1, 0.0), 1.0)
    assert Finished() in actions  # all three arrived: no waiting for a deadline
    assert torch.equal(params, torch.zeros(4))  # nothing mixed
    assert machine.counters == {"rejected_update": 3, "rejected_wrong_length": 1, "rejected_missing_part": 1,
                                "rejected_wrong_dtype": 1}


def test_a_straggler_is_left_out_without_holding_up_the_rest_of_the_ring() -> None:
    # p02 needs 12 s per step; its neighbours give up on it after 5 s, then stop waiting for it
    # (a laggard), so p00 -- two hops away -- never misses anyone: no cascade of deadlines.
    topology = build("ring:4")
    targets = torch.eye(4, dtype=torch.float64)
    workers = {n: QuadraticWorker(torch.zeros(4, dtype=torch.float64), targets[i], lr=0.5)
               for i, n in enumerate(topology.names)}
    machines = {n: make_machine(GossipConfig(total_steps=6, deadline_s=5.0), name=n, topology=topology,
                                params=workers[n].flat_params) for n in topology.names}
    driver = Driver(machines, workers, step_time_s={"p00": 1.0, "p01": 1.0, "p02": 12.0, "p03": 1.0})
    driver.start()
    driver.run()
    assert driver.finished == set(topology.names)
    for neighbour in ("p01", "p03"):  # round 0 had p02's message (sent before its step); rounds 1-5 not
        assert machines[neighbour].counters["missed_deadline"] == 5
        assert driver.metrics[neighbour]["missed_deadline"] == 5.0  # reported as a metric
    assert machines["p00"].counters["missed_deadline"] == 0
    # the fast peers waited for p02 once (5 s), not in every round (6 x 1 s of work + 5 s + latencies)
    assert all(driver.finished_at[n] < 12.0 for n in ("p00", "p01", "p03")), driver.finished_at


def test_gossip_config_loads_from_toml_data_and_errors_name_the_key() -> None:
    config = load(GossipConfig, {"algorithm": "choco", "compression": "topk:fraction=0.01",
                                 "consensus_step": 0.1, "final_gossip_rounds": 5}, source="peer.toml")
    assert config.algorithm == "choco" and config.consensus_step == 0.1
    with pytest.raises(ConfigError, match="algorithm"):
        load(GossipConfig, {"algorithm": "gossip"}, source="peer.toml", prefix="gossip")
    with pytest.raises(ConfigError, match=r"peer\.toml.*local_steps must be >= 1"):
        load(GossipConfig, {"local_steps": 0}, source="peer.toml", prefix="gossip")


def test_rounds_that_need_no_waiting_follow_one_another_without_recursion() -> None:
    # No neighbour in the topology: each of 5000 gossip-only rounds is complete as soon as it starts.
    # (Neighbours that are down are waited for: tests/test_gossip_alone.py.)
    machine = make_machine(GossipConfig(total_steps=0, final_gossip_rounds=5000), name="p00",
                           topology=build("ring:1"), params=torch.zeros(2))
    actions = machine.handle(Start(), 0.0)
    assert Finished() in actions
    assert machine.export_state()[1]["round"] == 5000


def test_adpsgd_alone_trains_then_finishes_without_gossip() -> None:
    # No neighbour in the topology. (Neighbours that are down are waited for: test_gossip_alone.py.)
    params = torch.zeros(2)
    machine = make_machine(GossipConfig(algorithm="adpsgd", total_steps=2, final_gossip_rounds=5000),
                           name="p00", topology=build("ring:1"), params=params)
    assert machine.handle(Start(), 0.0) == [StartWork(1)]
    assert StartWork(1) in machine.handle(WorkDone(1, 0.0), 1.0)
    assert Finished() in machine.handle(WorkDone(1, 0.0), 2.0)

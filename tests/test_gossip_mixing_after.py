"""``mixing = "after"`` (adapt-then-combine): local steps first, then mix the post-step values.

On a complete graph with uniform weights and H = 1 that is data-parallel SGD,
``x <- x - lr * mean_i g_i(x)``; with H > 1 it is classic local SGD
(H local steps, then ``x <- W x``). Both are checked against numpy recursions
in float64 to 1e-12, with the default "overlap" mode as the control that the
comparison can fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gossip_driver import Driver, LogRegWorker, sent_param_pushes

from protocols.events import Send, Start, StartWork, WorkDone
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import Message, ParamPush
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


def _run(spec: str, options: dict[str, Any], starts: np.ndarray, *, lr: float, seed: int = 3,
         step_time_s: float | dict[str, float] = 1.0) -> tuple[np.ndarray, Driver, list[np.ndarray],
                                                               list[np.ndarray]]:
    topology = build(spec)
    names = topology.names
    xs, ys = _logreg_data(len(names), m=40, d=starts.shape[1], seed=seed)
    workers = {n: LogRegWorker(xs[i], ys[i], lr, starts[i]) for i, n in enumerate(names)}
    config = GossipConfig(**options)
    machines = {n: make_machine(config, name=n, topology=topology, params=workers[n].flat_params, seed=0)
                for n in names}
    driver = Driver(machines, workers, step_time_s=step_time_s)
    driver.start()
    assert driver.run()
    assert driver.finished == set(names)
    return np.stack([workers[n].flat_params.numpy() for n in names]), driver, xs, ys


def _counters(driver: Driver, name: str) -> Any:
    return driver.machines[name].counters  # type: ignore[attr-defined]


def _data_parallel(start: np.ndarray, xs: list[np.ndarray], ys: list[np.ndarray], *, lr: float,
                   steps: int) -> np.ndarray:
    x = start.copy()
    for _ in range(steps):
        x = x - lr * np.mean([LogRegWorker.gradient(xs[i], ys[i], x) for i in range(len(xs))], axis=0)
    return x


def test_after_with_h1_on_a_complete_graph_equals_data_parallel_sgd() -> None:
    n, d, lr, steps = 5, 6, 0.3, 30
    start = np.random.default_rng(4).normal(size=d)
    starts = np.tile(start, (n, 1))  # data-parallel: one model, replicated
    options = {"algorithm": "dpsgd", "mixing": "after", "total_steps": steps}
    got, driver, xs, ys = _run(f"complete:{n}", options, starts, lr=lr)
    expected = _data_parallel(start, xs, ys, lr=lr, steps=steps)
    assert np.abs(got - expected).max() < 1e-12
    assert all(driver.steps[name] == steps for name in driver.machines)
    assert all(_counters(driver, name)["missed_deadline"] == 0 for name in driver.machines)
    # control: "overlap" (x_i <- mean(x) - lr g_i(x_i)) is not data-parallel SGD, by far more than 1e-12
    overlap, *_ = _run(f"complete:{n}", {**options, "mixing": "overlap"}, starts, lr=lr)
    assert np.abs(overlap - expected).max() > 1e-4


def test_pushsum_after_with_h1_on_a_complete_graph_equals_data_parallel_sgd() -> None:
    n, d, lr, steps = 4, 5, 0.3, 20
    start = np.random.default_rng(7).normal(size=d)
    options = {"algorithm": "pushsum", "mixing": "after", "total_steps": steps}
    got, _, xs, ys = _run(f"complete:{n}", options, np.tile(start, (n, 1)), lr=lr)
    assert np.abs(got - _data_parallel(start, xs, ys, lr=lr, steps=steps)).max() < 1e-12


@pytest.mark.parametrize("spec", ["complete:4", "ring:6"])
def test_local_sgd_after_with_h8_equals_the_classic_local_sgd_recursion(spec: str) -> None:
    topology = build(spec)
    n, d, lr, h, rounds = len(topology.names), 5, 0.2, 8, 6
    starts = np.random.default_rng(5).normal(size=(n, d))  # different starts: W mixes them too
    options = {"algorithm": "local", "local_steps": h, "mixing": "after", "total_steps": h * rounds}
    got, driver, xs, ys = _run(spec, options, starts, lr=lr)
    w_matrix = topology.mixing(0)
    expected = starts.copy()
    for _ in range(rounds):
        for _ in range(h):
            expected = expected - lr * np.stack([LogRegWorker.gradient(xs[i], ys[i], expected[i])
                                                 for i in range(n)])
        expected = w_matrix @ expected
    assert np.abs(got - expected).max() < 1e-12
    assert all(driver.steps[name] == h * rounds for name in driver.machines)
    overlap, *_ = _run(spec, {**options, "mixing": "overlap"}, starts, lr=lr)
    assert np.abs(overlap - expected).max() > 1e-4


def test_after_sends_nothing_before_the_work_and_the_post_step_values_after_it() -> None:
    topology = build("complete:3")
    params = torch.zeros(4, dtype=torch.float64)
    machine = make_machine(GossipConfig(algorithm="dpsgd", mixing="after", total_steps=2), name="p00",
                           topology=topology, params=params, seed=0)
    first = machine.handle(Start(), 0.0)
    assert not [a for a in first if isinstance(a, Send)]
    assert [a for a in first if isinstance(a, StartWork)] == [StartWork(1)]
    params.add_(1.5)  # the local step
    (push,) = sent_param_pushes(machine.handle(WorkDone(1, 0.0), 1.0))
    assert push.round == 0
    # the default mode sends the pre-step values with StartWork
    overlap = make_machine(GossipConfig(algorithm="dpsgd", total_steps=2), name="p00", topology=topology,
                           params=torch.zeros(4, dtype=torch.float64), seed=0)
    assert len(sent_param_pushes(overlap.handle(Start(), 0.0))) == 1
    decoded = machine.payload.decode(push.tensors, push.meta)
    assert torch.equal(decoded, torch.full((4,), 1.5, dtype=torch.float64))


def test_after_renormalises_a_missed_deadline_and_screens_outliers() -> None:
    n, d, lr, steps = 4, 5, 0.3, 6
    start = np.random.default_rng(4).normal(size=d)
    names = build(f"complete:{n}").names
    # p03 is 100x slower than the deadline allows: its neighbours mix without it and count the miss
    slow = {name: (100.0 if name == "p03" else 1.0) for name in names}
    options: dict[str, Any] = {"algorithm": "dpsgd", "mixing": "after", "total_steps": steps,
                               "deadline_s": 5.0}
    got, driver, xs, ys = _run(f"complete:{n}", options, np.tile(start, (n, 1)), lr=lr, step_time_s=slow)
    assert _counters(driver, "p00")["missed_deadline"] >= 1
    # p03's weight 1/4 is renormalised into the self weight: x_i <- x_i / 2 + (x_j + x_k) / 4, post-step
    renormalised = np.full((3, 3), 0.25) + 0.25 * np.eye(3)
    fast = np.tile(start, (3, 1))
    for _ in range(steps):
        fast = fast - lr * np.stack([LogRegWorker.gradient(xs[i], ys[i], fast[i]) for i in range(3)])
        fast = renormalised @ fast
    assert np.abs(got[:3] - fast).max() < 1e-12

    # an insider sending a huge vector is screened out (own step norm is the filter's floor)
    def inflate(sender: str, message: Message) -> Message:
        assert isinstance(message, ParamPush)
        return ParamPush(round=message.round, tensors={k: v * 1e6 for k, v in message.tensors.items()},
                         meta=message.meta)

    topology = build(f"complete:{n}")
    workers = {name: LogRegWorker(xs[i], ys[i], lr, start) for i, name in enumerate(names)}
    machines = {name: make_machine(GossipConfig(**{**options, "deadline_s": 10.0}), name=name,
                                   topology=topology, params=workers[name].flat_params, seed=0)
                for name in names}
    driver = Driver(machines, workers, tamper={"p03": inflate})
    driver.start()
    assert driver.run()
    assert all(machines[name].counters["rejected_update"] == steps for name in names[:3])
    honest = np.stack([workers[name].flat_params.numpy() for name in names[:3]])
    assert np.abs(honest - fast).max() < 1e-12  # a rejected update is renormalised like a missing one


@pytest.mark.parametrize("algorithm", ["choco", "adpsgd"])
def test_after_is_refused_by_algorithms_that_mix_as_they_go(algorithm: str) -> None:
    with pytest.raises(ValueError, match="mixing 'after' is for algorithms dpsgd, local and pushsum"):
        GossipConfig(algorithm=algorithm, mixing="after")  # type: ignore[arg-type]


def test_mixing_must_be_overlap_or_after() -> None:
    with pytest.raises(ValueError, match="mixing must be one of overlap, after"):
        GossipConfig(mixing="before")  # type: ignore[arg-type]

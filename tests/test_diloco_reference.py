"""DiLoCo (``outer = "diloco"``) over D-PSGD, local SGD, CHOCO and push-sum, several outer steps,
against numpy: the inner algorithm's recursion plus a Nesterov outer step written out by hand.

Every ``outer_every`` local steps, right after that round's mixing, each peer takes

    d = anchor - x;  m = mu m + d;  anchor = anchor - lr_out (d + mu m);  x = anchor

with its own anchor (its start) and momentum (zero). The machines run through
tests/gossip_driver.py on full-batch logistic regression in float64, so the comparison is
exact to rounding. Asynchronous AD-PSGD is left out: its partner draws make no plain recursion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np
import pytest
from gossip_driver import Driver, LogRegWorker

from protocols.gossip import GossipConfig, make_machine
from topology import Topology, build, from_graph

LR = 0.3
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9
OUTER_EVERY = 4
TOTAL_STEPS = 12  # three outer steps
DIMENSION = 5
TOLERANCE = 1e-12


@dataclass(frozen=True)
class Case:
    algorithm: Any  # a protocols.gossip.config.Algorithm
    local_steps: int = 1
    options: tuple[tuple[str, object], ...] = ()

    def topology(self) -> Topology:
        if self.algorithm != "pushsum":
            return build("ring:6")
        # A directed ring plus two chords from p0: column stochastic with dyadic shares, rows not,
        # so the push-sum weights drift away from 1 and the de-biasing is exercised.
        graph = nx.DiGraph()
        graph.add_edges_from([(f"p{i}", f"p{(i + 1) % 8}") for i in range(8)] + [("p0", "p2"), ("p0", "p5")])
        return from_graph(graph)


CASES = [
    Case("dpsgd"),
    Case("local", local_steps=2),
    Case("choco", options=(("compression", "identity"), ("consensus_step", 0.5))),
    Case("pushsum"),
]


def logreg_data(n_peers: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=DIMENSION)
    xs, ys = [], []
    for i in range(n_peers):
        x = rng.normal(loc=0.3 * i, size=(40, DIMENSION))
        xs.append(x)
        ys.append((x @ truth + rng.normal(size=40) > 0).astype(np.float64))
    return xs, ys


# ---------------------------------------------------------------- the machines


def run_machines(case: Case, outer: Any, starts: np.ndarray, xs: list[np.ndarray], ys: list[np.ndarray]
                 ) -> tuple[np.ndarray, Driver]:
    topology = case.topology()
    names = topology.names
    workers = {n: LogRegWorker(xs[i], ys[i], LR, starts[i]) for i, n in enumerate(names)}
    options: dict[str, Any] = dict(case.options)
    config = GossipConfig(algorithm=case.algorithm, local_steps=case.local_steps, total_steps=TOTAL_STEPS,
                          outer=outer, outer_every=OUTER_EVERY, outer_lr=OUTER_LR,
                          outer_momentum=OUTER_MOMENTUM, **options)
    machines = {n: make_machine(config, name=n, topology=topology, params=workers[n].flat_params, seed=0)
                for n in names}
    driver = Driver(machines, workers)
    driver.start()
    driver.run()
    assert driver.finished == set(names)
    assert all(driver.steps[n] == TOTAL_STEPS for n in names)
    return np.stack([workers[n].flat_params.numpy() for n in names]), driver


# ---------------------------------------------------------------- numpy


OuterStep = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def nesterov(x: np.ndarray, anchor: np.ndarray, momentum: np.ndarray) -> None:
    """The outer step of the module docstring, every peer (row) at once, in place."""
    d = anchor - x
    momentum *= OUTER_MOMENTUM
    momentum += d
    anchor -= OUTER_LR * (d + OUTER_MOMENTUM * momentum)
    x[...] = anchor


def heavy_ball(x: np.ndarray, anchor: np.ndarray, momentum: np.ndarray) -> None:
    """A wrong outer step for the negative control: plain momentum, not Nesterov."""
    momentum *= OUTER_MOMENTUM
    momentum += anchor - x
    anchor -= OUTER_LR * momentum
    x[...] = anchor


def reference(case: Case, starts: np.ndarray, xs: list[np.ndarray], ys: list[np.ndarray], *,
              outer: OuterStep | None, outer_steps: int = TOTAL_STEPS // OUTER_EVERY) -> np.ndarray:
    """Rounds of the inner algorithm (sending before its local steps, as the machines do), with
    ``outer`` after the mixing of every round that completes ``OUTER_EVERY`` steps (the first
    ``outer_steps`` of them)."""
    w = case.topology().mixing(0)
    n = len(starts)
    h = case.local_steps
    x = starts.copy()
    anchor, momentum = starts.copy(), np.zeros_like(starts)
    x_hat = np.zeros_like(starts)  # CHOCO's public copies
    weight = np.ones(n)            # push-sum's weights
    gamma = dict(case.options).get("consensus_step", 1.0)
    taken = 0
    for r in range(TOTAL_STEPS // h):
        before = x.copy()
        for _ in range(h):
            x = x - LR * np.stack([LogRegWorker.gradient(xs[i], ys[i], x[i]) for i in range(n)])
        delta = x - before
        if case.algorithm in ("dpsgd", "local"):
            x = w @ before + delta
        elif case.algorithm == "choco":  # identity compression: q = x_before - x_hat
            x_hat = before.copy()
            x = x + gamma * (w @ x_hat - x_hat)
        else:  # push-sum: numerators w z mix by the column-stochastic W, then de-bias
            mixed_weight = w @ weight
            x = (w @ (weight[:, None] * before)) / mixed_weight[:, None] + delta
            weight = mixed_weight
        if outer is not None and (r + 1) * h % OUTER_EVERY == 0 and taken < outer_steps:
            outer(x, anchor, momentum)
            taken += 1
    return x


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c.algorithm for c in CASES])
def test_diloco_equals_the_inner_recursion_with_a_hand_computed_nesterov_step(case: Case) -> None:
    # Prepare
    n = len(case.topology().names)
    xs, ys = logreg_data(n, seed=3)
    starts = np.random.default_rng(4).normal(size=(n, DIMENSION))
    # Execute
    got, driver = run_machines(case, "diloco", starts, xs, ys)
    plain, _ = run_machines(case, "none", starts, xs, ys)
    # Assert: without DiLoCo the machines follow the bare recursion; with it, the outer steps too.
    assert not driver.rejections
    assert np.abs(plain - reference(case, starts, xs, ys, outer=None)).max() < TOLERANCE
    assert np.abs(got - reference(case, starts, xs, ys, outer=nesterov)).max() < TOLERANCE
    # Negative controls: no outer step, only the first one, or heavy-ball momentum are all far off.
    for wrong in (plain, reference(case, starts, xs, ys, outer=nesterov, outer_steps=1),
                  reference(case, starts, xs, ys, outer=heavy_ball)):
        assert np.abs(got - wrong).max() > 1e6 * TOLERANCE

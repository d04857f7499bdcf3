"""FedProx's proximal term in the trainer (Li et al. 2020): ``run_steps(n, proximal=(anchor, mu))``
adds ``mu (params - anchor)`` to every step's gradient, pulling the local model toward the
round's global model; with ``mu = 0`` the run is plain SGD, bit for bit. Both federation drivers
(the simulator's, ``hivemesh edge``) hand their client's anchor and mu to it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig
from protocols.rng import torch_generator

torch.set_num_threads(1)


def digits_trainer(**overrides: object) -> Trainer:
    config = TrainerConfig(device="cpu", lr=0.1, batch_size=32, **overrides)  # type: ignore[arg-type]
    return Trainer(get_task("digits-mlp"), config, np.arange(0, 600), seed=5, member_index=1)


def test_mu_zero_is_plain_sgd_bit_for_bit() -> None:
    # Prepare: two trainers from the same seed, an anchor elsewhere (it must not matter)
    plain, proximal = digits_trainer(), digits_trainer()
    anchor = torch.randn(plain.flat_params.shape, generator=torch_generator(0, "anchor", 0, "test"))
    # Execute
    losses = [plain.run_steps(7), proximal.run_steps(7, proximal=(anchor, 0.0)),
              plain.run_steps(5), proximal.run_steps(5, proximal=(None, 3.0))]   # no anchor: no pull
    # Assert
    assert torch.equal(plain.flat_params, proximal.flat_params)
    assert losses[0] == losses[1] and losses[2] == losses[3]


def test_one_step_adds_mu_times_the_distance_to_the_gradient() -> None:
    # Prepare: whole-shard batches in float64, so one step's gradient is the full-batch gradient
    task = get_task("logreg", n_samples=200, n_features=5, n_classes=3)
    trainer = Trainer(task, TrainerConfig(dtype="float64", lr=0.3, batch_size=0, device="cpu"),
                      np.arange(0, 200, 2), seed=7, member_index=0)
    trainer.run_steps(3)    # away from logreg's all-zero start
    start = trainer.flat_params.clone()
    anchor = torch.randn(start.shape, dtype=torch.float64, generator=torch_generator(0, "anchor", 1, "test"))
    mu = 0.7
    expected = start - 0.3 * (trainer.gradient() + mu * (start - anchor))
    # Execute
    trainer.run_steps(1, proximal=(anchor, mu))
    # Assert
    assert torch.allclose(trainer.flat_params, expected, rtol=0, atol=1e-12)


def test_the_pull_keeps_the_local_model_near_the_global_one() -> None:
    """The farther the local model may drift, the smaller mu: distance after 60 local steps falls
    as mu grows, and with lr * mu = 1 (each step restarts from the anchor) it stays within one
    step's gradient of it."""
    # Prepare
    distances = {}
    for mu in (0.0, 1.0, 10.0):
        trainer = digits_trainer()
        anchor = trainer.flat_params.clone()
        # Execute
        trainer.run_steps(60, proximal=(anchor, mu))
        distances[mu] = float(torch.linalg.vector_norm(trainer.flat_params - anchor))
    # Assert
    assert distances[0.0] > distances[1.0] > distances[10.0] > 0
    # lr * mu = 1: params = anchor - lr * g_task after each step, so at most lr times the largest
    # task gradient; the free run went much farther
    assert distances[10.0] < 0.25 * distances[0.0], distances


def test_a_bad_anchor_or_mu_is_refused() -> None:
    trainer = digits_trainer()
    with pytest.raises(ValueError, match="shape"):
        trainer.run_steps(1, proximal=(torch.zeros(3), 1.0))
    with pytest.raises(ValueError, match="mu"):
        trainer.run_steps(1, proximal=(trainer.flat_params.clone(), -1.0))


def test_the_simulators_federation_clients_feel_the_pull() -> None:
    """The simulator's driver hands its clients' anchor and ``prox_mu`` to the trainer (as
    ``hivemesh edge`` does): one round with lr * mu = 1 moves the global model far less."""
    from sim.federation import FederationRun
    from sim.scenario import scenario_from_dict

    moved = {}
    for mu in (0.0, 10.0):
        server = {"rounds": 1, "fraction": 1.0, "min_clients": 3, "local_epochs": 2, "seed": 3,
                  "prox_mu": mu}
        scenario = scenario_from_dict({
            "name": "prox", "seed": 3, "duration_s": 1000.0, "task": {"name": "digits-mlp"},
            "trainer": {"lr": 0.1, "batch_size": 32}, "partition": {"scheme": "iid"},
            "links": {"latency_ms": 5.0, "bandwidth_mbps": 100.0}, "nodes": {"step_time_ms": 10.0},
            "federation": {"gateways": 1, "clients": 3, "server": server}})
        run = FederationRun(scenario)
        run.run()
        [gateway] = run.gateways
        found = run.members[gateway].server
        assert found is not None and len(found.reports) == 1
        moved[mu] = float(torch.linalg.vector_norm(found.params - run.initial))
    assert 0 < moved[10.0] < 0.25 * moved[0.0], moved


def test_hivemesh_edge_trains_with_the_pull_of_its_round(tmp_path: Path) -> None:
    """The real edge client's driver (peer/runtime/edge.py) hands its round's anchor and ``prox_mu``
    to the trainer: one RoundStart fed to it by hand (no gateway: its update is counted unsent)
    with mu = 10 leaves the model far nearer the round's global model than with mu = 0."""
    from _federation_support import make_federation

    from peer.net.dial import DialTransport
    from peer.runtime.edge import EdgeClient
    from peer.runtime.edgeconfig import load_edge_config
    from protocols.messages import RoundStart

    files = make_federation(tmp_path / "fed", edges=2, rounds=1, min_clients=1)
    config = load_edge_config(files.edge_configs["e000"])
    moved = {}
    for mu in (0.0, 10.0):
        shutil.rmtree(config.data_dir, ignore_errors=True)     # the same start each time
        edge = EdgeClient(config)
        # the gateway's port is reserved (bound, listening) but nobody serves it
        edge.transport = DialTransport(edge.address, curve=edge.curve)
        try:
            edge._carry_out(edge.node.start(edge.now()))
            model = edge.trainer.flat_params.clone()
            start = RoundStart(round=0, tensors={"x": model}, deadline_s=30.0,
                               meta={"local_epochs": 0, "local_steps": 40, "prox_mu": mu})
            edge._carry_out(edge.node.receive("gw0", start, edge.now()))
            edge._train(edge._work.pop(0))
            moved[mu] = float(torch.linalg.vector_norm(edge.trainer.flat_params - model))
            assert edge.unsent["client_update"] == 1 and edge.client.prox_mu == mu
        finally:
            edge.transport.close()
            edge.lock.release()
    assert 0 < moved[10.0] < 0.25 * moved[0.0], moved

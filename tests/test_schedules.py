"""Schedules that mean what they say (issue 29, items 5 and g).

A federation client's learning-rate schedule counts the federation's global work (round, or
FedBuff's model version, times the round's local steps), not the client's own steps; a run
whose learning rate reaches 0 before its end says so once.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from pathlib import Path

import _federation_support as federation_support
import numpy as np
import pytest
from _daemon_support import CEILING_S, describe, make_network, peers, status

from peer.cli.init import default_network
from peer.cli.main import main
from peer.cli.status import render
from peer.files.statefiles import StatusWriter
from peer.runtime.netinit import create_federation
from peer.train.federated import round_schedule
from peer.train.tasks import get_task
from peer.train.trainer import FlatOptimizer, SchedulePoint, Trainer, TrainerConfig, lr_at
from sim.comparison import run_warnings, trainer_warnings
from sim.federation import FederationRun
from sim.from_network import scenario_from_federation_files

ROUNDS = 30
LOCAL_EPOCHS = 2
LR = 0.1   # hivemesh init's rate for digits-mlp


def _cosine(step: int, total_steps: int) -> float:
    return LR * 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total_steps)))


def test_a_round_sits_after_the_federations_earlier_rounds_on_the_schedule() -> None:
    # 30 rounds of 8 local steps: without a written horizon the schedule spans them all
    spanning = TrainerConfig(lr=LR, lr_decay="cosine")
    written = TrainerConfig(lr=LR, lr_decay="cosine", total_steps=100)
    assert round_schedule(spanning, round_index=0, rounds=30, steps=8) == SchedulePoint(0, 240)
    assert round_schedule(spanning, round_index=29, rounds=30, steps=8) == SchedulePoint(232, 240)
    assert round_schedule(written, round_index=29, rounds=30, steps=8) == SchedulePoint(232, 100)
    assert lr_at(spanning, 239, 240) == pytest.approx(_cosine(239, 240)) and lr_at(spanning, 239, 240) > 0
    with pytest.raises(ValueError, match="needs total_steps"):   # no horizon: no decaying rate to give
        lr_at(spanning, 0)


def _init_federation(out: Path, mode: str, trainer: str = "") -> FederationRun:
    """The federation `hivemesh init --gateways 1 --edges 5` writes, with 2 local epochs a round
    (and ``trainer``'s lines added to its [network.trainer])."""
    assert main(["init", "--gateways", "1", "--edges", "5", "--rounds", str(ROUNDS), "--out", str(out)]) == 0
    for config in out.glob("*.toml"):
        text = config.read_text().replace("local_epochs = 1", f"local_epochs = {LOCAL_EPOCHS}")
        text = text.replace("[network.trainer]\n", f"[network.trainer]\n{trainer}")
        config.write_text(text.replace("[federation]\n", f'[federation]\nmode = "{mode}"\n')
                          if config.name != "roster.toml" else text)
    scenario = scenario_from_federation_files(out / "gw0.toml", sorted(out.glob("e*.toml")),
                                              duration_s=36000.0, nodes={"step_time_ms": 10.0},
                                              links={"latency_ms": 1.0})
    return FederationRun(scenario)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "fedbuff"])
def test_a_federation_of_init_defaults_trains_its_last_round_at_the_schedules_global_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # Prepare: every optimiser step's rate, with the round (FedBuff: model version) its client trains
    run = _init_federation(tmp_path / "fed", mode)
    owner = {id(m.trainer._optimizer): m for m in run.members.values() if m.trainer is not None}
    rates: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    apply = FlatOptimizer.apply

    def recording(self: FlatOptimizer, params: object, grads: object, lr: float) -> None:
        member = owner[id(self)]
        assert member.client is not None
        rates[member.name][member.client.round].append(lr)
        apply(self, params, grads, lr)  # type: ignore[arg-type]

    monkeypatch.setattr(FlatOptimizer, "apply", recording)
    # Execute
    result = run.run()
    # Assert: each client's steps of round r sit at r * w ... r * w + w - 1 of a schedule of
    # ROUNDS * w steps (w: its local steps a round), whichever rounds it was asked into
    last = max(r for by_round in rates.values() for r in by_round)
    assert last >= ROUNDS - 3, last       # FedBuff's versions: the last few are made by others' updates
    in_last = [name for name, by_round in rates.items() if last in by_round]
    assert in_last, dict(rates)
    for name, by_round in rates.items():
        work = run.members[name].trainer.steps_per_epoch * LOCAL_EPOCHS  # type: ignore[union-attr]
        for round_index, lrs in by_round.items():
            expected = [_cosine(round_index * work + i, ROUNDS * work) for i in range(work)]
            times = len(lrs) // work   # FedBuff may ask a client twice from one model version
            assert lrs == pytest.approx(expected * times, rel=1e-12, abs=0.0), (name, round_index)
    for name in in_last:
        assert min(rates[name][last]) > 0.0, (name, rates[name][last])
    assert trainer_warnings(result) == []


def test_a_simulated_federation_whose_learning_rate_reaches_zero_early_warns_in_one_line(
        tmp_path: Path) -> None:
    # Prepare: init's federation with a horizon of 20 schedule steps written (round 0 or 1 reaches it)
    run = _init_federation(tmp_path / "fed", "sync", trainer="total_steps = 20\n")
    # Execute
    result = run.run()
    # Assert: every client that trained warned; the run's warnings say it once, for all of them
    clients = [name for name, peer in result.peers.items() if peer.get("role") == "client"]
    assert len(clients) == 5 and all(len(result.peers[name]["warnings"]) == 1 for name in clients)
    said = [line for line in run_warnings(result) if "learning rate reached 0" in line]
    assert len(said) == 1 and said[0].startswith("5 of 5 members' trainers warned; the first: e000: "), said
    assert "total_steps = 20" in said[0], said


def _trainer(total_steps: int) -> Trainer:
    config = TrainerConfig(lr=LR, lr_decay="cosine", total_steps=total_steps, batch_size=8, threads=1)
    return Trainer(get_task("logreg"), config, np.arange(64), seed=0, member_index=0)


def test_a_learning_rate_that_reaches_zero_before_the_end_is_warned_exactly_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: a horizon of 6 steps, trained for 4 rounds of 3 (the last two rounds at lr 0)
    trainer = _trainer(total_steps=6)
    writer = StatusWriter(tmp_path, name="p00", progress=False)
    said: list[list[str]] = []
    # Execute: what a driver does after each round's work
    with caplog.at_level(logging.WARNING):
        for _ in range(4):
            trainer.run_steps(3)
            said.append(trainer.warnings())
            for text in trainer.warnings():
                writer.warn_once(f"p00: warning: {text}")
    # Assert: nothing while the rate is above 0; from step 6 on, the same one line; said once
    assert said[:2] == [[], []] and said[2] == said[3] and len(said[2]) == 1, said
    assert "reached 0 at step 6" in said[2][0] and "total_steps = 6" in said[2][0]
    lines = [r.getMessage() for r in caplog.records if "learning rate reached 0" in r.getMessage()]
    assert lines == [f"p00: warning: {said[2][0]}"]


def test_a_schedule_that_lasts_the_run_warns_nothing() -> None:
    # negative control: 12 steps of a 12-step horizon never train at lr 0
    trainer = _trainer(total_steps=12)
    trainer.run_steps(12)
    assert trainer.warnings() == []


@pytest.mark.processes
def test_a_gossip_peer_whose_learning_rate_reaches_zero_early_warns_once_in_status_and_log(
        tmp_path: Path) -> None:
    # Prepare: 40 gossip steps, a cosine schedule over 10
    files = make_network(tmp_path / "net", peers=2, topology="complete", steps=40,
                         trainer={"total_steps": 10})
    # Execute
    with peers(files) as processes:
        processes.start_all()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    # Assert
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    for name in files.configs:
        found = [w for w in status(files, name)["warnings"] if "learning rate reached 0" in w]
        assert len(found) == 1 and "at step 10 " in found[0], status(files, name)["warnings"]
        assert status(files, name)["lr"] == 0.0
        assert render(status(files, name)).count(f"  warning: {found[0]}") == 1    # hivemesh status
        log = (files.out / "data" / name / "peer.log").read_text()
        assert log.count("learning rate reached 0") == 1, log


@pytest.mark.processes
def test_an_edge_whose_learning_rate_reaches_zero_early_warns_once_in_status_and_log(tmp_path: Path) -> None:
    # Prepare: 3 rounds of 2 local steps for both clients, a cosine schedule written over 3 steps
    network = default_network(topology="ring", task="digits-mlp", algorithm="dpsgd", compression="identity",
                              steps=300, seed=0)
    network["trainer"]["total_steps"] = 3
    files = create_federation(tmp_path / "fed", gateways=1, edges=2, network=network, reserve=True,
                              federation={"rounds": 3, "fraction": 1.0, "min_clients": 2, "local_epochs": 0,
                                          "local_steps": 2, "round_timeout_s": 30.0},
                              peer_options=federation_support.GATEWAY_OPTIONS,
                              edge_options=federation_support.EDGE_OPTIONS)
    # Execute
    with federation_support.processes(files) as run:
        run.start_all()
        finished = run.wait(CEILING_S)
        codes = run.exitcodes()
    # Assert: rounds 1 and 2 train at lr 0 from global step 3 on; each client says it once
    assert finished and all(code == 0 for code in codes.values()), codes
    for name in files.edge_configs:
        warnings = federation_support.status(files, name)["warnings"]
        found = [w for w in warnings if "learning rate reached 0" in w]
        assert len(found) == 1 and "at step 3 " in found[0], warnings
        edge = federation_support.status(files, name)
        assert (edge["lr"], edge["schedule_step"]) == (0.0, 2 * 2 + 1), edge   # round 2's last step
        shown = render(edge)                                                    # hivemesh status
        assert "learning rate 0 at schedule step 5 " in shown and shown.count(f"  warning: {found[0]}") == 1
        log = (files.network.out / "data" / name / "peer.log").read_text()
        assert log.count("learning rate reached 0") == 1, log


@pytest.mark.processes
def test_edges_train_the_last_round_at_the_schedules_global_step_whatever_rounds_they_were_asked_into(
        tmp_path: Path) -> None:
    # Prepare: init's federation (cosine, no written horizon), 3 edges of which each round asks 2,
    # 30 rounds of 2 local epochs
    files = federation_support.init_federation(tmp_path / "fed", edges=3, rounds=ROUNDS, fraction=0.5,
                                               min_clients=2, local_epochs=LOCAL_EPOCHS)
    # Execute
    with federation_support.processes(files) as run:
        run.start_all()
        finished = run.wait(CEILING_S)
        codes = run.exitcodes()
    # Assert: each edge's last step sat at round * w + w - 1 of a schedule of ROUNDS * w steps (w: its
    # local steps a round), at that point's rate, whatever rounds it skipped; the last round's is > 0
    assert finished and all(code == 0 for code in codes.values()), \
        f"{codes}\n{federation_support.describe(files)}"
    edges = {name: federation_support.status(files, name) for name in files.edge_configs}
    print("\n" + "\n".join(f"{name}: rounds trained {edge['rounds_trained']}, last round "
                            f"{edge['last_round_asked']}, schedule step {edge['schedule_step']}, "
                            f"lr {edge['lr']:.3g}"
                            for name, edge in edges.items()))
    for name, edge in edges.items():
        work = math.ceil(edge["num_samples"] / 32) * LOCAL_EPOCHS     # init's batch_size: 32
        assert edge["schedule_step"] == edge["last_round_asked"] * work + work - 1, (name, edge, work)
        assert edge["lr"] == pytest.approx(_cosine(edge["schedule_step"], ROUNDS * work), rel=1e-12), name
        assert edge["step"] == edge["rounds_trained"] * work and edge["warnings"] == [], edge
    last = [edge for edge in edges.values() if edge["last_round_asked"] == ROUNDS - 1]
    assert last and all(edge["lr"] > 0.0 for edge in last), edges
    skipped = [name for name, edge in edges.items() if edge["rounds_trained"] < ROUNDS]
    assert skipped, {name: edge["rounds_trained"] for name, edge in edges.items()}   # sampling did its part

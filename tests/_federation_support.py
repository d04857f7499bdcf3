"""Helpers for the process tests of a federation (one or more gateways, ``hivemesh edge`` clients):
make one, run it, read what it left.

Each test writes its federation with ``make_federation`` (the gateway's port reserved and
handed to it), starts every process through ``processes(files)`` and waits on the files they
write (status, hook marks), never on the clock; its ceilings are ones a healthy run never reaches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peer.cli.init import default_federation, federation_network
from peer.files.statefiles import read_status
from peer.runtime.launch import PeerProcesses
from peer.runtime.netinit import FederationFiles, create_federation

CEILING_S = 240.0
GATEWAY = "gw0"
# acceptance (a): 30 rounds of 5 of 10 clients, 2 local epochs, digits-mlp on Dirichlet(0.3) shards
FEDERATION = {"rounds": 30, "fraction": 0.5, "min_clients": 5, "local_epochs": 2, "max_samples": 1000,
              "round_timeout_s": 30.0, "seed": 3}
GATEWAY_OPTIONS = {"progress": False, "eval_every_steps": 0, "heartbeat_interval_s": 0.5,
                   "neighbour_timeout_s": 30.0, "start_timeout_s": 120.0, "finish_grace_s": 2.0}
EDGE_OPTIONS = {"progress": False, "heartbeat_interval_s": 0.5, "neighbour_timeout_s": 30.0}


def make_federation(folder: Path, *, edges: int = 10, gateways: int = 1, partition: str = "dirichlet",
                    edge_options: dict[str, Any] | None = None, gateway_options: dict[str, Any] | None = None,
                    **federation: Any) -> FederationFiles:
    """A digits-mlp federation in ``folder`` (Dirichlet(0.3) shards unless ``partition`` says
    otherwise); ``federation``: [federation] keys over :data:`FEDERATION`; ``edge_options``: [edge]
    keys over :data:`EDGE_OPTIONS`; ``gateway_options``: [peer] keys over :data:`GATEWAY_OPTIONS`."""
    network = federation_network(task="digits-mlp", seed=3, gateways=gateways, partition=partition, alpha=0.3)
    network["trainer"] = {"optimizer": "sgd", "lr": 0.1, "batch_size": 32, "lr_decay": "none"}
    return create_federation(folder, gateways=gateways, edges=edges, network=network,
                             federation={**FEDERATION, **federation}, reserve=True,
                             peer_options={**GATEWAY_OPTIONS, **(gateway_options or {})},
                             edge_options={**EDGE_OPTIONS, **(edge_options or {})})


def processes(files: FederationFiles) -> PeerProcesses:
    net = files.network
    return PeerProcesses(net.configs, listeners=dict(net.listeners), edges=files.edge_configs)


def status(files: FederationFiles, name: str) -> dict[str, Any]:
    return read_status(files.network.out / "data" / name) or {}


def wait_until(what: str, condition: Callable[[], bool], files: FederationFiles,
               timeout_s: float = CEILING_S) -> None:
    """Wait (on the files the processes write) until ``condition()``; fail with the gateway's story."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s\n{describe(files)}")


def describe(files: FederationFiles) -> str:
    gateway = status(files, GATEWAY)
    fed = gateway.get("federation", {})
    log = files.network.out / "data" / GATEWAY / "peer.log"
    tail = "\n".join(log.read_text().splitlines()[-8:]) if log.exists() else "(no log)"
    return (f"gateway: state {gateway.get('state')}, round {fed.get('round')}, phase {fed.get('phase')}, "
            f"registered {fed.get('registered')}, counters {fed.get('counters')}\n{tail}")


def closed_rounds(files: FederationFiles) -> dict[int, dict[str, Any]]:
    """The gateway's closed rounds (``rounds.jsonl``: one report per line), by round."""
    path = files.network.out / "data" / GATEWAY / "rounds.jsonl"
    return {row["round"]: row for row in map(json.loads, path.read_text().splitlines())}


def init_federation(folder: Path, *, edges: int, rounds: int, edge_options: dict[str, Any] | None = None,
                    partition: str = "dirichlet", **federation: Any) -> FederationFiles:
    """`hivemesh init --gateways 1 --edges N`'s federation in ``folder``: its [network] and
    [federation] tables (its CLI defaults, seed 0), ``federation`` keys over them, round 0 waiting for
    every edge (``min_registered``: which edges a round asks then does not depend on start-up
    timing), the test timings of GATEWAY_OPTIONS and EDGE_OPTIONS (``edge_options``: [edge] keys
    over them; ``partition``: init's ``--partition``)."""
    network = federation_network(task="digits-mlp", seed=0, gateways=1, partition=partition)
    table = {**default_federation(rounds=rounds, gateways=1, edges=edges, seed=0), "min_registered": edges,
             **federation}
    return create_federation(folder, gateways=1, edges=edges, network=network, federation=table,
                             reserve=True, peer_options=GATEWAY_OPTIONS,
                             edge_options={**EDGE_OPTIONS, **(edge_options or {})})


def simulated_accuracy(files: FederationFiles, last_rounds: int) -> float:
    """The simulator's run of the same files, with no attacker (the clean run): the mean accuracy of
    its global model over its last ``last_rounds`` rounds."""
    from sim.federation import FederationRun
    from sim.from_network import scenario_from_federation_files

    scenario = scenario_from_federation_files(
        files.network.configs[GATEWAY], list(files.edge_configs.values()), duration_s=3600.0,
        nodes={"step_time_ms": 10.0}, links={"latency_ms": 1.0})
    trace = FederationRun(scenario).run().trace
    return sum(t.mean_accuracy for t in trace[-last_rounds:]) / last_rounds

"""Helpers for the process tests of the peer daemon: make a network, run it, read what it left."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from peer.cmd_init import default_network
from peer.export import latest_params
from peer.netinit import NetworkFiles, create_network
from peer.peerconfig import load_peer_config
from peer.statefiles import read_status

# Fast, safe timings for 8 processes on a busy 2-core machine.
TEST_PEER_OPTIONS = {"progress": False, "eval_every_steps": 0, "heartbeat_interval_s": 0.5,
                     "neighbour_timeout_s": 3.0, "start_timeout_s": 60.0, "finish_grace_s": 2.0}


def make_network(folder: Path, *, peers: int = 8, topology: str = "ring", algorithm: str = "dpsgd",
                 compression: str = "identity", steps: int = 300, gossip: Mapping[str, Any] | None = None,
                 trainer: Mapping[str, Any] | None = None, peer_options: Mapping[str, Any] | None = None,
                 sections: Mapping[str, Mapping[str, Any]] | None = None) -> NetworkFiles:
    network = default_network(topology=topology, task="digits-mlp", algorithm=algorithm,
                              compression=compression, steps=steps, seed=0)
    network["gossip"].update(gossip or {})
    network["trainer"].update(trainer or {})
    return create_network(folder, peers=peers, network=network,
                          peer_options={**TEST_PEER_OPTIONS, **(peer_options or {})}, sections=sections)


def status(files: NetworkFiles, name: str) -> dict[str, Any]:
    found = read_status(files.out / "data" / name)
    assert found is not None, f"{name} wrote no status"
    return found


def wait_for_step(files: NetworkFiles, names: list[str], step: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [read_status(files.out / "data" / n) for n in names]
        if all(s is not None and s.get("step", 0) >= step for s in found):
            return
        time.sleep(0.2)
    raise AssertionError(f"peers {names} did not reach step {step} in {timeout_s} s")


def final_params(files: NetworkFiles) -> dict[str, torch.Tensor]:
    return {name: latest_params(load_peer_config(path))[0].to(torch.float64)
            for name, path in files.configs.items()}


def consensus_distance(params: Mapping[str, torch.Tensor]) -> float:
    stacked = torch.stack(list(params.values()))
    mean = stacked.mean(dim=0)
    return float(torch.linalg.vector_norm(stacked - mean, dim=1).max() / torch.linalg.vector_norm(mean))


def log_tail(files: NetworkFiles, name: str, lines: int = 15) -> str:
    path = files.out / "data" / name / "peer.log"
    return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else "(no log)"


def describe(files: NetworkFiles) -> str:
    """Everything useful when a process test fails."""
    parts = []
    for name in files.configs:
        found = read_status(files.out / "data" / name) or {}
        keys = ("state", "step", "accuracy", "rejections", "metrics", "unreachable")
        brief = {k: found.get(k) for k in keys}
        parts.append(f"{name}: {json.dumps(brief)}\n{log_tail(files, name, 6)}")
    return "\n".join(parts)

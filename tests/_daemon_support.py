"""Helpers for the process tests of the peer daemon: make a network, run it, read what it left.

Process tests place their faults on the peers' progress (peer.runtime.testhooks), not on
the wall clock, and their timeouts are ceilings a healthy run never reaches:
``TEST_PEER_OPTIONS`` gives a neighbour 30 s of silence before it is reported
down, and a test that needs every round complete asserts ``no_neighbour_lost``.
Ports are reserved (bound and kept) before the roster is written, and each
peer adopts its own socket (``peers(files)``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from peer.cli.init import default_network
from peer.files.statefiles import read_status
from peer.runtime.datalock import LOCK_FILE
from peer.runtime.export import latest_params
from peer.runtime.launch import PeerProcesses
from peer.runtime.netinit import NetworkFiles, create_network
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import Hook
from protocols.consensus import max_relative_distance

# Timings for 8 processes on a busy 2-core machine: fast heartbeats, and silences a healthy run never
# reaches (a 3 s stall of a loaded machine must not look like a dead neighbour).
TEST_PEER_OPTIONS = {"progress": False, "eval_every_steps": 0, "heartbeat_interval_s": 0.5,
                     "neighbour_timeout_s": 30.0, "start_timeout_s": 120.0, "finish_grace_s": 2.0}
CEILING_S = 240.0     # the longest any wait in a process test may take; a healthy run takes far less


def make_network(folder: Path, *, peers: int = 8, topology: str = "ring", algorithm: str = "dpsgd",
                 compression: str = "identity", steps: int = 300, gossip: Mapping[str, Any] | None = None,
                 trainer: Mapping[str, Any] | None = None, peer_options: Mapping[str, Any] | None = None,
                 sections: Mapping[str, Mapping[str, Any]] | None = None, task: str = "digits-mlp",
                 task_options: Mapping[str, Any] | None = None) -> NetworkFiles:
    network = default_network(topology=topology, task=task, algorithm=algorithm,
                              compression=compression, steps=steps, seed=0)
    if task_options:
        network["task_options"] = dict(task_options)
    network["gossip"].update(gossip or {})
    network["trainer"].update(trainer or {})
    return create_network(folder, peers=peers, network=network,
                          peer_options={**TEST_PEER_OPTIONS, **(peer_options or {})}, sections=sections,
                          reserve=True)


def peers(files: NetworkFiles, names: Iterable[str] | None = None, *, schedule: str = "") -> PeerProcesses:
    """The peer processes of ``files`` (``names``: a subset), each adopting its reserved port;
    ``schedule``: a fault schedule for all (``peer.runtime.testhooks.schedule_json``)."""
    chosen = list(names) if names is not None else list(files.configs)
    return PeerProcesses({n: files.configs[n] for n in chosen},
                         listeners={n: files.listeners[n] for n in chosen if n in files.listeners},
                         schedule=schedule)


def run_to_end(files: NetworkFiles) -> dict[str, dict[str, Any]]:
    """Start every peer of ``files``, wait until all have exited 0, and return their statuses."""
    with peers(files) as processes:
        processes.start_all()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    return {name: status(files, name) for name in files.configs}


@dataclass(frozen=True)
class HandRun:
    """Peers started by hand (``hivemesh peer`` processes) on the network files in ``out``."""

    out: Path
    codes: Sequence[int | None]
    outputs: Sequence[str]


PORT_TAKEN = "Address already in use"


def retry_if_port_taken(attempt: Callable[[int], HandRun], tries: int = 3) -> HandRun:
    """``attempt(i)`` again (a new network, new ports) while a peer of it could not listen because
    another process took its port after ``hivemesh init`` wrote it down: an operator's init only
    writes ports down, so that race is the test machine's, not the code's. Nothing else is retried."""
    for index in range(tries):
        run = attempt(index)
        if not any(code == 2 and PORT_TAKEN in output for code, output in zip(run.codes, run.outputs,
                                                                                  strict=True)):
            return run
    return run


def set_peer_option(config: Path, key: str, value: str) -> None:
    """Set one key of a peer config's [peer] table (written there by make_network, or added)."""
    text = config.read_text()
    line = re.compile(rf"^{key} = .*$", re.MULTILINE)
    text = (line.sub(f"{key} = {value}", text, count=1) if line.search(text)
            else text.replace("[peer]\n", f"[peer]\n{key} = {value}\n", 1))
    config.write_text(text)


def hold_at(step: int, gate: Path, marks: Path, name: str) -> Hook:
    """A hook that holds ``name``'s training at ``step`` until ``gate`` exists; it marks the moment."""
    return Hook(at_step=step, action="hold", gate=str(gate), mark=str(marks / f"{name}-held-{step}"))


def wait_for_files(paths: Iterable[Path], timeout_s: float = CEILING_S) -> None:
    """Wait until every path exists (what a hook or a peer creates when an event happened)."""
    waiting = list(paths)
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        waiting = [p for p in waiting if not p.exists()]
        time.sleep(0.05)
    assert not waiting, f"never appeared in {timeout_s} s: {[str(p) for p in waiting]}"


def wait_for_locks(files: NetworkFiles, processes: PeerProcesses, names: list[str]) -> None:
    """Wait until each peer holds its data directory (peer.runtime.datalock): it is assembled and about to
    listen. The ceiling is one a healthy start never reaches."""
    deadline = time.monotonic() + CEILING_S
    waiting = list(names)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        waiting = [n for n in waiting if not _holds_lock(files, n, processes.processes[n].pid)]
    assert not waiting, f"never took their data directories in {CEILING_S} s: {waiting}\n{describe(files)}"


def _holds_lock(files: NetworkFiles, name: str, pid: int | None) -> bool:
    lock = files.out / "data" / name / LOCK_FILE
    return lock.exists() and lock.read_text().strip() == str(pid)


def wait_for_log(files: NetworkFiles, name: str, text: str, timeout_s: float = CEILING_S) -> str:
    """Wait until ``name``'s log contains ``text``; return the log."""
    path = files.out / "data" / name / "peer.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = path.read_text() if path.exists() else ""
        if text in found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{name} never logged {text!r} in {timeout_s} s:\n{log_tail(files, name)}")


def no_neighbour_lost(files: NetworkFiles) -> None:
    """Every peer heard every neighbour all along: no round went without one (nothing timed out)."""
    for name in files.configs:
        found = status(files, name)
        assert found.get("neighbour_down", {}) == {}, f"{name}: {found.get('neighbour_down')}"
        assert found.get("absent_at_start", {}) == {}, f"{name}: {found.get('absent_at_start')}"
        assert found["metrics"].get("missed_deadline", 0) == 0, f"{name}: a round missed its deadline"


def status(files: NetworkFiles, name: str) -> dict[str, Any]:
    found = read_status(files.out / "data" / name)
    assert found is not None, f"{name} wrote no status"
    return found


def wait_for_step(files: NetworkFiles, names: list[str], step: int, timeout_s: float = CEILING_S) -> None:
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


def consensus_max_relative(params: Mapping[str, torch.Tensor]) -> float:
    """max_i ||x_i - mean|| / ||mean|| over every peer (the measure of a peer's status estimate)."""
    return max_relative_distance(list(params.values()))


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


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines file a process is appending to (``rounds.jsonl``), in the
    order written; a line still being written ends the list. [] while the file does not exist."""
    found = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            found.append(json.loads(line))
        except ValueError:
            break
    return found

"""Helpers for the multi-host tests (issue 16): peers started on hosts (tests/_netns.py) the way an
operator starts them, and what they left behind.

A network is made with ``hivemesh init --hosts`` (one address per member, port
``PORT`` on each host), and each peer is a ``hivemesh peer --config NAME.toml``
process on its host, with the process tests' timings given as ``--set`` (an
operator's overrides): a neighbour is reported down after 30 s of silence, and
status.json is refreshed every 0.2 s so that a test reads fresh steps. Each
peer's output goes to ``DATA_DIR/peer.log``, as with the loopback helpers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from _daemon_support import CEILING_S, TEST_PEER_OPTIONS
from _netns import Hosts

from peer.cli.main import main
from peer.files.statefiles import read_status
from peer.runtime.export import latest_params
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import ENVIRONMENT_VARIABLE, Hook, hooks_json

PORT = 7000     # every host's peer listens here (hosts have addresses of their own)
OPTIONS = {**TEST_PEER_OPTIONS, "status_interval_s": 0.2}
REPO = Path(__file__).resolve().parents[1]
ENVIRONMENT = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def init_network(hosts: Hosts, out: Path, *, steps: int, peers: int = 0,
                 extra: Sequence[str] = ()) -> list[str]:
    """``hivemesh init --hosts``: one peer on each of the first ``peers`` hosts (0: all); the names."""
    peers = peers or len(hosts.names)
    assert main(["init", "--peers", str(peers), "--out", str(out), "--steps", str(steps),
                 "--hosts", ",".join(hosts.addresses[:peers]), "--base-port", str(PORT), *extra]) == 0
    return [f"p{i:02d}" for i in range(peers)]


def peer_command(config: Path) -> list[str]:
    """``hivemesh peer`` with the process tests' timings (``--set``, as an operator tunes a peer)."""
    sets = [f"peer.{key}={str(value).lower() if isinstance(value, bool) else value}"
            for key, value in OPTIONS.items()]
    return [sys.executable, "-m", "peer", "peer", "--config", str(config), "--quiet",
            *(arg for item in sets for arg in ("--set", item))]


def start_peer(hosts: Hosts, index: int, out: Path, name: str,
               hooks: Sequence[Hook] = ()) -> subprocess.Popen[bytes]:
    """Peer ``name`` on host ``index``, with test ``hooks`` for this run of it (peer/runtime/testhooks.py);
    killed by ``hosts.close()`` if still running."""
    data = out / "data" / name
    data.mkdir(parents=True, exist_ok=True)
    return hosts.popen(index, peer_command(out / f"{name}.toml"), log=data / "peer.log",
                       env={**os.environ, **ENVIRONMENT, ENVIRONMENT_VARIABLE: hooks_json(hooks)}, cwd=out)


def steps(out: Path, names: Sequence[str]) -> dict[str, int]:
    """Each peer's step, from its status.json (0 before it wrote one)."""
    return {name: int((read_status(out / "data" / name) or {}).get("step", 0)) for name in names}


def wait_for_step(out: Path, names: Sequence[str], step: int,
                  processes: Mapping[str, subprocess.Popen[bytes]]) -> None:
    """Wait until every peer is at ``step`` or later; fails at once if a process exited."""
    deadline = time.monotonic() + CEILING_S
    while min(steps(out, names).values()) < step:
        assert time.monotonic() < deadline, f"not all at step {step} in {CEILING_S} s: {steps(out, names)}"
        assert not [n for n, p in processes.items() if p.poll() is not None], describe(out, names)
        time.sleep(0.1)


def wait_for_exit(processes: Mapping[str, subprocess.Popen[bytes]]) -> dict[str, int | None]:
    """Wait (up to the ceiling) for every process to exit; their exit codes."""
    deadline = time.monotonic() + CEILING_S
    for process in processes.values():
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    return {name: process.returncode for name, process in processes.items()}


def final_params(out: Path, names: Sequence[str]) -> dict[str, torch.Tensor]:
    return {name: latest_params(load_peer_config(out / f"{name}.toml"))[0].to(torch.float64)
            for name in names}


def describe(out: Path, names: Sequence[str]) -> str:
    """Everything useful when a multi-host test fails."""
    parts = []
    for name in names:
        log = out / "data" / name / "peer.log"
        tail = "\n".join(log.read_text().splitlines()[-8:]) if log.exists() else "(no log)"
        found = read_status(out / "data" / name) or {}
        links = {key: found.get(key) for key in ("transport_refused", "transport_connections", "redialed",
                                                  "unreachable", "abandoned_sends", "neighbour_down")}
        parts.append(f"{name}: step {found.get('step')} accuracy {found.get('accuracy')} "
                     f"metrics {found.get('metrics')} rejections {found.get('rejections')} {links}\n{tail}")
    return "\n".join(parts)


def wait_until(what: str, ready: Callable[[], object], processes: Mapping[str, subprocess.Popen[bytes]],
               why: Callable[[], str]) -> None:
    """Poll ``ready()`` until true (up to the ceiling); fails at once if a process exited (says ``why()``)."""
    deadline = time.monotonic() + CEILING_S
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not in {CEILING_S} s\n{why()}"
        exited = {n: p.returncode for n, p in processes.items() if p.poll() is not None}
        assert not exited, f"{what}: exited {exited}\n{why()}"
        time.sleep(0.05)

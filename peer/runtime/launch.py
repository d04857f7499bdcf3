"""Start several peer daemons on this machine, as processes, cheaply.

A new Python process that imports torch takes about 3.6 s here, so peers are
forked from a ``forkserver`` that has imported torch and the daemon once
(``set_forkserver_preload``); each peer then starts in a fraction of a second
with one torch thread. Used by ``hivemesh demo`` and the process tests. Each
peer's stdout and stderr go to ``DATA_DIR/peer.log``.

Listening sockets: given ``listeners`` (peer.net.transport.reserve_listeners), a
peer adopts its bound socket instead of binding its address itself, so the
port is never free for another process to take, not even across a restart.
Test hooks (peer.runtime.testhooks) are passed per start.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from peer.runtime.testhooks import (
    ENVIRONMENT_VARIABLE,
    PROTOCOL_VARIABLE,
    SCHEDULE_VARIABLE,
    Hook,
    hooks_json,
)

PRELOAD = ["torch", "sklearn.datasets", "peer.runtime.daemon", "peer.train.trainer", "peer.train.tasks",
           "peer.train.tasks.digits", "peer.train.partition", "protocols.wire", "protocols.gossip"]

_context: multiprocessing.context.ForkServerContext | None = None


def context() -> multiprocessing.context.ForkServerContext:
    """The forkserver context, with torch and the daemon preloaded (started on first use)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _peer_main(config_path: str, log_path: str, quiet: bool, listener: socket.socket | None,
               hooks: str, schedule: str, protocol_version: int | None = None) -> None:
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives as long as the process)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    import torch

    torch.set_num_threads(1)
    from peer.runtime.peerprocess import run_peer

    os.environ[ENVIRONMENT_VARIABLE] = hooks
    if schedule:
        os.environ[SCHEDULE_VARIABLE] = schedule
    if protocol_version is not None:
        os.environ[PROTOCOL_VARIABLE] = str(protocol_version)
    listen_fd = listener.detach() if listener is not None else None
    code = run_peer(config_path, quiet=quiet, listen_fd=listen_fd)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _edge_main(config_path: str, log_path: str, quiet: bool, hooks: str) -> None:
    """An edge client (``hivemesh edge``) in a child: it has no listening socket to adopt."""
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives as long as the process)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    import torch

    torch.set_num_threads(1)
    from peer.runtime.edge import run_edge

    os.environ[ENVIRONMENT_VARIABLE] = hooks
    code = run_edge(config_path, quiet=quiet)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class PeerProcesses:
    """A set of peer processes started from config files; ``close()`` kills whatever still runs."""

    def __init__(self, configs: Mapping[str, Path], *, quiet: bool = True,
                 listeners: Mapping[str, socket.socket] | None = None, schedule: str = "",
                 edges: Mapping[str, Path] | None = None) -> None:
        """``listeners``: per peer, a socket bound to its roster address; closed by ``close()``;
        ``schedule``: a test's fault schedule for every peer (``testhooks.schedule_json``);
        ``edges``: edge clients' configs (``hivemesh edge``), started and stopped like the peers."""
        self.configs = {**dict(configs), **dict(edges or {})}
        self.edges = frozenset(edges or {})
        self.schedule = schedule
        self.quiet = quiet
        self.listeners = dict(listeners or {})
        self.processes: dict[str, multiprocessing.process.BaseProcess] = {}

    def log_path(self, name: str) -> Path:
        from peer.runtime.edgeconfig import load_edge_config
        from peer.runtime.peerconfig import load_peer_config

        if name in self.edges:
            data_dir = load_edge_config(self.configs[name]).data_dir
        else:
            data_dir = load_peer_config(self.configs[name]).data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        return data_dir / "peer.log"

    def start(self, name: str, hooks: Sequence[Hook] = (), *, protocol_version: int | None = None) -> None:
        """Start (or restart) peer ``name``, with test ``hooks`` for this run of it (``protocol_version``:
        the highest it speaks, as a member not yet upgraded)."""
        old = self.processes.get(name)
        if old is not None and old.is_alive():
            raise RuntimeError(f"peer {name} is already running")
        if name in self.edges:
            process = context().Process(target=_edge_main, name=f"hivemesh-{name}",
                                        args=(str(self.configs[name]), str(self.log_path(name)), self.quiet,
                                              hooks_json(hooks)))
            process.start()
            self.processes[name] = process
            return
        process = context().Process(target=_peer_main, name=f"hivemesh-{name}",
                                    args=(str(self.configs[name]), str(self.log_path(name)), self.quiet,
                                          self.listeners.get(name), hooks_json(hooks), self.schedule,
                                          protocol_version))
        process.start()
        self.processes[name] = process

    def start_all(self, hooks: Mapping[str, Sequence[Hook]] | None = None) -> None:
        for name in self.configs:
            self.start(name, (hooks or {}).get(name, ()))

    def kill(self, name: str) -> None:
        """SIGKILL: no checkpoint, no goodbye (a crash)."""
        process = self.processes[name]
        if process.pid is not None and process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        process.join(10)

    def terminate(self, name: str) -> None:
        """SIGTERM: the peer checkpoints and exits 0."""
        self._signal(name, signal.SIGTERM)

    def interrupt(self, name: str) -> None:
        """SIGINT, as Ctrl-C on a terminal: the same clean stop as SIGTERM."""
        self._signal(name, signal.SIGINT)

    def _signal(self, name: str, signum: signal.Signals) -> None:
        process = self.processes[name]
        if process.pid is not None and process.is_alive():
            os.kill(process.pid, signum)

    def alive(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.is_alive()]

    def wait(self, timeout_s: float, names: list[str] | None = None) -> bool:
        """Wait until the named (default: all started) peers have exited; False on timeout."""
        deadline = time.monotonic() + timeout_s
        for name in names or list(self.processes):
            self.processes[name].join(max(0.0, deadline - time.monotonic()))
        return not any(self.processes[n].is_alive() for n in names or list(self.processes))

    def exitcodes(self) -> dict[str, int | None]:
        return {name: p.exitcode for name, p in self.processes.items()}

    def close(self) -> None:
        for process in self.processes.values():
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
            process.join(10)
        for listener in self.listeners.values():
            listener.close()

    def __enter__(self) -> PeerProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

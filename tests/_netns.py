"""Hosts for the multi-host tests (issue 16): network namespaces joined by veth links and a bridge.

``Hosts(n)`` makes ``n`` (at most ``MAX_HOSTS``) namespaces, each a "host" with
one interface ``eth0`` and its own address in ``SUBNET``, all cabled to a
bridge ``br0`` that lives in a namespace of its own, so nothing of it is
in the machine's own namespace::

    hm-PID-XXXXXX-h0 [eth0 10.77.0.1] ──veth── [v0 ┐
    hm-PID-XXXXXX-h1 [eth0 10.77.0.2] ──veth── [v1 ├ br0]  hm-PID-XXXXXX-br
    ...                                     ...┘

Every interface is created inside a namespace made here (``ip -n NS link add
... peer name eth0 netns HOST``), and the cleanup deletes only the
namespaces made here (which takes their interfaces with them), so the
machine's own interfaces, addresses and routes are never touched. A name
carries its maker's pid (``hm-PID-TOKEN-h0``): namespaces a killed test run
left behind (its pid gone) are swept, with whatever still runs in them, when
the next ``Hosts`` is made.

Faults: ``link_down(i)``/``link_up(i)`` take the bridge end of host i's cable
down and up (a pulled cable: the host keeps its address, its TCP
connections see silence, not a reset); ``partition([[0, 1], [2, 3]])`` puts
each group's cables on a bridge of its own (no firewall here, so a split is
a rewiring: inside a group hosts still talk, across groups nothing passes)
and ``heal()`` puts them all back on ``br0``; ``rate_mbit`` puts a ``tc tbf``
rate limit on both ends of every cable (the kernel shapes only egress).
``netem`` is not available here, so delay is the simulator's business.

Processes: ``popen(i, argv)`` runs ``ip netns exec HOST argv`` (Python 3.11 has no
``os.setns``, so a peer imports torch afresh, about 4 s). ``ip netns exec``
execs the command, so the pid is the command's. ``close()`` (also run by
``with``, by a finalizer and at interpreter exit) kills the processes
started here and any other still in the namespaces made here (``ip netns
pids``), then deletes the namespaces; it never raises, and runs once.

Needs root and iproute2 (CI runs as root); without them ``Hosts`` raises, it
does not skip: a multi-host test that cannot run fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

MAX_HOSTS = 6            # each host process imports torch afresh: more would not fit the CI budget
SUBNET = "10.77.0"       # the hosts' /24, inside their namespaces only; checked unused outside them
PREFIX = "hm-"


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed: what it said."""


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS`` (or ``tc`` when ``args[0] == "tc"``); its stdout, or NetnsError."""
    argv = list(args) if args[0] == "tc" else ["ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass
class _Made:
    """What one Hosts made, kept apart from it so that its finalizer holds no reference to it."""

    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    closed: bool = False


def _clean(made: _Made) -> None:
    """Kill the processes, then delete the namespaces made (newest first); never raises."""
    if made.closed:
        return
    made.closed = True
    for process in made.processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    for name in reversed(made.namespaces):
        _delete(name)


def _delete(namespace: str) -> None:
    """Kill what runs in ``namespace`` (one made here, or by a dead run), then delete it; never raises."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for pid in ip("netns", "pids", namespace, check=False).split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", namespace, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete the namespaces this harness made in a run that has died (its pid in the name is gone);
    their names."""
    made_here = re.compile(rf"{re.escape(PREFIX)}(\d+)-[0-9a-f]{{6}}-(br|h\d+)")
    stale = [name for name in existing_namespaces()
             if (match := made_here.fullmatch(name)) and not _alive(int(match[1]))]
    for name in stale:
        _delete(name)
    return stale


def existing_namespaces() -> set[str]:
    return {line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()}


def subnet_unused_here() -> bool:
    """Whether this (the machine's own) namespace has no address or route in ``SUBNET``."""
    return f"{SUBNET}." not in ip("-4", "-o", "addr", "show") + ip("-4", "route", "show", "table", "all")


class Hosts:
    """``count`` hosts in network namespaces, on one bridge; see the module docstring."""

    def __init__(self, count: int, *, rate_mbit: float | None = None) -> None:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"1 to {MAX_HOSTS} hosts, not {count}")
        if not subnet_unused_here():
            raise NetnsError(f"{SUBNET}.0/24 is in use on this machine: choose another SUBNET")
        sweep_stale()
        self._made = _Made()
        self._finalizer = weakref.finalize(self, _clean, self._made)   # also runs at interpreter exit
        taken = existing_namespaces()
        stem = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        while f"{stem}-br" in taken:
            stem = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.bridge = f"{stem}-br"
        self.names = [f"{stem}-h{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        try:
            self._build(rate_mbit)
        except BaseException:
            self.close()
            raise

    def _build(self, rate_mbit: float | None) -> None:
        self._add_namespace(self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")
        for index, (host, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            self._add_namespace(host)
            ip("-n", host, "link", "set", "lo", "up")
            cable = f"v{index}"
            ip("-n", self.bridge, "link", "add", cable, "type", "veth", "peer", "name", "eth0", "netns", host)
            ip("-n", self.bridge, "link", "set", cable, "master", "br0", "up")
            ip("-n", host, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", host, "link", "set", "eth0", "up")
            if rate_mbit is not None:
                self.limit(index, rate_mbit)

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self._made.namespaces.append(name)

    # ------------------------------------------------------------------ faults

    def limit(self, index: int, rate_mbit: float) -> None:
        """A ``tbf`` rate limit of ``rate_mbit`` on both ends of host ``index``'s cable."""
        rate = f"{int(rate_mbit * 1000)}kbit"
        for namespace, device in ((self.names[index], "eth0"), (self.bridge, f"v{index}")):
            ip("tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
               "burst", "32kb", "latency", "400ms")

    def link_down(self, index: int) -> None:
        """Pull host ``index``'s cable out of the bridge (its own end stays configured)."""
        ip("-n", self.bridge, "link", "set", f"v{index}", "down")

    def link_up(self, index: int) -> None:
        ip("-n", self.bridge, "link", "set", f"v{index}", "up")

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Split the hosts: group g's cables go to bridge ``br{g}`` (every host in exactly one group)."""
        listed = sorted(index for group in groups for index in group)
        if listed != list(range(len(self.names))):
            raise ValueError(f"every host in exactly one group: {groups}")
        for number, group in enumerate(groups):
            bridge = f"br{number}"
            if number and bridge not in ip("-n", self.bridge, "-o", "link", "show"):
                ip("-n", self.bridge, "link", "add", bridge, "type", "bridge")
                ip("-n", self.bridge, "link", "set", bridge, "up")
            for index in group:
                ip("-n", self.bridge, "link", "set", f"v{index}", "master", bridge)

    def heal(self) -> None:
        """Every cable back on ``br0`` (after ``partition``)."""
        for index in range(len(self.names)):
            ip("-n", self.bridge, "link", "set", f"v{index}", "master", "br0")

    # ------------------------------------------------------------------ processes

    def popen(self, index: int, argv: Sequence[str], *, log: IO[bytes] | Path | None = None,
              env: Mapping[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on host ``index`` (stdout and stderr to ``log``); ``close()`` kills it."""
        if self._made.closed:
            raise NetnsError("these hosts are closed")
        handle = log.open("ab") if isinstance(log, Path) else log
        try:
            process = subprocess.Popen(["ip", "netns", "exec", self.names[index], *argv], cwd=cwd,
                                       stdin=subprocess.DEVNULL, stdout=handle,
                                       stderr=subprocess.STDOUT if handle is not None else None,
                                       env=dict(env) if env is not None else None)
        finally:
            if isinstance(log, Path) and handle is not None:
                handle.close()      # the child has its own copy
        self._made.processes.append(process)
        return process

    def run(self, index: int, argv: Sequence[str],
            timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host ``index`` to its end; its output (no exception on failure)."""
        return subprocess.run(["ip", "netns", "exec", self.names[index], *argv], capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)

    # ------------------------------------------------------------------ cleanup

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

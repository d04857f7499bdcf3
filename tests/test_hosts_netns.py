"""The multi-host harness itself (tests/_netns.py): hosts reach each other over the bridge, a pulled
cable cuts one off and plugging it back restores it, a partition splits them in two and a heal joins
them, rate limits sit on both cable ends, and the cleanup removes exactly what was made, even when
the test fails or its run was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from _netns import PREFIX, Hosts, existing_namespaces, ip, sweep_stale

pytestmark = [pytest.mark.hosts, pytest.mark.processes]

PORT = 9000
SERVE = ("import socket, sys\n"
         "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
         "while True:\n"
         "    s.accept()[0].close()\n")
CONNECT = ("import socket, sys\n"
           "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()\n")


def reaches(hosts: Hosts, source: int, target: int, timeout_s: float) -> bool:
    done = hosts.run(source, [sys.executable, "-c", CONNECT, hosts.addresses[target], str(PORT),
                              str(timeout_s)], timeout_s=timeout_s + 20)
    return done.returncode == 0


def wait_until_reaches(hosts: Hosts, source: int, target: int) -> None:
    deadline = time.monotonic() + 30
    while not reaches(hosts, source, target, 2.0):
        assert time.monotonic() < deadline, f"host {source} never reached host {target}"


def machine_network() -> str:
    """The machine's own interfaces, addresses and routes (what the harness must never change)."""
    return ip("-o", "link", "show") + ip("-o", "addr", "show") + ip("route", "show", "table", "all")


def test_hosts_talk_over_the_bridge_and_a_pulled_cable_cuts_one_off() -> None:
    before = machine_network()
    with Hosts(3) as hosts:
        assert all(name.startswith(PREFIX) for name in [*hosts.names, hosts.bridge])
        assert set(hosts.names) | {hosts.bridge} <= existing_namespaces()
        server = hosts.popen(2, [sys.executable, "-c", SERVE, hosts.addresses[2], str(PORT)])
        wait_until_reaches(hosts, 0, 2)
        assert reaches(hosts, 1, 2, 2.0)

        hosts.link_down(2)
        assert not reaches(hosts, 0, 2, 1.0)
        hosts.link_up(2)
        wait_until_reaches(hosts, 0, 2)
        assert server.poll() is None
    assert server.poll() is not None, "close() kills what the hosts ran"
    assert not {n for n in existing_namespaces() if n.startswith(hosts.bridge.removesuffix("-br"))}
    assert machine_network() == before


def test_a_partition_splits_the_hosts_in_two_and_heal_joins_them() -> None:
    with Hosts(4) as hosts:
        for index in range(4):
            hosts.popen(index, [sys.executable, "-c", SERVE, hosts.addresses[index], str(PORT)])
        for target in (1, 2, 3):
            wait_until_reaches(hosts, 0, target)

        hosts.partition([[0, 1], [2, 3]])
        assert reaches(hosts, 0, 1, 2.0) and reaches(hosts, 2, 3, 2.0)
        assert not reaches(hosts, 0, 2, 1.0) and not reaches(hosts, 3, 1, 1.0)
        hosts.heal()
        wait_until_reaches(hosts, 0, 2)
        wait_until_reaches(hosts, 3, 1)
        with pytest.raises(ValueError, match="every host in exactly one group"):
            hosts.partition([[0, 1], [1, 2, 3]])


def test_rate_limits_sit_on_both_ends_of_every_cable() -> None:
    with Hosts(2, rate_mbit=1.0) as hosts:
        for index, host in enumerate(hosts.names):
            assert "tbf" in ip("tc", "-n", host, "qdisc", "show", "dev", "eth0")
            assert "rate 1Mbit" in ip("tc", "-n", hosts.bridge, "qdisc", "show", "dev", f"v{index}")


def test_cleanup_runs_when_the_test_fails() -> None:
    made: list[str] = []
    with pytest.raises(RuntimeError, match="a failing test"), Hosts(2) as hosts:
        made = [*hosts.names, hosts.bridge]
        hosts.popen(0, ["sleep", "600"])
        raise RuntimeError("a failing test")
    assert made and not set(made) & existing_namespaces()


def test_namespaces_a_dead_run_left_are_swept_with_what_runs_in_them() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{PREFIX}{dead.pid}-abcdef-h0"
    ip("netns", "add", stale)
    left = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
    try:
        while not ip("netns", "pids", stale).split():   # until the sleep runs inside
            assert left.poll() is None
        alive = f"{PREFIX}{os.getpid()}-abcdef-h0"       # a live run's: never swept
        ip("netns", "add", alive)
        try:
            assert stale in sweep_stale()
            assert stale not in existing_namespaces() and alive in existing_namespaces()
            assert left.wait(timeout=10) == -signal.SIGKILL
        finally:
            ip("netns", "del", alive)
    finally:
        left.kill()
        ip("netns", "del", stale, check=False)


def test_at_most_six_hosts() -> None:
    with pytest.raises(ValueError, match="1 to 6 hosts"):
        Hosts(7)

"""Helpers for the multi-host tests (issue 16): peers started on hosts (tests/_netns.py) the way an
operator starts them, and what they left behind.

A network is made with ``hivemesh init --hosts`` (one address per member, port
``PORT`` on each host), and each peer is a ``hivemesh peer --config NAME.toml``
process on its host, with the process tests' timings given as ``--set`` (an
operator's overrides): a neighbour is reported down after 30 s of silence, and
status.json is refreshed every 0.2 s so that a test reads fresh steps. Each
peer's output goes to ``DATA_DIR/peer.log``, as with the loopback helpers.

:class:`RssTrace` follows every host process's resident memory over a run, so
that a test checks it does not grow without bound (issue 16, item 4).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from _daemon_support import CEILING_S, TEST_PEER_OPTIONS
from _fault_report import REPORT, record
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
        # our sockets to neighbours with no connection at its last status: for how long and why
        links["dial_down"] = {n: f"{i.get('dial_down_s')} s ({i.get('dial_reason')})"
                              for n, i in (found.get("neighbours") or {}).items() if i.get("dial_reason")}
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



# ---------------------------------------------------------------------------- resident memory

RSS_SAMPLE_S = 0.5          # how often each process's VmRSS is read: a few small files, no cost to a test
RSS_GROWTH_MIB = 16.0       # the most a process's RSS may grow after its warm-up: keeping every message
                            # received (digits-mlp: 38 KB, 2 a step, 300 steps) would be 22 MiB; measured < 2
RSS_STARTING = ("starting", "waiting for neighbours", "syncing", "registered")   # states before the work
RSS_SLOPE_MIN_S = 30.0      # the table's slopes: of lives at least this long (over seconds: noise)
RSS_WARM_SAMPLES = 5        # the reference: the median of a life's first samples after its warm-up
RSS_MIN_SAMPLES = 12        # a life with fewer samples after its warm-up is too short to judge
RSS_ROW = "resident memory (RSS) after warm-up"


def _rss_mib(pid: int) -> float | None:
    """The current resident memory of ``pid`` (``VmRSS``, MiB); None once it is gone (a zombie has none).
    A process in a network namespace is still one of this PID namespace's: /proc has it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024     # kB
    return None


@dataclass(frozen=True)
class RssLife:
    """One process's resident memory once warm: ``warm_mib`` just after its warm-up, ``late_mib`` the
    largest in the last quarter of its life, and the least-squares slope over all of it."""

    name: str
    pid: int
    samples: int
    working_s: float
    warm_mib: float
    late_mib: float
    slope_mib_per_min: float

    @property
    def growth_mib(self) -> float:
        return self.late_mib - self.warm_mib


def rss_life(name: str, pid: int, samples: Sequence[tuple[float, float]]) -> RssLife:
    """Judge one life's samples after its warm-up, ``(monotonic s, MiB)`` in time order."""
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    span_s = times[-1] - times[0]
    late = [v for t, v in samples if t >= times[-1] - span_s / 4]
    mean_t, mean_v = sum(times) / len(times), sum(values) / len(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    slope = sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread if spread else 0.0
    return RssLife(name, pid, len(samples), span_s, statistics.median(values[:RSS_WARM_SAMPLES]),
                   max(late), 60.0 * slope)


class RssTrace:
    """Every process's resident memory (``VmRSS``) over the run, so that a test can check it does not
    grow without bound (issue 16, item 4).

    A thread reads it every ``RSS_SAMPLE_S`` for each process in ``processes``, followed as the test
    changes it (a restart is a new life: a new pid under the same name), until all of them have
    exited. A life's warm-up (torch's import, the data, the model, the first messages: RSS climbs to
    about 350 MiB) ends once its own status.json (its pid, in ``out/data/NAME``) says it is past
    ``RSS_STARTING`` and has done some work: a training step, or a gateway's round (an edge client's
    first round takes about 12 MiB more); only samples from then on count. The peak (``ru_maxrss``,
    status.json's ``memory_peak_mib``) cannot tell growth: the import sets it. :meth:`check` asserts,
    per life, that
    the largest RSS in the last quarter of it is at most ``RSS_GROWTH_MIB`` above its median just
    after the warm-up, and reports the growth and slope (MiB/min) in the session's table.
    """

    def __init__(self, out: Path, processes: Mapping[str, subprocess.Popen[bytes]]) -> None:
        self.out = out
        self.processes = processes
        self.samples: dict[tuple[str, int], list[tuple[float, float]]] = {}   # (name, pid) -> after warm-up
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-trace", daemon=True)
        self._thread.start()

    def _warm(self, name: str, pid: int) -> bool:
        if (name, pid) in self.samples:
            return True
        found = read_status(self.out / "data" / name) or {}
        return (found.get("pid") == pid and found.get("state", RSS_STARTING[0]) not in RSS_STARTING
                and max(found.get("step", 0), found.get("steps_done", 0)) >= 1)

    def _sample(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            running = [(n, p) for n, p in dict(self.processes).items() if p.poll() is None]  # a copy:
            for name, process in running:                                      # the test may add meanwhile
                if self._warm(name, process.pid) and (rss := _rss_mib(process.pid)) is not None:
                    self.samples.setdefault((name, process.pid), []).append((now, rss))
            if not running:
                return
            self._stop.wait(RSS_SAMPLE_S)

    def lives(self) -> tuple[list[RssLife], int]:
        """Stop sampling; every life long enough to judge after its warm-up, and how many were not."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        lives = [rss_life(name, pid, samples) for (name, pid), samples in self.samples.items()
                 if len(samples) >= RSS_MIN_SAMPLES]
        return lives, len(self.samples) - len(lives)

    def check(self, test: str) -> list[RssLife]:
        """After the run (every process exited): assert no life grew past ``RSS_GROWTH_MIB`` after its
        warm-up; add ``test``'s lives to the session's RSS row (tests/_fault_report.py); the lives."""
        lives, short = self.lives()
        said = [f"{life.name}/{life.pid} {life.warm_mib:.1f} -> {life.late_mib:.1f} MiB in "
                f"{life.working_s:.0f} s, {life.slope_mib_per_min:+.2f} MiB/min" for life in lives]
        print(f"RSS after warm-up ({test}): {', '.join(said)}; {short} lives too short to judge")
        _RSS_CHECKED.extend((test, life) for life in lives)
        _RSS_UNJUDGED[test] = short
        _record_rss()
        assert lives, f"{test}: no life ran long enough after its warm-up to judge its RSS"
        grown = [life for life in lives if life.growth_mib > RSS_GROWTH_MIB]
        assert not grown, f"{test}: RSS grew more than {RSS_GROWTH_MIB} MiB after warm-up: {grown}"
        return lives


_RSS_CHECKED: list[tuple[str, RssLife]] = []     # every life checked in this session, by test
_RSS_UNJUDGED: dict[str, int] = {}                # by test: lives too short after their warm-up


def _record_rss() -> None:
    """One row for every test's lives so far (replacing the row the last check made)."""
    REPORT.rows[:] = [row for row in REPORT.rows if row.fault != RSS_ROW]
    tests = dict.fromkeys(test for test, _ in _RSS_CHECKED)
    worst = {test: max(life.growth_mib for t, life in _RSS_CHECKED if t == test) for test in tests}
    slopes = [life.slope_mib_per_min for _, life in _RSS_CHECKED if life.working_s >= RSS_SLOPE_MIN_S]
    record(RSS_ROW, injected=len(_RSS_CHECKED),
           survived=sum(life.growth_mib <= RSS_GROWTH_MIB for _, life in _RSS_CHECKED),
           note="largest growth per test (MiB): " + ", ".join(f"{t} {g:+.1f}" for t, g in worst.items())
                + f" (bound {RSS_GROWTH_MIB:.0f}); steepest slope {max(slopes, default=0.0):+.2f} MiB/min "
                  f"(lives of {RSS_SLOPE_MIN_S:.0f} s or more); "
                  f"VmRSS every {RSS_SAMPLE_S} s, each process life "
                  f"({sum(_RSS_UNJUDGED.values())} too short to judge)")

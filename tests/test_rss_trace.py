"""The multi-host tests' RSS check (tests/_hosts_support.py ``RssTrace``, issue 16 item 4), on two
local processes: one that grows only while it starts, one that keeps growing once it works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _hosts_support import RSS_GROWTH_MIB, RSS_MIN_SAMPLES, RssTrace, rss_life, wait_until

pytestmark = pytest.mark.processes

# a stand-in for a host process: its status.json says "starting" while it takes 48 MiB (as torch's
# import), then "training" at step 0 while it takes 48 MiB more (as an edge client's first round): the
# warm-up; then step 1, and from then on it takes grow_mib more every 0.1 s (a leak) or nothing, until
# the test's stop file exists
PROCESS = """
import json, os, sys, time
from pathlib import Path
data, grow_mib, stop = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
data.mkdir(parents=True)
def status(state, step):
    (data / ".tmp").write_text(json.dumps({"pid": os.getpid(), "state": state, "step": step}))
    (data / ".tmp").replace(data / "status.json")
held = []
for state in ("starting", "training"):  # a warm-up of some samples: 96 MiB in 2.4 s
    status(state, 0)
    for _ in range(12):
        held.append(b"s" * (4 << 20))
        time.sleep(0.1)
status("training", 1)
while not stop.exists():
    if grow_mib and len(held) < 200:
        held.append(b"g" * (grow_mib << 20))
    time.sleep(0.1)
"""


def test_growth_after_the_warm_up_is_found_and_the_warm_up_is_not_counted(tmp_path: Path) -> None:
    out, stop = tmp_path / "net", tmp_path / "stop"
    processes = {name: subprocess.Popen([sys.executable, "-c", PROCESS, str(out / "data" / name), str(grow),
                                         str(stop)]) for name, grow in (("flat", 0), ("leaky", 1))}
    try:
        trace = RssTrace(out, processes)
        wait_until("enough samples after the warm-ups", lambda: len(trace.samples) == 2 and min(
            len(s) for s in trace.samples.values()) >= RSS_MIN_SAMPLES + 4, processes,
            lambda: str(trace.samples))
        stop.touch()
        assert all(process.wait(timeout=30) == 0 for process in processes.values())
        lives, short = trace.lives()
    finally:
        for process in processes.values():
            process.kill()
    by_name = {life.name: life for life in lives}
    assert short == 0 and sorted(by_name) == ["flat", "leaky"]
    assert by_name["flat"].warm_mib > 96        # the samples began after the warm-up's 96 MiB
    assert abs(by_name["flat"].growth_mib) < 2 and by_name["flat"].growth_mib < RSS_GROWTH_MIB
    assert by_name["leaky"].growth_mib > RSS_GROWTH_MIB and by_name["leaky"].slope_mib_per_min > 60


def test_a_life_is_judged_by_its_last_quarter_against_its_start_and_its_slope_in_mib_per_minute() -> None:
    steady = [(float(t), 100.0 + (5.0 if t == 20 else 0.0)) for t in range(40)]
    life = rss_life("p00", 1, steady)
    assert life.warm_mib == 100.0 and life.late_mib == 100.0 and life.working_s == 39.0
    rising = [(float(t), 100.0 + 0.5 * t) for t in range(41)]   # 0.5 MiB/s: 30 MiB/min
    life = rss_life("p00", 1, rising)
    assert life.warm_mib == 101.0 and life.late_mib == 120.0 and life.growth_mib == 19.0
    assert life.slope_mib_per_min == pytest.approx(30.0)

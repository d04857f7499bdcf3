"""Every bench script runs with --quick, finishes, and prints its table.

The benches are run by hand, rarely, and nothing else imports them: a crash
or a hang in one (as in gpu_two_peers' exchange, and bench_exchange's barrier
that dropped data at small sizes) went unnoticed until someone read it. Here
each runs as a user would, in its own process, at tiny sizes; the timeout is
a generous ceiling that a healthy run stays far below. The assertions are on
the table (its header and a row per measured thing), not just the exit code.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
from bench_compress import SPECS  # noqa: E402 (the operators it runs, in order)

CEILING_S = 240.0   # a healthy --quick run took 7-32 s here with 2 cores at load 7

# script -> lines (regular expressions) its table must print, header first
EXPECTED: dict[str, list[str]] = {
    "bench_wire.py": [
        r"^operation\s+ms\s+GB/s\s+x SHA-256\s+x BLAKE3$",
        r"^copy into a touched buffer\s+[\d.]+",
        r"^encode \+ sign \(seal\)\s+[\d.]+",
        r"^verify \+ decode \(open\)\s+[\d.]+",
        r"^verify \+ decode, threads \+ reused\s+[\d.]+",
        r"^digest choice: BLAKE3 is [\d.]+x",
    ],
    "bench_compress.py": [
        line for workload in ("flat", "resnet18", "transformer") for line in (
            rf"^== {workload}: [\d,]+ float32",
            r"^operator\s+comp ms\s+comp GB/s",
            *(rf"^{re.escape(spec)}\s+\d+\s+[\d.]+\s.*\s(met|MISS)$" for spec in SPECS))
    ],
    "bench_exchange.py": [
        r"^exchange\s+time\s+GB/s each way\s+/ signed$",
        r"^raw pyzmq DEALER/ROUTER, 4 MiB frames\s+\d+ ms",
        r"^ours unsigned \(framing, tracked send, gather, mix\)\s+\d+ ms",
        r"^ours signed, serial digests\s+\d+ ms",
        r"^ours signed \(caller .*as the daemon\)\s+\d+ ms\s+[\d.]+\s+1\.00$",
        r"^torch.distributed gloo all_reduce \+ /2\s+\d+ ms",
        r"^hivemind DecentralizedAverager step\s+skipped$",
        r"^signed / gloo all_reduce\s+[\d.]+",
    ],
    "bench_large_message.py": [
        r"^2 peers, charlm width 48 x 2 layers, 2 steps, init defaults: a [\d.]+ MB message",
        r"^peer\s+rounds\s+both\s+incomplete\s+abandoned\s+MB sent\s+MB accepted by the other\s+loop s/round",
        r"^p00\s+2\s+2\s+0\s+0\s+[\d.]+\s+[\d.]+\s+[\d.]+",
        r"^p01\s+2\s+2\s+0\s+0\s+[\d.]+\s+[\d.]+\s+[\d.]+",
        r"^raw pyzmq exchange of the same bytes both ways: \d+ ms; our wire over CurveZMQ",
    ],
    "bench_sim.py": [
        r"^run\s+wall s\s+ms/peer-round\s+overhead ms",
        r"^plain torch loop \(floor\)\s+[\d.]+",
        r"^sim, verify_fraction=1\s+[\d.]+",
        r"^sim, verify_fraction=0.05\s+[\d.]+",
        r"^part 2: 16 peers",
        r"^peak memory \(ru_maxrss\)\s+\d+ MB",
        r"^final mean accuracy\s+[\d.]+",
    ],
    "bench_federation.py": [
        r"^size\s+system\s+total s\s+first round s\s+later rounds ms\s+final acc$",
        r"^4 x 2\s+flower\s+skipped$",
        r"^4 x 2\s+ours\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$",
        r"^\s+accuracy per round, ours:\s+[\d.]+ [\d.]+$",
        r"^3 x 2 over real processes on loopback",
        r"^3 x 2\s+ours\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$",
        r"^3 x 2\s+real\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$",
        r"^\s+real's final model is ours bit for bit: yes;",
        r"^20 x 2\s+ours\s+[\d.]+",
        r"^peak memory \(ru_maxrss\) ours at 20 clients: \d+ MB$",
    ],
    "bench_filter_grid.py": [
        r"^graph\s+shards\s+seed\s+refused\s+max/peer\s+final acc\s+consensus\s+wall$",
        r"^ring:16\s+\S+\s+1\s+\d+\s+\d+\s+[\d.]+\s+[\d.e+-]+\s+[\d.]+s$",
        r"^false positives in all cells: \d+ \(goal: 0\)$",
    ],
    "bench_choco_grid.py": [
        r"^graph\s+partition\s+seed\s+gamma\s+reduced\s+exact\s+choco\s+pts\s+bytes x\s+stab\s+bars$",
        r"^ring:16\s+dirichlet0.3\s+0\s+[\d.]+\s+\d+\s+[\d.]+\s+[\d.]+\s+-?[\d.]+\s+[\d.]+\s+[\d.]+\s+(met|MISSED)",
        r"^cells missing a bar: \d+$",
    ],
    "bench_secagg.py": [
        r"^SecAgg one round, update 1,000 elements",
        r"^mode\s+n\s+k\s+t\s+client up KB\s+down KB\s+client ms\s+gateway MB\s+gateway s\s+FedAvg gw ms"
        r"\s+gw CPU x FedAvg\s+x FedAvg",
        r"^secagg\+\s+10\s+9\s+5\s+[\d.]+",
        r"^plain\s+10\s+9\s+5\s+[\d.]+",
        r"^secagg\+\s+30\s+16\s+9\s+[\d.]+",
        r"^plain\s+30\s+29\s+15\s+[\d.]+",
        r"^n=30: SecAgg\+ needs k=16 against plain SecAgg's 29",
        r"^traffic over the clear data: Bonawitz et al\. 1\.73x .* ours [\d.]+x",
    ],
    "bench_gpt.py": [
        r"^gpt 1 x 32, 2 heads, context 16, vocab 256: [\d,]+ parameters; batch 1, AdamW",
        r"^variant\s+ms/step\s+x torch\s+CPU ms/step\s+x torch\s+peak (RSS|CUDA) MB\s+x torch$",
        r"^torch\s+[\d.]+\s+1\.00\s+[\d.]+\s+1\.00\s+\d+\s+1\.00$",
        *(rf"^{variant}\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+$"
          for variant in ("hivemesh", "torch bf16", "hivemesh bf16")),
    ],
    "gpu_two_peers.py": [
        r"^training on (cpu|cuda): exit codes \{'p00': 0, 'p01': 0\}",
        r"^  correct: yes$",
        r"^  exchange\s+ms$",
        r"^  GPU tensors .*\s+(\d+|skipped \(no CUDA\))$",
        r"^  CPU tensors \(seal, send, verify, mix\)\s+\d+$",
    ],
}


# scripts that are tools rather than measurements, with the test that covers each
TESTED_ELSEWHERE = {"flaky.py": "tests/test_flaky_gate.py"}


def run_quick(script: str) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """The finished run, its wall seconds and the CPU seconds of it and its (reaped) children."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(BENCH / script), "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=CEILING_S)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return done, wall_s, cpu_s


def missing_line(output: str, patterns: list[str]) -> str | None:
    """The first pattern that no line matches after the previous pattern's line, else None."""
    lines = output.splitlines()
    at = 0
    for pattern in patterns:
        hit = next((i for i in range(at, len(lines)) if re.search(pattern, lines[i])), None)
        if hit is None:
            return pattern
        at = hit + 1
    return None


def test_every_bench_script_has_a_smoke_test() -> None:
    scripts = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
    assert scripts == sorted([*EXPECTED, *TESTED_ELSEWHERE])


def test_the_table_check_catches_a_missing_row() -> None:
    """Negative control: a table without a row, or with its header last, fails the check."""
    patterns = [r"^operation", r"^row one", r"^row two"]
    assert missing_line("operation ms\nrow one 1.0\nrow two 2.0", patterns) is None
    assert missing_line("operation ms\nrow one 1.0", patterns) == r"^row two"
    assert missing_line("row one 1.0\noperation ms\nrow two 2.0", patterns) == r"^row one"


@pytest.mark.processes
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_bench_script_runs_quick_and_prints_its_table(script: str) -> None:
    done, wall_s, cpu_s = run_quick(script)

    output = done.stdout
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{output}\n{done.stderr[-3000:]}"
    missing = missing_line(output, EXPECTED[script])
    assert missing is None, f"{script} did not print a line matching {missing!r} (in order):\n{output}"
    print(f"{script} --quick: {wall_s:.1f} s wall, {cpu_s:.1f} s CPU")

"""Same scenario, same bytes: two processes with different PYTHONHASHSEED write identical reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Everything that draws randomness or orders events: loss, jitter, stragglers, random churn,
# attackers, sampled verification.
SCENARIO = """
name = "determinism"
seed = 9
duration_s = 2.5
eval_every_s = 0.5
target_accuracy = 0.7
verify_fraction = 0.5

[graph]
spec = "exponential:8"

[links]
latency_ms = 5.0
bandwidth_mbps = 50.0
loss = 0.05
jitter_ms = 3.0

[nodes]
step_time_ms = 10.0
straggle_probability = 0.2
neighbour_timeout_s = 0.5
behaviour = { p02 = "sign-flip", p05 = "forged-signature" }

[algorithm]
algorithm = "dpsgd"
deadline_s = 0.1
norm_multiple = 3.0
total_steps = 40

[task]
name = "logreg"
options = { n_samples = 400, n_features = 10 }

[trainer]
lr = 0.2

[faults.rates]
crash_rate_per_s = 0.2
mean_downtime_s = 0.5
nodes = ["p03", "p06"]
"""


@pytest.mark.processes
def test_two_processes_with_different_hash_seeds_write_byte_identical_reports(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario-determinism.toml"
    scenario.write_text(SCENARIO)
    runs = []
    for hash_seed in ("1", "4242"):
        out = tmp_path / f"out-{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        command = [sys.executable, "-m", "peer.cli.main", "sim", str(scenario), "--out", str(out),
                   "--no-plots", "--quiet"]
        runs.append((out, subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for _, process in runs:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr.decode()[-2000:]
    first, second = ((out / "report.json").read_bytes() for out, _ in runs)
    assert first == second
    report = json.loads(first)["scenarios"][0]
    # The run exercised what it claims to: drops, refusals, filtering, crashes.
    assert report["dropped"]["lost"] > 0
    assert report["rejections"]["bad_signature"] > 0
    assert report["metrics"]["rejected_update"] > 0
    assert sum(p.get("restarts", 0) for p in report["peers"].values()) > 0
    assert (runs[0][0] / "metrics.csv").read_bytes() == (runs[1][0] / "metrics.csv").read_bytes()

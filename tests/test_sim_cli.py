"""`hivemesh sim` and `hivemesh sim calibrate` from the command line (in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peer.cli import main
from sim.scenario import load_scenario

SCENARIO = """# my network
name = "tiny"
seed = 4
duration_s = 1.0
eval_every_s = 0.5
compare_with = ["allreduce"]

[graph]
spec = "ring:4"

[nodes]
speed = { p01 = 0.5 }   # a slow one

[algorithm]
algorithm = "dpsgd"
total_steps = 20

[task]
name = "logreg"
options = { n_samples = 200, n_features = 5 }
"""


def test_calibrate_writes_step_time_into_the_scenario_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "scenario-tiny.toml"
    path.write_text(SCENARIO)
    assert main(["sim", "calibrate", "--write", str(path), "--steps", "20"]) == 0
    text = path.read_text()
    assert "# my network" in text and "# a slow one" in text
    scenario = load_scenario(path)
    assert scenario.nodes.step_time_ms > 0 and scenario.nodes.speed == {"p01": 0.5}
    first = scenario.nodes.step_time_ms
    assert main(["sim", "calibrate", "--write", str(path), "--steps", "20"]) == 0
    assert text.count("step_time_ms") == path.read_text().count("step_time_ms") == 1
    assert load_scenario(path).nodes.step_time_ms > 0 and first > 0


def test_sim_runs_a_scenario_and_its_baseline_into_one_report(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scenario-tiny.toml"
    path.write_text(SCENARIO)
    out = tmp_path / "report"
    assert main(["sim", str(path), "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [s["name"] for s in report["scenarios"]] == ["tiny", "tiny/allreduce"]
    assert [s["kind"] for s in report["scenarios"]] == ["gossip:dpsgd", "allreduce"]
    assert (out / "metrics.csv").read_text().startswith("scenario,time_s,")
    for plot in ("accuracy_vs_time.png", "accuracy_vs_bytes.png", "consensus_vs_time.png",
                 "loss_vs_time.png", "traffic_00_tiny.png"):
        assert (out / plot).stat().st_size > 1000
    assert "tiny/allreduce" in capsys.readouterr().out


def test_bad_scenarios_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scenario-bad.toml"
    path.write_text("[links]\nbandwidth_mbps = -1\n")
    assert main(["sim", str(path), "--out", str(tmp_path / "r")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "bandwidth_mbps must be > 0" in error and str(path) in error
    assert main(["sim", str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err

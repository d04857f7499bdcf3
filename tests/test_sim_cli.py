"""`hivemesh sim` and `hivemesh sim calibrate` from the command line (in process)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from peer.cli.main import main
from sim import calibrate
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


def printed_step_ms(out: str) -> float:
    match = re.fullmatch(r"step_time_ms = ([0-9.]+) written to .*\n", out)
    assert match is not None, out
    return float(match.group(1))


def test_calibrate_writes_step_time_into_the_scenario_and_keeps_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scenario-tiny.toml"
    path.write_text(SCENARIO)
    assert main(["sim", "calibrate", "--write", str(path), "--steps", "20"]) == 0
    text = path.read_text()
    assert "# my network" in text and "# a slow one" in text
    scenario = load_scenario(path)
    # The file holds what was measured (and printed), not merely some positive number.
    assert scenario.nodes.step_time_ms == printed_step_ms(capsys.readouterr().out) > 0
    assert scenario.nodes.speed == {"p01": 0.5}
    assert main(["sim", "calibrate", "--write", str(path), "--steps", "20"]) == 0
    assert text.count("step_time_ms") == path.read_text().count("step_time_ms") == 1
    assert load_scenario(path).nodes.step_time_ms == printed_step_ms(capsys.readouterr().out)


class ScriptedClock:
    """perf_counter for sim.calibrate: each timed chunk takes the next of ``chunk_ms`` (in ms)."""

    def __init__(self, chunk_ms: list[float]) -> None:
        self.readings = [t for ms in chunk_ms for t in (0.0, ms / 1000.0)]

    def perf_counter(self) -> float:
        return self.readings.pop(0)


def test_calibrate_writes_the_median_per_step_time_of_its_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 steps in 5 chunks of 4: chunk times 20, 4, 12, 400, 8 ms are 5, 1, 3, 100, 2 ms a step.
    # The median (3) is written; the mean (22.2) or a total (444) would be wrong.
    path = tmp_path / "scenario-tiny.toml"
    path.write_text(SCENARIO)
    clock = ScriptedClock([20.0, 4.0, 12.0, 400.0, 8.0])
    monkeypatch.setattr(calibrate, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    assert main(["sim", "calibrate", "--write", str(path), "--steps", "20"]) == 0
    assert clock.readings == []  # every chunk was timed
    assert load_scenario(path).nodes.step_time_ms == pytest.approx(3.0, abs=1e-3)


def test_calibrate_rejects_an_unknown_task_and_leaves_the_file_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scenario-tiny.toml"
    path.write_text(SCENARIO)
    assert main(["sim", "calibrate", "--write", str(path), "--task", "no-such-task", "--steps", "20"]) == 2
    assert "unknown task 'no-such-task'" in capsys.readouterr().err
    assert path.read_text() == SCENARIO


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
    # The page holds each scenario as it ran (tests/test_sim_report_html.py checks the rest).
    page = html.unescape((out / "report.html").read_text(encoding="utf-8"))
    assert page.count('"total_steps": 20') == 1 and page.count('"kind": "allreduce"') == 1
    assert "tiny/allreduce" in capsys.readouterr().out


def test_bad_scenarios_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scenario-bad.toml"
    path.write_text("[links]\nbandwidth_mbps = -1\n")
    assert main(["sim", str(path), "--out", str(tmp_path / "r")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "bandwidth_mbps must be > 0" in error and str(path) in error
    assert main(["sim", str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err

"""Every example scenario runs, shortened, through `hivemesh sim`; every example path we print exists.

The examples are what a new user runs first, and nothing else loads them. Each
one runs here in process for one simulated second (``--set`` overrides, the
same ones a user can type), which is enough to check that it loads, starts,
trains, finishes and writes report.json and metrics.csv with one row per
scenario it names. Scenarios without named members run on 4 peers instead of
16; the churn example's faults are replayed ten times sooner, so its crash,
restart, departure and partition all happen inside the short run.
"""

from __future__ import annotations

import csv
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from peer.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("scenario-*.toml"))
QUICK_S = 1.0
# Every example, shortened; eval twice so the trace has a start, a middle and an end.
COMMON = [f"duration_s={QUICK_S}", f"eval_every_s={QUICK_S / 2}"]
# Examples whose members are not named anywhere may shrink; the others keep their 16.
FEWER_PEERS = {"choco-top1": "ring:4", "exact-gossip": "ring:4", "ring-vs-allreduce-slow": "ring:4"}
PATH_PATTERN = re.compile(r"\b(?:examples|bench)/[\w.*-]*\w")


def _toml_value(value: Any) -> str:
    """A TOML inline value: JSON's strings, numbers and arrays are TOML too; tables are written out."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(value)


def _sooner(events: list[dict[str, Any]], scale: float) -> list[dict[str, Any]]:
    return [{key: value * scale if key.endswith("_s") else value for key, value in event.items()}
            for event in events]


def quick_overrides(data: dict[str, Any], name: str) -> list[str]:
    overrides = list(COMMON)
    if name in FEWER_PEERS:
        overrides.append(f"graph.spec={FEWER_PEERS[name]}")
    faults = data.get("faults", {})
    scale = QUICK_S / data["duration_s"]
    for key in ("churn", "partitions"):
        if faults.get(key):
            overrides.append(f"faults.{key}={_toml_value(_sooner(faults[key], scale))}")
    return overrides


def expected_rows(data: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """(name, kind) of each scenario the file stands for: itself, then its compare_with baselines."""
    gossip = (name, f"gossip:{data['algorithm']['algorithm']}")
    return [gossip, *((f"{name}/{kind}", kind) for kind in data.get("compare_with", []))]


def test_there_are_examples_to_run() -> None:
    assert len(EXAMPLES) >= 5, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_scenario_runs_shortened_and_writes_its_report(
        path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tomllib.loads(path.read_text())
    name = data.get("name", path.stem.removeprefix("scenario-"))
    out = tmp_path / "report"

    code = main(["sim", str(path), "--out", str(out), "--no-plots", "--quiet",
                 *(f"--set={item}" for item in quick_overrides(data, name))])

    assert code == 0
    rows = expected_rows(data, name)
    report = json.loads((out / "report.json").read_text())
    scenarios = report["scenarios"]
    assert [(s["name"], s["kind"]) for s in scenarios] == rows
    for scenario in scenarios:
        # the overrides took hold (a full run is 20-40 s), and the run did something in it
        assert 0 < scenario["simulated_time_s"] <= QUICK_S, scenario["name"]
        assert scenario["members"] == (4 if name in FEWER_PEERS else 16)
        assert scenario["bytes_sent"] > 0 and scenario["final"]["mean_accuracy"] is not None
        assert len(scenario["trace"]["time_s"]) >= 2
    with (out / "metrics.csv").open() as handle:
        metrics = list(csv.DictReader(handle))
    assert sorted({row["scenario"] for row in metrics}) == sorted(n for n, _ in rows)
    printed = capsys.readouterr().out
    assert all(n in printed for n, _ in rows) and "report.json" in printed


def test_the_churn_example_faults_all_happen_in_its_short_run(tmp_path: Path) -> None:
    """The compressed faults really fire: p03 crashes and comes back, p12 leaves for good."""
    path = ROOT / "examples" / "scenario-churn-partition.toml"
    data = tomllib.loads(path.read_text())
    out = tmp_path / "report"

    assert main(["sim", str(path), "--out", str(out), "--no-plots", "--quiet",
                 *(f"--set={item}" for item in quick_overrides(data, "churn-partition"))]) == 0

    peers = json.loads((out / "report.json").read_text())["scenarios"][0]["peers"]
    assert peers["p03"]["restarts"] >= 1 and peers["p03"]["running"]
    assert not peers["p12"]["running"]


def test_a_misspelt_override_is_a_one_line_error_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES[0]
    assert main(["sim", str(path), "--out", str(tmp_path), "--set", "duration=1"]) == 2
    error = capsys.readouterr().err.strip()
    assert "duration" in error and str(path) in error and "\n" not in error
    assert main(["sim", str(path), "--out", str(tmp_path), "--set", "graph.spec.kind=ring"]) == 2
    assert "'graph.spec' is not a table" in capsys.readouterr().err


def named_paths(text: str) -> set[str]:
    return set(PATH_PATTERN.findall(text))


def sim_help(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "1000")   # argparse wraps at hyphens: one line per paragraph
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_the_path_pattern_finds_files_and_globs() -> None:
    text = "run `hivemesh sim examples/scenario-a.toml` or see (examples/scenario-*.toml), bench/b.py."
    assert named_paths(text) == {"examples/scenario-a.toml", "examples/scenario-*.toml", "bench/b.py"}


@pytest.mark.parametrize("where", ["hivemesh sim --help", "README.md", "docs/**/*.md", "examples/*.toml"])
def test_every_example_path_we_name_exists(where: str, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    if where == "hivemesh sim --help":
        text = sim_help(monkeypatch, capsys)
    elif where == "README.md":
        text = (ROOT / "README.md").read_text()
    elif where == "docs/**/*.md":
        text = "\n".join(path.read_text() for path in sorted((ROOT / "docs").rglob("*.md")))
    else:
        text = "\n".join(path.read_text() for path in EXAMPLES)
    paths = named_paths(text)
    if where != "examples/*.toml":
        assert any(p.startswith("examples/") for p in paths), f"{where} names no example"
    missing = sorted(p for p in paths if not list(ROOT.glob(p)))
    assert not missing, f"{where} names files that do not exist: {missing}"

"""Help texts and docstrings that tell a user what to type say what the code accepts (issue 17, 6)."""

from __future__ import annotations

import ast
import textwrap
import tomllib
from pathlib import Path

import pytest

from peer.cli.main import main
from peer.files.config import load
from peer.files.schema import NetworkSection
from sim.scenario import scenario_from_dict
from topology import KINDS

ROOT = Path(__file__).resolve().parents[1]


def test_topology_show_help_names_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["topology", "show", "--help"])
    text = " ".join(capsys.readouterr().out.split())      # argparse wraps lines
    missing = [kind for kind in KINDS if f"{kind}:" not in text.replace("- ", "-")]
    assert not missing, missing


def _snippet(docstring: str, heading: str) -> dict[str, object]:
    """The TOML lines under ``# heading`` in a docstring's example block, parsed."""
    lines = docstring.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"# {heading}") + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return tomllib.loads(textwrap.dedent("\n".join(lines[start:end])))


def test_the_custom_task_example_tables_load_as_written() -> None:
    path = ROOT / "examples" / "custom_task.py"
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    scenario_table = _snippet(docstring, "scenario.toml")
    peer_table = _snippet(docstring, "peer.toml (the task is part of what every member agrees on)")
    scenario = scenario_from_dict({"graph": {"spec": "ring:4"}, **scenario_table})
    network = load(NetworkSection, peer_table["network"], source="peer.toml", prefix="network")
    assert scenario.task.name.endswith("custom_task.py:make_task") and scenario.task.options == {"hidden": 16}
    assert network.task.endswith("custom_task.py:make_task") and network.task_options == {"hidden": 16}

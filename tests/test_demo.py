"""The README's main command, `hivemesh demo`, at a small size: real peer processes on 127.0.0.1."""

from __future__ import annotations

import re

import pytest

from peer.cli.main import main


@pytest.mark.processes
def test_demo_runs_a_small_network_to_a_per_peer_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--peers", "4", "--steps", "120"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"p0\d ", line)]
    assert [row[0] for row in rows] == ["p00", "p01", "p02", "p03"]
    assert all(row[1] == "0" and row[2] == "120" for row in rows), out
    assert all(float(row[3]) >= 0.80 for row in rows), out
    consensus = float(re.search(r"consensus distance .*: (\S+)", out).group(1))  # type: ignore[union-attr]
    assert consensus < 1e-2

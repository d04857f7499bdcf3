"""`hivemesh topology show/save`, run in-process through peer.cli.main.main."""

import json
from pathlib import Path

import pytest

from peer.cli.main import main


def test_show_json_reports_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "show", "ring:16", "--json", "--model-params", "1000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"nodes", "edges", "spectral_gap", "diameter", "rounds_to_1000x", "degree",
            "bytes_per_round"} <= report.keys()
    assert report["nodes"] == 16 and report["edges"] == 16 and report["diameter"] == 8
    assert report["bytes_per_round"] == 32 * 1000 * 4


def test_show_prints_a_table_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "show", "one-peer-exponential", "--names", "d,c,b,a,h,g,f,e"]) == 0
    out = capsys.readouterr().out
    assert "spectral gap     1.000000" in out
    assert "period           3 round(s) (time-varying)" in out
    assert "8 (a, b, c ... " not in out and "a ... h" in out


def test_show_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.png"
    assert main(["topology", "show", "torus:4x4", "--plot", str(path)]) == 0
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert f"plot written to {path}" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "needle"), [
    (["topology", "show", "banana:4"], "unknown topology 'banana'"),
    (["topology", "show", "hypercube:12"], "power-of-two number of members, got 12"),
    (["topology", "show", "ring:4", "--names", "a,b,c"], "says 4 members but the roster has 3"),
    (["topology", "show", "missing/graph.json"], "cannot read graph file"),
])
def test_bad_input_is_one_line_not_a_traceback(argv: list[str], needle: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hivemesh: error: ") and needle in lines[0]


def test_malformed_graph_file_names_the_edge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "links.edgelist"
    path.write_text("a b latency_ms=3\nb c latency_ms=-1\n")
    assert main(["topology", "show", str(path)]) == 2
    assert "edge 'b'-'c' has latency_ms -1.0" in capsys.readouterr().err


def test_save_then_show_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ring.graphml"
    assert main(["topology", "save", "ring:6", str(path)]) == 0
    assert main(["topology", "show", str(path), "--json", "--weights", "edges"]) == 0
    report = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert report["nodes"] == 6 and report["diameter"] == 3

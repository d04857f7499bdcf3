"""`hivemesh init` checks every spec it writes as a peer would, before writing anything (issue 17):
a mistake is one line naming the option and exit 2, not a failure later on every peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.cli.main import main

BAD = [
    (["--task", "digits-mpl"], "--task"),
    (["--task", "no_such_module:make"], "--task"),
    (["--compression", "topk:fraction=0.01"], "--compression"),     # a sparsifier needs CHOCO
    (["--compression", "nonsense:x=1"], "--compression"),
    (["--compression", "topk:fraction=7", "--algorithm", "choco"], "--compression"),
    (["--algorithm", "dpsdg"], "--algorithm"),
    (["--algorithm", "dpsgd", "--topology", "directed-exponential"], "--algorithm"),  # needs undirected
    (["--topology", "torus:3x3"], "--topology"),                   # 9 members, 4 peers
    (["--topology", "nonsense"], "--topology"),
    (["--alpha", "-1"], "--partition/--alpha"),
    (["--steps", "0"], "--steps"),
    (["--peers", "0"], "--peers"),
]


@pytest.mark.parametrize(("extra", "option"), BAD, ids=[" ".join(e) for e, _ in BAD])
def test_a_bad_option_is_one_line_naming_it_and_nothing_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], option: str) -> None:
    out = tmp_path / "net"
    args = ["init", "--peers", "4", "--topology", "ring", "--out", str(out), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hivemesh: error: {option}") and err.count("\n") == 1, err
    assert not out.exists()


def test_the_good_neighbours_of_those_options_are_accepted(tmp_path: Path) -> None:
    # negative control: the same options with good values write a network
    for i, extra in enumerate([["--task", "digits-cnn"], ["--algorithm", "choco", "--compression",
                                                          "topk:fraction=0.05"],
                               ["--algorithm", "pushsum", "--topology", "directed-exponential"],
                               ["--topology", "torus:2x2"], ["--compression", "fp16"]]):
        out = tmp_path / f"net{i}"
        assert main(["init", "--peers", "4", "--topology", "ring", "--out", str(out), *extra]) == 0, extra
        assert (out / "roster.toml").exists()

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


TASK_FILE = '''from peer.train.tasks.digits import digits_mlp


def make():
    return digits_mlp()
'''


@pytest.mark.parametrize("network", [["--peers", "2"], ["--gateways", "1", "--edges", "2"]],
                         ids=["gossip", "federation"])
def test_a_task_file_given_relative_to_the_working_folder_loads_from_the_configs_init_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, network: list[str]) -> None:
    # Prepare: the task file beside the user, the network in a folder of its own
    from peer.runtime.edgeconfig import load_edge_config
    from peer.runtime.peerconfig import load_peer_config
    from peer.train.tasks import get_task

    (tmp_path / "some" / "dir").mkdir(parents=True)
    (tmp_path / "some" / "dir" / "file.py").write_text(TASK_FILE)
    monkeypatch.chdir(tmp_path)
    # Execute
    code = main(["init", *network, "--task", "some/dir/file.py:make", "--out", "net"])
    # Assert: every config names a task that loads from it, wherever it is read from
    assert code == 0
    monkeypatch.chdir("/")
    configs = sorted((tmp_path / "net").glob("[pg]*.toml"))
    edges = sorted((tmp_path / "net").glob("e*.toml"))
    assert len(configs) + len(edges) == (2 if network[0] == "--peers" else 3)
    for config in [*map(load_peer_config, configs), *map(load_edge_config, edges)]:
        assert Path(config.network.task.rpartition(":")[0]).samefile(tmp_path / "some" / "dir" / "file.py")
        assert get_task(config.network.task).n_train > 0


def test_a_task_file_that_is_not_there_is_one_line_naming_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--gateways", "1", "--edges", "2", "--task", "some/dir/file.py:make",
                 "--out", "net"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hivemesh: error: --task: ") and "no such file" in err and err.count("\n") == 1, err
    assert not (tmp_path / "net").exists()


def test_init_reads_back_what_it_wrote_and_a_task_the_configs_cannot_load_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: the old bug put back (the task written as given, checked from the working folder)
    import peer.cli.init as init

    (tmp_path / "some" / "dir").mkdir(parents=True)
    (tmp_path / "some" / "dir" / "file.py").write_text(TASK_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(init, "task_as_written", lambda task: task)
    monkeypatch.setattr(init, "check_network", lambda *args, **kwargs: None)
    # Execute
    code = main(["init", "--gateways", "1", "--edges", "2", "--task", "some/dir/file.py:make",
                 "--out", "net"])
    # Assert: no success reported; one line naming the written file, the key and what is missing
    out, err = capsys.readouterr()
    assert code == 2 and "created" not in out, out
    opening = "hivemesh: error: init wrote a config that does not load: net/gw0.toml: key 'network.task': "
    assert err.startswith(opening) and "no such file" in err and err.count("\n") == 1, err

"""`hivemesh init`, the peer config schema and the peer's start-up checks (no sockets, no training)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from peer.cli.main import main
from peer.files import tomlout
from peer.files.config import ConfigError
from peer.files.keyfile import load_identity
from peer.runtime.assemble import identity_and_roster, next_epoch
from peer.runtime.netinit import load_roster
from peer.runtime.peerconfig import load_peer_config
from protocols.errors import HivemeshError
from topology import build


def _init(tmp_path: Path, *extra: str, peers: int = 4) -> Path:
    out = tmp_path / "net"
    assert main(["init", "--peers", str(peers), "--topology", "ring", "--out", str(out), *extra]) == 0
    return out


def test_tomlout_round_trips_what_generated_files_hold() -> None:
    data = {"a": 1, "b": 2.5, "c": "x \"quoted\" \\ back", "d": True, "e": [1, 2],
            "f": {"g": {"h": "i"}, "j": 0}, "member": [{"name": "p0"}, {"name": "p1", "k": 1.0}]}
    assert tomllib.loads(tomlout.dumps(data)) == data


def test_init_writes_keys_roster_and_loadable_configs(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = _init(tmp_path, "--algorithm", "choco", "--steps", "50")
    assert "hivemesh peer --config" in capsys.readouterr().out
    roster = load_roster(out / "roster.toml")
    assert roster.names == ("p00", "p01", "p02", "p03")
    addresses = {m.address for m in roster}
    assert len(addresses) == 4 and all(a.startswith("tcp://127.0.0.1:") for a in addresses)
    for name in roster.names:
        key = out / "keys" / f"{name}.key"
        assert os.stat(key).st_mode & 0o777 == 0o600
        assert load_identity(key).public_id == roster.member(name).public_id
        config = load_peer_config(out / f"{name}.toml")
        assert config.gossip.algorithm == "choco" and config.gossip.compression == "topk:fraction=0.01"
        assert config.trainer.total_steps == 50
        assert config.data_dir == (out / "data" / name).resolve() or config.data_dir == out / "data" / name
        assert identity_and_roster(config)[2] == name


def test_init_refuses_a_non_empty_folder_and_a_bad_topology(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = _init(tmp_path)
    assert main(["init", "--peers", "4", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["init", "--peers", "4", "--topology", "torus:3x3", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hivemesh: error:") and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_wrong_config_key_names_file_and_key(tmp_path: Path) -> None:
    out = _init(tmp_path)
    path = out / "p00.toml"
    path.write_text(path.read_text().replace("[network.gossip]", "[network.gossip]\nalgoritm = \"dpsgd\""))
    with pytest.raises(ConfigError, match=r"p00\.toml: unknown key 'network\.gossip\.algoritm'"):
        load_peer_config(path)
    path.write_text(path.read_text().replace('name = "p00"', 'name = "p00"\nlisten_port = 4'))
    with pytest.raises(ConfigError, match=r"unknown key 'peer\.listen_port'"):
        load_peer_config(path)


def test_bad_values_are_config_errors(tmp_path: Path) -> None:
    out = _init(tmp_path)
    path = out / "p01.toml"
    text = path.read_text()
    path.write_text(text.replace("lr = 0.1", "lr = -1.0"))
    with pytest.raises(ConfigError, match=r"network\.trainer.*lr must be a positive number"):
        load_peer_config(path)
    path.write_text(text + "\n[checkpoint]\nkeep = 0\n")
    with pytest.raises(ConfigError, match="keep must be at least 1"):
        load_peer_config(path)


def test_missing_and_foreign_key_files_are_one_line_errors(tmp_path: Path) -> None:
    out = _init(tmp_path)
    config = load_peer_config(out / "p02.toml")
    (out / "keys" / "p02.key").rename(out / "keys" / "moved.key")
    with pytest.raises(HivemeshError, match="no such key file"):
        identity_and_roster(config)
    (out / "keys" / "p03.key").rename(out / "keys" / "p02.key")   # someone else's key
    with pytest.raises(HivemeshError, match="is not the key of 'p02' on the roster"):
        identity_and_roster(config)


def test_epoch_increments_at_every_start(tmp_path: Path) -> None:
    assert [next_epoch(tmp_path / "d") for _ in range(3)] == [0, 1, 2]
    (tmp_path / "d" / "epoch").write_text("garbage")
    with pytest.raises(HivemeshError, match="corrupt epoch file"):
        next_epoch(tmp_path / "d")


def test_neighbours_cover_the_whole_schedule() -> None:
    names = tuple(f"p{i}" for i in range(8))
    assert build("ring", names).neighbours("p0") == ("p1", "p7")
    one_peer = build("one-peer-exponential:8", names)
    assert one_peer.period == 3
    union = set(one_peer.neighbours("p0"))
    assert len(union) == 3 and "p0" not in union    # one partner per round, a new one each round
    assert all(set(one_peer.in_neighbours("p0", t)) <= union for t in range(3))
    directed = build("directed-exponential:8", names)   # whom p0 sends to and whom it hears from
    assert set(directed.neighbours("p0")) == {*directed.in_neighbours("p0"), *directed.out_neighbours("p0")}
    assert set(directed.in_neighbours("p0")) != set(directed.out_neighbours("p0"))

"""A federation's files (``hivemesh init --gateways G --edges E``) and an edge client's own data formats."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from peer.cli.main import main
from peer.runtime.edgeconfig import load_edge_config
from peer.runtime.netinit import load_roster
from peer.runtime.peerconfig import load_peer_config
from peer.train.local_data import load_local_data
from protocols.errors import HivemeshError
from protocols.roster import run_id


def test_init_writes_a_federation_whose_members_share_one_run_id(tmp_path: Path) -> None:
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "2", "--edges", "5", "--rounds", "7", "--out", str(out)]) == 0
    roster = load_roster(out / "roster.toml")
    assert [m.name for m in roster.with_role("gateway")] == ["gw0", "gw1"]
    edges = roster.with_role("edge")
    assert [m.name for m in edges] == ["e000", "e001", "e002", "e003", "e004"]
    assert all(not m.address for m in edges) and all(m.address for m in roster.with_role("gateway"))
    gateway = load_peer_config(out / "gw0.toml")
    assert gateway.federation is not None and gateway.federation.rounds == 7
    assert gateway.federation.gossip_rounds == 1     # two gateways gossip after each round
    # the influence bounds (issue 32) and min_registered are in the shared file, for an operator to
    # see and change; the members' own files include it and hold no table of it
    written = tomllib.loads((out / "federation.toml").read_text())
    fed = written["federation"]
    assert (fed["samples_multiple"], fed["norm_multiple"], fed["min_registered"]) == (2.0, 2.0, 2)
    for path in (out / "gw0.toml", out / "e000.toml"):
        own = tomllib.loads(path.read_text())
        assert own["include"] == "federation.toml" and not {"network", "federation"} & set(own), path
    assert gateway.gossip.total_steps == 7 and gateway.gossip.mixing == "after"
    assert gateway.peer.clients == ("e000", "e001", "e002")      # blocks: client i of 5 is gw(i*2//5)'s
    assert load_peer_config(out / "gw1.toml").peer.clients == ("e003", "e004")
    ids = {run_id(gateway.shared())}
    for index, edge in enumerate(m.name for m in edges):
        config = load_edge_config(out / f"{edge}.toml")
        assert config.edge.gateway == ("gw0" if index < 3 else "gw1")
        ids.add(run_id(config.shared()))
    assert len(ids) == 1
    # a plain peer's run id is not a gateway's: [federation] is part of it
    assert main(["init", "--peers", "2", "--out", str(tmp_path / "net")]) == 0
    assert run_id(load_peer_config(tmp_path / "net" / "p00.toml").shared()) not in ids


def test_init_refuses_a_federation_and_peers_at_once(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x")
    assert main(["init", "--peers", "2", "--gateways", "1", "--edges", "2", "--out", out]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_bad_federation_key_is_named(tmp_path: Path) -> None:
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "1", "--edges", "2", "--out", str(out)]) == 0
    text = (out / "federation.toml").read_text().replace("fraction = 0.5", "fraction = 1.5")
    (out / "federation.toml").write_text(text)
    # the shared file is named, where the key is written
    with pytest.raises(HivemeshError, match=r"federation\.toml: .*federation\.fraction"):
        load_peer_config(out / "gw0.toml")
    with pytest.raises(HivemeshError, match=r"federation\.toml: .*federation\.fraction"):
        load_edge_config(out / "e000.toml")


def test_local_data_in_every_documented_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 1, 2, 1])
    np.savez(tmp_path / "d.npz", x=x, y=y)
    save_file({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, str(tmp_path / "d.safetensors"))
    rows = "\n".join(",".join(str(v) for v in [*r, label]) for r, label in zip(x, y, strict=True))
    (tmp_path / "d.csv").write_text("a,b,c,label\n" + rows + "\n")
    (tmp_path / "mydata.py").write_text(
        "import torch\n\ndef load():\n"
        "    return torch.arange(12.).reshape(4, 3), torch.tensor([0, 1, 2, 1])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("d.npz", "d.safetensors", "d.csv"):
        got_x, got_y = load_local_data(str(tmp_path / spec))
        assert torch.equal(got_x, torch.from_numpy(x)) and torch.equal(got_y, torch.from_numpy(y)), spec
    got_x, got_y = load_local_data("mydata:load")
    assert got_x.shape == (4, 3) and got_y.tolist() == [0, 1, 2, 1]
    sys.modules.pop("mydata", None)


def test_local_data_errors_say_what_is_wrong(tmp_path: Path) -> None:
    np.savez(tmp_path / "nox.npz", y=np.zeros(3))
    with pytest.raises(HivemeshError, match="no array named x"):
        load_local_data(str(tmp_path / "nox.npz"))
    (tmp_path / "d.csv").write_text("a,b\n1,2\n")
    with pytest.raises(HivemeshError, match="no column 'label'"):
        load_local_data(str(tmp_path / "d.csv"))
    np.savez(tmp_path / "frac.npz", x=np.zeros((2, 2)), y=np.array([0.5, 1.0]))
    with pytest.raises(HivemeshError, match="integer class labels"):
        load_local_data(str(tmp_path / "frac.npz"))
    with pytest.raises(HivemeshError, match=r"expected a \.npz"):
        load_local_data("data.parquet")

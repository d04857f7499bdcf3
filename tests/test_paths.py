"""Relative paths in a peer config or a scenario are taken from that file's folder, whatever the
working directory; the run id digests them as written, so it depends on neither."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from peer.runtime.assemble import assemble
from peer.runtime.netinit import create_network, load_roster
from peer.runtime.peerconfig import load_peer_config
from protocols.roster import run_id
from sim.from_network import scenario_from_peer_file
from sim.gossip_driver import GossipRun
from sim.scenario import load_scenario
from sim.world import build_world

N = 3
NAMES = ("p00", "p01", "p02")
N_TRAIN = 30
# Member i gets every third sample from i: no seeded scheme would deal these, so using them proves
# the file was read.
SHARDS = {f"p{i:02d}": list(range(i, N_TRAIN, N)) for i in range(N)}  # keyed by member name

TASK_FILE = '''
import torch
from torch import nn


def make(*, features: int = 4):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, features, generator=generator)
    y = (x.sum(dim=1) > 0).long()

    def model(seed):
        torch.manual_seed(seed)
        return nn.Linear(features, 2)

    return {"model": model, "train": (x[:30], y[:30]), "test": (x[30:], y[30:])}
'''


def _write_beside(folder: Path) -> None:
    """The task file, the partition file and a graph file, next to the config that names them."""
    (folder / "tasks").mkdir()
    (folder / "tasks" / "custom.py").write_text(TASK_FILE)
    (folder / "shards.json").write_text(json.dumps(SHARDS))
    (folder / "triangle.edgelist").write_text("p00 p01\np01 p02\np02 p00\n")


NETWORK = {"topology": "triangle.edgelist", "task": "tasks/custom.py:make", "task_options": {"features": 4},
           "partition": {"scheme": "file", "path": "shards.json"},
           "gossip": {"algorithm": "dpsgd", "total_steps": 2}, "trainer": {"lr": 0.1, "batch_size": 4}}


def _peer_network(folder: Path) -> Path:
    files = create_network(folder, peers=N, network=NETWORK)
    _write_beside(folder)
    return files.configs["p01"]


def _run_id(config_path: Path) -> bytes:
    parts = assemble(load_peer_config(config_path))
    parts.lock.release()
    return parts.run_id


def test_peer_config_paths_resolve_against_its_folder_from_any_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_path = _peer_network(tmp_path / "net")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")

    parts = assemble(load_peer_config(Path("../net/p01.toml")))

    assert parts.topology.names == NAMES and parts.topology.graph.number_of_edges() == 3
    assert parts.trainer.shard.tolist() == SHARDS["p01"]
    assert parts.trainer.flat_params.numel() == 4 * 2 + 2    # the custom task's nn.Linear(4, 2)
    assert config_path.parent.name == "net"


def test_run_id_depends_neither_on_the_working_directory_nor_on_the_config_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_path = _peer_network(tmp_path / "net")
    # Another machine: the same files (same roster, keys, network) in another folder.
    copy_path = Path(shutil.copytree(tmp_path / "net", tmp_path / "other" / "deeper" / "net")) / "p01.toml"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    monkeypatch.chdir(tmp_path / "a")
    here = _run_id(config_path)
    monkeypatch.chdir(tmp_path / "b")
    from_b = _run_id(Path("../net/p01.toml"))
    copied = _run_id(copy_path)

    assert here == from_b == copied
    # Control: the resolved paths do differ between the two folders, so digesting them (what
    # members must not do) would have split the network.
    original, copy = load_peer_config(config_path), load_peer_config(copy_path)
    assert original.network != copy.network and original.network_as_written == copy.network_as_written
    roster = load_roster(original.roster_path)
    assert (run_id({"roster": roster, "network": dataclasses.asdict(original.network)})
            != run_id({"roster": roster, "network": dataclasses.asdict(copy.network)}))


def test_scenario_from_a_peer_file_takes_its_paths_from_the_peer_files_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _peer_network(tmp_path / "net")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")

    world = build_world(scenario_from_peer_file(Path("../net/p00.toml"), duration_s=10.0))

    assert world.names == NAMES
    assert [world.trainers[n].shard.tolist() for n in NAMES] == [SHARDS[n] for n in NAMES]


SCENARIO = """
seed = 2
steps = 2
duration_s = 10.0
eval_every_s = 10.0

[graph]
spec = "graphs/triangle.edgelist"

[task]
name = "tasks/custom.py:make"
options = { features = 4 }

[partition]
scheme = "file"
path = "shards.json"

[algorithm]
algorithm = "dpsgd"

[trainer]
batch_size = 4
"""


def test_scenario_paths_resolve_against_its_folder_from_any_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    _write_beside(folder)
    (folder / "graphs").mkdir()
    (folder / "triangle.edgelist").rename(folder / "graphs" / "triangle.edgelist")
    (folder / "scenario-paths.toml").write_text(SCENARIO)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")

    world = build_world(load_scenario(Path("../scenarios/scenario-paths.toml")))
    result = GossipRun(world).run()

    assert world.names == NAMES
    assert [world.trainers[n].shard.tolist() for n in NAMES] == [SHARDS[n] for n in NAMES]
    assert all(result.peers[n]["steps"] == 2 for n in NAMES)

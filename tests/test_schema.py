"""One config schema for `hivemesh peer` and scenarios: the same table, the same settings or the same error.

A peer file keeps the shared settings under ``[network]`` (and its liveness keys under
``[peer]``); a scenario keeps them at the top level, in ``[partition]``, ``[algorithm]``,
``[trainer]`` and ``[nodes]``. These tests write one set of tables both ways and load each
with its own loader (``load_peer_config``, ``load_scenario``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from peer.files import tomlout
from peer.files.config import ConfigError
from peer.files.schema import PartitionConfig
from peer.runtime.peerconfig import load_peer_config
from sim.scenario import load_scenario

PEER = {"name": "p00", "key": "p00.key", "roster": "roster.toml", "data_dir": "data"}
# the scenario's name for each table a peer file holds (peer.files.schema's inventory)
SCENARIO_TABLE = {"network.partition": "partition", "network.gossip": "algorithm",
                  "network.trainer": "trainer", "peer": "nodes"}


def write_both(folder: Path, tables: dict[str, dict[str, Any]]) -> tuple[Path, Path]:
    """``tables`` (keyed by the peer file's table names) as a peer file and as a scenario."""
    network: dict[str, Any] = {"topology": "ring", "seed": 3}
    peer = dict(PEER)
    scenario: dict[str, Any] = {"seed": 3, "graph": {"spec": "ring:4"}}
    for name, table in tables.items():
        if name == "peer":
            peer.update(table)
        else:
            network[name.removeprefix("network.")] = table
        scenario[SCENARIO_TABLE[name]] = table
    peer_path, scenario_path = folder / "p00.toml", folder / "scenario-s.toml"
    peer_path.write_text(tomlout.dumps({"peer": peer, "network": network}))
    scenario_path.write_text(tomlout.dumps(scenario))
    return peer_path, scenario_path


GOOD: dict[str, dict[str, Any]] = {
    "network.partition": {"scheme": "shards", "shards_per_member": 3},
    "network.gossip": {"algorithm": "local", "local_steps": 4, "total_steps": 40, "deadline_s": 2.5},
    # no total_steps: the decay horizon is the gossip table's (the daemon used to refuse this)
    "network.trainer": {"lr": 0.2, "lr_decay": "cosine", "batch_size": 16},
    "peer": {"neighbour_timeout_s": 0.75, "sync_answer_interval_s": 2.0, "sync_timeout_s": 4.0,
             "sync_attempts": 3},
}


def test_the_same_tables_give_equal_settings_through_both_loaders(tmp_path: Path) -> None:
    peer_path, scenario_path = write_both(tmp_path, GOOD)

    peer, scenario = load_peer_config(peer_path), load_scenario(scenario_path)

    assert peer.network.partition == scenario.partition
    assert scenario.partition == PartitionConfig(scheme="shards", shards_per_member=3)
    assert peer.gossip == scenario.gossip_config()
    assert peer.gossip.seed == 3 and peer.gossip.total_steps == 40
    assert peer.trainer == scenario.trainer_config()
    assert peer.trainer.total_steps == 40 and peer.trainer.lr == 0.2
    assert peer.peer.node_config() == scenario.nodes.node_config()
    assert scenario.nodes.node_config().neighbour_timeout_s == 0.75
    shared = scenario.network()
    assert (shared.seed, shared.task, shared.task_options) == (peer.network.seed, peer.network.task,
                                                               peer.network.task_options)


def test_empty_tables_give_the_same_defaults(tmp_path: Path) -> None:
    peer_path, scenario_path = write_both(tmp_path, {name: {} for name in SCENARIO_TABLE})

    peer, scenario = load_peer_config(peer_path), load_scenario(scenario_path)

    assert peer.network.partition == scenario.partition
    assert scenario.partition.scheme == "iid"     # the one default (peer.files.schema says why)
    assert peer.gossip == scenario.gossip_config()
    assert peer.trainer == scenario.trainer_config()
    assert peer.peer.node_config() == scenario.nodes.node_config()


def normalised(error: ConfigError, source: Path) -> str:
    """The message with the file and the table's layout-specific name taken out."""
    text = str(error).replace(str(source), "<file>")
    for peer_name, scenario_name in SCENARIO_TABLE.items():
        text = re.sub(rf"\b{re.escape(peer_name)}\b", scenario_name, text)
    return text


BAD = [
    ("network.partition", {"alpha": -1.0}, "alpha must be positive"),
    ("network.partition", {"alpha": float("nan")}, "alpha must be positive"),
    ("network.partition", {"shards_per_member": 0}, "shards_per_member must be at least 1"),
    ("network.partition", {"scheme": "file"}, "scheme 'file' needs a path"),
    ("network.partition", {"scheme": "zipf"}, "expected one of 'iid', 'dirichlet', 'shards', 'file'"),
    ("network.partition", {"alpah": 0.3}, "unknown key 'partition.alpah' in table [partition]"),
    ("network.gossip", {"algorithm": "gossip"}, "expected one of"),
    ("network.gossip", {"algorithm": "dpsgd", "local_steps": 2}, "local_steps must be 1"),
    ("network.gossip", {"total_steps": "many"}, "key 'algorithm.total_steps': expected int"),
    ("network.gossip", {"algoritm": "dpsgd"}, "unknown key 'algorithm.algoritm' in table [algorithm]"),
    ("network.trainer", {"lr": 0.0}, "lr must be a positive number"),
    ("network.trainer", {"lr_decay": "cosine"}, "needs total_steps > warmup_steps"),
    ("network.trainer", {"learning_rate": 0.1}, "unknown key 'trainer.learning_rate' in table [trainer]"),
    ("peer", {"neighbour_timeout_s": 0.0}, "neighbour_timeout_s must be > 0"),
    ("peer", {"neighbour_timeout_s": float("inf")}, "neighbour_timeout_s must be > 0"),
    ("peer", {"sync_answer_interval_s": -1.0}, "sync_answer_interval_s must be >= 0"),
    ("peer", {"sync_attempts": 0}, "sync_attempts must be >= 1"),
]


@pytest.mark.parametrize(("table", "values", "needle"), BAD, ids=[f"{t}-{'-'.join(v)}" for t, v, _ in BAD])
def test_a_bad_value_gives_the_same_error_through_both_loaders(
        tmp_path: Path, table: str, values: dict[str, Any], needle: str) -> None:
    peer_path, scenario_path = write_both(tmp_path, {table: values})

    with pytest.raises(ConfigError) as from_peer:
        load_peer_config(peer_path)
    with pytest.raises(ConfigError) as from_scenario:
        load_scenario(scenario_path)

    assert needle in normalised(from_peer.value, peer_path)
    if table == "peer":
        # [peer] and [nodes] hold other keys too (their lists of known keys differ): the reason must match
        assert normalised(from_peer.value, peer_path).split(": ")[-1] == \
            normalised(from_scenario.value, scenario_path).split(": ")[-1]
    else:
        assert normalised(from_peer.value, peer_path) == normalised(from_scenario.value, scenario_path)


@pytest.mark.parametrize(("where", "needle"), [
    ({"nodes": {"neighbour_timeot_s": 1.0}}, "unknown key 'nodes.neighbour_timeot_s' in table [nodes]"),
    ({"graph": {"spce": "ring:4"}}, "unknown key 'graph.spce' in table [graph]"),
    ({"sede": 1}, "unknown key 'sede' in the top-level table"),
])
def test_a_scenario_refuses_an_unknown_key_naming_it_and_its_table(
        tmp_path: Path, where: dict[str, Any], needle: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(tomlout.dumps({"graph": {"spec": "ring:4"}, **where}))
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_scenario(path)


def test_a_peer_file_refuses_an_unknown_key_naming_it_and_its_table(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(tomlout.dumps({"peer": {**PEER, "neighbour_timeot_s": 1.0}}))
    with pytest.raises(ConfigError, match=re.escape("unknown key 'peer.neighbour_timeot_s' in table [peer]")):
        load_peer_config(path)


def test_the_old_neighbour_timeout_ms_is_refused_with_the_new_key_named(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(tomlout.dumps({"graph": {"spec": "ring:4"}, "nodes": {"neighbour_timeout_ms": 500.0}}))
    with pytest.raises(ConfigError) as refused:
        load_scenario(path)
    assert "'nodes.neighbour_timeout_ms'" in str(refused.value)
    assert "renamed: use neighbour_timeout_s (seconds" in str(refused.value)
    path.write_text(tomlout.dumps({"graph": {"spec": "ring:4"}, "nodes": {"neighbour_timeout_s": 0.5}}))
    assert load_scenario(path).nodes.neighbour_timeout_s == 0.5    # control: the new key is taken


def test_a_scenario_checks_its_partition_algorithm_and_trainer_when_loaded(tmp_path: Path) -> None:
    # the simulator used to take any alpha and fail (or not) only when the world was built
    for tables in ({"partition": {"scheme": "dirichlet", "alpha": 0.0}},
                   {"algorithm": {"algorithm": "dpsgd", "local_steps": 3}},
                   {"trainer": {"lr": -1.0}}):
        path = tmp_path / "s.toml"
        path.write_text(tomlout.dumps({"graph": {"spec": "ring:4"}, **tables}))
        with pytest.raises(ConfigError, match=re.escape(f"key '{next(iter(tables))}")):
            load_scenario(path)

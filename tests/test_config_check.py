"""Configs checked before they run (issue 17, item 4): `hivemesh config check`, `config reference`,
`--set`, nearest-key suggestions, and every config error naming its file and key."""

from __future__ import annotations

import copy
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from peer.cli.config import check_file
from peer.cli.main import main
from peer.cli.reference import edge_file_keys, peer_file_keys, render, scenario_keys
from peer.files import tomlout
from peer.files.config import ConfigError, read_toml
from peer.runtime.edgeconfig import load_edge_config
from peer.runtime.netinit import create_network
from peer.runtime.peerconfig import load_peer_config
from sim.scenario import load_scenario

PROBE = "zz_probe"


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 4-peer network (keys, roster, configs) as `hivemesh init` writes it."""
    out = tmp_path_factory.mktemp("cfg") / "net"
    create_network(out, peers=4, network={"topology": "ring", "seed": 1, "task": "digits-mlp",
                                          "gossip": {"algorithm": "dpsgd", "total_steps": 10}})
    return out


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(tomlout.dumps(data))
    return path


def _set(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``data`` with dotted ``key`` set (None: deleted)."""
    data = copy.deepcopy(data)
    *tables, last = key.split(".")
    table = data
    for name in tables:
        table = table.setdefault(name, {})
    if value is None:
        del table[last]
    else:
        table[last] = value
    return data


# ------------------------------------------------------------ the reference against the loaders


def _accepted(load: Callable[[dict[str, Any]], None], base: dict[str, Any]) -> set[str]:
    """Every key ``load`` accepts, found by asking it: a table given an unknown key is refused with
    the keys that table knows (ConfigError.known); a key given a table of an unknown key is a table
    when that is the answer, else a value. Lists of tables are asked through their first item."""

    def known_in(path: list[str], as_list: bool) -> tuple[str, ...] | None:
        data = copy.deepcopy(base)
        table = data
        for name in path[:-1]:
            table = table.setdefault(name, {})
        table[path[-1]] = [{PROBE: 1}] if as_list else {PROBE: 1}
        try:
            load(data)
        except ConfigError as error:
            dotted = ".".join(path) + ("[0]" if as_list else "")
            if error.key == f"{dotted}.{PROBE}" and error.known:
                return error.known
        return None

    found: set[str] = set()

    def walk(path: list[str], keys: tuple[str, ...], shown: str) -> None:
        for name in keys:
            here = [*path, name]
            label = f"{shown}.{name}" if shown else name
            if (inner := known_in(here, as_list=False)) is not None:
                walk(here, inner, label)
            elif (items := known_in(here, as_list=True)) is not None:
                # a list of tables: the file writes [[faults.churn]]; the reference says faults.churn[]
                for item in items:
                    found.add(f"{label}[].{item}")
            else:
                found.add(label)

    data = copy.deepcopy(base)
    data[PROBE] = 1
    with pytest.raises(ConfigError) as top:
        load(data)
    walk([], top.value.known, "")
    return found


def test_the_reference_lists_exactly_the_keys_the_peer_loader_accepts(tmp_path: Path) -> None:
    base = {"peer": {"name": "p00", "key": "k.key", "roster": "roster.toml", "data_dir": "d"}}
    path = tmp_path / "p00.toml"

    def load(data: dict[str, Any]) -> None:
        load_peer_config(_write(path, data))

    accepted = _accepted(load, base)
    listed = {doc.key for doc in peer_file_keys()}
    assert listed == accepted
    # the keys the issue found undocumented are among them
    assert {"peer.late_join", "peer.finish_grace_s", "peer.eval_every_steps", "network.task_options",
            "peer.neighbour_timeout_s"} <= listed


def test_the_reference_lists_exactly_the_keys_the_edge_loader_accepts(tmp_path: Path) -> None:
    own = {"name": "e000", "key": "k.key", "roster": "roster.toml", "data_dir": "d", "gateway": "gw0"}
    base = {"edge": own, "federation": {}}
    path = tmp_path / "e000.toml"

    def load(data: dict[str, Any]) -> None:
        load_edge_config(_write(path, data))

    listed = {doc.key for doc in edge_file_keys()}
    # less the gateways' gossip keys, which an edge client takes (from the shared file) for the run id only
    assert listed == _accepted(load, base) - {"network.topology", "network.weights", "network.gossip"}
    assert {"edge.gateway_timeout_s", "federation.fraction", "network.trainer.lr"} <= listed
    # the one key read before the loaders, listed for both member files
    assert render().count("\ninclude = ") == 2


def test_the_reference_lists_exactly_the_keys_the_scenario_loader_accepts(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"

    def load(data: dict[str, Any]) -> None:
        load_scenario(_write(path, data))

    accepted = _accepted(load, {})
    listed = {doc.key for doc in scenario_keys()}
    assert listed == accepted
    assert "source" not in listed       # the loader's own field, refused in a file
    assert {"faults.churn[].at_s", "algorithm.compression", "trainer.lr", "nodes.nic"} <= listed


def test_every_key_in_the_reference_has_a_type_a_default_and_a_meaning() -> None:
    for doc in [*peer_file_keys(), *scenario_keys()]:
        assert doc.type and doc.default and doc.meaning, doc
    by_key = {doc.key: doc for doc in peer_file_keys()}
    assert (by_key["peer.finish_grace_s"].default, by_key["peer.finish_grace_s"].unit) == ("3.0", "s")
    assert by_key["peer.name"].default == "required"
    assert by_key["network.trainer.lr"].type == "float"


def test_config_reference_prints_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    out = capsys.readouterr().out
    assert out == render()
    for doc in [*peer_file_keys(), *scenario_keys()]:
        assert f"\n{doc.key} = {doc.default}  (" in out


# ------------------------------------------------------------ config check


def test_config_check_says_ok_in_one_line(network: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(network / "p01.toml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ok: peer config {network / 'p01.toml'}: member 'p01' of 4 peers")
    assert out.count("\n") == 1
    choco = {"algorithm": "choco", "compression": "topk:fraction=0.1"}
    scenario = _write(network.parent / "s.toml", {"graph": {"spec": "ring:4"}, "algorithm": choco})
    assert main(["config", "check", str(scenario)]) == 0
    assert capsys.readouterr().out.startswith(f"ok: scenario {scenario}: 4 members, graph 'ring:4', choco")


def test_config_check_refuses_in_one_line_with_exit_2(network: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(network / "p01.toml"), "--set", "network.topology=torus:3x3"]) == 2
    err = capsys.readouterr().err
    assert err == (f"hivemesh: error: {network / 'p01.toml'}: key 'network.topology' (roster "
                   f"{network / 'roster.toml'}): topology spec 'torus:3x3' says 9 members but the roster "
                   "has 4\n")


# A peer file: (dotted key, value; None deletes it) -> the key the error must name.
PEER_CASES = [
    ("network.topology", "ringg:4", "network.topology"),                 # unknown topology spec
    ("network.topology", "torus:3x3", "network.topology"),               # 9 members, 4 on the roster
    ("peer.key", "keys/nobody.key", "peer.key"),                         # missing key file
    ("peer.key", "keys/p01.key", "peer.key"),                            # another member's key
    ("peer.roster", "no-roster.toml", "peer.roster"),                    # missing roster
    ("peer.name", "p09", "peer.name"),                                   # not on the roster
    ("peer.data_dir", None, "peer.data_dir"),                            # missing required key
    ("peer.heartbeat_interval_s", "fast", "peer.heartbeat_interval_s"),  # wrong type
    ("peer.heartbeat_interval_s", 0.0, "peer.heartbeat_interval_s"),     # out of range
    ("peer.neighbour_timeout_ms", 500, "peer.neighbour_timeout_ms"),     # renamed
    ("network.trainer.lrr", 0.1, "network.trainer.lrr"),                 # misspelt
    ("network.gossip.local_steps", 0, "network.gossip.local_steps"),
    ("network.gossip.compression", "topk:fraction=0.01", "network.gossip.compression"),  # needs CHOCO
    ("network.gossip.compression", "nonsense:x=1", "network.gossip.compression"),
    ("network.task", "digits-mpl", "network.task"),
    ("network.partition.alpha", -1.0, "network.partition.alpha"),
    ("checkpoint.keep", 0, "checkpoint.keep"),
    ("transport.reconnect_max_ms", 1, "transport.reconnect_max_ms"),
]

# A scenario: (dotted key, value) -> the key the error must name.
SCENARIO_CASES = [
    ("graph.spec", "ringg:4", "graph.spec"),
    ("graph.members", ["a", "b"], "graph.spec"),                         # ring:4 over two members
    ("sede", 1, "sede"),
    ("duration_s", "long", "duration_s"),
    ("duration_s", -1.0, "duration_s"),
    ("links.latency_ms", -1.0, "links.latency_ms"),
    ("nodes.step_time_ms", 0.0, "nodes.step_time_ms"),
    ("nodes.speed.p99", 0.5, "nodes.speed.p99"),                         # no such member
    ("nodes.neighbour_timeout_ms", 500, "nodes.neighbour_timeout_ms"),
    ("algorithm.algoritm", "dpsgd", "algorithm.algoritm"),
    ("algorithm.algorithm", "dpsdg", "algorithm.algorithm"),
    ("trainer.optimizer", "adam", "trainer.optimizer"),
    ("task.name", "nope", "task.name"),
    ("baseline.local_steps", 0, "baseline.local_steps"),
    ("faults.churn", [{"node": "p00", "kind": "explode", "at_s": 1.0}], "faults.churn[0].kind"),
    ("source", "x.toml", "source"),
]


@pytest.mark.parametrize(("key", "value", "named"), PEER_CASES, ids=[f"{k}={v}" for k, v, _ in PEER_CASES])
def test_a_peer_config_error_names_the_file_and_the_key(network: Path, key: str, value: Any,
                                                        named: str) -> None:
    good = read_toml(network / "p00.toml")
    bad = _write(network / f"bad-{key.replace('.', '-')}.toml", _set(good, key, value))
    with pytest.raises(ConfigError) as error:
        check_file(bad)
    message = str(error.value)
    assert message.startswith(str(bad)) and f"'{named}'" in message and "\n" not in message, message
    assert error.value.key == named


@pytest.mark.parametrize(("key", "value", "named"), SCENARIO_CASES,
                         ids=[f"{k}={v}" for k, v, _ in SCENARIO_CASES])
def test_a_scenario_error_names_the_file_and_the_key(tmp_path: Path, key: str, value: Any,
                                                     named: str) -> None:
    good = {"duration_s": 5.0, "graph": {"spec": "ring:4"}, "algorithm": {"algorithm": "dpsgd"}}
    if key.startswith("baseline"):
        good = {"duration_s": 5.0, "baseline": {"kind": "allreduce"}}
    bad = _write(tmp_path / "scenario-bad.toml", _set(good, key, value))
    with pytest.raises(ConfigError) as error:
        check_file(bad)
    message = str(error.value)
    assert message.startswith(str(bad)) and f"'{named}'" in message and "\n" not in message, message
    assert error.value.key == named


def test_the_good_files_of_those_cases_pass(network: Path, tmp_path: Path) -> None:
    # negative control: the files the malformed ones are made from are accepted
    assert check_file(network / "p00.toml").startswith("ok: peer config")
    for good in ({"duration_s": 5.0, "graph": {"spec": "ring:4"}, "algorithm": {"algorithm": "dpsgd"}},
                 {"duration_s": 5.0, "baseline": {"kind": "allreduce"}}):
        assert check_file(_write(tmp_path / "s.toml", good)).startswith("ok: scenario")


def test_the_member_count_mismatch_says_both_counts(network: Path) -> None:
    torus = _set(read_toml(network / "p00.toml"), "network.topology", "torus:3x3")
    bad = _write(network / "torus.toml", torus)
    with pytest.raises(ConfigError, match="'torus:3x3' says 9 members but the roster has 4"):
        check_file(bad)


@pytest.mark.parametrize(("write", "typo", "suggested"), [
    ("peer", "network.trainer.lrr", "lr"),
    ("peer", "peer.eval_every_step", "eval_every_steps"),
    ("scenario", "nodes.neighbour_timeot_s", "neighbour_timeout_s"),
    ("scenario", "sede", "seed"),
    ("scenario", "algorithm.algorithm", "dpsgd"),    # a misspelt value of a closed set, too
])
def test_a_misspelt_key_suggests_the_nearest_known_one(network: Path, tmp_path: Path, write: str, typo: str,
                                                         suggested: str) -> None:
    if write == "peer":
        path = _write(network / "typo.toml", _set(read_toml(network / "p00.toml"), typo, 1))
    else:
        path = _write(tmp_path / "typo.toml", _set({}, typo, "dpsdg" if typo == "algorithm.algorithm" else 1))
    with pytest.raises(ConfigError, match=f"'{typo}'.*did you mean '{suggested}'\\?"):
        check_file(path)


def test_a_key_far_from_every_known_one_gets_no_guess(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        check_file(_write(tmp_path / "s.toml", {"qqqqqqqq": 1}))
    assert "did you mean" not in str(error.value) and "unknown key 'qqqqqqqq'" in str(error.value)


# ------------------------------------------------------------ --set


def test_set_overrides_a_peer_config_key_as_a_toml_value(network: Path) -> None:
    config = load_peer_config(network / "p00.toml", ["peer.eval_every_steps=7", "network.trainer.lr=0.05",
                                                     "checkpoint.every_steps=0", "network.topology=ring"])
    assert (config.peer.eval_every_steps, config.trainer.lr, config.checkpoint.every_steps) == (7, 0.05, 0)
    assert load_peer_config(network / "p00.toml").peer.eval_every_steps == 50   # the file is untouched


def test_peer_set_refuses_an_unknown_key_naming_it(network: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the daemon never starts: the config is checked first, in this process
    assert main(["peer", "--config", str(network / "p00.toml"), "--set", "network.trainer.lrr=0.05"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'network.trainer.lrr'" in err and "did you mean 'lr'?" in err and err.count("\n") == 1


def test_sim_set_refuses_an_unknown_key_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = _write(tmp_path / "s.toml", {"graph": {"spec": "ring:4"}})
    assert main(["sim", str(scenario), "--out", str(tmp_path / "out"), "--set", "graph.spce=ring:4"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'graph.spce'" in err and "did you mean 'spec'?" in err
    assert not (tmp_path / "out").exists()


def test_set_needs_key_equals_value(network: Path) -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_peer_config(network / "p00.toml", ["peer.eval_every_steps"])


def test_a_port_in_use_names_the_file_and_the_key(network: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # in this process: the peer fails at its bind, before any neighbour is waited for
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(["peer", "--config", str(network / "p02.toml"), "--quiet",
                     "--set", f"peer.listen=tcp://127.0.0.1:{port}"])
    finally:
        for number, handler in saved.items():   # the daemon installs its own; give pytest its back
            signal.signal(number, handler)
        holder.close()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{network / 'p02.toml'}: key 'peer.listen': peer p02: cannot listen on" in err
    assert "Address already in use" in err

"""One federation file (issue 30, item 1): `hivemesh init --gateways G --edges E` writes [network]
and [federation] once, in federation.toml, which every member's config includes; a member's own
file that sets a key of them is refused naming the key; an edit of the shared file reaches every
member; `init --set` and `--min-registered` write into it; configs carry no keys their role ignores."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from peer.cli.config import check_file
from peer.cli.main import main
from peer.files.config import ConfigError
from peer.files.include import read_member
from peer.runtime.edgeconfig import load_edge_config
from peer.runtime.peerconfig import load_peer_config
from protocols.roster import run_id

MEMBERS = ("gw0", "gw1", "e000", "e001", "e002", "e003")


def init(out: Path, *extra: str) -> Path:
    assert main(["init", "--gateways", "2", "--edges", "4", "--rounds", "3", "--out", str(out), *extra]) == 0
    return out


def loaded(out: Path, name: str) -> object:
    return (load_peer_config if name.startswith("gw") else load_edge_config)(out / f"{name}.toml")


def test_one_edit_of_the_shared_file_reaches_every_member_and_one_run_id(tmp_path: Path) -> None:
    # Prepare
    out = init(tmp_path / "fed")
    shared = out / "federation.toml"
    # Execute: the operator's one edit
    shared.write_text(shared.read_text().replace("fraction = 0.5", "fraction = 0.75"))
    configs = [loaded(out, name) for name in MEMBERS]
    # Assert: every member has it, and they share one run id
    assert {config.federation.fraction for config in configs} == {0.75}    # type: ignore[attr-defined]
    assert len({run_id(config.shared()) for config in configs}) == 1         # type: ignore[attr-defined]


@pytest.mark.parametrize("member", ["gw1", "e002"])
def test_a_shared_key_in_a_members_own_file_is_refused_naming_it(tmp_path: Path, member: str) -> None:
    out = init(tmp_path / "fed")
    own = out / f"{member}.toml"
    own.write_text(own.read_text() + "\n[federation]\nfraction = 0.3\n")
    with pytest.raises(ConfigError) as refused:
        loaded(out, member)
    assert refused.value.key == "federation.fraction"
    assert f"{member}.toml: key 'federation.fraction'" in str(refused.value)
    assert "federation.toml" in str(refused.value) and "\n" not in str(refused.value)
    # config check says the same, for the member and for the shared file (which checks every member)
    for path in (own, out / "federation.toml"):
        with pytest.raises(ConfigError, match=r"key 'federation\.fraction'"):
            check_file(path)
    # the other members are untouched
    assert loaded(out, "gw0").federation.fraction == 0.5      # type: ignore[attr-defined]


def test_a_nested_table_of_the_shared_file_names_its_first_key(tmp_path: Path) -> None:
    out = init(tmp_path / "fed")
    own = out / "gw0.toml"
    own.write_text(own.read_text() + "\n[network.trainer]\nlr = 0.5\n")
    with pytest.raises(ConfigError, match=r"key 'network\.trainer\.lr'"):
        load_peer_config(own)


def test_the_include_is_one_level_and_names_a_missing_file(tmp_path: Path) -> None:
    out = init(tmp_path / "fed")
    shared = out / "federation.toml"
    shared.write_text('include = "other.toml"\n' + shared.read_text())
    with pytest.raises(ConfigError, match="one level"):
        load_peer_config(out / "gw0.toml")
    shared.unlink()
    with pytest.raises(ConfigError, match=r"key 'include': .*federation\.toml: no such file"):
        load_edge_config(out / "e000.toml")


def test_relative_paths_in_the_shared_file_are_taken_from_its_folder(tmp_path: Path) -> None:
    # Prepare: the shared file names a partition file beside it; the member sits one folder down
    out = init(tmp_path / "fed")
    (out / "split.json").write_text("[[0, 1], [2, 3], [4, 5], [6, 7]]")
    shared = out / "federation.toml"
    text = shared.read_text().replace('scheme = "dirichlet"', 'scheme = "file"\npath = "split.json"')
    shared.write_text(text)
    (out / "members").mkdir()
    moved = out / "members" / "e001.toml"
    moved.write_text((out / "e001.toml").read_text().replace('include = "federation.toml"',
                                                             'include = "../federation.toml"')
                     .replace('"keys/', '"../keys/').replace('"roster.toml"', '"../roster.toml"'))
    # Execute
    config = load_edge_config(moved)
    # Assert: resolved against the shared file's folder; the run id digests it as written
    assert Path(config.network.partition.path) == (out / "split.json").resolve()
    assert run_id(config.shared()) == run_id(load_edge_config(out / "e001.toml").shared())
    assert read_member(moved).file_of("network") == moved.parent / "../federation.toml"


def test_init_set_and_min_registered_write_the_shared_file(tmp_path: Path) -> None:
    out = init(tmp_path / "fed", "--set", "federation.fraction=0.25", "--set", "network.trainer.lr=0.2",
               "--min-registered", "2")
    written = tomllib.loads((out / "federation.toml").read_text())
    assert written["federation"]["fraction"] == 0.25 and written["federation"]["min_registered"] == 2
    assert written["network"]["trainer"]["lr"] == 0.2
    assert load_edge_config(out / "e003.toml").trainer.lr == 0.2


@pytest.mark.parametrize(("extra", "uplink", "round_timeout_s"), [
    ([], "identity", 180.0),                                           # what it needs, written
    (["--set", "federation.secure_aggregation.share_timeout_s=90"], "identity", 240.0),
    (["--set", "federation.uplink=fp16", "--set", "federation.round_timeout_s=500"], "fp16", 500.0),
])
def test_init_that_turns_on_secure_aggregation_writes_what_it_needs_unless_told(
        tmp_path: Path, extra: list[str], uplink: str, round_timeout_s: float) -> None:
    # Prepare / Execute: SecAgg on for 4 clients a round, with init's other defaults (qsgd, 30 s)
    out = init(tmp_path / "fed", "--set", "federation.secure_aggregation.min_roster=4", "--set",
               "federation.fraction=1.0", "--set", "federation.min_clients=4", *extra)
    # Assert: an uplink it can sum and a round that outlasts its five phases; what --set says, kept
    written = tomllib.loads((out / "federation.toml").read_text())["federation"]
    assert (written["uplink"], written["round_timeout_s"]) == (uplink, round_timeout_s)
    check_file(out / "federation.toml")


def test_init_writes_min_registered_as_min_clients_by_default(tmp_path: Path) -> None:
    written = tomllib.loads((init(tmp_path / "fed") / "federation.toml").read_text())["federation"]
    assert written["min_registered"] == written["min_clients"] == 2


@pytest.mark.parametrize(("extra", "named"), [
    (["--set", "peer.curve=false"], "--set"),                  # a member's own key
    (["--set", "federation.fraction=2"], "--set"),             # a bad value, named by key
    (["--min-registered", "-1"], "--rounds/--min-registered"),
    (["--steps", "100"], "--steps"),                            # a federation counts rounds
])
def test_init_refuses_in_one_line_naming_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    extra: list[str], named: str) -> None:
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "2", "--edges", "4", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hivemesh: error: {named}") and err.count("\n") == 1, err
    assert not out.exists()


def test_one_gateway_is_given_no_gossip_keys_and_refuses_gossip_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a lone gateway gossips with no one: no topology, algorithm or steps in its files
    assert main(["init", "--gateways", "1", "--edges", "3", "--out", str(tmp_path / "one")]) == 0
    written = tomllib.loads((tmp_path / "one" / "federation.toml").read_text())
    assert not {"topology", "gossip"} & set(written["network"])
    assert "gossip_rounds" not in written["federation"]
    assert "total_steps" not in written["network"]["trainer"]
    summary = check_file(tmp_path / "one" / "gw0.toml")
    assert "ring" not in summary and "dpsgd" not in summary
    assert main(["init", "--gateways", "1", "--edges", "3", "--topology", "star",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--topology: one gateway gossips with no one" in capsys.readouterr().err
    # two gateways gossip: the graph and algorithm act, the steps are the rounds' (not written)
    out = init(tmp_path / "two")
    network = tomllib.loads((out / "federation.toml").read_text())["network"]
    assert network["topology"] == "ring" and network["gossip"] == {"algorithm": "dpsgd"}
    assert load_peer_config(out / "gw0.toml").gossip.total_steps == 3

"""Networks on several hosts, as an operator sets them up (issue 16, item 1): `hivemesh init --hosts`
(or `--hosts-file`) writes one address per member, `hivemesh roster set-address` moves one, and an
address this machine doesn't own is one line naming what to change, never a traceback."""

from __future__ import annotations

import signal
import tomllib
from pathlib import Path

import pytest

from peer.cli.main import main
from peer.files import roster_file

# TEST-NET-3 (RFC 5737): documentation only, never an address of a test machine
NOT_OURS = "203.0.113.7"


def addresses(roster: Path) -> list[str]:
    return [member.address for member in roster_file.read(roster).members]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("hivemesh: error: ") and err.count("\n") == 1, err
    return err


def test_hosts_give_one_address_per_member_in_roster_order(tmp_path: Path) -> None:
    out = tmp_path / "net"
    code = main(["init", "--peers", "3", "--out", str(out),
                 "--hosts", f"10.77.0.1:7000, 10.77.0.2:7001,{NOT_OURS}:7002"])
    assert code == 0
    assert addresses(out / "roster.toml") == ["tcp://10.77.0.1:7000", "tcp://10.77.0.2:7001",
                                              f"tcp://{NOT_OURS}:7002"]
    assert roster_file.read(out / "roster.toml").names == ("p00", "p01", "p02")


def test_hosts_without_ports_take_consecutive_ports_from_the_base_port(tmp_path: Path) -> None:
    out = tmp_path / "net"
    assert main(["init", "--peers", "3", "--out", str(out), "--base-port", "7100",
                 "--hosts", "10.77.0.1,10.77.0.2:9000,[fd00::5]"]) == 0
    assert addresses(out / "roster.toml") == ["tcp://10.77.0.1:7100", "tcp://10.77.0.2:9000",
                                              "tcp://[fd00::5]:7102"]


def test_a_host_of_this_machine_without_a_port_gets_a_free_one(tmp_path: Path) -> None:
    out = tmp_path / "net"
    assert main(["init", "--peers", "2", "--out", str(out), "--hosts", "127.0.0.1,127.0.0.1"]) == 0
    first, second = addresses(out / "roster.toml")
    assert first.startswith("tcp://127.0.0.1:") and second.startswith("tcp://127.0.0.1:") and first != second


def test_a_hosts_file_is_one_address_a_line_with_comments(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# the lab\n10.77.0.1:7000\n\n10.77.0.2:7000   # second rack\n")
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "2", "--edges", "3", "--out", str(out),
                 "--hosts-file", str(hosts)]) == 0
    roster = roster_file.read(out / "roster.toml")
    assert [(m.name, m.address) for m in roster.with_role("gateway")] == [
        ("gw0", "tcp://10.77.0.1:7000"), ("gw1", "tcp://10.77.0.2:7000")]
    assert all(m.address == "" for m in roster.with_role("edge"))


BAD_HOSTS = [
    (["--hosts", "10.77.0.1:7000,10.77.0.2:7000"], "--hosts: 2 addresses for 3 members (p00, p01, p02)"),
    (["--hosts", "10.77.0.1:7000,10.77.0.2:7000,10.77.0.3:7000,10.77.0.4:7000"],
     "--hosts: 4 addresses for 3"),
    (["--hosts", f"10.77.0.1:7000,10.77.0.2:7000,{NOT_OURS}"],
     f"--hosts: {NOT_OURS} is not an address of this machine"),
    (["--hosts", "10.77.0.1:7000,10.77.0.1:7000,10.77.0.3:7000"],
     "--hosts: tcp://10.77.0.1:7000 is given to two"),
    (["--hosts", "10.77.0.1:http,10.77.0.2:7000,10.77.0.3:7000"], "--hosts: '10.77.0.1:http' is not HOST"),
    (["--hosts", "10.77.0.1:70000,10.77.0.2:7000,10.77.0.3:7000"], "--hosts: '10.77.0.1:70000': port 70000"),
    (["--hosts", "10.77.0.1:7000,,10.77.0.3:7000"], "--hosts: entry 2 is empty"),
    (["--host", NOT_OURS], f"--host: {NOT_OURS} is not an address of this machine, so no free port can be "
                           "chosen for it here: give --base-port"),
    (["--hosts-file", "/nonexistent/hosts"], "--hosts-file /nonexistent/hosts: No such file"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_HOSTS, ids=[m.split(":")[0] + str(i)
                                                               for i, (_, m) in enumerate(BAD_HOSTS)])
def test_bad_hosts_are_one_line_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        extra: list[str], message: str) -> None:
    out = tmp_path / "net"
    assert main(["init", "--peers", "3", "--out", str(out), *extra]) == 2
    assert message in one_line_error(capsys)
    assert not out.exists()


def test_host_and_hosts_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["init", "--peers", "2", "--out", str(tmp_path / "n"), "--host", "127.0.0.1",
              "--hosts", "127.0.0.1,127.0.0.1"])
    assert exited.value.code == 2


@pytest.fixture
def network(tmp_path: Path) -> Path:
    out = tmp_path / "net"
    assert main(["init", "--peers", "3", "--out", str(out), "--base-port", "7000",
                 "--hosts", "10.77.0.1,10.77.0.2,10.77.0.3"]) == 0
    return out


def test_set_address_moves_one_member_and_is_the_next_roster_version(
        network: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roster = network / "roster.toml"
    before = roster_file.read(roster)
    assert main(["roster", "set-address", "--roster", str(roster), "p01", "10.77.0.9:7100",
                 "--effective-round", "50"]) == 0
    after = roster_file.read(roster)
    assert addresses(roster) == ["tcp://10.77.0.1:7000", "tcp://10.77.0.9:7100", "tcp://10.77.0.3:7002"]
    assert (after.version, after.effective_round) == (before.version + 1, 50)
    assert [(m.name, m.public_id, m.curve_key) for m in after] == [
        (m.name, m.public_id, m.curve_key) for m in before]
    assert "p01 now listens at tcp://10.77.0.9:7100" in capsys.readouterr().out


BAD_MOVES = [
    (["p07", "10.77.0.9:7000"], "no member 'p07' (members: p00, p01, p02)"),
    (["p01", "10.77.0.1:7000"], "tcp://10.77.0.1:7000 is already p00's address"),
    (["p01", "nonsense"], "address 'tcp://nonsense' is not tcp://HOST:PORT"),
    (["p01", "10.77.0.9:99999"], "is not tcp://HOST:PORT"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_MOVES, ids=[m for _, m in BAD_MOVES])
def test_a_bad_set_address_is_one_line_and_leaves_the_roster_alone(
        network: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    roster = network / "roster.toml"
    before = roster.read_text()
    assert main(["roster", "set-address", "--roster", str(roster), *extra]) == 2
    assert message in one_line_error(capsys)
    assert roster.read_text() == before


def test_an_edge_client_has_no_address_to_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "1", "--edges", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["roster", "set-address", "--roster", str(out / "roster.toml"), "e000",
                 "10.77.0.5:7000"]) == 2
    assert "e000 is an edge client: it dials out and listens nowhere" in one_line_error(capsys)


def test_a_peer_given_another_hosts_address_says_so_in_one_line(
        network: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the roster from --hosts names 10.77.0.x, none of them this machine's: the peer fails at its bind
    config = network / "p01.toml"
    assert tomllib.loads(config.read_text())["peer"]["name"] == "p01"
    capsys.readouterr()
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(["peer", "--config", str(config), "--quiet"])
    finally:
        for number, handler in saved.items():   # the daemon installs its own; give pytest its back
            signal.signal(number, handler)
    assert code == 2
    err = one_line_error(capsys)
    assert "key 'peer.roster' ('p01''s address in" in err and "cannot listen on tcp://10.77.0.2:7001" in err
    assert "10.77.0.2 is not an address of this machine" in err and "hivemesh roster set-address" in err

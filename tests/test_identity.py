"""Identities, key files, the roster and its CLI, and the run id."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import zmq
from zmq.utils import z85

from peer.cli.main import main
from peer.files.keyfile import KeyFileError, identity_text, load_identity, save_identity
from protocols.identity import (
    Identity,
    decode_public_id,
    encode_public_id,
    z85_decode,
    z85_encode,
)
from protocols.roster import Member, Roster, RosterError, run_id


def member_dict(name: str, identity: Identity, **extra: Any) -> dict[str, Any]:
    entry = {"name": name, "public_id": identity.public_id, "address": "tcp://127.0.0.1:7000"}
    entry.update(extra)
    return entry


# ------------------------------------------------------------ identities and key files


def test_public_id_round_trips_and_is_printable() -> None:
    identity = Identity.generate()
    assert len(identity.public_id) == 52 and identity.public_id.isalnum() and identity.public_id.islower()
    assert decode_public_id(identity.public_id) == identity.public_key
    assert encode_public_id(identity.public_key) == identity.public_id
    for bad in ("", "x" * 52, identity.public_id.upper(), identity.public_id[:-1], identity.public_id + "a"):
        with pytest.raises(ValueError):
            decode_public_id(bad)


def test_save_writes_mode_0600_and_refuses_overwrite(tmp_path: Path) -> None:
    identity = Identity.generate()
    path = tmp_path / "alice.key"
    old_umask = os.umask(0)  # even a permissive umask gives 0600
    try:
        save_identity(identity, path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_identity(path)
    assert loaded.public_id == identity.public_id
    assert loaded.curve_secret_key == identity.curve_secret_key
    before = path.read_bytes()
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        save_identity(Identity.generate(), path)
    assert path.read_bytes() == before


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_key_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "k.key"
    save_identity(Identity.generate(), path)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_identity(path)


@pytest.mark.parametrize("content", [
    b"", b"garbage\n", b"\xff\xfe\x00", b"hivemesh-identity 1\n",
    b"hivemesh-identity 1\ned25519-seed AAAA\ncurve-secret 0000000000000000000000000000000000000000\n",
    b"hivemesh-identity 1\ned25519-seed !!!!\ncurve-secret x\n",
])
def test_corrupt_key_file_gives_a_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="not a valid hivemesh key file"):
        load_identity(path)


def test_key_file_with_mismatched_public_id_is_refused(tmp_path: Path) -> None:
    text = identity_text(Identity.generate()).replace(
        "public-id ", "public-id " + Identity.generate().public_id + "\n# was ")
    path = tmp_path / "mixed.key"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="does not match"):
        load_identity(path)


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="hivemesh keygen"):
        load_identity(tmp_path / "nope.key")


def test_curve_keys_agree_with_libzmq() -> None:
    identity = Identity.generate()
    assert zmq.curve_public(identity.curve_secret_key.encode()).decode() == identity.curve_public_key
    public, secret = zmq.curve_keypair()
    assert z85_encode(z85_decode(public.decode())) == public.decode()
    assert z85.decode(secret) == z85_decode(secret.decode())
    assert z85.encode(bytes(range(32))).decode() == z85_encode(bytes(range(32)))


def test_signatures_verify_only_for_their_key_and_data() -> None:
    from protocols.identity import load_public_key, verify_signature

    alice, bob = Identity.generate(), Identity.generate()
    signature = alice.sign(b"data")
    assert verify_signature(load_public_key(alice.public_key), signature, b"data")
    assert not verify_signature(load_public_key(alice.public_key), signature, b"datA")
    assert not verify_signature(load_public_key(bob.public_key), signature, b"data")


# ------------------------------------------------------------ roster


def test_roster_round_trip_and_lookups() -> None:
    a, b, c = Identity.generate(), Identity.generate(), Identity.generate()
    data = {"member": [
        member_dict("zed", a, curve_key=a.curve_public_key),
        member_dict("amy", b, role="gateway"),
        {"name": "phone1", "public_id": c.public_id, "role": "edge"},
    ]}
    roster = Roster.from_dict(data)
    assert roster.names == ("amy", "phone1", "zed")
    assert Roster.from_dict(roster.to_dict()) == roster
    assert roster.member("zed").public_id == a.public_id
    assert roster.by_public_id(b.public_id) == roster.member("amy")
    assert roster.by_public_key(c.public_key) == roster.member("phone1")
    assert roster.by_public_id("not an id") is None
    assert roster.curve_allowlist() == frozenset({a.curve_public_key})
    assert [m.name for m in roster.with_role("edge")] == ["phone1"]
    assert roster.remove("amy").names == ("phone1", "zed")


@pytest.mark.parametrize(("entries", "needles"), [
    ([{"name": "p", "public_id": "short", "address": "tcp://h:1"}], ["member 'p'", "public_id"]),
    ([{"name": "p", "role": "boss", "address": "tcp://h:1"}], ["member 'p'", "missing public_id"]),
    ([{"name": "p", "colour": "red"}], ["member 'p'", "unknown key(s) colour"]),
    ([{"public_id": "x"}], ["member #1", "missing name"]),
    (["just a string"], ["member #1", "expected a table"]),
])
def test_bad_roster_entries_are_named(entries: list[Any], needles: list[str]) -> None:
    with pytest.raises(RosterError) as caught:
        Roster.from_dict({"member": entries}, source="r.toml")
    for needle in needles:
        assert needle in str(caught.value)
    assert str(caught.value).startswith("r.toml")


def test_roster_needs_addresses_roles_and_unique_entries() -> None:
    a, b = Identity.generate(), Identity.generate()
    with pytest.raises(ValueError, match="needs an address"):
        Member(name="p", public_id=a.public_id, role="peer")
    with pytest.raises(ValueError, match="role must be one of"):
        Member(name="p", public_id=a.public_id, role="boss", address="tcp://h:1")
    with pytest.raises(ValueError, match="not tcp://HOST:PORT"):
        Member(name="p", public_id=a.public_id, address="tcp://h:99999")
    with pytest.raises(ValueError, match="name must be"):
        Member(name="bad name", public_id=a.public_id, address="tcp://h:1")
    assert Member(name="e", public_id=a.public_id, role="edge").address == ""
    with pytest.raises(RosterError, match="'p' is listed twice"):
        Roster.from_dict({"member": [member_dict("p", a), member_dict("p", b)]})
    with pytest.raises(RosterError, match="share a public_id"):
        Roster.from_dict({"member": [member_dict("p", a), member_dict("q", a)]})


def test_run_id_is_canonical_and_sensitive() -> None:
    a = Identity.generate()
    roster = Roster.from_dict({"member": [member_dict("p", a)]})
    shared = {"roster": roster, "topology": "ring", "algorithm": "dpsgd", "task": {"name": "mlp", "lr": 0.1}}
    reordered = {"task": {"lr": 0.1, "name": "mlp"}, "algorithm": "dpsgd", "topology": "ring",
                 "roster": roster.to_dict()}
    assert run_id(shared) == run_id(reordered)
    assert len(run_id(shared)) == 32
    for change in ({"topology": "torus:2x2"}, {"algorithm": "choco"}, {"task": {"name": "mlp", "lr": 0.2}}):
        assert run_id({**shared, **change}) != run_id(shared)
    other = Roster.from_dict({"member": [member_dict("p", Identity.generate())]})
    assert run_id({**shared, "roster": other}) != run_id(shared)
    with pytest.raises(TypeError, match="not plain data"):
        run_id({"x": object()})


# ------------------------------------------------------------ CLI


def test_keygen_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "alice.key"
    assert main(["keygen", "--out", str(key)]) == 0
    public_id = capsys.readouterr().out.strip()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert load_identity(key).public_id == public_id
    assert main(["keygen", "--out", str(key)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert load_identity(key).public_id == public_id


def test_roster_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roster_path, alice_key = str(tmp_path / "roster.toml"), tmp_path / "alice.key"
    alice, bob = Identity.generate(), Identity.generate()
    save_identity(alice, alice_key)
    assert main(["roster", "add", "--roster", roster_path, "alice", "--key", str(alice_key),
                 "--address", "tcp://10.0.0.1:7000"]) == 0
    assert main(["roster", "add", "--roster", roster_path, "bob", "--public-id", bob.public_id,
                 "--role", "edge"]) == 0
    assert main(["roster", "add", "--roster", roster_path, "carl", "--public-id", bob.public_id,
                 "--address", "tcp://h:1"]) == 2
    assert "share a public_id" in capsys.readouterr().err
    dan = Identity.generate().public_id
    assert main(["roster", "add", "--roster", roster_path, "dan", "--public-id", dan,
                 "--role", "gateway"]) == 2
    assert "needs an address" in capsys.readouterr().err

    from peer.files import roster_file
    roster = roster_file.read(roster_path)
    assert roster.names == ("alice", "bob")
    assert roster.member("alice").curve_key == alice.curve_public_key
    assert roster.member("bob").role == "edge" and roster.member("bob").public_id == bob.public_id

    assert main(["roster", "show", "--roster", roster_path]) == 0
    shown = capsys.readouterr().out
    assert alice.public_id in shown and bob.public_id in shown and "tcp://10.0.0.1:7000" in shown

    assert main(["roster", "remove", "--roster", roster_path, "bob"]) == 0
    assert roster_file.read(roster_path).names == ("alice",)
    assert main(["roster", "remove", "--roster", roster_path, "bob"]) == 2
    assert "no member 'bob'" in capsys.readouterr().err
    assert main(["roster", "show", "--roster", str(tmp_path / "missing.toml")]) == 2

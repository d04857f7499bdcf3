"""Key rotation and revocation, and protocol versions one apart (issue 14, item 3: keys, upgrades).

Pure: rosters, Membership and Endpoints handing frames to each other, no sockets. The CLI test
writes a roster file; the real-process test is tests/test_daemon_keys.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from peer.cli.main import main
from peer.files import roster_file
from peer.files.keydir import find_identity
from peer.files.keyfile import load_identity, save_identity
from protocols.codec import Policy
from protocols.compress.accounting import endpoint_message_bytes
from protocols.identity import Identity
from protocols.messages import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, Heartbeat, Message, ParamPush
from protocols.node.membership import Membership
from protocols.roster import Member, Roster, RosterError, run_id
from protocols.wire import Endpoint, Opened, Rejection, wire_size

ROUND = 50          # the round a rotation takes effect
NAMES = ("a", "b", "c")
RUN = run_id({"topology": "ring"})


@dataclasses.dataclass
class Keys:
    old: dict[str, Identity]
    new_a: Identity

    def roster(self) -> Roster:
        return Roster(tuple(Member(name=name, public_id=key.public_id, address=f"tcp://127.0.0.1:{7000 + i}",
                                   curve_key=key.curve_public_key)
                            for i, (name, key) in enumerate(self.old.items())))

    def rotated(self) -> Roster:
        """Version 2 from ROUND: a's key rotated, c revoked."""
        signature = self.old["a"].sign_rotation("a", self.new_a, ROUND)
        roster = self.roster().rotate("a", public_id=self.new_a.public_id,
                                      curve_key=self.new_a.curve_public_key, at_round=ROUND,
                                      signature=signature)
        return roster.revoke("c").revised(ROUND)


@pytest.fixture
def keys() -> Keys:
    return Keys({name: Identity.generate() for name in NAMES}, Identity.generate())


def send(sender: Endpoint, receiver: Endpoint, message: Message | None = None) -> Opened | Rejection:
    frames = sender.seal((receiver.name,), message or Heartbeat(step=1))
    return receiver.open(frames)


# ------------------------------------------------------------ the roster record


def test_a_rotation_is_signed_by_the_old_key_and_survives_the_file(keys: Keys, tmp_path: Path) -> None:
    v2 = keys.rotated()
    path = tmp_path / "roster.toml"
    roster_file.write(path, v2)
    again = roster_file.read(path)
    assert again == v2
    entry = again.member("a")
    assert (entry.public_id, entry.rotated_from, entry.rotated_at_round) == (
        keys.new_a.public_id, keys.old["a"].public_id, ROUND)
    assert set(again.revoked) == {keys.old["a"].public_id, keys.old["c"].public_id}
    assert again.is_revoked(keys.old["c"].public_key) and not again.is_revoked(keys.new_a.public_key)
    # a record that does not match what the old key signed is refused: another round, another key,
    # a signature by someone else
    data = again.to_dict()
    record = next(m for m in data["member"] if m["name"] == "a")
    forged = Identity.generate()
    for change in ({"rotated_at_round": ROUND + 1}, {"public_id": forged.public_id},
                   {"rotation_signature": forged.sign_rotation("a", keys.new_a, ROUND)}):
        bad = {**data, "member": [m if m is not record else {**record, **change} for m in data["member"]]}
        with pytest.raises(RosterError, match="rotation_signature is not the old key"):
            Roster.from_dict(bad)
    # a revoked key cannot stay a member's
    with pytest.raises(RosterError, match="on the revoked list"):
        dataclasses.replace(keys.roster(), revoked=(keys.old["b"].public_id,))


def test_a_new_version_that_changes_a_key_without_a_rotation_is_refused(keys: Keys) -> None:
    v1 = keys.roster()
    swapped = Member(name="b", public_id=Identity.generate().public_id, address="tcp://127.0.0.1:7001")
    v2 = v1.remove("b").add(swapped).revised(ROUND)
    with pytest.raises(ValueError, match="another key without a rotation"):
        Membership(v1).changed_to(v2)
    assert Membership(v1).changed_to(keys.rotated()).current.version == 2


# ------------------------------------------------------------ who is accepted, before and after


def test_either_accepts_both_keys_of_a_rotated_member_and_drops_a_revoked_one_at_once(keys: Keys) -> None:
    membership = Membership(keys.roster()).changed_to(keys.rotated())
    either = membership.either()
    # a: its old entry (addressed, dialled) with the new key beside; c: gone, its key revoked
    assert either.member("a").public_id == keys.old["a"].public_id
    assert either.by_public_key(keys.new_a.public_key).name == "a"  # type: ignore[union-attr]
    assert "c" not in either and either.is_revoked(keys.old["c"].public_key)
    assert either.curve_allowlist() == {keys.old["a"].curve_public_key, keys.new_a.curve_public_key,
                                        keys.old["b"].curve_public_key}
    settled = membership.settled().current
    assert settled.by_public_key(keys.old["a"].public_key) is None
    assert settled.is_revoked(keys.old["a"].public_key)
    assert settled.curve_allowlist() == {keys.new_a.curve_public_key, keys.old["b"].curve_public_key}


def test_old_keys_are_refused_after_the_change_and_counted(keys: Keys) -> None:
    # Prepare: three endpoints on version 1; a holds its new key too (found beside its key file)
    v1, v2 = keys.roster(), keys.rotated()
    a, b, c = (Endpoint(keys.old[name], v1, RUN, 1) for name in NAMES)
    a.add_identity(keys.new_a)
    membership = Membership(v1).changed_to(v2)
    # Execute: everyone learns version 2 (the rounds before ROUND: both of a's keys)
    for endpoint in (a, b):
        endpoint.set_roster(membership.either())
    before = send(a, b)
    revoked_now = c.seal(("b",), Heartbeat(step=1))
    # ... then ROUND comes: only the new key
    for endpoint in (a, b):
        endpoint.set_roster(membership.settled().current)
    after = send(a, b)
    replayed_old_key = Endpoint(keys.old["a"], v1, RUN, 2).seal(("b",), Heartbeat(step=2))
    # Assert: a signed with its old key before, its new key after; the revoked and rotated-away keys
    # are refused by reason
    assert isinstance(before, Opened) and before.sender == "a"
    assert isinstance(after, Opened) and after.sender == "a"
    assert a.identity.public_key == keys.new_a.public_key
    assert b.open(revoked_now) == Rejection("revoked_key", f"key {keys.old['c'].public_id} was revoked or "
                                            "rotated away", keys.old["c"].public_id)
    refused = b.open(replayed_old_key)
    assert isinstance(refused, Rejection) and refused.reason == "revoked_key"
    assert b.rejections == {"revoked_key": 2}
    # at the boundary: a member not yet at ROUND takes a's new key, and a takes what it addresses to
    # a's old key
    late = Endpoint(keys.old["b"], membership.either(), RUN, 3)
    assert isinstance(late.open(a.seal(("b",), Heartbeat(step=3))), Opened)
    assert isinstance(a.open(late.seal(("a",), Heartbeat(step=3))), Opened)


def test_a_member_without_its_new_key_cannot_take_the_new_roster(keys: Keys) -> None:
    v1 = keys.roster()
    membership = Membership(v1).changed_to(keys.rotated())
    a = Endpoint(keys.old["a"], v1, RUN, 1)
    a.set_roster(membership.either())      # before the round: still its old key
    with pytest.raises(Exception, match="none of this member's keys"):
        a.set_roster(membership.settled().current)


def test_the_new_key_file_is_found_beside_the_configured_one(keys: Keys, tmp_path: Path) -> None:
    save_identity(keys.old["a"], tmp_path / "a.key")
    save_identity(keys.new_a, tmp_path / "a-2.key")
    (tmp_path / "junk.key").write_text("not a key")
    (tmp_path / "junk.key").chmod(0o600)
    found = find_identity(tmp_path / "a.key", keys.new_a.public_id)
    assert found is not None and found.public_key == keys.new_a.public_key
    assert find_identity(tmp_path / "a.key", Identity.generate().public_id) is None


# ------------------------------------------------------------ versions


def test_members_one_version_apart_interoperate(keys: Keys) -> None:
    # Prepare: b is not yet upgraded (speaks and accepts only MIN_PROTOCOL_VERSION); a and c are
    roster = keys.roster()
    old = Policy(accepted_versions=(MIN_PROTOCOL_VERSION, MIN_PROTOCOL_VERSION))
    a, c = Endpoint(keys.old["a"], roster, RUN, 1), Endpoint(keys.old["c"], roster, RUN, 1)
    b = Endpoint(keys.old["b"], roster, RUN, 1, old)
    assert PROTOCOL_VERSION == MIN_PROTOCOL_VERSION + 1
    # Execute: a speaks first to b, before it has heard b; then b speaks; then a again
    first = send(a, b, Heartbeat(step=1, loss=0.5, roster_version=1))
    from_b = send(b, a, Heartbeat(step=1, loss=0.5, roster_version=1))
    second = send(a, b, Heartbeat(step=2, loss=0.5, roster_version=1))
    push = send(a, b, ParamPush(round=3, tensors={"w": torch.ones(3)}))
    from_c = send(c, a, Heartbeat(step=1, loss=0.5, roster_version=1))
    to_both = a.seal(("b", "c"), Heartbeat(step=4, loss=0.5, roster_version=1))
    # Assert: the one message b could not read is counted; after it a speaks b's version to b
    # (the version-4 field left out) and its own to c, and the lowest of the two to both
    assert isinstance(first, Rejection) and first.reason == "version_unsupported"
    assert b.rejections == {"version_unsupported": 1}
    assert isinstance(from_b, Opened) and from_b.message == Heartbeat(step=1, loss=0.5, roster_version=0)
    assert isinstance(second, Opened) and second.message == Heartbeat(step=2, loss=0.5, roster_version=0)
    assert isinstance(push, Opened) and torch.equal(push.message.tensors["w"], torch.ones(3))  # type: ignore[union-attr]
    assert isinstance(from_c, Opened) and from_c.message == Heartbeat(step=1, loss=0.5, roster_version=1)
    assert a.version_for(("b",)) == MIN_PROTOCOL_VERSION and a.version_for(("c",)) == PROTOCOL_VERSION
    assert isinstance(b.open(to_both), Opened)
    # the simulator's byte count still matches what is sealed
    message = ParamPush(round=4, tensors={"w": torch.ones(5)})
    assert endpoint_message_bytes(c, ["a"], message) == wire_size(c.seal(("a",), message))


def test_a_version_outside_the_range_is_refused_by_reason(keys: Keys) -> None:
    from protocols.codec import encode

    roster = keys.roster()
    b = Endpoint(keys.old["b"], roster, RUN, 1)
    for version in (MIN_PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1):
        frames = encode(Heartbeat(step=1), identity=keys.old["a"], recipients=[keys.old["b"].public_key],
                        run_id=RUN, epoch=1, seq=version, version=version)
        refused = b.open(frames)
        assert isinstance(refused, Rejection) and refused.reason == "version_unsupported"
    with pytest.raises(ValueError, match="accepted_versions"):
        Policy(accepted_versions=(MIN_PROTOCOL_VERSION - 1, PROTOCOL_VERSION))


# ------------------------------------------------------------ the command line


def test_roster_rotate_and_revoke_from_the_command_line(keys: Keys, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a roster of three and their key files, a new key for a
    path = tmp_path / "roster.toml"
    roster_file.write(path, keys.roster())
    for name, key in keys.old.items():
        save_identity(key, tmp_path / f"{name}.key")
    save_identity(keys.new_a, tmp_path / "a-2.key")
    roster = ["--roster", str(path)]
    # Execute
    wrong = main(["roster", "rotate", *roster, "a", "--old-key", str(tmp_path / "b.key"),
                  "--new-key", str(tmp_path / "a-2.key"), "--effective-round", str(ROUND)])
    rotated = main(["roster", "rotate", *roster, "a", "--old-key", str(tmp_path / "a.key"),
                    "--new-key", str(tmp_path / "a-2.key"), "--effective-round", str(ROUND)])
    revoked = main(["roster", "revoke", *roster, "c", "--effective-round", str(ROUND)])
    shown = main(["roster", "show", *roster])
    # Assert: the wrong old key is refused and changes nothing; the others make versions 2 and 3
    out = capsys.readouterr()
    assert wrong != 0 and "is not a's key on the roster" in out.err
    assert (rotated, revoked, shown) == (0, 0, 0)
    final = roster_file.read(path)
    assert (final.version, final.effective_round, final.names) == (3, ROUND, ("a", "b"))
    assert final.member("a").public_id == keys.new_a.public_id
    assert set(final.revoked) == {keys.old["a"].public_id, keys.old["c"].public_id}
    assert f"rotated at round {ROUND}" in out.out and "2 key(s) revoked" in out.out
    # each version follows from the one before (the rotation is signed by the old key)
    version_1 = keys.roster()
    assert Membership(version_1).changed_to(final).current == final


# ------------------------------------------------------------ the Node


def test_the_node_stops_dialling_a_revoked_neighbour_at_once_and_says_a_later_roster() -> None:
    from test_membership import EFFECTIVE_ROUND, NEW, OLD, node_at_round, roster_of

    from protocols.events import NeighbourDown, Send
    from protocols.node import Neighbour, Note
    from protocols.node.membership import Connect
    from topology import build

    # Prepare: p01 (ring of OLD, neighbours p00 and p02) at a round before the change
    node, machine = node_at_round(EFFECTIVE_ROUND - 2)
    v1 = node.membership.current
    # Execute: version 2 revokes p02 (the ring of NEW from EFFECTIVE_ROUND); a neighbour tells of version 3
    v2 = dataclasses.replace(roster_of(NEW, version=2, effective_round=EFFECTIVE_ROUND),
                             revoked=(v1.member("p02").public_id,))
    actions = node.change_membership(v2, build("ring", NEW), 0.0, make_neighbour=Neighbour)
    told = node.receive("p00", Heartbeat(step=1, roster_version=3), 1.0)
    again = node.receive("p00", Heartbeat(step=2, roster_version=3), 2.0)
    # Assert: p02 neither verified, dialled, waited for nor sent to from now on, though the graph keeps
    # it until the round
    connect = next(a for a in actions if isinstance(a, Connect))
    assert "p02" not in connect.roster and "p02" not in connect.neighbours
    assert connect.roster.is_revoked(v1.member("p02").public_key)
    assert "p02" not in node.neighbourhood.names()
    assert NeighbourDown("p02") in machine.fed
    assert node._stamped([Send(("p00", "p02"), Heartbeat(step=1))]) == [Send(("p00",), Heartbeat(step=1))]
    assert node._stamped([Send(("p02",), Heartbeat(step=1))]) == []
    assert told == [Note("p00 holds roster version 3, p01 2: is this member's roster file up to date?",
                         warning=True)]
    assert again == []
    assert set(OLD) - set(NEW) == {"p02"}


def test_the_node_does_not_take_a_roster_that_swaps_a_key_unsigned() -> None:
    from test_membership import EFFECTIVE_ROUND, OLD, node_at_round

    from protocols.node import Neighbour
    from topology import build

    node, _machine = node_at_round(EFFECTIVE_ROUND - 2)
    v1 = node.membership.current
    swapped = dataclasses.replace(v1.member("p00"), public_id=Identity.generate().public_id)
    v2 = v1.remove("p00").add(swapped).revised(EFFECTIVE_ROUND)
    actions = node.change_membership(v2, build("ring", OLD), 0.0, make_neighbour=Neighbour)
    assert node.membership.current is v1
    assert node.all_rejections()["roster_key_change_unsigned"] == 1
    assert "another key without a rotation signed by its old one" in str(actions)


def test_a_restarted_member_finds_its_rotated_key_and_a_foreign_key_is_still_an_error(tmp_path: Path) -> None:
    from test_membership import NETWORK

    from peer.files.config import ConfigError
    from peer.runtime.assemble import identity_and_roster
    from peer.runtime.netinit import create_network
    from peer.runtime.peerconfig import load_peer_config

    # Prepare: a network of three whose roster rotated p01's key; the new key file beside the old
    files = create_network(tmp_path / "net", peers=3, network=NETWORK)
    roster = roster_file.read(files.roster)
    old, new = load_identity(files.keys["p01"]), Identity.generate()
    save_identity(new, files.keys["p01"].with_name("p01-next.key"))
    rotated = roster.rotate("p01", public_id=new.public_id, curve_key=new.curve_public_key, at_round=ROUND,
                            signature=old.sign_rotation("p01", new, ROUND)).revised(ROUND)
    roster_file.write(files.roster, rotated)
    # Execute / Assert: p01 (its config still names p01.key) starts with the new key
    identity, _, name = identity_and_roster(load_peer_config(files.configs["p01"]))
    assert (name, identity.public_id) == ("p01", new.public_id)
    # ... while a config naming another member's key is refused, though that folder holds the right one
    config = files.configs["p02"]
    config.write_text(config.read_text().replace("p02.key", "p00.key"))
    with pytest.raises(ConfigError, match="is not the key of 'p02' on the roster"):
        identity_and_roster(load_peer_config(config))

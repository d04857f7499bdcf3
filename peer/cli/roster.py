"""``hivemesh roster add|remove|set-address|rotate|revoke|show --roster FILE``: edit and print the roster.

An edit of an existing roster is its next version (``version`` + 1), applied by every member
from ``--effective-round`` on; running peers pick the file up without a restart.

``rotate NAME --old-key OLD --new-key NEW --effective-round R`` hands a member's place to a new
key pair from round R on, signed by the old key (so it needs the old key file, which only that
member's operator holds); the old key is revoked. The member's peer finds the new key file
beside its configured one (peer/files/keydir.py). ``revoke NAME`` removes a member and revokes
its key: every peer refuses that key as soon as it reads the file, and leaves the member out of
its graph from ``--effective-round`` on. ``set-address NAME HOST:PORT`` moves a peer or
gateway to another address (another host): the member listens there from its next start,
and running peers dial it there as soon as they read the file.

``reload --config PEER.toml`` (or ``--data-dir DIR``) tells the peer running on that data
directory to re-read its roster file now: it sends the peer SIGHUP, found by the PID in the
directory's held lock (peer/runtime/datalock.py). Running peers also notice a changed file on
their own within a second; reload is for an operator who wants it taken now, and sees the peer
say what it found (``SIGHUP: roster ... re-read: version N``) in its log. No peer running there
is an error, and so is an edge client's folder (its status says ``role = "edge"``): an edge
client reads the roster when it starts (it ignores SIGHUP).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocols.roster import Member, Roster


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "roster", help="add, remove or show roster members",
        description="Edit and print the roster, the one list of members (name, public id, role, "
                    "address, curve key) every peer trusts.")
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)

    add = actions.add_parser("add", help="add a member (creates the roster file if needed)",
                             description="Add a member. Give its public id (printed by `hivemesh keygen`) "
                                         "or, for your own key, the key file.")
    add.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    add.add_argument("name", help="member name (letters, digits, '_', '.', '-')")
    who = add.add_mutually_exclusive_group(required=True)
    who.add_argument("--public-id", help="the member's public id")
    who.add_argument("--key", metavar="FILE", help="read the public id and curve key from this key file")
    add.add_argument("--role", default="peer", choices=("peer", "gateway", "edge"), help="default: peer")
    add.add_argument("--address", default="", help="tcp://HOST:PORT (required for peers and gateways)")
    add.add_argument("--gateway", default="", help="an edge client's gateway (its name): the gateway that "
                     "serves it while running, whatever the gateways' [peer] clients list")
    add.add_argument("--curve-key", default="", help="the member's CurveZMQ public key (Z85)")
    _effective_round(add)
    add.set_defaults(func=run_add)

    remove = actions.add_parser("remove", help="remove a member")
    remove.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    remove.add_argument("name", help="member name")
    _effective_round(remove)
    remove.set_defaults(func=run_remove)

    move = actions.add_parser(
        "set-address", help="change where a peer or gateway listens (HOST:PORT)",
        description="Set a member's address (where it listens and its neighbours dial it). Stop the "
                    "member, set its address, start it there: running peers dial it at the new address "
                    "as soon as they read the file.")
    move.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    move.add_argument("name", help="member name")
    move.add_argument("address", metavar="HOST:PORT", help="the new address (tcp:// optional)")
    _effective_round(move)
    move.set_defaults(func=run_set_address)

    rotate = actions.add_parser(
        "rotate", help="give a member a new key pair from a round on (signed by its old key)",
        description="Replace a member's signing and CurveZMQ keys from --effective-round on. The old key "
                    "signs the new keys, so give the old key file; the old key is revoked. Put the new key "
                    "file beside the peer's configured key file: the peer signs with it from that round.")
    rotate.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    rotate.add_argument("name", help="member name")
    rotate.add_argument("--old-key", required=True, metavar="FILE", help="the member's current key file")
    rotate.add_argument("--new-key", required=True, metavar="FILE",
                        help="the new key file (`hivemesh keygen`)")
    rotate.add_argument("--effective-round", type=int, required=True, metavar="ROUND",
                        help="the first round signed with the new key: one every member has yet to reach")
    rotate.set_defaults(func=run_rotate)

    revoke = actions.add_parser(
        "revoke", help="remove a member and refuse its key at once",
        description="Remove a member and put its key on the revoked list: every peer refuses the key "
                    "(counted as revoked_key) and its CurveZMQ key as soon as it reads the file.")
    revoke.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    revoke.add_argument("name", help="member name")
    _effective_round(revoke)
    revoke.set_defaults(func=run_revoke)

    reload = actions.add_parser(
        "reload", help="make a running peer re-read its roster file now (SIGHUP)",
        description="Send SIGHUP to the peer running on a data directory: it re-reads its roster file at "
                    "once and says what it found in its log. Copy the edited roster to the peer's host "
                    "first; a version is applied from its effective round.")
    where = reload.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", metavar="PEER.toml", help="the running peer's config file")
    where.add_argument("--data-dir", metavar="DIR",
                       help="the running peer's data folder, instead of its config")
    reload.set_defaults(func=run_reload)

    show = actions.add_parser("show", help="print the members")
    show.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    show.set_defaults(func=run_show)


def _effective_round(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--effective-round", type=int, default=0, metavar="ROUND",
                        help="the round from which every member applies the edit (a running network: a "
                             "round every member has yet to reach; running peers pick the file up). "
                             "Default: 0, from the start")


def _revised(roster: Roster, edited: Roster, args: argparse.Namespace, *, new_file: bool) -> Roster:
    """``edited`` as the next version of ``roster`` (a new file starts at version 1)."""
    from protocols.roster import RosterError

    if args.effective_round < 0:
        raise RosterError(f"--effective-round must be >= 0, not {args.effective_round}")
    if new_file:
        return edited
    if args.effective_round == 0:
        print("note: effective from round 0, as if from the start: peers already running apply it at once, "
              "not together (for a running network give --effective-round, a round none has reached)")
    return dataclasses.replace(edited, version=roster.version + 1, effective_round=args.effective_round)


def _said(roster: Roster) -> str:
    return f"version {roster.version}, effective from round {roster.effective_round}"


def run_add(args: argparse.Namespace) -> int:
    from peer.files import roster_file
    from peer.files.keyfile import load_identity
    from protocols.roster import Member, RosterError

    roster = roster_file.read(args.roster, missing_ok=True)
    public_id, curve_key = args.public_id, args.curve_key
    if args.key:
        identity = load_identity(args.key)
        public_id, curve_key = identity.public_id, curve_key or identity.curve_public_key
    if args.name in roster:
        raise RosterError(f"{args.roster}: member {args.name!r} is already listed; remove it first")
    try:
        member = Member(name=args.name, public_id=public_id, role=args.role, address=args.address,
                        curve_key=curve_key, gateway=args.gateway)
    except ValueError as error:
        raise RosterError(f"member {args.name!r}: {error}") from None
    new_file = not Path(args.roster).exists()
    edited = _revised(roster, roster.add(member), args, new_file=new_file)
    roster_file.write(args.roster, edited)
    print(f"added {args.name} ({args.role}) to {args.roster}: {len(edited)} members ({_said(edited)})")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    from peer.files import roster_file

    roster = roster_file.read(args.roster)
    _member(roster, args)
    edited = _revised(roster, roster.remove(args.name), args, new_file=False)
    roster_file.write(args.roster, edited)
    print(f"removed {args.name} from {args.roster}: {len(edited)} members ({_said(edited)})")
    return 0


def run_set_address(args: argparse.Namespace) -> int:
    from peer.files import roster_file
    from protocols.roster import RosterError

    roster = roster_file.read(args.roster)
    member = _member(roster, args)
    address = args.address if args.address.startswith("tcp://") else f"tcp://{args.address}"
    if member.role == "edge":
        raise RosterError(f"{args.name} is an edge client: it dials out and listens nowhere")
    taken = [m.name for m in roster if m.address == address and m.name != args.name]
    if taken:
        raise RosterError(f"{address} is already {taken[0]}'s address")
    try:
        moved = dataclasses.replace(member, address=address)
    except ValueError as error:
        raise RosterError(f"member {args.name!r}: {error}") from None
    kept = tuple(moved if m.name == args.name else m for m in roster.members)
    edited = _revised(roster, dataclasses.replace(roster, members=kept), args, new_file=False)
    roster_file.write(args.roster, edited)
    print(f"{args.name} now listens at {address} in {args.roster} ({_said(edited)}): start it there; running "
          "peers dial it there once they read the file")
    return 0


def run_rotate(args: argparse.Namespace) -> int:
    from peer.files import roster_file
    from peer.files.keyfile import load_identity
    from protocols.roster import RosterError

    roster = roster_file.read(args.roster)
    member = _member(roster, args)
    if args.effective_round < 1:
        raise RosterError(f"--effective-round must be >= 1 (a round no member has reached), not "
                          f"{args.effective_round}")
    old, new = load_identity(args.old_key), load_identity(args.new_key)
    if old.public_id != member.public_id:
        raise RosterError(f"{args.old_key} (public id {old.public_id}) is not {args.name}'s key on "
                          "the roster")
    if roster.by_public_key(new.public_key) is not None or roster.is_revoked(new.public_key):
        raise RosterError(f"{args.new_key}: this key is already on the roster (or revoked)")
    rotated = roster.rotate(args.name, public_id=new.public_id, curve_key=new.curve_public_key,
                            at_round=args.effective_round,
                            signature=old.sign_rotation(args.name, new, args.effective_round))
    edited = _revised(roster, rotated, args, new_file=False)
    roster_file.write(args.roster, edited)
    print(f"rotated {args.name}'s key to {new.public_id} from round {args.effective_round} in {args.roster} "
          f"({_said(edited)}); put {args.new_key} beside the peer's configured key file")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from peer.files import roster_file

    roster = roster_file.read(args.roster)
    _member(roster, args)
    edited = _revised(roster, roster.revoke(args.name), args, new_file=False)
    roster_file.write(args.roster, edited)
    print(f"revoked {args.name} in {args.roster}: its key is refused by every peer that reads the file; "
          f"{len(edited)} members ({_said(edited)})")
    return 0


def run_reload(args: argparse.Namespace) -> int:
    import os
    import signal

    from peer.files.statefiles import read_status
    from peer.runtime.datalock import holder
    from protocols.errors import HivemeshError

    if args.config:
        from peer.runtime.peerconfig import load_peer_config

        config = load_peer_config(args.config)
        data_dir, roster, who = config.data_dir, f" ({config.roster_path})", f"peer {config.peer.name}"
    else:
        data_dir, roster, who = Path(args.data_dir), "", "the peer"
    found = read_status(data_dir) or {}
    if found.get("role") == "edge":    # an edge does not reload (it ignores SIGHUP): say so, not 'sent'
        raise HivemeshError(f"{data_dir} is edge client {found.get('name')}'s: an edge client reads the "
                            "roster when it starts; restart it to apply a roster change")
    pid = holder(data_dir)
    if pid is None:
        raise HivemeshError(f"no peer is running on data directory {data_dir}: nothing to reload (a peer "
                            "reads its roster when it starts)")
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise HivemeshError(f"{data_dir}: the peer (pid {pid}) has just exited: nothing to reload") from None
    except PermissionError:
        raise HivemeshError(f"{data_dir}: not allowed to signal the peer (pid {pid}): run as its "
                            "user") from None
    print(f"sent SIGHUP to {who} (pid {pid}): it re-reads its roster{roster} now; its log says what it found")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from peer.files import roster_file

    roster = roster_file.read(args.roster)
    if not len(roster):
        print(f"{args.roster}: no members")
        return 0
    revoked = f", {len(roster.revoked)} key(s) revoked" if roster.revoked else ""
    print(f"{args.roster}: {_said(roster)}{revoked}")
    rows = [("NAME", "ROLE", "ADDRESS", "CURVE", "PUBLIC ID")]
    rows += [(m.name, m.role, m.address or (f"(gateway {m.gateway})" if m.gateway else "-"),
              "yes" if m.curve_key else "no",
              m.public_id + (f" (rotated at round {m.rotated_at_round})" if m.rotated_from else ""))
             for m in roster]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    return 0


def _member(roster: Roster, args: argparse.Namespace) -> Member:
    """The roster's member ``args.name``, or a RosterError that lists the members there are."""
    from protocols.roster import RosterError

    member = roster.get(args.name)
    if member is None:
        listed = ", ".join(roster.names) or "none"
        raise RosterError(f"{args.roster}: no member {args.name!r} (members: {listed})")
    return member

"""``hivemesh roster add|remove|show --roster FILE``: edit and print the membership list.

An edit of an existing roster is its next version (``version`` + 1), applied by every member
from ``--effective-round`` on; running peers pick the file up without a restart.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocols.roster import Roster


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
    add.add_argument("--curve-key", default="", help="the member's CurveZMQ public key (Z85)")
    _effective_round(add)
    add.set_defaults(func=run_add)

    remove = actions.add_parser("remove", help="remove a member")
    remove.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    remove.add_argument("name", help="member name")
    _effective_round(remove)
    remove.set_defaults(func=run_remove)

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
    from protocols.identity import Identity
    from protocols.roster import Member, RosterError

    roster = roster_file.read(args.roster, missing_ok=True)
    public_id, curve_key = args.public_id, args.curve_key
    if args.key:
        identity = Identity.load(args.key)
        public_id, curve_key = identity.public_id, curve_key or identity.curve_public_key
    if args.name in roster:
        raise RosterError(f"{args.roster}: member {args.name!r} is already listed; remove it first")
    try:
        member = Member(name=args.name, public_id=public_id, role=args.role, address=args.address,
                        curve_key=curve_key)
    except ValueError as error:
        raise RosterError(f"member {args.name!r}: {error}") from None
    new_file = not Path(args.roster).exists()
    edited = _revised(roster, roster.add(member), args, new_file=new_file)
    roster_file.write(args.roster, edited)
    print(f"added {args.name} ({args.role}) to {args.roster}: {len(edited)} members ({_said(edited)})")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    from peer.files import roster_file
    from protocols.roster import RosterError

    roster = roster_file.read(args.roster)
    if args.name not in roster:
        listed = ", ".join(roster.names) or "none"
        raise RosterError(f"{args.roster}: no member {args.name!r} (members: {listed})")
    edited = _revised(roster, roster.remove(args.name), args, new_file=False)
    roster_file.write(args.roster, edited)
    print(f"removed {args.name} from {args.roster}: {len(edited)} members ({_said(edited)})")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from peer.files import roster_file

    roster = roster_file.read(args.roster)
    if not len(roster):
        print(f"{args.roster}: no members")
        return 0
    print(f"{args.roster}: {_said(roster)}")
    rows = [("NAME", "ROLE", "ADDRESS", "CURVE", "PUBLIC ID")]
    rows += [(m.name, m.role, m.address or "-", "yes" if m.curve_key else "no", m.public_id) for m in roster]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    return 0

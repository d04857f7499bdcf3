"""``hivemesh roster add|remove|show --roster FILE``: edit and print the membership list."""

from __future__ import annotations

import argparse


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
    add.set_defaults(func=run_add)

    remove = actions.add_parser("remove", help="remove a member")
    remove.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    remove.add_argument("name", help="member name")
    remove.set_defaults(func=run_remove)

    show = actions.add_parser("show", help="print the members")
    show.add_argument("--roster", required=True, metavar="FILE", help="roster TOML file")
    show.set_defaults(func=run_show)


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
    roster_file.write(args.roster, roster.add(member))
    print(f"added {args.name} ({args.role}) to {args.roster}: {len(roster) + 1} members")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    from peer.files import roster_file
    from protocols.roster import RosterError

    roster = roster_file.read(args.roster)
    if args.name not in roster:
        listed = ", ".join(roster.names) or "none"
        raise RosterError(f"{args.roster}: no member {args.name!r} (members: {listed})")
    roster_file.write(args.roster, roster.remove(args.name))
    print(f"removed {args.name} from {args.roster}: {len(roster) - 1} members")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from peer.files import roster_file

    roster = roster_file.read(args.roster)
    if not len(roster):
        print(f"{args.roster}: no members")
        return 0
    rows = [("NAME", "ROLE", "ADDRESS", "CURVE", "PUBLIC ID")]
    rows += [(m.name, m.role, m.address or "-", "yes" if m.curve_key else "no", m.public_id) for m in roster]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    return 0

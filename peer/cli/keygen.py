"""``hivemesh keygen --out NAME.key``: a new identity key; prints its public id."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "keygen", help="create an identity key and print its public id",
        description="Write a new Ed25519 identity key (with a CurveZMQ key pair) to OUT, readable "
                    "only by you (mode 0600), and print its public id. An existing file is never "
                    "overwritten. Keep the key file secret; put the public id on the roster.")
    parser.add_argument("--out", required=True, metavar="NAME.key", help="key file to create")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peer.files.keyfile import save_identity
    from protocols.identity import Identity

    identity = Identity.generate()
    save_identity(identity, args.out)
    print(identity.public_id)
    print(f"wrote {args.out} (mode 0600); curve key {identity.curve_public_key}\n"
          f"add it to a roster with: hivemesh roster add --roster roster.toml NAME --key {args.out} "
          f"--address tcp://HOST:PORT", file=sys.stderr)
    return 0

"""The ``hivemesh`` command line.

Each subcommand lives in its own ``peer/cli/*.py`` module exposing
``register(subparsers)``; registration must stay light (no torch import), so
that ``hivemesh --help`` and ``hivemesh topology show`` start fast. Errors a
user can fix (:class:`HivemeshError`) are printed as one line, never as a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from protocols.errors import HivemeshError

# Order here is the order in `hivemesh --help`.
COMMAND_MODULES = (
    "peer.cli.demo",
    "peer.cli.topology",
    "peer.cli.init",
    "peer.cli.config",
    "peer.cli.peer",
    "peer.cli.edge_command",
    "peer.cli.status",
    "peer.cli.export",
    "peer.cli.eval",
    "peer.cli.keygen",
    "peer.cli.roster",
    "peer.cli.sim",
)


def _version() -> str:
    try:
        return metadata.version("hivemesh")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hivemesh",
        description="Decentralized peer-to-peer and federated training for PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"hivemesh {_version()}")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="least severe log message shown (default: INFO)")
    parser.add_argument("--log-file", metavar="FILE",
                        help="also append log messages to FILE, with their level")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        from peer.files.console import configure_logging

        configure_logging(args.log_level, args.log_file)
        return int(args.func(args) or 0)
    except HivemeshError as error:
        print(f"hivemesh: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hivemesh: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`hivemesh status | head -2`): what it chose not to read is no error;
        # stdout goes to /dev/null so that the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""``hivemesh demo``: the main job on a built-in default (upgraded as the daemon lands)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the main job on a built-in default",
        description="Run the main job on a built-in default.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("hivemesh demo: nothing to run yet")
    return 0

"""``hivemesh edge --config edge.toml``: run an edge client of a federation until its gateway finishes."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "edge", help="run an edge client (train on local data when its gateway asks, upload signed updates)",
        description="Run one edge client of a federation: dial its gateway (nothing listens here, so it "
                    "works behind NAT), train on its own data in the rounds it is sampled for, upload "
                    "signed, compressed updates. Its data never leaves the device. SIGINT or SIGTERM "
                    "writes a checkpoint and exits 0; starting again resumes.")
    parser.add_argument("--config", required=True, help="the client's config (written by `hivemesh init "
                                                          "--gateways G --edges E`)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on the console")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peer.runtime.edge import run_edge

    return run_edge(args.config, quiet=args.quiet)

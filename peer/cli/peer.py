"""``hivemesh peer --config peer.toml``: run one peer daemon until its training is done."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "peer", help="run a peer daemon (train and gossip with its neighbours)",
        description="Run one peer: train locally, gossip with the neighbours the topology gives it, "
                    "checkpoint, and write status.json / metrics.jsonl into its data folder. "
                    "SIGINT or SIGTERM writes a checkpoint and exits 0; starting again resumes.")
    parser.add_argument("--config", required=True, help="the peer's config file (written by `hivemesh init`)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on the console")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="override a key of the config file, as TOML (dotted for tables; repeatable), "
                             "e.g. --set peer.eval_every_steps=10 --set checkpoint.every_steps=0; "
                             "a [network] key changes the run id, so give every peer the same; "
                             "every key: hivemesh config reference")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics on 127.0.0.1:PORT (or [peer] metrics_host), "
                             "instead of the config's [peer] metrics_port; 0: none")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peer.runtime.peerprocess import run_peer

    return run_peer(args.config, quiet=args.quiet, overrides=args.overrides, metrics_port=args.metrics_port)

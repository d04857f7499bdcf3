"""``hivemesh init``: keys, roster and one config per peer for a new network."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "init", help="create keys, roster and peer configs for a new network",
        description="Create a new network in OUT: one identity key per peer (keys/), the roster "
                    "(roster.toml) and one config per peer (NAME.toml). Start each peer with "
                    "`hivemesh peer --config OUT/NAME.toml`.")
    parser.add_argument("--peers", type=int, required=True, help="number of peers")
    parser.add_argument("--topology", default="ring", help="topology spec or graph file (default: ring)")
    parser.add_argument("--out", required=True, help="new (or empty) folder to write into")
    parser.add_argument("--task", default="digits-mlp", help="training task (default: digits-mlp)")
    parser.add_argument("--algorithm", default="dpsgd",
                        help="gossip algorithm: dpsgd, local, choco, pushsum, adpsgd (default: dpsgd)")
    parser.add_argument("--compression", default="identity", help="compression spec (default: identity)")
    parser.add_argument("--steps", type=int, default=300, help="local training steps per peer (default: 300)")
    parser.add_argument("--seed", type=int, default=0, help="network seed (default: 0)")
    parser.add_argument("--partition", default="dirichlet", choices=("iid", "dirichlet", "shards"),
                        help="how the data is split (default: dirichlet)")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha (default: 0.5)")
    parser.add_argument("--host", default="127.0.0.1", help="address peers listen on (default: 127.0.0.1)")
    parser.add_argument("--base-port", type=int, default=0,
                        help="first port (then consecutive); default: free ports chosen now")
    parser.add_argument("--curve", action="store_true", help="switch on CurveZMQ transport encryption")
    parser.set_defaults(func=run)


def default_network(*, topology: str, task: str, algorithm: str, compression: str, steps: int, seed: int,
                    partition: str = "dirichlet", alpha: float = 0.5) -> dict[str, Any]:
    """The [network] table of a new network (what every member agrees on)."""
    from peer.defaults import gossip_table, trainer_table

    return {
        "topology": topology,
        "seed": seed,
        "task": task,
        "partition": {"scheme": partition, "alpha": alpha},
        "gossip": gossip_table(algorithm=algorithm, compression=compression, steps=steps, seed=seed),
        "trainer": trainer_table(task=task, steps=steps),
    }


def run(args: argparse.Namespace) -> int:
    from peer.netinit import create_network
    from topology import build, default_names

    network = default_network(topology=args.topology, task=args.task, algorithm=args.algorithm,
                              compression=args.compression, steps=args.steps, seed=args.seed,
                              partition=args.partition, alpha=args.alpha)
    build(args.topology, default_names(args.peers), seed=args.seed)   # a bad spec fails before any file
    files = create_network(args.out, peers=args.peers, network=network, host=args.host,
                           base_port=args.base_port, peer_options={"curve": True} if args.curve else None)
    print(f"created a network of {args.peers} peers in {files.out}")
    print(f"  roster:  {files.roster}")
    print(f"  keys:    {files.out / 'keys'}/ (mode 0600; give each machine only its own)")
    for name, path in files.configs.items():
        print(f"  {name}:  hivemesh peer --config {path}")
    return 0

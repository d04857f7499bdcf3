"""``hivemesh demo``: the main job on a built-in default (upgraded as the daemon lands).

Until the peer daemon exists, the demo compares the built-in topologies a
16-member network could use: how fast gossip averaging converges on each and
what a round costs for a 25M-parameter model.
"""

from __future__ import annotations

import argparse

# The comparison the demo prints: four ways to wire 16 members.
DEMO_SPECS = ("ring:16", "torus:4x4", "exponential:16", "one-peer-exponential:16")
# A 25M-parameter model (100 MB of float32), the size the benchmarks use.
DEMO_MODEL_PARAMS = 25_000_000


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the main job on a built-in default",
        description="Run the main job on a built-in default (for now: compare gossip topologies "
                    "for 16 members and a 25M-parameter model).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peer.cmd_topology import human_bytes
    from topology import build
    from topology.analysis import bytes_per_round, rounds_to_shrink, spectral_gap

    print(f"hivemesh demo: gossip topologies for 16 members, {DEMO_MODEL_PARAMS:,}-parameter model (float32)")
    header = ("topology", "spectral gap", "rounds to 1000x", "bytes/round", "bytes to 1000x")
    rows = []
    for spec in DEMO_SPECS:
        topology = build(spec)
        rounds = rounds_to_shrink(topology, 1000.0)
        per_round = bytes_per_round(topology, DEMO_MODEL_PARAMS)
        rows.append((spec, f"{spectral_gap(topology):.4f}", "never" if rounds is None else str(rounds),
                     human_bytes(per_round), "-" if rounds is None else human_bytes(per_round * rounds)))
    widths = [max(len(row[k]) for row in (header, *rows)) for k in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print("(see `hivemesh topology show SPEC --plot FILE.png` for any one of them)")
    return 0

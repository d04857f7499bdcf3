"""``hivemesh topology``: inspect a communication graph before training on it.

``show`` prints the mixing schedule's figures of merit (spectral gap, rounds
to shrink disagreement 1000x, diameter, degrees, traffic) as a table or JSON,
and optionally draws the graph beside its mixing matrix. ``save`` writes a
spec out as a graph file to edit (add link latencies, node speeds, ...).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from topology import Topology


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "topology", help="inspect a communication graph: spectral gap, diameter, traffic, plot",
        description="Inspect a communication graph: mixing matrix, spectral gap, diameter, "
                    "expected consensus rate, traffic per round.")
    commands = parser.add_subparsers(title="topology commands", metavar="COMMAND")
    from topology.spec import SPEC_HELP as spec_help  # the one list, beside the kinds it names

    show = commands.add_parser("show", help="print a topology's figures of merit (or JSON); optionally plot",
                               description="Print a topology's figures of merit.")
    show.add_argument("spec", metavar="SPEC", help=spec_help)
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.add_argument("--plot", metavar="FILE.png", help="draw the graph and its mixing matrix to this PNG")
    show.add_argument("--model-params", type=int, metavar="N",
                      help="model size in parameters, to report float32 bytes sent per round")
    _common(show)
    show.set_defaults(func=run_show)

    save = commands.add_parser("save", help="write a topology as a graph file (.graphml, .json, .edgelist)",
                               description="Write a topology's graph, with mixing weights, to a file.")
    save.add_argument("spec", metavar="SPEC", help=spec_help)
    save.add_argument("path", metavar="FILE", help="output: .graphml, .json or .edgelist")
    _common(save)
    save.set_defaults(func=run_save)
    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--names", metavar="A,B,...",
                        help="comma-separated member names (default p00, p01, ...; sorted before use)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random graphs (default 0)")
    parser.add_argument("--weights", default="metropolis", choices=("metropolis", "max-degree", "edges"),
                        help="mixing weights (default metropolis; 'edges' reads each edge's weight)")


def _build(args: argparse.Namespace) -> Topology:
    from topology import build

    names = [name.strip() for name in args.names.split(",")] if args.names else None
    return build(args.spec, names, seed=args.seed, weights=args.weights)


def run_show(args: argparse.Namespace) -> int:
    from protocols.errors import HivemeshError
    from topology.analysis import summary

    if args.model_params is not None and args.model_params < 0:
        raise HivemeshError(f"--model-params must be >= 0, got {args.model_params}")
    topology = _build(args)
    report = summary(topology, model_params=args.model_params)
    if args.plot:
        from topology.plot import draw

        draw(topology, args.plot)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_table(report))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def run_save(args: argparse.Namespace) -> int:
    from topology.io import save

    topology = _build(args)
    save(topology.graph, args.path)
    print(f"wrote {topology.size} members and {topology.graph.number_of_edges()} edges to {args.path}")
    return 0


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def format_table(report: dict[str, Any]) -> str:
    members = report["members"]
    shown = ", ".join(members) if len(members) <= 6 else f"{members[0]} ... {members[-1]}"
    kind = "directed (push-sum, column-stochastic W)" if report["directed"] else \
        "undirected (symmetric doubly-stochastic W)"
    rounds = report["rounds_to_1000x"]
    degree = report["degree"]
    rows = [
        ("topology", report["spec"]),
        ("members", f"{report['nodes']} ({shown})"),
        ("edges", f"{report['edges']} {kind}"),
        ("period", f"{report['period']} round(s)" + (" (time-varying)" if report["period"] > 1 else "")),
        ("spectral gap", f"{report['spectral_gap']:.6f} per round (|lambda2| {report['lambda2']:.6f})"),
        ("rounds to 1000x", "never" if rounds is None else str(rounds)),
        ("diameter", f"{report['diameter']} hops"),
        ("degree", f"min {degree['minimum']}, max {degree['maximum']}, mean {degree['mean']:.2f}"),
        ("messages/round", f"{report['messages_per_round']:g}"),
    ]
    if "bytes_per_round" in report:
        rows.append(("bytes/round", f"{human_bytes(report['bytes_per_round'])} "
                                    f"({report['model_params']:,} float32 params per message)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)

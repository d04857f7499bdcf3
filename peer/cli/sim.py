"""``hivemesh sim``: simulate scenarios with the real protocol code; ``hivemesh sim calibrate``.

``hivemesh sim SCENARIO.toml [MORE.toml ...] --out DIR`` runs each scenario
in turn (a progress line each) and writes one report comparing them all:
``DIR/report.json``, ``DIR/metrics.csv``, plots and ``DIR/report.html`` (all of it on one page).

``hivemesh sim calibrate --task NAME --write SCENARIO.toml`` times the real
trainer once on this machine and writes ``[nodes] step_time_ms`` into the
scenario (created if missing), so simulations never depend on timing
measured while they run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from protocols.errors import HivemeshError

if TYPE_CHECKING:
    from peer.files.console import Progress
    from sim.world import TracePoint


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sim", help="simulate scenarios on a modelled network with the real protocol code",
        description="Simulate scenario files (TOML) on a modelled network with the real protocol and "
                    "training code, and write one report comparing them. "
                    "'hivemesh sim calibrate --task NAME --write FILE' measures the trainer's step time.",
        epilog="examples: hivemesh sim examples/scenario-ring-vs-allreduce-slow.toml --out sim-report; "
               "hivemesh sim examples/scenario-choco.toml examples/scenario-exact-gossip.toml "
               "--out sim-report; a shorter run of one: add --set duration_s=2; "
               "hivemesh sim calibrate --task digits-mlp --write my-scenario.toml")
    parser.add_argument("scenarios", nargs="+", metavar="SCENARIO.toml",
                        help="scenario files, or 'calibrate'")
    parser.add_argument("--out", default="sim-report", help="report directory (default: sim-report)")
    parser.add_argument("--no-plots", action="store_true",
                        help="no plots (report.json, metrics.csv and report.html only)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="override a key in every scenario file, as TOML (dotted for tables; "
                             "repeatable), e.g. --set duration_s=2 --set algorithm.total_steps=50; "
                             "every key: hivemesh config reference")
    calibrate = parser.add_argument_group("calibrate")
    calibrate.add_argument("--task", help="task to time (default: the scenario's, else digits-mlp)")
    calibrate.add_argument("--write", metavar="SCENARIO.toml",
                           help="scenario file to write step_time_ms into")
    calibrate.add_argument("--batch-size", type=int, default=0,
                           help="batch size to time (default: the scenario's trainer, else 32)")
    calibrate.add_argument("--steps", type=int, default=200, help="steps to time (default: 200)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.scenarios[0] == "calibrate":
        if len(args.scenarios) > 1:
            raise HivemeshError("'hivemesh sim calibrate' takes no scenario files; use --write FILE")
        return calibrate(args)
    return simulate(args)


def simulate(args: argparse.Namespace) -> int:
    from sim.report import comparison_table, write_report
    from sim.run import check_scenario, run_scenario
    from sim.scenario import load_scenario, variants

    # Every file is checked before anything runs; compare_with adds baseline variants.
    scenarios = [variant for path in args.scenarios
                 for variant in variants(load_scenario(path, args.overrides))]
    for scenario in scenarios:
        check_scenario(scenario)
    results = []
    width = max(len(scenario.name) for scenario in scenarios)
    for scenario in scenarios:
        display = None if args.quiet else _display(scenario.name.ljust(width), scenario.duration_s)
        try:
            result = run_scenario(scenario, None if display is None else _feed(display))
        finally:
            if display is not None:
                display.close()
        if not args.quiet:
            print(f"{scenario.name:<{width}} done: {result.simulated_time_s:.1f} s simulated in "
                  f"{result.wall_s:.1f} s wall", file=sys.stderr)
        results.append(result)
    written = write_report(results, args.out, plots=not args.no_plots)
    print(comparison_table(results))
    print(f"report: {written[0]} ({len(written)} files in {args.out})")
    return 0


# ---------------------------------------------------------------- calibrate


def calibrate(args: argparse.Namespace) -> int:
    if not args.write:
        raise HivemeshError("'hivemesh sim calibrate' needs --write SCENARIO.toml")
    from sim.calibrate import measure_step_ms, write_step_time

    path = Path(args.write)
    step_ms = measure_step_ms(path, task_name=args.task, batch_size=args.batch_size, steps=args.steps)
    write_step_time(path, step_ms, task_name=args.task)
    print(f"step_time_ms = {step_ms:.3f} written to {path}")
    return 0


def _display(label: str, duration_s: float) -> Progress:
    """The live display of one scenario, on stderr (stdout gets the comparison table)."""
    from peer.files.console import Progress

    return Progress(label, duration_s, unit="s simulated", rate_unit="simulated s/s", stream=sys.stderr)


def _feed(display: Progress) -> Callable[[float, float, TracePoint], None]:
    from peer.files.console import Reading

    def progress(now_s: float, total_s: float, point: TracePoint) -> None:
        display.update(Reading(done=now_s, accuracy=point.mean_accuracy, bytes_sent=point.bytes_sent,
                               members=f"members running {point.running}"))

    return progress

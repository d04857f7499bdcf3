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
import time
from collections.abc import Callable
from pathlib import Path

from topology.errors import HivemeshError


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
    interactive = sys.stderr.isatty()
    width = max(len(scenario.name) for scenario in scenarios)
    for scenario in scenarios:
        progress = None if args.quiet else _progress_line(scenario.name, width, interactive)
        result = run_scenario(scenario, progress)
        if not args.quiet:
            done = (f"{scenario.name:<{width}} done: {result.simulated_time_s:.1f} s simulated in "
                    f"{result.wall_s:.1f} s wall")
            print("\r" + done.ljust(100) if interactive else done, file=sys.stderr)
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


def _progress_line(name: str, width: int, interactive: bool) -> Callable[[float, float], None]:
    """A live bar on a terminal; a line every 5 s in a log file."""
    started = time.perf_counter()
    last_line_s = float("-inf")

    def progress(now_s: float, total_s: float) -> None:
        nonlocal last_line_s
        wall_s = time.perf_counter() - started
        if not interactive and wall_s - last_line_s < 5.0:
            return
        last_line_s = wall_s
        done = min(1.0, now_s / total_s) if total_s > 0 else 1.0
        line = (f"{name:<{width}} [{'#' * int(done * 20):<20}] {now_s:8.1f}/{total_s:.1f} s simulated, "
                f"{wall_s:6.1f} s wall")
        if interactive:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    return progress
